//! Commands kept for the host: started with `keep`, they outlive the connection that started
//! them (the host may restart meanwhile). Each keeps its output frames (up to
//! `MAX_KEPT_OUTPUT`) and its status; a host reads one again from its first byte with
//! `attach`, and an entry goes once a host has read its EXIT, or [`FORGET_AFTER`] after it
//! ended unread. All kept output together is capped at [`MAX_TOTAL`] (the guest's memory).

/// How long an ended command nobody read to its end is kept.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Output kept for all commands together.
const MAX_TOTAL: usize = 32 << 20;
static TOTAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use brig_vmm_api::agent::{self, KeepExec, KeptInfo, MAX_KEPT, MAX_KEPT_OUTPUT};

/// One kept command.
pub struct KeptExec {
    /// Tells this entry from a later one under the same id.
    serial: u64,
    keep: KeepExec,
    argv: Vec<String>,
    started: Instant,
    /// Its process group.
    group: i32,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    frames: Vec<(u8, Vec<u8>)>,
    bytes: usize,
    gap: bool,
    /// The EXIT or SIGNALED frame, once it ended, and when.
    exit: Option<(u8, i32)>,
    ended: Option<Instant>,
}

impl Drop for KeptExec {
    fn drop(&mut self) {
        let bytes = lock(&self.state).bytes;
        TOTAL.fetch_sub(bytes, Ordering::Relaxed);
    }
}

fn table() -> &'static Mutex<HashMap<u64, Arc<KeptExec>>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, Arc<KeptExec>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps the command `keep` names (process group `group`); none when the agent keeps
/// [`MAX_KEPT`] already (it then runs as if not kept).
pub fn register(keep: KeepExec, argv: &[String], group: i32) -> Option<Arc<KeptExec>> {
    let mut table = lock(table());
    table.retain(|_, e| lock(&e.state).ended.is_none_or(|t| t.elapsed() < FORGET_AFTER));
    if table.len() >= MAX_KEPT && !table.contains_key(&keep.id) {
        return None;
    }
    let argv = argv.iter().take(16).map(|a| a.chars().take(256).collect()).collect();
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let exec = Arc::new(KeptExec {
        serial: SERIAL.fetch_add(1, Ordering::Relaxed),
        keep,
        argv,
        started: Instant::now(),
        group,
        state: Mutex::default(),
        changed: Condvar::new(),
    });
    table.insert(keep.id, exec.clone());
    Some(exec)
}

impl KeptExec {
    /// Keeps an output frame (past the cap, notes the gap instead).
    pub fn record(&self, kind: u8, data: &[u8]) {
        let mut state = lock(&self.state);
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
        drop(state);
        self.changed.notify_all();
    }

    /// A host has its EXIT: the entry goes (unless a later command took its id).
    pub fn delivered(&self) {
        let mut table = lock(table());
        if table.get(&self.keep.id).is_some_and(|e| e.serial == self.serial) {
            table.remove(&self.keep.id);
        }
    }
}

/// The kept commands, for `kept`.
pub fn list() -> Vec<KeptInfo> {
    let table = lock(table());
    let mut out: Vec<KeptInfo> = table
        .values()
        .map(|e| {
            let state = lock(&e.state);
            KeptInfo {
                keep: e.keep,
                argv: e.argv.clone(),
                elapsed_ms: u64::try_from(e.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                ended: state.exit.is_some(),
                gap: state.gap,
            }
        })
        .collect();
    out.sort_by_key(|i| i.keep.id);
    out
}

/// Kills kept command `id`'s process group; whether the agent keeps it.
pub fn kill(id: u64) -> bool {
    let Some(exec) = lock(table()).get(&id).cloned() else { return false };
    if exec.group > 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-exec.group),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    true
}

/// Sends kept command `id`'s output from its first byte, then what follows, then its end,
/// to `out`; stops early when the host hangs up (`reader` reaches its end).
pub fn attach(
    id: u64,
    mut reader: impl Read + Send + 'static,
    out: &Mutex<std::fs::File>,
) -> std::io::Result<()> {
    let Some(exec) = lock(table()).get(&id).cloned() else {
        crate::frame(out, agent::STDERR, format!("brig-agent: no kept command {id}\n").as_bytes())?;
        return crate::frame(out, agent::EXIT, &1i32.to_le_bytes());
    };
    let hung_up = Arc::new(AtomicBool::new(false));
    {
        let (exec, hung_up) = (exec.clone(), hung_up.clone());
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            while matches!(reader.read(&mut byte), Ok(n) if n > 0) {}
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
