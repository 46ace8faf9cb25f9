//! `AsyncSandbox`: commands, files, lifecycle and security of one sandbox. Every method that
//! talks to brigd returns an awaitable.

use crate::bridge::future_into_py;
use brig_sdk::{CallLimits, CallRequest, Cmd, Sandbox};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::convert::{duration, selector, Json};
use crate::errors::to_py;
use crate::exec::{PyCallResult, PyExecResult, PyExecStream, PySession};

#[pyclass(module = "brig", name = "AsyncSandbox", frozen)]
pub struct PySandbox {
    pub(crate) inner: Sandbox,
}

/// `exec`'s command: a string runs through `sh -c`, a list is the argv (an empty list runs
/// the image's own command, `Entrypoint` + `Cmd`).
fn command(cmd: &Bound<'_, PyAny>) -> PyResult<Cmd> {
    if let Ok(script) = cmd.cast::<PyString>() {
        return Ok(Cmd::shell(script.to_str()?));
    }
    let argv: Vec<String> = cmd.extract()?;
    Ok(Cmd::new(argv))
}

/// A `Cmd` from `exec`'s command and keywords: stdin (bytes; `True` on `exec_stream` keeps it
/// open), env, cwd, user, timeout (seconds or timedelta), output_limit, terminal (`(rows,
/// cols)`: a pty; its output arrives as stdout).
fn build(cmd: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Cmd> {
    let mut c = command(cmd)?;
    let Some(options) = options else { return Ok(c) };
    for (key, value) in options.iter() {
        if value.is_none() {
            continue;
        }
        let key: String = key.extract()?;
        c = match key.as_str() {
            "env" => {
                for (k, v) in value.extract::<std::collections::BTreeMap<String, String>>()? {
                    c = c.env(&k, &v);
                }
                c
            }
            "cwd" => c.cwd(&value.extract::<String>()?),
            "user" => c.user(&value.extract::<String>()?),
            "timeout" => c.timeout(duration(&value)?),
            "output_limit" => c.output_limit(value.extract()?),
            "terminal" => {
                let (rows, cols): (u16, u16) = value.extract()?;
                c.terminal(rows, cols)
            }
            "stdin" if value.is_instance_of::<pyo3::types::PyBool>() => {
                if value.extract::<bool>()? {
                    c.stdin_stream()
                } else {
                    c
                }
            }
            "stdin" => c.stdin(value.extract::<Vec<u8>>()?),
            other => {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "exec() got an unexpected keyword {other:?}"
                )))
            }
        };
    }
    Ok(c)
}

#[pymethods]
impl PySandbox {
    #[getter]
    fn id(&self) -> String {
        self.inner.id().to_string()
    }

    fn __repr__(&self) -> String {
        format!("AsyncSandbox({:?})", self.inner.id())
    }

    /// Runs a command to its end: `cmd` is a shell string (`sh -c`) or an argv list; `stdin`
    /// bytes are fed to it. Returns an `ExecResult`; a non-zero exit is not an exception.
    #[pyo3(signature = (cmd, **options))]
    fn exec<'py>(
        &self,
        py: Python<'py>,
        cmd: &Bound<'py, PyAny>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = build(cmd, options)?;
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.exec_with(c).await.map(|out| PyExecResult { out }).map_err(to_py)
        })
    }

    /// Starts a command and streams it: `stdin=True` keeps its stdin open for
    /// `ExecStream.write_stdin`. Returns an `ExecStream`.
    #[pyo3(signature = (cmd, **options))]
    fn exec_stream<'py>(
        &self,
        py: Python<'py>,
        cmd: &Bound<'py, PyAny>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = build(cmd, options)?;
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.exec_stream(c).await.map(PyExecStream::start).map_err(to_py)
        })
    }

    /// Streams a command started earlier again: its kept output from the start, then the rest.
    fn attach<'py>(&self, py: Python<'py>, exec_id: u64) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.attach(exec_id).await.map(PyExecStream::start).map_err(to_py)
        })
    }

    /// Kills a command and everything it started.
    fn kill<'py>(&self, py: Python<'py>, exec_id: u64) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.kill(exec_id).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Writes bytes to the stdin of a running command started with `stdin=True` (or on a
    /// terminal), by exec id: from any client, and after the node restarted.
    fn write_stdin<'py>(
        &self,
        py: Python<'py>,
        exec_id: u64,
        data: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.write_stdin(exec_id, data).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Ends a running command's stdin by exec id (it reads end of file).
    fn close_stdin<'py>(&self, py: Python<'py>, exec_id: u64) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.close_stdin(exec_id).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Commands the sandbox ran or runs: dicts with `exec_id`, `argv`, `result`.
    fn execs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(
            py,
            async move { Json::record("ExecInfo", &sb.execs().await.map_err(to_py)?) },
        )
    }

    /// A new persistent shell (`Session`).
    fn open_session<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.open_session().await.map(|inner| PySession { inner }).map_err(to_py)
        })
    }

    /// An existing session by id (no request).
    fn session(&self, id: &str) -> PySession {
        PySession { inner: self.inner.session(id) }
    }

    /// Calls a tool with this sandbox's workspace (fncall tier).
    #[pyo3(signature = (tool, input=String::new()))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        tool: String,
        input: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.call_with(CallRequest::new(tool, input))
                .await
                .map(|inner| PyCallResult { inner })
                .map_err(to_py)
        })
    }

    fn read_file<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move { sb.read_file(&path).await.map_err(to_py) })
    }

    /// Writes `data` (bytes or str) to `path`; returns the bytes written.
    fn write_file<'py>(
        &self,
        py: Python<'py>,
        path: String,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bytes: Vec<u8> = match data.cast::<PyString>() {
            Ok(s) => s.to_str()?.as_bytes().to_vec(),
            Err(_) => data.extract()?,
        };
        let sb = self.inner.clone();
        future_into_py(py, async move { sb.write_file(&path, &bytes).await.map_err(to_py) })
    }

    /// Streams a local file into the sandbox.
    fn upload_file<'py>(
        &self,
        py: Python<'py>,
        remote: String,
        local: std::path::PathBuf,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move { sb.upload_file(&remote, &local).await.map_err(to_py) })
    }

    /// Streams a sandbox file to a local one.
    fn download_file<'py>(
        &self,
        py: Python<'py>,
        remote: String,
        local: std::path::PathBuf,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move { sb.download_file(&remote, &local).await.map_err(to_py) })
    }

    fn list_dir<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            Json::record("FileEntry", &sb.list_dir(&path).await.map_err(to_py)?)
        })
    }

    fn stat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            Json::record("FileEntry", &sb.stat(&path).await.map_err(to_py)?)
        })
    }

    #[pyo3(signature = (path, parents=true))]
    fn mkdir<'py>(
        &self,
        py: Python<'py>,
        path: String,
        parents: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.mkdir(&path, parents).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    #[pyo3(signature = (path, recursive=false))]
    fn remove<'py>(
        &self,
        py: Python<'py>,
        path: String,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.remove(&path, recursive).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// The sandbox's record (state, labels, usage, egress, …) as a dict.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move { Json::sandbox(&sb.status().await.map_err(to_py)?) })
    }

    fn destroy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.destroy().await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Pauses it; any later request resumes it.
    fn pause<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.pause().await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Pauses keeping the files only: every process ends and the memory is given back; the
    /// resume starts it with nothing running.
    fn pause_files_only<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.pause_files_only().await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    fn resume<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.resume().await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// `count` children from this sandbox's files now (extra `labels` on them).
    #[pyo3(signature = (count, labels=None))]
    fn fork<'py>(
        &self,
        py: Python<'py>,
        count: u32,
        labels: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let labels = labels.as_ref().map(selector).transpose()?.unwrap_or_default();
        let sb = self.inner.clone();
        future_into_py(py, async move {
            let kids =
                sb.fork_labeled(count, &crate::convert::as_refs(&labels)).await.map_err(to_py)?;
            Ok(kids.into_iter().map(|inner| PySandbox { inner }).collect::<Vec<_>>())
        })
    }

    /// One child for grading: the files now, no processes, hidden paths shown read-only.
    fn fork_for_evaluation<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.fork_for_evaluation().await.map(|inner| PySandbox { inner }).map_err(to_py)
        })
    }

    /// Replaces the egress rules (service names or `addr[/prefix][:port]`).
    fn set_egress<'py>(&self, py: Python<'py>, rules: Vec<String>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(
            py,
            async move { Json::sandbox(&sb.set_egress(rules).await.map_err(to_py)?) },
        )
    }

    /// New lifetimes (seconds or timedelta); unnamed ones stay as they are.
    #[pyo3(signature = (*, idle_ttl=None, pause_when_idle=None, paused_ttl=None, max_lifetime=None))]
    fn set_lifetimes<'py>(
        &self,
        py: Python<'py>,
        idle_ttl: Option<&Bound<'py, PyAny>>,
        pause_when_idle: Option<bool>,
        paused_ttl: Option<&Bound<'py, PyAny>>,
        max_lifetime: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut l = brig_sdk::Lifetimes::new();
        if let Some(t) = idle_ttl {
            l = l.idle_ttl(duration(t)?);
        }
        if let Some(p) = pause_when_idle {
            l = l.idle_action(if p {
                brig_sdk::IdleAction::Pause
            } else {
                brig_sdk::IdleAction::Destroy
            });
        }
        if let Some(t) = paused_ttl {
            l = l.paused_ttl(Some(duration(t)?));
        }
        if let Some(t) = max_lifetime {
            l = l.max_lifetime(Some(duration(t)?));
        }
        let sb = self.inner.clone();
        future_into_py(py, async move { Json::sandbox(&sb.set_lifetimes(l).await.map_err(to_py)?) })
    }

    /// Moves it to another CPU QoS class now (`latency_sensitive`, `best_effort`).
    fn set_qos<'py>(&self, py: Python<'py>, qos: &str) -> PyResult<Bound<'py, PyAny>> {
        let class = crate::convert::qos(qos)?;
        let sb = self.inner.clone();
        future_into_py(py, async move { Json::sandbox(&sb.set_qos(class).await.map_err(to_py)?) })
    }

    /// Turns this container's writable layer into layer `name` (next version unless given),
    /// without the `scrub` paths; new sandboxes can start from it.
    #[pyo3(signature = (name, version=None, scrub=None))]
    fn checkpoint<'py>(
        &self,
        py: Python<'py>,
        name: String,
        version: Option<u32>,
        scrub: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            let scrub = scrub.unwrap_or_default();
            let refs: Vec<&str> = scrub.iter().map(String::as_str).collect();
            Json::record("LayerInfo", &sb.checkpoint(&name, version, &refs).await.map_err(to_py)?)
        })
    }

    /// Changes the terminal size of a command started with `terminal=(rows, cols)`.
    fn resize_terminal<'py>(
        &self,
        py: Python<'py>,
        exec_id: u64,
        rows: u16,
        cols: u16,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.resize_terminal(exec_id, rows, cols).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Its audit trail after event `after_seq`: a list of dicts.
    #[pyo3(signature = (after_seq=0))]
    fn audit<'py>(&self, py: Python<'py>, after_seq: u64) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            Json::record("AuditEvent", &sb.audit(after_seq).await.map_err(to_py)?)
        })
    }

    /// The audit trail as an async iterator of event dicts; with `follow`, new events as they
    /// happen until the sandbox ends.
    #[pyo3(signature = (after_seq=0, follow=true))]
    fn audit_stream<'py>(
        &self,
        py: Python<'py>,
        after_seq: u64,
        follow: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        future_into_py(py, async move {
            let stream = sb.audit_stream(after_seq, follow).await.map_err(to_py)?;
            Ok(crate::client::PyAuditStream::start(stream))
        })
    }

    /// Calls with limits (`timeout` seconds, `memory_mib`, `fuel`, `output_bytes`), and
    /// `args`, `env`, `stdin` for `wasi:cli/run` commands.
    #[pyo3(signature = (tool, input=String::new(), **options))]
    fn call_with<'py>(
        &self,
        py: Python<'py>,
        tool: String,
        input: String,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let call = call_request(tool, input, options)?;
        let sb = self.inner.clone();
        future_into_py(py, async move {
            sb.call_with(call).await.map(|inner| PyCallResult { inner }).map_err(to_py)
        })
    }
}

/// A `CallRequest` from `call_with`'s keywords.
pub(crate) fn call_request(
    tool: String,
    input: String,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<CallRequest> {
    let mut call = CallRequest::new(tool, input);
    let Some(options) = options else { return Ok(call) };
    let mut limits = CallLimits::default();
    for (key, value) in options.iter() {
        if value.is_none() {
            continue;
        }
        let key: String = key.extract()?;
        match key.as_str() {
            "args" => call.args = value.extract()?,
            "env" => {
                call.env = value
                    .extract::<std::collections::BTreeMap<String, String>>()?
                    .into_iter()
                    .collect()
            }
            "stdin" => call.stdin = value.extract()?,
            "timeout" => {
                limits.timeout_ms =
                    Some(u32::try_from(duration(&value)?.as_millis()).unwrap_or(u32::MAX))
            }
            "memory_mib" => limits.memory_mib = Some(value.extract()?),
            "fuel" => limits.fuel = Some(value.extract()?),
            "output_bytes" => limits.output_bytes = Some(value.extract()?),
            other => {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "call_with() got an unexpected keyword {other:?}"
                )))
            }
        }
    }
    call.limits = limits;
    Ok(call)
}

/// Builds a list of sandboxes for Python.
pub(crate) fn sandboxes(list: Vec<Sandbox>) -> Vec<PySandbox> {
    list.into_iter().map(|inner| PySandbox { inner }).collect()
}
