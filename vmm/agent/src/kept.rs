//! Commands kept for the host: started with `keep`, they outlive the connection that started
//! them (the host may restart meanwhile). Each keeps its output frames (up to
//! `MAX_KEPT_OUTPUT`) and its status; a host reads one again from its first byte with
//! `attach`, and an entry goes once a host has read its EXIT, or [`FORGET_AFTER`] after it
//! ended unread. All kept output together is capped at [`MAX_TOTAL`] (the guest's memory).
//!
//! Commands are kept by scope and id: the scope is a container's name (a container-host VM's
//! service keeps each container's commands apart) or empty (the VM's own commands).

/// How long an ended command nobody read to its end is kept.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Output kept for all commands together.
const MAX_TOTAL: usize = 32 << 20;
static TOTAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use brig_vmm_api::agent::{self, KeepExec, KeptInfo, MAX_KEPT, MAX_KEPT_OUTPUT};

/// One kept command.
pub struct KeptExec {
    /// Tells this entry from a later one under the same id.
    serial: u64,
    /// The container it runs in, or empty.
    scope: String,
    keep: KeepExec,
    argv: Vec<String>,
    started: Instant,
    /// Its process group.
    group: i32,
    state: Mutex<State>,
    changed: Condvar,
    /// Its stdin's write end, while kept open for the host ([`agent::KeptStdin::Kept`]).
    input: Mutex<Option<Box<dyn Write + Send>>>,
    /// Whether `input` holds it (read without waiting for a writer blocked on a full pipe).
    input_open: AtomicBool,
}

#[derive(Default)]
struct State {
    frames: Vec<(u8, Vec<u8>)>,
    bytes: usize,
    gap: bool,
    /// The EXIT or SIGNALED frame, once it ended, and when.
    exit: Option<(u8, i32)>,
    ended: Option<Instant>,
    /// Kills everything it started (a container's exec cgroup), until it ends: the cgroup may
    /// serve another command after that.
    tree_kill: Option<TreeKill>,
}

/// Kills a command's whole process tree.
pub type TreeKill = Box<dyn FnOnce() + Send>;

impl Drop for KeptExec {
    fn drop(&mut self) {
        let bytes = lock(&self.state).bytes;
        TOTAL.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A kept command's scope (a container's name, or empty) and id.
type Key = (String, u64);

fn table() -> &'static Mutex<HashMap<Key, Arc<KeptExec>>> {
    static TABLE: OnceLock<Mutex<HashMap<Key, Arc<KeptExec>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

fn key(scope: &str, id: u64) -> Key {
    (scope.to_string(), id)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps the command `keep` names in `scope` (process group `group`, and what else
/// `tree_kill` kills); none when the agent keeps [`MAX_KEPT`] already (it then runs as if not
/// kept).
pub fn register(
    scope: &str,
    keep: KeepExec,
    argv: &[String],
    group: i32,
    tree_kill: Option<TreeKill>,
) -> Option<Arc<KeptExec>> {
    let mut table = lock(table());
    table.retain(|_, e| lock(&e.state).ended.is_none_or(|t| t.elapsed() < FORGET_AFTER));
    if table.len() >= MAX_KEPT && !table.contains_key(&key(scope, keep.id)) {
        return None;
    }
    let argv = argv.iter().take(16).map(|a| a.chars().take(256).collect()).collect();
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let exec = Arc::new(KeptExec {
        serial: SERIAL.fetch_add(1, Ordering::Relaxed),
        scope: scope.to_string(),
        keep,
        argv,
        started: Instant::now(),
        group,
        state: Mutex::new(State { tree_kill, ..State::default() }),
        changed: Condvar::new(),
        input: Mutex::new(None),
        input_open: AtomicBool::new(false),
    });
    table.insert(key(scope, keep.id), exec.clone());
    Some(exec)
}

impl KeptExec {
    /// Keeps an output frame (past the cap, notes the gap instead).
    pub fn record(&self, kind: u8, data: &[u8]) {
        let mut state = lock(&self.state);
        if state.exit.is_some() {
            // What a background process writes after the command's end is not its output.
            return;
        }
        let total = TOTAL.load(Ordering::Relaxed);
        if state.bytes + data.len() > MAX_KEPT_OUTPUT || total + data.len() > MAX_TOTAL {
            state.gap = true;
        } else {
            TOTAL.fetch_add(data.len(), Ordering::Relaxed);
            state.bytes += data.len();
            state.frames.push((kind, data.to_vec()));
        }
        self.changed.notify_all();
    }

    /// Keeps how it ended: `kind` EXIT or SIGNALED, with its status.
    pub fn finish(&self, kind: u8, status: i32) {
        let mut state = lock(&self.state);
        state.exit = Some((kind, status));
        state.ended = Some(Instant::now());
        state.tree_kill = None;
        drop(state);
        self.changed.notify_all();
        // Nothing is written to an ended command's stdin. A writer blocked on a pipe that a
        // background process keeps open holds the lock: it drops the pipe when it fails.
        self.input_open.store(false, Ordering::SeqCst);
        if let Ok(mut input) = self.input.try_lock() {
            *input = None;
        }
    }

    /// Whether the host asked for its stdin to stay open past the connection.
    pub fn keeps_input(&self) -> bool {
        self.keep.stdin == agent::KeptStdin::Kept
    }

    /// Keeps the write end of its stdin open past the connection that started it.
    pub fn keep_input(&self, pipe: Box<dyn Write + Send>) {
        *lock(&self.input) = Some(pipe);
        self.input_open.store(true, Ordering::SeqCst);
    }

    /// Writes `data` to its kept stdin; an empty `data` ends the input. False once the input
    /// is closed: ended so, by the command's end, or by the command no longer reading.
    pub fn write_input(&self, data: &[u8]) -> bool {
        let mut input = lock(&self.input);
        let Some(pipe) = input.as_mut().filter(|_| self.input_open.load(Ordering::SeqCst)) else {
            *input = None;
            return false;
        };
        if data.is_empty() || pipe.write_all(data).is_err() {
            // Listed closed before the command can see its end.
            self.input_open.store(false, Ordering::SeqCst);
            *input = None;
            return false;
        }
        true
    }

    /// A host has its EXIT: the entry goes (unless a later command took its id).
    pub fn delivered(&self) {
        let mut table = lock(table());
        let key = key(&self.scope, self.keep.id);
        if table.get(&key).is_some_and(|e| e.serial == self.serial) {
            table.remove(&key);
        }
    }
}

/// The kept commands of `scope`, for `kept`.
pub fn list(scope: &str) -> Vec<KeptInfo> {
    let table = lock(table());
    let mut out: Vec<KeptInfo> = table
        .values()
        .filter(|e| e.scope == scope)
        .map(|e| {
            let state = lock(&e.state);
            KeptInfo {
                keep: e.keep,
                argv: e.argv.clone(),
                elapsed_ms: u64::try_from(e.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                ended: state.exit.is_some(),
                gap: state.gap,
                input_open: e.input_open.load(Ordering::SeqCst),
            }
        })
        .collect();
    out.sort_by_key(|i| i.keep.id);
    out
}

/// Kills kept command `id`'s process group; whether the agent keeps it.
pub fn kill(scope: &str, id: u64) -> bool {
    let Some(exec) = lock(table()).get(&key(scope, id)).cloned() else { return false };
    exec.kill();
    true
}

/// Kills every command kept in `scope` and forgets them (its container is destroyed).
pub fn forget_scope(scope: &str) {
    let mut gone = Vec::new();
    lock(table()).retain(|_, e| {
        let keep = e.scope != scope;
        if !keep {
            gone.push(e.clone());
        }
        keep
    });
    for exec in gone {
        exec.kill();
    }
}

impl KeptExec {
    /// Kills it and what it started, unless it has ended (its group and cgroup may be
    /// another's by then). The state stays locked meanwhile, so it cannot end halfway.
    fn kill(&self) {
        let mut state = lock(&self.state);
        if state.exit.is_some() {
            return;
        }
        if self.group > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-self.group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(tree_kill) = state.tree_kill.take() {
            tree_kill();
        }
    }
}

/// Sends kept command `id`'s output from its first byte, then what follows, then its end,
/// to `out`; stops early when the host hangs up (`reader` reaches its end). With `input`, the
/// IN_STDIN frames on `reader` go to the command's kept stdin.
pub fn attach(
    scope: &str,
    id: u64,
    mut reader: impl Read + Send + 'static,
    out: &Mutex<std::fs::File>,
    input: bool,
) -> std::io::Result<()> {
    let Some(exec) = lock(table()).get(&key(scope, id)).cloned() else {
        crate::frame(out, agent::STDERR, format!("brig-agent: no kept command {id}\n").as_bytes())?;
        return crate::frame(out, agent::EXIT, &1i32.to_le_bytes());
    };
    let hung_up = Arc::new(AtomicBool::new(false));
    {
        let (exec, hung_up) = (exec.clone(), hung_up.clone());
        std::thread::spawn(move || {
            if input {
                let mut open = true;
                // A frame over the size cap ends the connection, as a hang-up does.
                while let Ok((kind, data)) = agent::read_frame(&mut reader) {
                    if kind == agent::IN_STDIN && open {
                        open = exec.write_input(&data);
                    }
                }
            } else {
                let mut byte = [0u8; 1];
                while matches!(reader.read(&mut byte), Ok(n) if n > 0) {}
            }
            hung_up.store(true, Ordering::SeqCst);
            let _state = lock(&exec.state);
            exec.changed.notify_all();
        });
    }
    let mut next = 0;
    loop {
        let (batch, exit) = {
            let mut state = lock(&exec.state);
            while next == state.frames.len()
                && state.exit.is_none()
                && !hung_up.load(Ordering::SeqCst)
            {
                state = exec
                    .changed
                    .wait_timeout(state, Duration::from_secs(1))
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            (state.frames[next..].to_vec(), state.exit)
        };
        if hung_up.load(Ordering::SeqCst) {
            return Ok(());
        }
        next += batch.len();
        for (kind, data) in &batch {
            crate::frame(out, *kind, data)?;
        }
        if let Some((kind, status)) = exit {
            if batch.is_empty() {
                crate::frame(out, kind, &status.to_le_bytes())?;
                exec.delivered();
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two containers' commands under one id are two commands: each is listed, killed and
    /// forgotten in its own scope only, and a tree kill does not outlive the command's end.
    #[test]
    fn each_container_has_its_own_command_ids() {
        let keep = KeepExec {
            id: 7,
            timeout_ms: 1000,
            output_limit: 1 << 10,
            stdin: agent::KeptStdin::EndsWithConnection,
            started: false,
        };
        let killed = Arc::new(AtomicBool::new(false));
        let tree_kill: TreeKill = {
            let killed = killed.clone();
            Box::new(move || killed.store(true, Ordering::SeqCst))
        };
        // Group 0: no process group is signalled.
        let a = register("t-sb-a", keep, &["sleep".into()], 0, Some(tree_kill)).expect("a");
        let b = register("t-sb-b", keep, &["true".into()], 0, None).expect("b");
        assert_eq!(list("t-sb-a").len(), 1);
        assert_eq!(list("t-sb-b")[0].argv, vec!["true".to_string()]);
        assert!(list("").iter().all(|i| i.keep.id != 7 || i.argv != ["sleep"]));

        b.finish(agent::EXIT, 0);
        assert!(kill("t-sb-b", 7), "an ended command is still kept until read");
        assert!(!killed.load(Ordering::SeqCst));
        assert!(kill("t-sb-a", 7));
        assert!(killed.load(Ordering::SeqCst), "the tree kill ran");

        forget_scope("t-sb-a");
        assert!(list("t-sb-a").is_empty());
        assert_eq!(list("t-sb-b").len(), 1);
        b.delivered();
        assert!(list("t-sb-b").is_empty());
        drop(a);
    }

    /// A kept command's stdin outlives the connection that fed it: a host attached again with
    /// `input` writes on, an empty frame ends it (the command reads end of file), and the
    /// listing says whether it is open.
    #[test]
    fn a_kept_stdin_is_written_again_through_an_attach() {
        use std::os::fd::OwnedFd;
        use std::os::unix::net::UnixStream;
        use std::process::{Command, Stdio};
        let keep = KeepExec {
            id: 8,
            timeout_ms: 10_000,
            output_limit: 1 << 10,
            stdin: agent::KeptStdin::Kept,
            started: true,
        };
        let mut cat =
            Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("cat");
        let exec = register("t-input", keep, &["cat".into()], 0, None).expect("kept");
        assert!(exec.keeps_input());
        assert!(!list("t-input")[0].input_open, "nothing kept yet");
        exec.keep_input(Box::new(cat.stdin.take().expect("stdin")));
        assert!(exec.write_input(b"one\n"), "the first connection's write");
        assert!(list("t-input")[0].input_open);

        // The first connection is gone; a host attaches again with input.
        let (mut host, agent_end) = UnixStream::pair().expect("pair");
        let reader = agent_end.try_clone().expect("clone");
        let out = Mutex::new(std::fs::File::from(OwnedFd::from(agent_end)));
        let attached = std::thread::spawn(move || attach("t-input", 8, reader, &out, true));
        agent::write_frame(&mut host, agent::IN_STDIN, b"two\n").expect("write");
        agent::write_frame(&mut host, agent::IN_STDIN, b"").expect("end the input");
        let mut echoed = String::new();
        cat.stdout.take().expect("stdout").read_to_string(&mut echoed).expect("read cat");
        assert_eq!(echoed, "one\ntwo\n", "cat read both connections' input, then its end");
        assert!(!list("t-input")[0].input_open, "ended by the empty frame");
        assert!(!exec.write_input(b"three\n"), "a closed stdin takes nothing");

        let status = cat.wait().expect("wait");
        exec.finish(agent::EXIT, status.code().unwrap_or(-1));
        let (kind, data) = agent::read_frame(&mut host).expect("the end");
        assert_eq!((kind, agent::status_of(&data)), (agent::EXIT, 0));
        attached.join().expect("join").expect("attach");
        assert!(list("t-input").is_empty(), "forgotten once its end was read");
    }
}
