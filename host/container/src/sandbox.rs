//! A container on the node's kernel as a [`brig_core::Sandbox`]: exec (pipes or a terminal),
//! sessions, files through its root, freeze-and-reclaim pause, fork from a copy of its writable
//! layer, and the record a restarted node takes it back from. Image resolution and the layer
//! store are the node's: a sandbox gets its layers resolved and says which store digests it holds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use brig_core::files::Entry;
use brig_core::records::{RecordError, TierRecord};
use brig_core::sandbox::{
    BoxFuture, Capabilities, Condition, ExecControl, ExecEvent, ExecExit, ExecSpec, FileAccess,
    FileWatch, ForkChild, ForkKind, ForkOptions, Forked, KeptWork, Op, PauseKind, Persistence,
    ReadSource, RecoveredExec, Requested, RunningExec, Sandbox, SandboxError, SessionSpec, Stdin,
    StdinChunk, TerminalSize, UploadTarget, Usage, WriteOptions,
};
use brig_core::{QosClass, SandboxId, Tier};
use tokio::sync::mpsc;

use crate::exec::{Killer, Stdin as EngineStdin};
use crate::protect::{Bind, Protected, Protections};
use crate::record::ContainerRecord;
use crate::rootfs::LayerSource;
use crate::runtime::{Container, ContainerSpec, Runtime, RuntimeError};
use crate::session::Session;
use brig_hostkit::cgroup::CgroupLimits;
use brig_hostkit::terminal::TerminalMaster;

/// What a container on the node's kernel serves.
pub const CONTAINER_CAPS: Capabilities = Capabilities::new(
    &[
        Op::Exec,
        Op::ExecAsUser,
        Op::Terminal,
        Op::Sessions,
        Op::SessionAsUser,
        Op::Files,
        Op::FileAppend,
        Op::FileMetadata,
        Op::FileWatch,
        Op::Pause,
        Op::PauseFilesOnly,
        Op::Fork,
        Op::Egress,
        Op::Qos,
        Op::ProtectedPaths,
        Op::Checkpoint,
    ],
    FileAccess::Local,
    PauseKind::Freeze,
    ForkKind::Files,
    Persistence::Record,
);

pub use crate::process_defaults::{merged_env, ProcessDefaults};

/// Events buffered between the engine and the node per command.
const EVENTS: usize = 64;

/// One container sandbox.
pub struct ContainerSandbox {
    runtime: Arc<Runtime>,
    container: Arc<Container>,
    /// What every command starts with when its request names nothing else.
    defaults: ProcessDefaults,
    /// The default shell of sessions.
    shell: String,
    layers: Vec<LayerSource>,
    limits: CgroupLimits,
    disk_bytes: u64,
    /// Store layers it uses (the node releases them when it goes).
    layer_digests: Vec<String>,
    /// Protected paths (kept for forks).
    protected: Vec<Protected>,
    /// Volumes bound into it (kept for forks: a child mounts them too).
    binds: Vec<Bind>,
}

/// A container's hostname: derived from its sandbox id, so forks differ from their parent.
pub fn hostname(id: &SandboxId) -> String {
    format!("sandbox-{}", &id.to_string()[12..])
}

impl ContainerSandbox {
    /// Starts a container as `spec` says; `layer_digests` are the store layers it holds.
    pub async fn create(
        runtime: &Arc<Runtime>,
        spec: ContainerSpec,
        defaults: ProcessDefaults,
        layer_digests: Vec<String>,
    ) -> Result<ContainerSandbox, RuntimeError> {
        let container = runtime.create(&spec).await?;
        let has_bash = container.root_dir().is_ok_and(|r| r.dir().stat("/bin/bash").is_ok());
        Ok(ContainerSandbox {
            runtime: runtime.clone(),
            container: Arc::new(container),
            defaults,
            shell: if has_bash { "/bin/bash" } else { "/bin/sh" }.to_string(),
            layers: spec.layers,
            limits: spec.limits,
            disk_bytes: spec.disk_bytes,
            layer_digests,
            protected: spec.protect.paths,
            binds: spec.protect.binds,
        })
    }

    /// Takes back a container an earlier run of the node started.
    pub async fn attach(
        runtime: &Arc<Runtime>,
        id: &SandboxId,
        record: &ContainerRecord,
    ) -> Result<ContainerSandbox, RuntimeError> {
        let container = runtime.attach(&id.to_string()).await?;
        Ok(ContainerSandbox {
            runtime: runtime.clone(),
            container: Arc::new(container),
            defaults: ProcessDefaults {
                env: record.env.clone(),
                cwd: record.cwd.clone(),
                user: record.user.clone(),
                command: record.command.clone(),
            },
            shell: record.shell.clone(),
            layers: record
                .layers
                .iter()
                .map(|(image, device)| LayerSource { image: image.clone(), device: device.clone() })
                .collect(),
            limits: CgroupLimits {
                memory_bytes: Some(record.memory_bytes),
                pids: Some(record.pids),
                cpu_millis: Some(record.cpu_millis),
            },
            disk_bytes: record.disk_bytes,
            layer_digests: record.layer_digests.clone(),
            protected: record
                .protected
                .iter()
                .map(|(path, hidden)| Protected { path: path.clone(), hidden: *hidden })
                .collect(),
            binds: record
                .binds
                .iter()
                .map(|(source, target, read_only)| Bind {
                    source: source.clone(),
                    target: target.clone(),
                    read_only: *read_only,
                })
                .collect(),
        })
    }

    /// A child on the same layers, starting from a copy of the writable layer (the caller
    /// keeps this container frozen meanwhile).
    async fn fork_one(
        &self,
        id: SandboxId,
        reveal: bool,
    ) -> Result<ContainerSandbox, SandboxError> {
        let seed = self.writable_layer()?;
        let spec = ContainerSpec {
            name: id.to_string(),
            hostname: hostname(&id),
            layers: self.layers.clone(),
            limits: self.limits,
            disk_bytes: self.disk_bytes,
            seed: Some(seed),
            protect: Protections {
                paths: self.protected.clone(),
                reveal,
                binds: self.binds.clone(),
            },
        };
        Ok(ContainerSandbox::create(
            &self.runtime,
            spec,
            self.defaults.clone(),
            self.layer_digests.clone(),
        )
        .await?)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Container) -> Result<T, RuntimeError> + Send + 'static,
    ) -> Result<T, SandboxError> {
        let c = self.container.clone();
        tokio::task::spawn_blocking(move || f(&c))
            .await
            .map_err(|e| SandboxError::internal(what, &e))?
            .map_err(SandboxError::from)
    }
}

/// Kills or resizes a command in a container.
struct EngineControl {
    killer: Killer,
    terminal: Option<Arc<TerminalMaster>>,
}

impl ExecControl for EngineControl {
    fn kill(&self) {
        self.killer.kill();
    }

    fn resize(&self, size: TerminalSize) -> Option<std::io::Result<()>> {
        self.terminal.as_ref().map(|t| t.resize(size))
    }
}

/// Where a container's session records live, under its spool directory.
const SESSIONS_DIR: &str = "sessions";

/// Where a spooled command's output is read back from once it finished.
fn archive_of(path: PathBuf, exec_id: u64) -> Arc<dyn brig_core::exec::ExecArchive> {
    Arc::new(crate::spool::SpoolArchive { path, exec_id })
}

/// A started engine command as the node sees it.
fn running(exec: crate::exec::Exec, exec_id: u64) -> RunningExec {
    let pid = crate::runtime::pid_in_namespace(exec.pid);
    let control = Arc::new(EngineControl { killer: exec.killer(), terminal: exec.terminal });
    let (tx, rx) = mpsc::channel(EVENTS);
    tokio::spawn(relay(exec.events, tx));
    let archive = exec.spool.map(|path| archive_of(path, exec_id));
    RunningExec { events: rx, control, pid, archive }
}

impl ContainerSandbox {
    /// One spooled command: finished, resumed from the descriptors its shim kept, or ended
    /// as lost (its shim kept nothing: the end is unknown, and the spool says so from now).
    fn recover_one(
        &self,
        path: &std::path::Path,
        recovered: crate::spool::Recovered,
    ) -> RecoveredExec {
        let mut output: Vec<ExecEvent> = recovered.events.clone();
        let mut stdin = None;
        let (running_exec, exit) = match &recovered.exit {
            Some(exit) => (None, Some(exit.clone())),
            None => match crate::exec::resume(&self.container, path, &recovered) {
                Some(mut exec) => {
                    // Its stdin, still open, is written by id from here (`ExecOp::Input`).
                    stdin = (exec.terminal.is_some() || exec.stdin.is_some()).then(|| {
                        let (tx, rx) = mpsc::channel(STDIN_CHUNKS);
                        feed_stdin(rx, &mut exec);
                        tx
                    });
                    (Some(running(exec, recovered.header.exec_id)), None)
                }
                None => {
                    let note = "[brig: the node restarted and this command could not be followed further]\n";
                    output.push(ExecEvent::Stderr(note.into()));
                    let lost = ExecExit { truncated: recovered.gap, ..ExecExit::default() };
                    crate::spool::Spool::reopen(path, &recovered).exit(&lost);
                    (None, Some(lost))
                }
            },
        };
        RecoveredExec {
            exec_id: recovered.header.exec_id,
            argv: recovered.header.argv,
            output,
            gap: recovered.gap,
            running: running_exec,
            exit,
            stdin,
            archive: Some(archive_of(path.to_path_buf(), recovered.header.exec_id)),
        }
    }
}

/// Stdin chunks buffered for a kept command's writers.
const STDIN_CHUNKS: usize = 16;

/// Feeds `exec`'s stdin from `rx`: typed into its terminal (which has no end of input), or
/// written into its pipe, closed (end of file) when `rx` ends. Each chunk is reported written
/// once it is in the terminal or pipe.
fn feed_stdin(mut rx: mpsc::Receiver<StdinChunk>, exec: &mut crate::exec::Exec) {
    match (exec.terminal.clone(), exec.stdin.take()) {
        (Some(terminal), _) => {
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    if terminal.write_all(&chunk.data).await.is_err() {
                        break;
                    }
                    chunk.written();
                }
            });
        }
        (None, Some(mut pipe)) => {
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    if pipe.write_all(&chunk.data).await.is_err() {
                        break;
                    }
                    chunk.written();
                }
            });
        }
        (None, None) => {}
    }
}

/// Passes the engine's events on; `Exited` comes once, last, even if the engine's channel ends
/// without one (its task died).
async fn relay(mut engine: mpsc::Receiver<ExecEvent>, out: mpsc::Sender<ExecEvent>) {
    while let Some(event) = engine.recv().await {
        let last = matches!(event, ExecEvent::Exited(_) | ExecEvent::Detached(_));
        // A receiver that went away changes nothing: the command runs to its end.
        let _ = out.send(event).await;
        if last {
            return;
        }
    }
    let _ = out.send(ExecEvent::Exited(ExecExit::default())).await;
}

impl Sandbox for ContainerSandbox {
    fn tier(&self) -> Tier {
        Tier::Container
    }

    fn capabilities(&self) -> Capabilities {
        CONTAINER_CAPS
    }

    fn condition(&self) -> Condition {
        if self.container.is_alive() {
            Condition::Running
        } else {
            Condition::Failed
        }
    }

    fn lost(&self) -> Option<String> {
        self.container.death()
    }

    fn placement(&self) -> Option<String> {
        Some("host-kernel".into())
    }

    fn image_command(&self) -> Vec<String> {
        self.defaults.command.clone()
    }

    fn exec(&self, spec: ExecSpec) -> BoxFuture<'_, Result<RunningExec, SandboxError>> {
        Box::pin(async move {
            let exec_id = spec.exec_id;
            let (stdin, mut input) = match spec.stdin {
                Stdin::Empty => (EngineStdin::Null, None),
                Stdin::Bytes(b) => (EngineStdin::Bytes(b), None),
                Stdin::Stream(rx) => (EngineStdin::Stream, Some(rx)),
            };
            let request = crate::exec::ExecRequest {
                argv: spec.argv,
                env: merged_env(&self.defaults.env, spec.env),
                cwd: self.defaults.cwd(spec.cwd),
                user: self.defaults.user(spec.user),
                stdin,
                timeout: Some(spec.timeout),
                output_limit: spec.output_limit,
                terminal: spec.terminal,
                spool: Some(crate::spool::SpoolTarget {
                    dir: self.container.spool_dir(),
                    exec_id: spec.exec_id,
                }),
            };
            if self.container.spool_sweep_due() {
                let container = self.container.clone();
                tokio::task::spawn_blocking(move || {
                    crate::spool::sweep(&container.spool_dir(), container.finished_spools.spares())
                });
            }
            let mut exec = crate::exec::exec(&self.container, request).await?;
            if let Some(rx) = input.take() {
                feed_stdin(rx, &mut exec);
            }
            Ok(running(exec, exec_id))
        })
    }

    fn recover_kept(&self) -> BoxFuture<'_, KeptWork> {
        Box::pin(async move {
            let (container, dir) = (self.container.clone(), self.container.spool_dir());
            let sessions_dir = dir.join(SESSIONS_DIR);
            let (spools, records) = tokio::task::spawn_blocking(move || {
                crate::spool::sweep(&dir, container.finished_spools.spares());
                let records = crate::session::SessionJournal::read_all(&dir.join(SESSIONS_DIR));
                (crate::spool::read_all(&dir), records)
            })
            .await
            .unwrap_or_default();
            let mut kept = KeptWork::default();
            // Finished ones past the bound, oldest first, are removed instead of served.
            let finished = spools.iter().filter(|(_, r)| r.exit.is_some()).count();
            let mut surplus = finished.saturating_sub(crate::spool::FINISHED_KEPT);
            for (path, recovered) in spools {
                if recovered.exit.is_some() {
                    if surplus > 0 {
                        surplus -= 1;
                        let _ =
                            crate::spool::retire(&path, self.container.finished_spools.spares());
                        continue;
                    }
                    self.container.spool_finished(path.clone());
                }
                kept.execs.push(self.recover_one(&path, recovered));
            }
            for record in records {
                let id = record.session_id.clone();
                match Session::resume(&self.container, &sessions_dir, record) {
                    Some(session) => kept.sessions.push((id, Box::new(session) as _)),
                    None => {
                        tracing::warn!(container = self.container.name(), session = %id, "a session's shell was not kept");
                        crate::session::SessionJournal::forget(&sessions_dir, &id);
                    }
                }
            }
            let released = self.container.release_unclaimed().await;
            if released > 0 {
                tracing::warn!(
                    container = self.container.name(),
                    released,
                    "kept processes with no record were let go"
                );
            }
            kept
        })
    }

    fn open_session(
        &self,
        spec: SessionSpec,
    ) -> BoxFuture<'_, Result<Box<dyn brig_core::sandbox::Session>, SandboxError>> {
        Box::pin(async move {
            let cwd = match self.defaults.cwd(Some(spec.cwd.clone())) {
                cwd if cwd.is_empty() => spec.start_dir(),
                cwd => cwd,
            };
            let shell = spec.shell.unwrap_or_else(|| self.shell.clone());
            let env = merged_env(&self.defaults.env, spec.env);
            let user = self.defaults.user(spec.user);
            let keep = crate::session::SessionKeep {
                dir: self.container.spool_dir().join(SESSIONS_DIR),
                session_id: spec.id,
            };
            let session =
                Session::open(&self.container, &shell, env, &cwd, user, Some(keep)).await?;
            Ok(Box::new(session) as Box<dyn brig_core::sandbox::Session>)
        })
    }

    fn read<'a>(
        &'a self,
        path: &'a str,
        _max_bytes: u64,
    ) -> BoxFuture<'a, Result<ReadSource, SandboxError>> {
        Box::pin(async move { Ok(ReadSource::File(self.container.read_file(path).await?)) })
    }

    fn open_write<'a>(
        &'a self,
        path: &'a str,
        o: WriteOptions,
    ) -> BoxFuture<'a, Result<UploadTarget, SandboxError>> {
        Box::pin(
            async move { Ok(self.container.write_file(path, o.append, o.parents, o.mode).await?) },
        )
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        Box::pin(async move { Ok(self.container.stat_file(path).await?) })
    }

    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        Box::pin(async move { Ok(self.container.list_dir(path).await?) })
    }

    fn set_metadata<'a>(
        &'a self,
        path: &'a str,
        metadata: brig_core::files::FileMetadata,
    ) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        Box::pin(async move { Ok(self.container.set_file_metadata(path, &metadata).await?) })
    }

    fn watch<'a>(
        &'a self,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<Box<dyn FileWatch>, SandboxError>> {
        Box::pin(async move {
            let watch = self.container.watch_dir(path, recursive).await?;
            Ok(Box::new(watch) as Box<dyn FileWatch>)
        })
    }

    fn mkdir<'a>(
        &'a self,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.container.make_dir(path, parents).await?) })
    }

    fn remove<'a>(
        &'a self,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.container.remove_path(path, recursive).await?) })
    }

    /// Freezes every process and pushes reclaimable memory out; the bytes freed.
    fn pause(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        Box::pin(self.blocking("pause task", |c| {
            c.set_frozen(true)?;
            Ok(c.reclaim())
        }))
    }

    fn resume(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(self.blocking("resume task", |c| c.set_frozen(false)))
    }

    /// Ends every process (init and the shim stay, holding the namespaces) and pushes the
    /// container's memory out: what is left charged is the files' page cache the kernel could
    /// not drop. Nothing is frozen, so the resume has nothing to thaw.
    fn pause_files_only(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        Box::pin(self.blocking("files-only pause task", |c| {
            let before = c.usage().1;
            c.end_processes()?;
            // Dirty pages cannot be given back until they are on the disk.
            c.sync_files();
            c.reclaim();
            Ok(before.saturating_sub(c.usage().1))
        }))
    }

    fn freeze(&self, frozen: bool) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(self.blocking("freezer task", move |c| c.set_frozen(frozen)))
    }

    /// Children side by side, each from a copy of the writable layer; the parent is frozen
    /// meanwhile unless it is paused.
    fn fork(
        &self,
        children: Vec<ForkChild>,
        options: ForkOptions,
    ) -> BoxFuture<'_, Result<Forked, SandboxError>> {
        Box::pin(async move {
            if !options.parent_paused {
                self.freeze(true).await?;
            }
            let made = futures::future::join_all(
                children.iter().map(|child| self.fork_one(child.id, options.reveal_protected)),
            )
            .await;
            if !options.parent_paused {
                self.freeze(false).await?;
            }
            Ok(made.into_iter().map(|r| r.map(|c| Arc::new(c) as Arc<dyn Sandbox>)).collect())
        })
    }

    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.container.destroy().await?) })
    }

    fn usage(&self) -> BoxFuture<'_, Option<Usage>> {
        let (cpu_ns, memory_bytes) = self.container.usage();
        brig_core::sandbox::ready(Some(Usage { cpu_ns, memory_bytes }))
    }

    fn requested(&self) -> Option<Requested> {
        Some(Requested {
            memory_bytes: self.limits.memory_bytes.unwrap_or(0),
            cpu_millis: self.limits.cpu_millis.unwrap_or(0),
        })
    }

    fn working_set_bytes(&self) -> Option<u64> {
        Some(self.container.usage().1)
    }

    fn set_qos(&self, class: QosClass) -> Result<(), SandboxError> {
        self.container
            .cgroup()
            .set_best_effort(class == QosClass::BestEffort)
            .map_err(|e| SandboxError::from(RuntimeError::from(e)))
    }

    fn net_pid(&self) -> Option<i32> {
        Some(self.container.init_pid())
    }

    fn held_layers(&self) -> Vec<String> {
        self.layer_digests.clone()
    }

    fn writable_layer(&self) -> Result<PathBuf, SandboxError> {
        self.container
            .upper_path()
            .ok_or_else(|| SandboxError::BadRequest("the container has no writable layer".into()))
    }

    fn record(&self) -> Result<Option<TierRecord>, RecordError> {
        let record = ContainerRecord {
            layers: self.layers.iter().map(|l| (l.image.clone(), l.device.clone())).collect(),
            layer_digests: self.layer_digests.clone(),
            env: self.defaults.env.clone(),
            shell: self.shell.clone(),
            memory_bytes: self.limits.memory_bytes.unwrap_or(0),
            pids: self.limits.pids.unwrap_or(0),
            cpu_millis: self.limits.cpu_millis.unwrap_or(0),
            disk_bytes: self.disk_bytes,
            protected: self.protected.iter().map(|p| (p.path.clone(), p.hidden)).collect(),
            cwd: self.defaults.cwd.clone(),
            user: self.defaults.user.clone(),
            command: self.defaults.command.clone(),
            binds: self
                .binds
                .iter()
                .map(|b| (b.source.clone(), b.target.clone(), b.read_only))
                .collect(),
        };
        record.to_tier().map(Some)
    }
}

impl brig_core::sandbox::Session for Session {
    fn run<'a>(
        &'a self,
        command: &'a str,
        timeout: Duration,
        sink: mpsc::Sender<brig_core::sandbox::SessionEvent>,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(Session::run(self, command, timeout, sink).await?) })
    }

    fn wait(
        &self,
        timeout: Duration,
        sink: mpsc::Sender<brig_core::sandbox::SessionEvent>,
    ) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move { Ok(Session::wait(self, timeout, sink).await?) })
    }

    fn input<'a>(&'a self, data: &'a [u8]) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(Session::input(self, data).await?) })
    }

    fn interrupt(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move { Ok(Session::interrupt(self).await?) })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(Session::close(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::FileError;
    use crate::session::SessionError;

    #[test]
    fn errors_keep_their_meaning() {
        let missing = FileError::Io {
            path: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(matches!(
            SandboxError::from(missing),
            SandboxError::Io { kind: std::io::ErrorKind::NotFound, .. }
        ));
        let dir = SandboxError::from(FileError::NotRegular("/etc".into()));
        assert!(matches!(&dir, SandboxError::BadRequest(t) if t.contains("not a regular file")));
        assert!(matches!(SandboxError::from(SessionError::Busy), SandboxError::Conflict(_)));
        assert!(matches!(SandboxError::from(SessionError::Idle), SandboxError::BadRequest(_)));
        assert!(matches!(SandboxError::from(SessionError::Closed), SandboxError::NotFound(_)));
        let magic = FileError::Io {
            path: "/proc/1/root".into(),
            source: std::io::Error::from_raw_os_error(libc::ELOOP),
        };
        assert!(matches!(SandboxError::from(magic), SandboxError::BadRequest(_)));
        let kernel = FileError::KernelFile { path: "/proc/1/mem".into(), magic: 0x9fa0 };
        assert!(matches!(SandboxError::from(kernel), SandboxError::BadRequest(_)));
        let setup = SandboxError::from(RuntimeError::Setup("no rootfs".into()));
        assert!(matches!(&setup, SandboxError::Internal(t) if t.contains("no rootfs")));
        let full = crate::writable_store::StoreError::Command {
            command: "mkfs.ext4",
            path: "/state/writable-layers/x.ext4".into(),
            output: "mkfs.ext4: No space left on device while writing out".into(),
        };
        let full = RuntimeError::Rootfs(crate::rootfs::RootfsError::Store(full));
        assert!(matches!(SandboxError::from(full), SandboxError::Exhausted(_)));
    }

    #[test]
    fn env_merges_with_the_request_on_top() {
        let base = vec![("A".into(), "1".into()), ("B".into(), "2".into())];
        let merged = merged_env(&base, vec![("B".into(), "3".into())]);
        assert_eq!(merged, vec![("A".into(), "1".into()), ("B".into(), "3".into())]);
    }

    #[test]
    fn containers_serve_every_operation_of_a_local_sandbox() {
        assert!(CONTAINER_CAPS.supports(Op::Terminal));
        assert!(!CONTAINER_CAPS.supports(Op::ToolCalls));
        assert_eq!(CONTAINER_CAPS.files, FileAccess::Local);
        assert_eq!(CONTAINER_CAPS.persistence, Persistence::Record);
    }
}
