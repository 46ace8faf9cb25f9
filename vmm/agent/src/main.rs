//! `brig-agent`: runs inside a microVM guest and serves the host over virtio-vsock.
//!
//! It serves one request per connection on port 1024 (or `BRIG_AGENT_PORT`), in the protocol
//! of `brig_vmm_api::agent`. A command is exec'd with exactly the argv, environment and
//! directory the host sent (no shell in between); a command killed by a signal reports 128 +
//! signal. In a container-host VM (`BRIG_AGENT_CONTAINERS` set) it also runs the node's
//! container runtime for container requests (see `containers`).

use std::io::{BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

mod containers;
mod guest_files;
mod kept;
mod kept_session;
mod session;

use brig_vmm_api::agent::{self, AgentRequest, KeepExec, KeptStdin, ProcessRun};
use brig_vmm_api::container::Failure;
use nix::sys::socket::{
    accept, bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, VsockAddr,
};

const DEFAULT_PORT: u32 = agent::PORT;
const VMADDR_CID_ANY: u32 = u32::MAX;

/// An init script that starts us in the background leaves SIGINT and SIGQUIT ignored, and
/// every command we start would inherit that: a session's interrupt must reach them.
#[allow(unsafe_code)]
fn default_signals() {
    for signal in [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGQUIT] {
        // SAFETY: restoring the default disposition installs no handler; nothing else in the
        // process relies on these signals being ignored, and no threads run yet.
        let _ = unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl) };
    }
}

fn main() {
    default_signals();
    let port =
        std::env::var("BRIG_AGENT_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(DEFAULT_PORT);
    if let Err(e) = serve(port) {
        eprintln!("brig-agent: {e}");
        std::process::exit(1);
    }
}

fn serve(port: u32) -> Result<(), nix::Error> {
    let listener = socket(AddressFamily::Vsock, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &VsockAddr::new(VMADDR_CID_ANY, port))?;
    listen(&listener, Backlog::new(64)?)?;
    eprintln!("brig-agent: listening on vsock port {port}");
    loop {
        let fd = match accept(std::os::fd::AsRawFd::as_raw_fd(&listener)) {
            Ok(fd) => fd,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e),
        };
        let stream = std::fs::File::from(owned(fd));
        std::thread::spawn(move || {
            // A host that hangs up mid-reply (a timeout, an output cap) is routine, not news.
            if let Err(e) = handle(stream) {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    eprintln!("brig-agent: connection: {e}");
                }
            }
        });
    }
}

/// Takes ownership of a descriptor `accept` returned.
#[allow(unsafe_code)]
fn owned(fd: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: `accept` just returned this descriptor; nothing else in the process holds or
    // closes it, so the OwnedFd is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

nix::ioctl_none!(rnd_reseed_crng, b'R', 0x07);

/// The sandbox's root, when the guest's init mounted one (`BRIG_AGENT_ROOT`): commands run
/// chrooted into it and file paths are inside it.
fn root() -> Option<String> {
    std::env::var("BRIG_AGENT_ROOT").ok().filter(|r| !r.is_empty() && r != "/")
}

/// `path` (absolute, in the sandbox) as the guest sees it; `..` is refused so a path stays
/// inside the sandbox's root.
fn rooted(path: &str) -> std::io::Result<String> {
    if path.split('/').any(|c| c == "..") {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "`..` in a path"));
    }
    Ok(match root() {
        Some(root) => format!("{}{}", root.trim_end_matches('/'), path),
        None => path.to_string(),
    })
}

/// A file transfer's path that is no regular file (answered with `agent::EXIT_NOT_REGULAR`).
#[derive(Debug)]
struct NotRegular(String);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not a regular file (a FIFO, device or socket)", self.0)
    }
}

impl std::error::Error for NotRegular {}

/// Opens `path` for a file transfer (`write`: made if missing, truncated) if it is a regular
/// file: opened without blocking, so a FIFO or a device is refused before anything waits on it.
fn open_regular(path: &str, write: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .create(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            NotRegular(path.to_string()),
        ));
    }
    // Transfers of a regular file block as the disk does.
    let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) - nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    if write {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Writes the next `len` bytes of the connection to `path` (parents created).
fn put(reader: &mut impl Read, path: &str, len: u64) -> std::io::Result<()> {
    if let Some(parent) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = open_regular(path, true)?;
    let copied = std::io::copy(&mut reader.take(len), &mut file)?;
    if copied != len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "upload cut short"));
    }
    file.sync_all()
}

/// Sends `path`'s bytes as STDOUT frames.
fn get(out: &Mutex<std::fs::File>, path: &str) -> std::io::Result<()> {
    let mut file = open_regular(path, false)?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        frame(out, agent::STDOUT, &buf[..n])?;
    }
}

/// Mixes `seed_hex` into the random pool and makes the CRNG reseed from it now.
fn reseed(seed_hex: &str) -> std::io::Result<()> {
    let bytes: Vec<u8> = (0..seed_hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(seed_hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let mut random = std::fs::OpenOptions::new().write(true).open("/dev/urandom")?;
    std::io::Write::write_all(&mut random, &bytes)?;
    #[allow(unsafe_code)]
    // SAFETY: RNDRESEEDCRNG takes no argument; the descriptor is an open /dev/urandom that
    // lives across the call.
    unsafe { rnd_reseed_crng(std::os::fd::AsRawFd::as_raw_fd(&random)) }
        .map(|_| ())
        .map_err(std::io::Error::from)
}

fn frame(out: &Mutex<std::fs::File>, kind: u8, data: &[u8]) -> std::io::Result<()> {
    let mut w = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    agent::write_frame(&mut *w, kind, data)
}

/// Answers a request that ran no process: EXIT 0, or the error and its status: a path that is
/// no regular file [`agent::EXIT_NOT_REGULAR`], else the [`Failure`] of its kind (a missing
/// file is `NotFound`, not a failure of the agent).
fn done(out: &Mutex<std::fs::File>, result: std::io::Result<()>) -> std::io::Result<()> {
    match result {
        Ok(()) => frame(out, agent::EXIT, &0i32.to_le_bytes()),
        Err(e) => {
            frame(out, agent::STDERR, format!("brig-agent: {e}\n").as_bytes())?;
            let refused = e.get_ref().is_some_and(|inner| inner.is::<NotRegular>());
            let status =
                if refused { agent::EXIT_NOT_REGULAR } else { Failure::of_io(e.kind()).code() };
            frame(out, agent::EXIT, &status.to_le_bytes())
        }
    }
}

fn handle(stream: std::fs::File) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let out = Arc::new(Mutex::new(stream));
    let request = match AgentRequest::read(&mut reader) {
        Ok(request) => request,
        Err(e) => {
            let message = format!(
                "brig-agent: {e}: {}\n",
                std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()
            );
            frame(&out, agent::STDERR, message.as_bytes())?;
            return frame(&out, agent::EXIT, &agent::EXIT_BAD_REQUEST.to_le_bytes());
        }
    };
    match request {
        AgentRequest::Hello => {
            let hello = agent::AgentHello { protocol: agent::PROTOCOL };
            frame(&out, agent::STDOUT, &serde_json::to_vec(&hello).unwrap_or_default())?;
            done(&out, Ok(()))
        }
        AgentRequest::Container { request } => containers::serve(request, reader, out),
        AgentRequest::Exec { process, stdin_frames, keep } => {
            exec(&process, stdin_frames, keep, reader, &out)
        }
        AgentRequest::Kept { container } => {
            // One frame per command: a frame's cap is never reached however many there are.
            for info in kept::list(scope(&container)) {
                frame(&out, agent::STDOUT, &serde_json::to_vec(&info).unwrap_or_default())?;
            }
            done(&out, Ok(()))
        }
        AgentRequest::Attach { id, container, input } => {
            kept::attach(scope(&container), id, reader, &out, input)
        }
        AgentRequest::Kill { id, container } => done(
            &out,
            kept::kill(scope(&container), id).then_some(()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no kept command {id}"))
            }),
        ),
        AgentRequest::Session { process, keep } => {
            let started = match keep {
                Some(id) => kept_session::start(id, &process, reader, out.clone()),
                None => session::serve(reader, out.clone(), &process),
            };
            match started {
                Ok(()) => Ok(()),
                Err(e) => {
                    frame(&out, agent::STDERR, format!("brig-agent: session: {e}\n").as_bytes())?;
                    frame(&out, agent::EXIT, &1i32.to_le_bytes())
                }
            }
        }
        AgentRequest::SessionAttach { id, container } => {
            kept_session::attach(scope(&container), &id, reader, out)
        }
        AgentRequest::SessionProbe { id, container } => {
            match kept_session::probe(scope(&container), &id) {
                Some(probe) => {
                    frame(&out, agent::STDOUT, &serde_json::to_vec(&probe).unwrap_or_default())?;
                    done(&out, Ok(()))
                }
                None => done(&out, Err(no_session(&id))),
            }
        }
        AgentRequest::Sessions { container } => {
            frame(
                &out,
                agent::STDOUT,
                &serde_json::to_vec(&kept_session::list(scope(&container))).unwrap_or_default(),
            )?;
            done(&out, Ok(()))
        }
        AgentRequest::SessionClose { id, container } => done(
            &out,
            kept_session::close(scope(&container), &id)
                .then_some(())
                .ok_or_else(|| no_session(&id)),
        ),
        AgentRequest::Seed { seed_hex } => done(&out, reseed(&seed_hex)),
        AgentRequest::Put { path, len } => {
            done(&out, rooted(&path).and_then(|p| put(&mut reader, &p, len)))
        }
        AgentRequest::Get { path } => done(&out, rooted(&path).and_then(|p| get(&out, &p))),
        AgentRequest::Files { request } => guest_files::serve(request, &out),
    }
}

/// The scope a request's kept commands and sessions are in: its container's, or the VM's own.
fn scope(container: &Option<String>) -> &str {
    container.as_deref().unwrap_or("")
}

fn no_session(id: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotFound, format!("no kept session {id:?}"))
}

/// Runs `process` with its output as frames and its status last; with `keep`, it outlives
/// the connection and its output and status are kept (see `kept`).
fn exec(
    process: &ProcessRun,
    stdin_frames: bool,
    keep: Option<KeepExec>,
    mut reader: BufReader<std::fs::File>,
    out: &Arc<Mutex<std::fs::File>>,
) -> std::io::Result<()> {
    let stdin_mode = keep.map(|k| k.stdin).unwrap_or_default();
    // Stdin given whole is all here before the command starts, in a file it reads.
    let whole = match (stdin_frames, stdin_mode) {
        (true, KeptStdin::Whole) => match read_whole_stdin(&mut reader) {
            Ok(file) => Some(file),
            Err(e) => {
                frame(out, agent::STDERR, format!("brig-agent: stdin: {e}\n").as_bytes())?;
                return frame(out, agent::EXIT, &agent::EXIT_CANNOT_START.to_le_bytes());
            }
        },
        _ => None,
    };
    let given_whole = whole.is_some();
    let say_started = given_whole || keep.is_some_and(|k| k.started);
    let piped = stdin_frames && !given_whole;
    let started = command(process).and_then(|mut command| {
        let stdin = match whole {
            Some(file) => Stdio::from(file),
            None if piped => Stdio::piped(),
            None => Stdio::null(),
        };
        command.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn()
    });
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            let program = process.argv.first().map_or("", String::as_str);
            let message = format!("brig-agent: cannot start {program:?}: {e}\n");
            frame(out, agent::STDERR, message.as_bytes())?;
            return frame(out, agent::EXIT, &agent::EXIT_CANNOT_START.to_le_bytes());
        }
    };
    // When the host hangs up (its timeout, or it went away), the command and everything it
    // started are killed, unless it is kept. With streamed stdin, the same reader feeds it
    // first (a kept command's stdin ends with the connection unless the host asked to keep
    // it too).
    let group_id = child.id() as i32;
    let kept = keep.and_then(|keep| kept::register("", keep, &process.argv, group_id, None));
    let kill_on_hangup = kept.is_none();
    let group = nix::unistd::Pid::from_raw(-group_id);
    let stdin = StdinSink::new(child.stdin.take(), kept.as_ref());
    feed_until_hangup(reader, stdin, move || {
        if kill_on_hangup {
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        }
    });
    if say_started {
        frame(out, agent::STARTED, &[])?;
    }
    let pipes: Vec<(u8, Box<dyn Read + Send>)> = vec![
        (agent::STDOUT, Box::new(child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?)),
        (agent::STDERR, Box::new(child.stderr.take().ok_or(std::io::ErrorKind::BrokenPipe)?)),
    ];
    pump(pipes, out, kept.clone());
    let status = exit_code(child.wait()?);
    if let Some(kept) = &kept {
        kept.finish(agent::EXIT, status);
    }
    frame(out, agent::EXIT, &status.to_le_bytes())?;
    if let Some(kept) = kept {
        kept.delivered();
    }
    Ok(())
}

/// Where a connection's IN_STDIN frames go.
pub(crate) enum StdinSink {
    /// Nowhere: the command's stdin is empty, given whole, or closed.
    Nowhere,
    /// Into this pipe, which closes with the connection.
    Pipe(Box<dyn Write + Send>),
    /// Into a kept command's stdin, which stays open past the connection (`kept`).
    Kept(Arc<kept::KeptExec>),
}

impl StdinSink {
    /// The command's stdin pipe (if it has one), kept by `kept` if the host asked for that.
    pub(crate) fn new(
        pipe: Option<impl Write + Send + 'static>,
        kept: Option<&Arc<kept::KeptExec>>,
    ) -> StdinSink {
        let Some(pipe) = pipe else { return StdinSink::Nowhere };
        match kept.filter(|k| k.keeps_input()) {
            Some(kept) => {
                kept.keep_input(Box::new(pipe));
                StdinSink::Kept(kept.clone())
            }
            None => StdinSink::Pipe(Box::new(pipe)),
        }
    }

    /// Writes one frame's bytes: an empty frame ends the input, as does a failed write (the
    /// command stopped reading).
    fn write(self, data: &[u8]) -> StdinSink {
        match self {
            StdinSink::Pipe(mut pipe) => {
                if data.is_empty() || pipe.write_all(data).is_err() {
                    return StdinSink::Nowhere;
                }
                StdinSink::Pipe(pipe)
            }
            StdinSink::Kept(kept) if kept.write_input(data) => StdinSink::Kept(kept),
            StdinSink::Kept(_) | StdinSink::Nowhere => StdinSink::Nowhere,
        }
    }
}

/// Feeds `stdin` from the connection's IN_STDIN frames until an empty one, then waits for the
/// host to hang up, and calls `kill` then: a command never outlives the connection that
/// started it, unless `kill` keeps it (a kept command, whose kept stdin stays open).
fn feed_until_hangup(
    mut reader: BufReader<std::fs::File>,
    mut stdin: StdinSink,
    kill: impl FnOnce() + Send + 'static,
) {
    std::thread::spawn(move || {
        // A frame over the size cap ends the connection, as a hang-up does.
        while let Ok((kind, data)) = agent::read_frame(&mut reader) {
            if kind == agent::IN_STDIN {
                stdin = stdin.write(&data);
            }
        }
        kill();
    });
}

/// Reads IN_STDIN frames up to the empty one that ends them (at most
/// [`agent::MAX_WHOLE_STDIN`] bytes) into a sealed in-memory file, for a command's stdin.
fn read_whole_stdin(reader: &mut impl Read) -> std::io::Result<std::fs::File> {
    let mut data = Vec::new();
    loop {
        let (kind, chunk) = agent::read_frame(reader).map_err(std::io::Error::other)?;
        if kind != agent::IN_STDIN {
            continue;
        }
        if chunk.is_empty() {
            break;
        }
        if data.len() + chunk.len() > agent::MAX_WHOLE_STDIN {
            let message = format!("more than {} bytes given whole", agent::MAX_WHOLE_STDIN);
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, message));
        }
        data.extend_from_slice(&chunk);
    }
    brig_container::exec::stdin_file(&data).map(std::fs::File::from).map_err(std::io::Error::other)
}

/// The process `run` names, as a command to spawn: its argv, its environment on top of the
/// agent's, started in its directory (inside the sandbox's root, when there is one). What
/// execve cannot carry is refused.
fn command(run: &ProcessRun) -> std::io::Result<Command> {
    let cwd = run.cwd.as_deref().filter(|c| !c.is_empty()).unwrap_or("/");
    brig_core::check_command(&run.argv, &run.env, cwd)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut command = Command::new(&run.argv[0]);
    command.args(&run.argv[1..]).envs(run.env.iter().map(|(k, v)| (k, v)));
    match root() {
        Some(root) => {
            let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
            let root = std::ffi::CString::new(root).map_err(invalid)?;
            let cwd = std::ffi::CString::new(cwd).map_err(invalid)?;
            enter_root(&mut command, root, cwd);
        }
        None => {
            command.current_dir(cwd);
        }
    }
    Ok(command)
}

/// Makes `command` chroot into `root` and change to `cwd` there before it execs (its program
/// is then looked up inside the root).
#[allow(unsafe_code)]
fn enter_root(command: &mut Command, root: std::ffi::CString, cwd: std::ffi::CString) {
    // SAFETY: the closure runs in the forked child before exec and calls only chroot and
    // chdir (async-signal-safe) on C strings made before the fork, which it owns.
    unsafe {
        command.pre_exec(move || {
            if libc::chroot(root.as_ptr()) != 0 || libc::chdir(cwd.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends what each pipe produces as frames of its kind until every pipe is closed. A kept
/// command's output is kept as well, and read on after the host hangs up.
fn pump(
    pipes: Vec<(u8, Box<dyn Read + Send>)>,
    out: &Arc<Mutex<std::fs::File>>,
    kept: Option<Arc<kept::KeptExec>>,
) {
    let pumps: Vec<_> = pipes
        .into_iter()
        .map(|(kind, mut pipe)| {
            let (out, kept) = (out.clone(), kept.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                let mut connected = true;
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if let Some(kept) = &kept {
                                kept.record(kind, &buf[..n]);
                            }
                            connected = connected && frame(&out, kind, &buf[..n]).is_ok();
                            if !connected && kept.is_none() {
                                break;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for p in pumps {
        let _ = p.join();
    }
}

/// After a process has ended, how long its pipes get to close (a background child may hold
/// them open forever).
const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// As [`pump`], for a process whose end `wait` reports: once it has ended, its pipes get
/// [`DRAIN_GRACE`] to close, and what is still open is left to its pump (a kept command's
/// output is kept until its end is, see `kept`).
fn pump_until_exit<T>(
    pipes: Vec<(u8, Box<dyn Read + Send>)>,
    out: &Arc<Mutex<std::fs::File>>,
    kept: Option<Arc<kept::KeptExec>>,
    wait: impl FnOnce() -> T,
) -> T {
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let count = pipes.len();
    for (kind, mut pipe) in pipes {
        let (out, closed_tx, kept) = (out.clone(), closed_tx.clone(), kept.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 << 10];
            let mut connected = true;
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                if let Some(kept) = &kept {
                    kept.record(kind, &buf[..n]);
                }
                connected = connected && frame(&out, kind, &buf[..n]).is_ok();
                if !connected && kept.is_none() {
                    break;
                }
            }
            let _ = closed_tx.send(());
        });
    }
    let ended = wait();
    let deadline = std::time::Instant::now() + DRAIN_GRACE;
    for _ in 0..count {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if closed.recv_timeout(left).is_err() {
            break;
        }
    }
    ended
}

/// A process's exit status as the protocol reports it: its code, or 128 + the signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Serves one connection as the agent does; returns the host's end.
    fn connect(request: &AgentRequest) -> UnixStream {
        let (mut host, agent_end) = UnixStream::pair().expect("pair");
        std::thread::spawn(move || handle(std::fs::File::from(OwnedFd::from(agent_end))));
        std::io::Write::write_all(&mut host, &request.to_frame()).expect("request");
        host
    }

    fn kept_exec(id: u64, argv: &[&str], stdin: KeptStdin, started: bool) -> AgentRequest {
        let keep = KeepExec { id, timeout_ms: 10_000, output_limit: 1 << 20, stdin, started };
        let argv = argv.iter().map(|a| a.to_string()).collect();
        let stdin_frames = stdin != KeptStdin::EndsWithConnection;
        AgentRequest::Exec { process: ProcessRun::argv(argv), stdin_frames, keep: Some(keep) }
    }

    fn whole(id: u64, argv: &[&str]) -> AgentRequest {
        kept_exec(id, argv, KeptStdin::Whole, false)
    }

    /// Reads frames to EXIT: stdout, stderr and the status.
    fn frames_to_exit(host: &mut UnixStream) -> (Vec<u8>, Vec<u8>, i32) {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            let (kind, data) = agent::read_frame(host).expect("frame");
            match kind {
                agent::STDOUT => stdout.extend_from_slice(&data),
                agent::STDERR => stderr.extend_from_slice(&data),
                agent::EXIT => return (stdout, stderr, agent::status_of(&data)),
                other => panic!("frame {other}: {}", String::from_utf8_lossy(&data)),
            }
        }
    }

    /// Reads frames to EXIT, with nothing on stderr: stdout and the status.
    fn read_to_exit(host: &mut UnixStream) -> (String, i32) {
        let (stdout, stderr, status) = frames_to_exit(host);
        assert!(stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&stderr));
        (String::from_utf8_lossy(&stdout).into_owned(), status)
    }

    /// The VM's own files: mkdir, stat, list, remove, each failure typed (a missing file is
    /// NotFound, for a whole-file read too; a non-empty directory is not removed without
    /// `recursive`).
    #[test]
    fn file_requests_answer_entries_and_typed_failures() {
        use brig_vmm_api::guest_files::{parse_listing, FileEntry, GuestFileRequest as G};
        let dir = format!("/tmp/brig-agent-files-{}", std::process::id());
        let _ = std::fs::remove_dir_all(&dir);
        let ask = |request: G| frames_to_exit(&mut connect(&AgentRequest::Files { request }));
        let (_, stderr, status) = ask(G::Mkdir { path: format!("{dir}/a/b"), parents: true });
        assert_eq!(status, 0, "{}", String::from_utf8_lossy(&stderr));
        std::fs::write(format!("{dir}/a/f"), b"12345").expect("write");
        let (stdout, _, status) = ask(G::Stat { path: format!("{dir}/a/f") });
        assert_eq!(status, 0);
        let entry: FileEntry = serde_json::from_slice(&stdout).expect("entry");
        assert_eq!((entry.kind.as_str(), entry.size), ("file", 5));
        let (stdout, _, status) = ask(G::List { path: format!("{dir}/a") });
        assert_eq!(status, 0);
        let mut names: Vec<String> =
            parse_listing(&stdout).expect("listing").into_iter().map(|e| e.path).collect();
        names.sort();
        assert_eq!(names, [format!("{dir}/a/b"), format!("{dir}/a/f")]);
        let (_, _, status) = ask(G::Remove { path: format!("{dir}/a"), recursive: false });
        assert_eq!(Failure::from_code(status), Failure::DirectoryNotEmpty);
        let (_, _, status) = ask(G::Remove { path: format!("{dir}/a"), recursive: true });
        assert_eq!(status, 0);
        let (_, _, status) = ask(G::Stat { path: format!("{dir}/a") });
        assert_eq!(Failure::from_code(status), Failure::NotFound);
        let get = AgentRequest::Get { path: format!("{dir}/missing") };
        let (_, _, status) = frames_to_exit(&mut connect(&get));
        assert_eq!(Failure::from_code(status), Failure::NotFound);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `hello` answers this agent's protocol; a command asked to say STARTED says it first,
    /// once it is kept, whatever its stdin; one not asked does not.
    #[test]
    fn hello_answers_the_protocol_and_started_comes_when_asked() {
        let mut host = connect(&AgentRequest::Hello);
        let (kind, data) = agent::read_frame(&mut host).expect("hello");
        assert_eq!(kind, agent::STDOUT);
        let hello: agent::AgentHello = serde_json::from_slice(&data).expect("hello json");
        assert_eq!(hello.protocol, agent::PROTOCOL);
        let (_, data) = agent::read_frame(&mut host).expect("exit");
        assert_eq!(agent::status_of(&data), 0);

        // What an agent older than a request does with it (as one older than hello did with
        // hello): EXIT_BAD_REQUEST, which a host reads as protocol 1.
        let (mut host, agent_end) = UnixStream::pair().expect("pair");
        std::thread::spawn(move || handle(std::fs::File::from(OwnedFd::from(agent_end))));
        let later = agent::encode_frame(agent::REQUEST, br#"{"op":"from_a_later_host"}"#);
        std::io::Write::write_all(&mut host, &later).expect("request");
        let (_, _, status) = frames_to_exit(&mut host);
        assert_eq!(status, agent::EXIT_BAD_REQUEST);

        // It runs a while: a command that ended and was delivered is no longer kept.
        let mut host = connect(&kept_exec(
            9_201,
            &["sh", "-c", "sleep 1; echo hi"],
            KeptStdin::EndsWithConnection,
            true,
        ));
        let (kind, _) = agent::read_frame(&mut host).expect("first frame");
        assert_eq!(kind, agent::STARTED, "STARTED comes first");
        assert!(kept::list("").iter().any(|i| i.keep.id == 9_201), "kept once started");
        assert_eq!(read_to_exit(&mut host), ("hi\n".to_string(), 0));

        let mut host = connect(&kept_exec(9_202, &["cat"], KeptStdin::Kept, true));
        let (kind, _) = agent::read_frame(&mut host).expect("first frame");
        assert_eq!(kind, agent::STARTED, "streamed stdin: STARTED before any input");
        agent::write_frame(&mut host, agent::IN_STDIN, b"in\n").expect("stdin");
        agent::write_frame(&mut host, agent::IN_STDIN, b"").expect("end of stdin");
        assert_eq!(read_to_exit(&mut host), ("in\n".to_string(), 0));

        let mut host =
            connect(&kept_exec(9_203, &["echo", "ho"], KeptStdin::EndsWithConnection, false));
        assert_eq!(read_to_exit(&mut host), ("ho\n".to_string(), 0), "no STARTED unless asked");
    }

    /// Stdin given whole: the agent takes all of it (more than a pipe holds), starts the
    /// command, says STARTED before any output, and the command reads it from a file. A host
    /// that hangs up before the input's end starts nothing.
    #[test]
    fn stdin_given_whole_is_all_there_before_the_command_starts() {
        let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut host =
            connect(&whole(9_101, &["sh", "-c", "sleep 1; wc -c; ls -l /proc/self/fd/0"]));
        for chunk in input.chunks(64 << 10) {
            agent::write_frame(&mut host, agent::IN_STDIN, chunk).expect("stdin");
        }
        agent::write_frame(&mut host, agent::IN_STDIN, b"").expect("end of stdin");
        let (kind, _) = agent::read_frame(&mut host).expect("first frame");
        assert_eq!(kind, agent::STARTED, "STARTED comes first");
        assert!(kept::list("").iter().any(|i| i.keep.id == 9_101), "kept once started");
        let (stdout, status) = read_to_exit(&mut host);
        assert_eq!(status, 0);
        assert!(stdout.starts_with("300000\n"), "{stdout}");
        assert!(stdout.contains("memfd:brig-stdin"), "stdin is the sealed file: {stdout}");

        let mut cut = connect(&whole(9_102, &["true"]));
        agent::write_frame(&mut cut, agent::IN_STDIN, b"half of it").expect("stdin");
        drop(cut);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(kept::list("").iter().all(|i| i.keep.id != 9_102), "started with half its stdin");
    }
}
