//! The container tier as the node sees it: turning create requests into containers, and
//! serving exec and session requests with streamed output.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use brig_container::cgroup::CgroupLimits;
use brig_container::exec::{ExecEvent, Killer, Stdin};
use brig_container::rootfs::LayerSource;
use brig_container::runtime::{Container, ContainerSpec, Runtime, RuntimeConfig};
use brig_container::session::{Session, SessionEvent};
use brig_container::shim_proto::ExitInfo;
use brig_core::SandboxId;
use brig_images::{LayerStore, ResolvedLayer};
use brig_proto::{
    CreateRequest, ExecRequest, ExecResult, OutputStream, Reply, SessionOpenRequest, StdinMode,
};
use brig_transport::Exchange;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::config::ContainerConfig;
use crate::NodeError;

/// The container tier of a node.
pub(crate) struct ContainerTier {
    runtime: Runtime,
    config: ContainerConfig,
    images_dir: PathBuf,
}

impl ContainerTier {
    /// Opens the tier, or says why it cannot be offered here.
    /// `run_dir` holds mounts (not under the private state directory: container root must
    /// traverse it to reach its rootfs before it pivots); `cgroup_parent` is unique per daemon.
    pub fn open(
        config: &ContainerConfig,
        state_dir: &Path,
        run_dir: &Path,
        cgroup_parent: &str,
    ) -> Result<ContainerTier, String> {
        if !config.enabled {
            return Err("disabled in the node configuration".into());
        }
        if !nix::unistd::geteuid().is_root() {
            return Err("brigd is not running as root".into());
        }
        let images_dir = config.images_dir.clone().unwrap_or_else(|| state_dir.join("images"));
        let runtime = Runtime::new(RuntimeConfig {
            run_dir: run_dir.to_owned(),
            shim_path: config
                .shim_path
                .clone()
                .unwrap_or_else(brig_container::runtime::default_shim_path),
            id_base: config.id_base,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: cgroup_parent.to_string(),
        })
        .map_err(|e| crate::error::chain(&e))?;
        Ok(ContainerTier { runtime, config: config.clone(), images_dir })
    }

    pub fn shutdown(&self) {
        self.runtime.shutdown();
    }

    /// The layers of `image`, bottom first: `env:NAME`, or parts joined by `+`, each a store
    /// reference (`kind/name[@version]`, `sha256:…`) or a plain image file name. Store layers
    /// are marked in use; their digests come back for [`LayerStore::release`].
    async fn resolve_image(
        &self,
        image: &str,
        store: Option<&LayerStore>,
    ) -> Result<(Vec<LayerSource>, Vec<String>), NodeError> {
        let bad = |why: &str| NodeError::BadImage(image.to_string(), why.to_string());
        let parts: Vec<String> = match (image.starts_with("env:"), store) {
            (true, Some(store)) => store.expand(image)?,
            (true, None) => return Err(bad("no layer store on this node")),
            (false, _) => image.split('+').map(str::to_string).collect(),
        };
        if parts.len() > 32 {
            return Err(bad("more than 32 layers"));
        }
        let store_refs: Vec<String> =
            parts.iter().filter(|p| LayerStore::is_store_reference(p)).cloned().collect();
        let resolved = match (store_refs.is_empty(), store) {
            (true, _) => Vec::new(),
            (false, Some(store)) => store.acquire(&store_refs).await?,
            (false, None) => return Err(bad("no layer store on this node")),
        };
        let digests: Vec<String> = resolved.iter().map(|r| r.digest.clone()).collect();
        match self.plain_layers(&parts, resolved) {
            Ok(layers) => Ok((layers, digests)),
            Err(e) => {
                if let Some(store) = store {
                    store.release(&digests);
                }
                Err(e)
            }
        }
    }

    /// Puts plain image files and resolved store layers together, in order.
    fn plain_layers(
        &self,
        parts: &[String],
        resolved: Vec<ResolvedLayer>,
    ) -> Result<Vec<LayerSource>, NodeError> {
        let mut resolved = resolved.into_iter();
        let mut layers = Vec::new();
        for name in parts {
            if LayerStore::is_store_reference(name) {
                let r = resolved
                    .next()
                    .ok_or_else(|| NodeError::BadImage(name.clone(), "not resolved".into()))?;
                layers.push(LayerSource { image: r.meta, device: Some(r.blob) });
                continue;
            }
            let bad = |why: &str| NodeError::BadImage(name.clone(), why.to_string());
            let ok = !name.is_empty()
                && name.len() <= 128
                && !name.starts_with('.')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b));
            if !ok {
                return Err(bad("layer names are 1-128 of [A-Za-z0-9._@-], joined by +"));
            }
            let path = self.images_dir.join(format!("{name}.erofs"));
            if !path.is_file() {
                return Err(bad(&format!(
                    "no layer {name:?} in {} or the layer store",
                    self.images_dir.display()
                )));
            }
            layers.push(LayerSource::image(path));
        }
        Ok(layers)
    }

    pub async fn create(
        &self,
        id: &SandboxId,
        req: &CreateRequest,
        store: Option<&LayerStore>,
    ) -> Result<ContainerSandbox, NodeError> {
        let image = req.image.as_deref().ok_or_else(|| {
            NodeError::BadImage(String::new(), "a container needs an image".into())
        })?;
        let (layers, digests) = self.resolve_image(image, store).await?;
        let c = &self.config;
        let pick =
            |asked: Option<u64>, default: u64, max: u64| asked.unwrap_or(default).clamp(1, max);
        let l = req.limits;
        let spec = ContainerSpec {
            name: id.to_string(),
            hostname: format!("sandbox-{}", &id.to_string()[12..]),
            layers,
            limits: CgroupLimits {
                memory_bytes: Some(
                    pick(l.memory_mib, c.default_memory_mib, c.max_memory_mib) << 20,
                ),
                pids: Some(pick(l.pids, c.default_pids, c.max_pids)),
                cpu_millis: Some(pick(l.cpu_millis, c.default_cpu_millis, c.max_cpu_millis)),
            },
            disk_bytes: pick(l.disk_mib, c.default_disk_mib, c.max_disk_mib) << 20,
        };
        let container = match self.runtime.create(&spec).await {
            Ok(c) => c,
            Err(e) => {
                if let Some(store) = store {
                    store.release(&digests);
                }
                return Err(e.into());
            }
        };
        let shell = if brig_container::files::RootDir::new(container.root(), container.id_base())
            .stat("/bin/bash")
            .is_ok()
        {
            "/bin/bash"
        } else {
            "/bin/sh"
        };
        Ok(ContainerSandbox {
            container: Arc::new(container),
            env: req.env.clone(),
            shell: shell.to_string(),
            execs: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            layer_digests: digests,
        })
    }

    fn timeout(&self, asked: Option<u64>) -> Duration {
        Duration::from_millis(
            asked
                .unwrap_or(self.config.default_exec_timeout_ms)
                .min(self.config.max_exec_timeout_ms),
        )
    }

    fn output_limit(&self, asked: Option<u64>) -> u64 {
        asked
            .unwrap_or(self.config.default_output_limit_bytes)
            .min(self.config.max_output_limit_bytes)
    }
}

/// One container sandbox.
pub(crate) struct ContainerSandbox {
    pub container: Arc<Container>,
    env: Vec<(String, String)>,
    shell: String,
    execs: Mutex<HashMap<u64, Killer>>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    next_session: AtomicU64,
    /// Store layers this container uses (released when it is destroyed).
    pub layer_digests: Vec<String>,
}

fn merged_env(base: &[(String, String)], extra: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        base.iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)).cloned().collect();
    env.extend(extra);
    env
}

fn result_of(exit: brig_container::exec::ExecExit) -> ExecResult {
    let (exit_code, signal) = match exit.status {
        Some(ExitInfo::Code(c)) => (Some(c), None),
        Some(ExitInfo::Signal(s)) => (None, Some(s)),
        None => (None, None),
    };
    ExecResult {
        exit_code,
        signal,
        timed_out: exit.timed_out,
        killed: exit.killed,
        truncated: exit.truncated,
        oom_killed: exit.oom_killed,
        duration_us: u64::try_from(exit.duration.as_micros()).unwrap_or(u64::MAX),
        stdout_bytes: exit.stdout_bytes,
        stderr_bytes: exit.stderr_bytes,
    }
}

impl ContainerSandbox {
    pub fn is_alive(&self) -> bool {
        self.container.is_alive()
    }

    /// Runs a command, streaming `ExecStarted`, `Output`… and `Exited` to the client.
    pub async fn exec(
        &self,
        tier: &ContainerTier,
        req: ExecRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let stream_stdin = req.stdin == StdinMode::Stream;
        let request = brig_container::exec::ExecRequest {
            argv: req.argv,
            env: merged_env(&self.env, req.env),
            cwd: req.cwd,
            user: req.user,
            stdin: match req.stdin {
                StdinMode::Empty => Stdin::Null,
                StdinMode::Bytes(b) => Stdin::Bytes(b),
                StdinMode::Stream => Stdin::Stream,
            },
            timeout: Some(tier.timeout(req.timeout_ms)),
            output_limit: tier.output_limit(req.output_limit_bytes),
        };
        if request.argv.is_empty() {
            return Err(NodeError::BadImage(String::new(), "exec needs a command".into()));
        }
        let mut exec = brig_container::exec::exec(&self.container, request).await?;
        let exec_id = u64::try_from(exec.pid).unwrap_or(0);
        self.execs.lock().insert(exec_id, exec.killer());
        let feeder = match (stream_stdin, exec.stdin.take(), exchange.take_upload()) {
            (true, Some(mut stdin), Some(mut upload)) => Some(tokio::spawn(async move {
                while let Ok(Some(chunk)) = upload.read().await {
                    if stdin.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            })),
            _ => None,
        };
        let mut delivered = exchange.reply(&Reply::ExecStarted { exec_id }).await.is_ok();
        let mut result = None;
        while let Some(event) = exec.events.recv().await {
            let reply = match event {
                ExecEvent::Stdout(b) => {
                    Reply::Output { stream: OutputStream::Stdout, data: b.to_vec() }
                }
                ExecEvent::Stderr(b) => {
                    Reply::Output { stream: OutputStream::Stderr, data: b.to_vec() }
                }
                ExecEvent::Exit(exit) => {
                    result = Some(result_of(exit));
                    break;
                }
            };
            // A client that went away stops receiving; the command still runs to its end.
            if delivered {
                delivered = exchange.reply(&reply).await.is_ok();
            }
        }
        self.execs.lock().remove(&exec_id);
        if let Some(feeder) = feeder {
            feeder.abort();
        }
        Ok(result.map(Reply::Exited))
    }

    pub fn kill(&self, exec_id: u64) -> Result<(), NodeError> {
        let killer =
            self.execs.lock().get(&exec_id).cloned().ok_or(NodeError::NoSuchExec(exec_id))?;
        killer.kill();
        Ok(())
    }

    pub async fn open_session(&self, req: SessionOpenRequest) -> Result<String, NodeError> {
        let shell = req.shell.unwrap_or_else(|| self.shell.clone());
        let cwd = if req.cwd.is_empty() { "/".to_string() } else { req.cwd };
        let session =
            Session::open(&self.container, &shell, merged_env(&self.env, req.env), &cwd, req.user)
                .await?;
        let id = format!("s{}", self.next_session.fetch_add(1, Ordering::Relaxed));
        self.sessions.lock().insert(id.clone(), Arc::new(session));
        Ok(id)
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, NodeError> {
        self.sessions
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| NodeError::NoSuchSession(id.to_string()))
    }

    /// Runs (`Some(command)`) or waits on (`None`) a session command, streaming its output.
    pub async fn session_run(
        &self,
        session: &str,
        command: Option<&str>,
        timeout: Duration,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let session = self.session(session)?;
        let (tx, mut rx) = mpsc::channel(64);
        let run = async {
            match command {
                Some(c) => session.run(c, timeout, tx).await,
                None => session.wait(timeout, tx).await,
            }
        };
        let forward = async {
            let mut last = None;
            let mut delivered = true;
            while let Some(event) = rx.recv().await {
                let reply = match event {
                    SessionEvent::Stdout(b) => {
                        Reply::Output { stream: OutputStream::Stdout, data: b.to_vec() }
                    }
                    SessionEvent::Stderr(b) => {
                        Reply::Output { stream: OutputStream::Stderr, data: b.to_vec() }
                    }
                    SessionEvent::Dropped { bytes } => Reply::Output {
                        stream: OutputStream::Stderr,
                        data: format!(
                            "[brig: {bytes} bytes of output dropped while nobody waited]\n"
                        )
                        .into_bytes(),
                    },
                    SessionEvent::Done { exit_code, cwd } => {
                        last = Some(Reply::SessionDone { exit_code, cwd });
                        continue;
                    }
                    SessionEvent::Pending => {
                        last = Some(Reply::SessionPending);
                        continue;
                    }
                };
                if delivered {
                    delivered = exchange.reply(&reply).await.is_ok();
                }
            }
            last
        };
        let (ran, last) = tokio::join!(run, forward);
        ran?;
        Ok(Some(last.unwrap_or(Reply::SessionPending)))
    }

    pub async fn session_input(&self, session: &str, data: &[u8]) -> Result<(), NodeError> {
        Ok(self.session(session)?.input(data).await?)
    }

    pub async fn session_interrupt(&self, session: &str) -> Result<(), NodeError> {
        Ok(self.session(session)?.interrupt().await?)
    }

    pub async fn session_close(&self, session: &str) -> Result<(), NodeError> {
        let removed = self.sessions.lock().remove(session);
        let session = removed.ok_or_else(|| NodeError::NoSuchSession(session.to_string()))?;
        session.close().await;
        Ok(())
    }

    /// Kills everything in the container and removes it.
    pub async fn destroy(&self) -> Result<(), NodeError> {
        let sessions: Vec<_> = self.sessions.lock().drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.close().await;
        }
        Ok(self.container.destroy().await?)
    }
}

impl ContainerSandbox {
    /// Packs the writable layer into a new store layer, without `scrub` paths. The container is
    /// frozen while its changes are copied, so the layer is a consistent point in time.
    pub async fn checkpoint(
        &self,
        store: &LayerStore,
        id: &str,
        name: &str,
        version: Option<u32>,
        scrub: &[String],
    ) -> Result<brig_images::LayerInfo, NodeError> {
        let upper = self.container.upper_path().ok_or_else(|| {
            NodeError::BadImage(id.to_string(), "no writable layer to checkpoint".into())
        })?;
        for path in scrub {
            if path.split('/').any(|p| p == "..") {
                return Err(NodeError::BadImage(
                    path.clone(),
                    "scrub paths may not contain ..".into(),
                ));
            }
        }
        let staging = brig_images::build::Staging::new_in(&store.work_dir())?;
        let root = staging.path().join("root");
        let container = self.container.clone();
        let scrub = scrub.to_vec();
        let target = root.clone();
        tokio::task::spawn_blocking(move || -> Result<(), NodeError> {
            std::fs::create_dir(&target)
                .map_err(|source| NodeError::Io { what: "checkpoint staging".into(), source })?;
            container.set_frozen(true)?;
            let copied = brig_images::build::stage_dir(&upper, &target);
            let thawed = container.set_frozen(false);
            copied?;
            thawed?;
            for path in scrub {
                let victim = target.join(path.trim_start_matches('/'));
                let _ = if victim.is_dir() {
                    std::fs::remove_dir_all(&victim)
                } else {
                    std::fs::remove_file(&victim)
                };
            }
            Ok(())
        })
        .await
        .map_err(|e| NodeError::Io {
            what: "checkpoint task".into(),
            source: std::io::Error::other(e),
        })??;
        let source = brig_images::ImportSource::Shifted(staging, format!("checkpoint of {id}"));
        Ok(store.import(name, version, source).await?)
    }
}
