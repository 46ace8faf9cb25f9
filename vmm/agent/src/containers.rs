//! The container service of a container-host VM (the agent runs with `BRIG_AGENT_CONTAINERS`
//! set to the runtime's scratch directory): the node's own container runtime,
//! `brig_container`, on this guest's kernel, driven by the node's container requests
//! (`brig_vmm_api::container`).
//!
//! ```text
//! node ══vsock══▶ agent ──▶ Runtime (EROFS layers from the VM's disks, overlay, cgroups v2)
//!                         └─▶ brig-shim per container ──▶ processes (fds passed in the guest)
//! ```
//! Processes start through each container's shim, outside the container's pid namespace, as
//! on the host kernel; nothing in a container can reach the agent. A connection's processes
//! die with it (a host hang-up kills the tree), unless they are kept: a command or session
//! started with `keep` outlives the connection (a restart of the node), kept under the
//! container's name (`kept`, `kept_session`), and goes with its container.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use brig_container::files::FileError;
use brig_container::rootfs::LayerSource;
use brig_container::runtime::{Container, ContainerSpec, Runtime, RuntimeConfig, SpawnRequest};
use brig_container::shim_proto::ExitInfo;
use brig_hostkit::cgroup::CgroupLimits;
use brig_vmm_api::agent;
use brig_vmm_api::container::{
    ContainerRequest, ContainerUsage, CreateSpec, Failure, FileEntry, ProcessSpec, MAX_CONTAINERS,
};

/// The environment variable that turns the service on: the runtime's scratch directory.
pub const ENV: &str = "BRIG_AGENT_CONTAINERS";

/// A request that failed before anything ran.
pub(crate) struct Refusal(pub(crate) Failure, pub(crate) String);

impl Refusal {
    fn bad(message: impl Into<String>) -> Refusal {
        Refusal(Failure::BadRequest, message.into())
    }
}

impl From<FileError> for Refusal {
    fn from(e: FileError) -> Refusal {
        let failure = match &e {
            FileError::Io { source, .. } => Failure::of_io(source.kind()),
            FileError::BadPath(_)
            | FileError::KernelFile { .. }
            | FileError::TooManyDirs { .. } => Failure::BadRequest,
            FileError::NotRegular(_) => Failure::IsADirectory,
        };
        Refusal(failure, e.to_string())
    }
}

impl From<std::io::Error> for Refusal {
    fn from(e: std::io::Error) -> Refusal {
        Refusal(Failure::of_io(e.kind()), e.to_string())
    }
}

impl From<brig_container::runtime::RuntimeError> for Refusal {
    fn from(e: brig_container::runtime::RuntimeError) -> Refusal {
        Refusal(Failure::Runtime, error_chain(&e))
    }
}

/// An error and its sources, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The runtime and its containers, made on the first request.
struct Service {
    tokio: tokio::runtime::Runtime,
    runtime: Runtime,
    containers: Mutex<HashMap<String, Arc<Container>>>,
}

fn service() -> Result<&'static Service, Refusal> {
    static SERVICE: OnceLock<Result<Service, String>> = OnceLock::new();
    SERVICE
        .get_or_init(|| {
            let run_dir = std::env::var(ENV).map_err(|_| format!("{ENV} is not set"))?;
            let tokio = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| format!("tokio: {e}"))?;
            let shim_path = std::env::var("BRIG_SHIM")
                .map(PathBuf::from)
                .unwrap_or_else(|_| brig_container::runtime::default_shim_path());
            let config = RuntimeConfig {
                run_dir: PathBuf::from(run_dir),
                shim_path,
                id_base: brig_container::runtime::DEFAULT_ID_BASE,
                cgroup_root: PathBuf::from("/sys/fs/cgroup"),
                cgroup_parent: "brig".into(),
                survive_node: false,
                spool_dir: None,
                cpu_min_quota_us: brig_hostkit::cgroup::DEFAULT_CPU_MIN_QUOTA_US,
                // A container-host VM holds far fewer containers than a node is sized for.
                spare_cgroups: 64,
                spare_cgroups_idle_secs: brig_container::runtime::DEFAULT_SPARE_CGROUPS_IDLE_SECS,
                // The guest's writable layers stay tmpfs (the VM's memory is its own).
                writable_store: None,
            };
            let runtime = {
                let _in_tokio = tokio.enter();
                Runtime::new(config).map_err(|e| error_chain(&e))?
            };
            Ok(Service { tokio, runtime, containers: Mutex::default() })
        })
        .as_ref()
        .map_err(|why| Refusal(Failure::Runtime, format!("the container runtime: {why}")))
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Service {
    fn container(&self, name: &str) -> Result<Arc<Container>, Refusal> {
        locked(&self.containers)
            .get(name)
            .cloned()
            .ok_or_else(|| Refusal(Failure::NoSuchContainer, format!("no container {name:?}")))
    }
}

/// Serves one container request; what follows it (stdin frames, a file) is on `reader`.
pub fn serve(
    request: ContainerRequest,
    reader: BufReader<File>,
    out: Arc<Mutex<File>>,
) -> std::io::Result<()> {
    // A kept command whose end this request reports: forgotten once the host has its end.
    let mut ended = None;
    let result = service().and_then(|svc| handle(svc, request, reader, &out, &mut ended));
    match result {
        Ok(NO_END) => Ok(()),
        Ok((kind, value)) => {
            crate::frame(&out, kind, &value.to_le_bytes())?;
            if let Some(kept) = ended {
                kept.delivered();
            }
            Ok(())
        }
        Err(Refusal(failure, message)) => {
            crate::frame(&out, agent::STDERR, format!("{message}\n").as_bytes())?;
            crate::frame(&out, agent::EXIT, &failure.code().to_le_bytes())
        }
    }
}

/// Runs a request; the last frame it answers with.
fn handle(
    svc: &'static Service,
    request: ContainerRequest,
    mut reader: BufReader<File>,
    out: &Arc<Mutex<File>>,
    ended: &mut Option<Arc<crate::kept::KeptExec>>,
) -> Result<End, Refusal> {
    match request {
        ContainerRequest::Create(spec) => create(svc, spec).map(|()| DONE),
        ContainerRequest::Destroy { name } => {
            let container = locked(&svc.containers).remove(&name);
            let container = container.ok_or_else(|| {
                Refusal(Failure::NoSuchContainer, format!("no container {name:?}"))
            })?;
            crate::kept::forget_scope(&name);
            crate::kept_session::close_scope(&name);
            svc.tokio.block_on(container.destroy())?;
            Ok(DONE)
        }
        ContainerRequest::Exec { process, stdin, keep } => {
            let container = svc.container(&process.name)?;
            let (end, kept) = exec(svc, &container, process, stdin, keep, reader, out)?;
            *ended = kept;
            Ok(end)
        }
        ContainerRequest::Session { process, keep: None } => {
            let container = svc.container(&process.name)?;
            session(svc, &container, process, reader, out)
        }
        ContainerRequest::Session { process, keep: Some(id) } => {
            let container = svc.container(&process.name)?;
            let name = process.name.clone();
            let spawn = || {
                kept_shell(svc, container, process)
                    .map_err(|Refusal(_, m)| std::io::Error::other(m))
            };
            crate::kept_session::start_with(&name, &id, spawn, reader, out.clone())
                .map_err(|e| Refusal::bad(format!("session: {e}")))?;
            // The session ended here by a hang-up or a close; its EXIT, when the shell ends,
            // goes to whichever connection is attached then.
            Ok(NO_END)
        }
        ContainerRequest::Put { name, path, len, append, mode } => {
            let container = svc.container(&name)?;
            let root = container.root_dir()?;
            let mut file = root.dir().open_write(&path, append, true, mode)?;
            let copied = std::io::copy(&mut (&mut reader).take(len), &mut file)?;
            if copied != len {
                return Err(Refusal::bad("the upload was cut short"));
            }
            file.sync_all()?;
            Ok(DONE)
        }
        ContainerRequest::Get { name, path } => {
            let container = svc.container(&name)?;
            let mut file = container.root_dir()?.dir().open_read(&path)?;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    return Ok(DONE);
                }
                crate::frame(out, agent::STDOUT, &buf[..n])?;
            }
        }
        ContainerRequest::Stat { name, path } => {
            let container = svc.container(&name)?;
            let entry = container.root_dir()?.dir().stat(&path)?;
            json(out, &entry_to_wire(entry))
        }
        ContainerRequest::List { name, path } => {
            let container = svc.container(&name)?;
            let entries = container.root_dir()?.dir().list(&path)?;
            json(out, &entries.into_iter().map(entry_to_wire).collect::<Vec<_>>())
        }
        ContainerRequest::Mkdir { name, path, parents } => {
            let container = svc.container(&name)?;
            container.root_dir()?.dir().mkdir(&path, parents)?;
            Ok(DONE)
        }
        ContainerRequest::Remove { name, path, recursive } => {
            let container = svc.container(&name)?;
            container.root_dir()?.dir().remove(&path, recursive)?;
            Ok(DONE)
        }
        ContainerRequest::Freeze { name, frozen } => {
            svc.container(&name)?.set_frozen(frozen)?;
            Ok(DONE)
        }
        ContainerRequest::Usage { name } => {
            let container = svc.container(&name)?;
            let (cpu_ns, memory_bytes) = container.usage();
            json(out, &ContainerUsage { cpu_ns, memory_bytes, alive: container.is_alive() })
        }
        ContainerRequest::Names {} => {
            let mut names: Vec<String> = locked(&svc.containers).keys().cloned().collect();
            names.sort();
            names.truncate(MAX_CONTAINERS);
            json(out, &names)
        }
    }
}

/// Answers with one STDOUT frame of JSON.
fn json(out: &Arc<Mutex<File>>, value: &impl serde::Serialize) -> Result<End, Refusal> {
    let bytes = serde_json::to_vec(value).map_err(|e| Refusal(Failure::Other, e.to_string()))?;
    crate::frame(out, agent::STDOUT, &bytes)?;
    Ok(DONE)
}

pub(crate) fn entry_to_wire(e: brig_core::files::Entry) -> FileEntry {
    use brig_core::files::EntryKind;
    let kind = match e.kind {
        EntryKind::File => "file",
        EntryKind::Dir => "dir",
        EntryKind::Symlink => "symlink",
        EntryKind::Other => "other",
    };
    FileEntry {
        path: e.path,
        kind: kind.into(),
        size: e.size,
        mode: e.mode,
        modified_unix_ms: e.modified_unix_ms,
    }
}

fn create(svc: &Service, spec: CreateSpec) -> Result<(), Refusal> {
    let name_ok = !spec.name.is_empty()
        && spec.name.len() <= 64
        && spec.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !name_ok {
        return Err(Refusal::bad(format!("bad container name {:?}", spec.name)));
    }
    if spec.layers.is_empty() || spec.layers.iter().any(|l| !l.starts_with("/dev/vd")) {
        return Err(Refusal::bad("layers must be the VM's disks (/dev/vd…)"));
    }
    if locked(&svc.containers).contains_key(&spec.name) {
        return Err(Refusal(Failure::AlreadyExists, format!("container {:?} exists", spec.name)));
    }
    if locked(&svc.containers).len() >= MAX_CONTAINERS {
        return Err(Refusal::bad(format!("this VM runs {MAX_CONTAINERS} containers already")));
    }
    let runtime_spec = ContainerSpec {
        name: spec.name.clone(),
        hostname: spec.hostname,
        layers: spec.layers.iter().map(LayerSource::image).collect(),
        limits: CgroupLimits {
            memory_bytes: spec.memory_bytes,
            pids: spec.pids,
            cpu_millis: spec.cpu_millis,
        },
        disk_bytes: spec.disk_bytes,
        seed: None,
        protect: Default::default(),
    };
    let container = svc.tokio.block_on(svc.runtime.create(&runtime_spec))?;
    locked(&svc.containers).insert(spec.name, Arc::new(container));
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Refusal> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Refusal::from(std::io::Error::from(e)))
}

fn spawn_request(p: ProcessSpec) -> SpawnRequest {
    SpawnRequest { argv: p.argv, env: p.env, cwd: p.cwd, user: p.user, terminal: false }
}

/// How a request ends: the last frame's kind (EXIT or SIGNALED) and its value.
type End = (u8, i32);

/// A request that ran to its end.
const DONE: End = (agent::EXIT, 0);

/// A request whose last frame is not this connection's to send (a kept session's).
const NO_END: End = (0, 0);

/// The last frame for how a process ended: EXIT with its code, SIGNALED with its signal, or
/// EXIT -1 when the container went away first.
fn end_of(exit: Option<ExitInfo>) -> End {
    match exit {
        Some(ExitInfo::Code(code)) => (agent::EXIT, code),
        Some(ExitInfo::Signal(signal)) => (agent::SIGNALED, signal),
        None => (agent::EXIT, -1),
    }
}

/// Runs a process to its end; with `keep`, it is kept under the container's name (the kept
/// command is returned: forget it once the host has its end).
fn exec(
    svc: &Service,
    container: &Container,
    process: ProcessSpec,
    stdin: bool,
    keep: Option<agent::KeepExec>,
    mut reader: BufReader<File>,
    out: &Arc<Mutex<File>>,
) -> Result<(End, Option<Arc<crate::kept::KeptExec>>), Refusal> {
    if process.argv.is_empty() {
        return Err(Refusal::bad("an empty command"));
    }
    let (name, argv) = (process.name.clone(), process.argv.clone());
    // Stdin given whole is all here before the process starts, in a file it reads.
    let whole = match (stdin, keep.map(|k| k.stdin).unwrap_or_default()) {
        (true, agent::KeptStdin::Whole) => Some(crate::read_whole_stdin(&mut reader)?),
        _ => None,
    };
    let say_started = whole.is_some() || keep.is_some_and(|k| k.started);
    let (input, in_w) = match whole {
        Some(file) => (OwnedFd::from(file), None),
        None => {
            let (in_r, in_w) = pipe()?;
            (in_r, Some(in_w).filter(|_| stdin))
        }
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let stdio = [input.as_fd(), out_w.as_fd(), err_w.as_fd()];
    let mut child =
        svc.tokio.block_on(container.spawn(spawn_request(process), stdio, &[], &[], None))?;
    drop((input, out_w, err_w));
    // The shim makes every process the leader of its own group.
    let kept = keep.and_then(|keep| {
        let tree_kill: crate::kept::TreeKill = Box::new(child.tree_killer());
        crate::kept::register(&name, keep, &argv, child.pid, Some(tree_kill))
    });
    let stdin = crate::StdinSink::new(in_w.map(File::from), kept.as_ref());
    // A hang-up before the process ends (the node's timeout or cap, a kill) kills its tree,
    // unless it is kept; after it ended, what it left in the background runs on, as on the
    // node's kernel.
    let finished = Arc::new(AtomicBool::new(false));
    let (done, kill_tree, kill_on_hangup) = (finished.clone(), child.tree_killer(), kept.is_none());
    crate::feed_until_hangup(reader, stdin, move || {
        if kill_on_hangup && !done.load(Ordering::SeqCst) {
            kill_tree();
        }
    });
    if say_started {
        crate::frame(out, agent::STARTED, &[])?;
    }
    let pipes: Vec<(u8, Box<dyn Read + Send>)> = vec![
        (agent::STDOUT, Box::new(File::from(out_r))),
        (agent::STDERR, Box::new(File::from(err_r))),
    ];
    // A kept command's output is kept (and read on after the host left) until it ends.
    let exit =
        crate::pump_until_exit(pipes, out, kept.clone(), || svc.tokio.block_on(child.wait()));
    let end = end_of(exit);
    if let Some(kept) = &kept {
        kept.finish(end.0, end.1);
    }
    finished.store(true, Ordering::SeqCst);
    child.cleanup(true);
    Ok((end, kept))
}

/// Starts a session shell in `container` for a kept session: the shim's child, waited for
/// on the service's runtime.
fn kept_shell(
    svc: &'static Service,
    container: Arc<Container>,
    process: ProcessSpec,
) -> Result<crate::kept_session::KeptShell, Refusal> {
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (cmd_r, cmd_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    let commands_pipe = brig_container::session_journal::pipe_name(&cmd_w)
        .ok_or_else(|| Refusal::bad("cannot name the command pipe"))?;
    let stdio = [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
    let extra = [cmd_r.as_fd(), done_w.as_fd()];
    let mut child =
        svc.tokio.block_on(container.spawn(spawn_request(process), stdio, &extra, &[], None))?;
    drop((in_r, out_w, err_w, cmd_r, done_w));
    let pid = child.pid;
    let wait = move || {
        let (kind, value) = end_of(svc.tokio.block_on(child.wait()));
        child.cleanup(false);
        drop(container);
        if kind == agent::SIGNALED {
            128 + value
        } else {
            value
        }
    };
    Ok(crate::kept_session::KeptShell {
        wait: Box::new(wait),
        group: nix::unistd::Pid::from_raw(-pid),
        shell_pid: pid,
        commands_pipe,
        relay: crate::session::Relay {
            stdin: File::from(in_w),
            commands: File::from(cmd_w),
            stdout: File::from(out_r),
            stderr: File::from(err_r),
            done: File::from(done_r),
        },
    })
}

fn session(
    svc: &Service,
    container: &Container,
    process: ProcessSpec,
    reader: BufReader<File>,
    out: &Arc<Mutex<File>>,
) -> Result<End, Refusal> {
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (cmd_r, cmd_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    let stdio = [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
    let extra = [cmd_r.as_fd(), done_w.as_fd()];
    let mut child =
        svc.tokio.block_on(container.spawn(spawn_request(process), stdio, &extra, &[], None))?;
    drop((in_r, out_w, err_w, cmd_r, done_w));
    // The shim makes every process the leader of its own group.
    let group = nix::unistd::Pid::from_raw(-child.pid);
    let relay = crate::session::Relay {
        stdin: File::from(in_w),
        commands: File::from(cmd_w),
        stdout: File::from(out_r),
        stderr: File::from(err_r),
        done: File::from(done_r),
    };
    relay.run(reader, out, group, child.tree_killer());
    let exit = svc.tokio.block_on(child.wait());
    child.cleanup(false);
    Ok(end_of(exit))
}
