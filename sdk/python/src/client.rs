//! `AsyncClient`: the connection to brigd (or a control-plane replica) and everything that is
//! not about one sandbox: one-shot calls, create (one or many), group operations by label,
//! tools, images and environments, projects and tokens.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::bridge::{future_into_py, LoopCallback};
use brig_sdk::{AuditStream, Client, ConnectOptions, Pin, ProjectLimits};
use futures::StreamExt;
use pyo3::exceptions::{PyStopAsyncIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::mpsc;

use crate::convert::{as_refs, options, selector, Json};
use crate::errors::to_py;
use crate::exec::PyCallResult;
use crate::sandbox::{call_request, sandboxes, PySandbox};

#[pyclass(module = "brig", name = "AsyncClient", frozen)]
pub struct PyClient {
    inner: Client,
}

fn addr(text: &str) -> PyResult<SocketAddr> {
    text.parse().map_err(|e| PyValueError::new_err(format!("address {text:?}: {e}")))
}

#[pymethods]
impl PyClient {
    /// Connects to brigd at `addr` (`host:port`), trusting the certificate with SHA-256
    /// fingerprint `cert_sha256`, with access `token`; `replicas` are other control-plane
    /// replicas (`[(addr, cert_sha256), …]`) to fail over to.
    #[staticmethod]
    #[pyo3(signature = (addr, cert_sha256, token, replicas=None))]
    fn connect<'py>(
        py: Python<'py>,
        addr: &str,
        cert_sha256: String,
        token: String,
        replicas: Option<Vec<(String, String)>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut opts = ConnectOptions::new(self::addr(addr)?, Pin::Sha256(cert_sha256), token);
        for (a, pin) in replicas.unwrap_or_default() {
            opts = opts.replica(self::addr(&a)?, Pin::Sha256(pin));
        }
        future_into_py(py, async move {
            Client::connect(opts).await.map(|inner| PyClient { inner }).map_err(to_py)
        })
    }

    /// Connects to the brigd whose state directory is `state_dir` (default `$BRIG_STATE_DIR`,
    /// else the user's data directory), as the `brig` CLI does.
    #[staticmethod]
    #[pyo3(signature = (state_dir=None))]
    fn connect_local(py: Python<'_>, state_dir: Option<PathBuf>) -> PyResult<Bound<'_, PyAny>> {
        let opts = match state_dir {
            Some(dir) => ConnectOptions::from_state_dir(&dir),
            None => ConnectOptions::local(),
        }
        .map_err(to_py)?;
        future_into_py(py, async move {
            Client::connect(opts).await.map(|inner| PyClient { inner }).map_err(to_py)
        })
    }

    /// The server's version string.
    fn server_version<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move { Ok(client.server_version().await) })
    }

    /// Whether the server is a control-plane replica (a cluster).
    #[getter]
    fn is_cluster(&self) -> bool {
        self.inner.is_cluster()
    }

    /// A one-shot tool call (fncall tier): no sandbox, nothing kept.
    #[pyo3(signature = (tool, input=String::new()))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        tool: String,
        input: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.call(&tool, &input).await.map(|inner| PyCallResult { inner }).map_err(to_py)
        })
    }

    /// A one-shot call with limits, argv, env and stdin (see `AsyncSandbox.call_with`).
    #[pyo3(signature = (tool, input=String::new(), **options))]
    fn call_with<'py>(
        &self,
        py: Python<'py>,
        tool: String,
        input: String,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let call = call_request(tool, input, options)?;
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.call_with(call).await.map(|inner| PyCallResult { inner }).map_err(to_py)
        })
    }

    /// Creates a sandbox of `tier` (`fncall`, `container`, `microvm`, `fullvm`). Options as
    /// keywords: image, memory_mib, cpu_millis, pids, disk_mib, labels (dict), env (dict),
    /// idle_ttl, pause_when_idle, paused_ttl, max_lifetime (seconds or timedelta), egress
    /// (list of rules), qos (`latency_sensitive`, `best_effort`), placement (`host_kernel`,
    /// `vm`), read_only_paths, hidden_paths.
    #[pyo3(signature = (tier="container", **options))]
    fn create<'py>(
        &self,
        py: Python<'py>,
        tier: &str,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = self::options(tier, options)?;
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.create(opts).await.map(|inner| PySandbox { inner }).map_err(to_py)
        })
    }

    /// Creates `n` sandboxes alike, at most `concurrency` at a time. All or nothing: if one
    /// fails, those made are destroyed and the error is raised.
    #[pyo3(signature = (n, tier="container", *, concurrency=32, **options))]
    fn create_many<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        tier: &str,
        concurrency: usize,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = self::options(tier, options)?;
        let client = self.inner.clone();
        future_into_py(py, async move {
            let results: Vec<_> = futures::stream::iter(0..n)
                .map(|_| client.create(opts.clone()))
                .buffer_unordered(concurrency.max(1))
                .collect()
                .await;
            let (made, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
            let made: Vec<_> = made.into_iter().filter_map(Result::ok).collect();
            if let Some(Err(e)) = failed.into_iter().next() {
                futures::future::join_all(made.iter().map(|sb| sb.destroy())).await;
                return Err(to_py(e));
            }
            Ok(sandboxes(made))
        })
    }

    /// A handle to an existing sandbox by id (no request: reconnect after a restart).
    fn sandbox(&self, id: &str) -> PySandbox {
        PySandbox { inner: self.inner.sandbox(id) }
    }

    /// Sandboxes whose labels include all of `labels` (all without): records as dicts.
    #[pyo3(signature = (labels=None))]
    fn list<'py>(
        &self,
        py: Python<'py>,
        labels: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let labels = labels.as_ref().map(selector).transpose()?.unwrap_or_default();
        let client = self.inner.clone();
        future_into_py(py, async move {
            let list = client.list(&as_refs(&labels)).await.map_err(to_py)?;
            list.iter().map(Json::sandbox).collect::<PyResult<Vec<_>>>()
        })
    }

    /// Pauses every sandbox matching `labels`; returns their ids.
    fn pause<'py>(
        &self,
        py: Python<'py>,
        labels: Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let labels = selector(&labels)?;
        let client = self.inner.clone();
        future_into_py(
            py,
            async move { client.pause_matching(&as_refs(&labels)).await.map_err(to_py) },
        )
    }

    /// Resumes every sandbox matching `labels`; returns their ids.
    fn resume<'py>(
        &self,
        py: Python<'py>,
        labels: Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let labels = selector(&labels)?;
        let client = self.inner.clone();
        future_into_py(
            py,
            async move { client.resume_matching(&as_refs(&labels)).await.map_err(to_py) },
        )
    }

    /// Destroys every sandbox matching `labels` (at least one label); returns their ids.
    fn destroy<'py>(
        &self,
        py: Python<'py>,
        labels: Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let labels = selector(&labels)?;
        if labels.is_empty() {
            return Err(PyValueError::new_err("destroy needs at least one label"));
        }
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.destroy_matching(&as_refs(&labels)).await.map_err(to_py)
        })
    }

    /// Registers a tool component (bytes of a `.wasm` component) as `name`.
    fn add_tool<'py>(
        &self,
        py: Python<'py>,
        name: String,
        component: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("ToolInfo", &client.add_tool(&name, component).await.map_err(to_py)?)
        })
    }

    fn tools<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("ToolInfo", &client.tools().await.map_err(to_py)?)
        })
    }

    fn remove_tool<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.remove_tool(&name).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Layers in the image store.
    fn images<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("LayerInfo", &client.images().await.map_err(to_py)?)
        })
    }

    /// Imports a layer from a local directory or tarball as `name` (next version).
    fn import_image<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: PathBuf,
    ) -> PyResult<Bound<'py, PyAny>> {
        let source = if path.is_dir() {
            brig_sdk::ImageSource::Dir(path)
        } else {
            brig_sdk::ImageSource::Tar(path)
        };
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record(
                "LayerInfo",
                &client.import_image(&name, None, source).await.map_err(to_py)?,
            )
        })
    }

    /// Pulls `reference` (`python:3.12-slim`, `localhost:5000/x:tag`) from its registry: one
    /// layer per image layer, the image the environment `name` (default `pulled/<reference>`).
    /// `on_progress`, if given, is called on the event loop with the pull's state (a dict:
    /// `reference`, `layers` of `digest`, `size`, `downloaded`, `state`) as it goes.
    #[pyo3(signature = (reference, name=None, on_progress=None))]
    fn pull_image<'py>(
        &self,
        py: Python<'py>,
        reference: String,
        name: Option<String>,
        on_progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let on_progress = on_progress.map(|f| LoopCallback::new(py, f)).transpose()?;
        future_into_py(py, async move {
            let pulled = match on_progress {
                None => client.pull_image(&reference, name.as_deref()).await,
                Some(callback) => {
                    let report = |p: &brig_sdk::PullProgress| {
                        if let Ok(value) = Json::record("PullProgress", p) {
                            callback.call(value);
                        }
                    };
                    client.pull_image_with_progress(&reference, name.as_deref(), report).await
                }
            };
            Json::record("PulledImage", &pulled.map_err(to_py)?)
        })
    }

    /// A layer's record and the paths it holds.
    fn inspect_image<'py>(
        &self,
        py: Python<'py>,
        reference: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            let (layer, paths) = client.inspect_image(&reference).await.map_err(to_py)?;
            Json::record("LayerDetails", &serde_json::json!({ "layer": layer, "paths": paths }))
        })
    }

    /// Gives layer `reference` another name (`name@version`, the next version by default).
    #[pyo3(signature = (reference, name, version=None))]
    fn tag_image<'py>(
        &self,
        py: Python<'py>,
        reference: String,
        name: String,
        version: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record(
                "LayerInfo",
                &client.tag_image(&reference, &name, version).await.map_err(to_py)?,
            )
        })
    }

    fn remove_image<'py>(&self, py: Python<'py>, reference: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.remove_image(&reference).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Checks every chunk of a layer against its digest (`DataLoss` if one fails).
    fn verify_image<'py>(&self, py: Python<'py>, reference: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("LayerInfo", &client.verify_image(&reference).await.map_err(to_py)?)
        })
    }

    /// Removes unreferenced layers and chunks: `{removed_layers, removed_chunks, freed_bytes}`.
    fn gc_images<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            let gc = client.gc_images().await.map_err(to_py)?;
            Json::record(
                "GcSummary",
                &serde_json::json!({
                    "removed_layers": gc.removed_layers,
                    "removed_chunks": gc.removed_chunks,
                    "freed_bytes": gc.freed_bytes,
                }),
            )
        })
    }

    /// How one-shot calls travelled (cluster): `{"direct": n, "via_control": n}`.
    fn call_hops(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let hops = self.inner.call_hops();
        [("direct", hops.direct), ("via_control", hops.via_control)].into_iter().collect()
    }

    /// Builds environment `name` from a Dockerfile's text, COPY reading from the directory
    /// `context`; each layer step is kept in the node's step cache, so an unchanged rebuild
    /// runs nothing. `on_event`, if given, is called on the event loop with each step's
    /// start, output and end (a dict: `step`, `steps`, `type` of `started`/`log`/`finished`,
    /// and `text`, `cached`, `stream` or `millis`). A failing step raises with its output.
    #[pyo3(signature = (name, dockerfile, context=None, build_args=None, no_cache=false, on_event=None))]
    #[allow(clippy::too_many_arguments)]
    fn build_image<'py>(
        &self,
        py: Python<'py>,
        name: String,
        dockerfile: String,
        context: Option<std::path::PathBuf>,
        build_args: Option<std::collections::BTreeMap<String, String>>,
        no_cache: bool,
        on_event: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        let on_event = on_event.map(|f| LoopCallback::new(py, f)).transpose()?;
        let mut options = brig_sdk::BuildOptions::dockerfile(&name, &dockerfile);
        if let Some(dir) = context {
            options = options.context(dir);
        }
        for (k, v) in build_args.iter().flatten() {
            options = options.build_arg(k, v);
        }
        if no_cache {
            options = options.no_cache();
        }
        future_into_py(py, async move {
            let report = |e: &brig_sdk::BuildEvent| {
                if let Some(callback) = &on_event {
                    callback.call(crate::convert::build_event(e));
                }
            };
            Json::record("BuiltImage", &client.build_image(options, report).await.map_err(to_py)?)
        })
    }

    /// Names an environment: layers, bottom first.
    fn create_env<'py>(
        &self,
        py: Python<'py>,
        name: String,
        layers: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            let refs: Vec<&str> = layers.iter().map(String::as_str).collect();
            client.create_env(&name, &refs).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    fn envs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move { Json::of(&client.envs().await.map_err(to_py)?) })
    }

    /// Makes a volume (a named directory tree sandboxes mount with `volumes={path: name}`).
    #[pyo3(signature = (name, *, quota_mib=None))]
    fn create_volume<'py>(
        &self,
        py: Python<'py>,
        name: String,
        quota_mib: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record(
                "VolumeInfo",
                &client.create_volume(&name, quota_mib).await.map_err(to_py)?,
            )
        })
    }

    /// The volumes this token sees.
    fn volumes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("VolumeInfo", &client.volumes().await.map_err(to_py)?)
        })
    }

    /// Deletes a volume (refused while a sandbox mounts it).
    fn delete_volume<'py>(&self, py: Python<'py>, volume: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move { client.delete_volume(&volume).await.map_err(to_py) })
    }

    /// Writes `data` (bytes or str) to `path` in a volume; returns its entry.
    fn volume_write<'py>(
        &self,
        py: Python<'py>,
        volume: String,
        path: String,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bytes: Vec<u8> = match data.cast::<pyo3::types::PyString>() {
            Ok(s) => s.to_str()?.as_bytes().to_vec(),
            Err(_) => data.extract()?,
        };
        let vol = self.inner.volume(&volume);
        future_into_py(py, async move {
            Json::record("VolumeEntry", &vol.write_file(&path, &bytes).await.map_err(to_py)?)
        })
    }

    /// A volume's file, as bytes.
    fn volume_read<'py>(
        &self,
        py: Python<'py>,
        volume: String,
        path: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let vol = self.inner.volume(&volume);
        future_into_py(py, async move { vol.read_file(&path).await.map_err(to_py) })
    }

    /// A volume's directory, `depth` levels down.
    #[pyo3(signature = (volume, path="/".to_string(), *, depth=1))]
    fn volume_list<'py>(
        &self,
        py: Python<'py>,
        volume: String,
        path: String,
        depth: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let vol = self.inner.volume(&volume);
        future_into_py(py, async move {
            Json::record("VolumeEntry", &vol.list(&path, depth).await.map_err(to_py)?)
        })
    }

    /// The node's status (tiers, capacity, use).
    fn node_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("NodeStatus", &client.node_status().await.map_err(to_py)?)
        })
    }

    /// The cluster's nodes (a control-plane replica).
    fn cluster_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("NodeSummary", &client.cluster_status().await.map_err(to_py)?)
        })
    }

    /// Creates or changes a project (admin): live sandboxes and creates per second at most.
    #[pyo3(signature = (name, *, max_live=None, max_creates_per_sec=None))]
    fn set_project<'py>(
        &self,
        py: Python<'py>,
        name: String,
        max_live: Option<u64>,
        max_creates_per_sec: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            client
                .set_project(&name, ProjectLimits { max_live, max_creates_per_sec })
                .await
                .map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    fn projects<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            Json::record("ProjectInfo", &client.projects().await.map_err(to_py)?)
        })
    }

    /// A new access token for `project` (admin).
    fn create_token<'py>(&self, py: Python<'py>, project: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move { client.create_token(&project).await.map_err(to_py) })
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        future_into_py(py, async move {
            client.close().await;
            Ok(None::<()>)
        })
    }
}

/// Audit events as an async iterator of dicts (pumped by a task, like `ExecStream`).
#[pyclass(module = "brig", name = "AuditStream", frozen)]
pub struct PyAuditStream {
    events: std::sync::Arc<tokio::sync::Mutex<mpsc::Receiver<Result<Json, brig_sdk::Error>>>>,
}

impl PyAuditStream {
    pub(crate) fn start(mut stream: AuditStream) -> PyAuditStream {
        let (tx, rx) = mpsc::channel(256);
        // Called inside a task on the bridge's runtime (a method's future).
        tokio::spawn(async move {
            loop {
                let batch = match stream.next_batch().await {
                    Ok(Some(batch)) => batch,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        break;
                    }
                };
                for event in batch {
                    let Ok(value) = Json::record("AuditEvent", &event) else { continue };
                    if tx.send(Ok(value)).await.is_err() {
                        return;
                    }
                }
            }
        });
        PyAuditStream { events: std::sync::Arc::new(tokio::sync::Mutex::new(rx)) }
    }
}

#[pymethods]
impl PyAuditStream {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let events = self.events.clone();
        future_into_py(py, async move {
            match events.lock().await.recv().await {
                Some(Ok(event)) => Ok(event),
                Some(Err(e)) => Err(to_py(e)),
                None => Err(PyStopAsyncIteration::new_err(())),
            }
        })
    }
}
