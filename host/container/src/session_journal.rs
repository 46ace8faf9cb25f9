//! A container session's record on disk, so a restarted node takes the session back
//! (`crate::session`, `crate::kept`), and how to tell from the outside whether its shell is
//! between commands.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A random command nonce.
pub fn new_nonce() -> String {
    hex::encode(rand::random::<[u8; 12]>())
}

/// What a shell is doing, for the log: its state, wait channel and syscall.
pub fn shell_state(pid: i32) -> String {
    let read =
        |what: &str| std::fs::read_to_string(format!("/proc/{pid}/{what}")).unwrap_or_default();
    let stat = read("stat");
    let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()).unwrap_or("?");
    format!("state {state} wchan {} syscall {}", read("wchan").trim(), read("syscall").trim())
}

/// How `/proc/<pid>/fd/N` names the pipe `end` is an end of.
pub fn pipe_name(end: &OwnedFd) -> Option<String> {
    let stat = nix::sys::stat::fstat(end.as_fd()).ok()?;
    Some(format!("pipe:[{}]", stat.st_ino))
}

/// Syscalls a shell waits for input in, besides `read`. A poll that a stop or a freeze
/// interrupted (a pause of the sandbox) goes on as `restart_syscall`.
#[cfg(target_arch = "x86_64")]
const WAIT_SYSCALLS: [i64; 5] = [
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_restart_syscall,
];
#[cfg(not(target_arch = "x86_64"))]
const WAIT_SYSCALLS: [i64; 3] = [libc::SYS_ppoll, libc::SYS_pselect6, libc::SYS_restart_syscall];

/// Whether the session shell `pid` is blocked reading its next command: waiting on fd 0 (in
/// `read` of it, or polling) with fd 0 being the command pipe whose write end is `commands` (the driver reads commands
/// with `<&3`, which puts that pipe on fd 0 for the read), in any of `samples` looks 5 ms
/// apart, so a shell between writing one command's report and reading the next counts as
/// idle.
pub fn shell_waits_for_command(pid: i32, pipe: &str, samples: u32) -> bool {
    for attempt in 0..samples {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let on_pipe = std::fs::read_link(format!("/proc/{pid}/fd/0"))
            .is_ok_and(|target| target.as_os_str() == pipe);
        let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        let mut fields = syscall.split_whitespace();
        let number = fields.next().and_then(|n| n.parse::<i64>().ok());
        // bash reads fd 0 directly; busybox polls it first.
        let waiting = match number {
            Some(libc::SYS_read) => fields.next() == Some("0x0"),
            Some(n) => WAIT_SYSCALLS.contains(&n),
            None => false,
        };
        if on_pipe && waiting {
            return true;
        }
    }
    false
}

/// What a restarted node needs to take a container's session back: its shell (by the shim's
/// id and exec cgroup; the shim keeps the node's ends of its five pipes, `crate::kept`) and
/// the nonce of the command running in it, if any.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionRecord {
    pub session_id: String,
    pub spawn_id: u64,
    pub cgroup: String,
    pub running: Option<String>,
    /// The nonce the next command gets (drawn ahead, see [`SessionJournal::take_next`]).
    pub next: String,
}

/// A session's record on disk (`<spool>/sessions/<id>.json`), rewritten as commands start and
/// finish, removed when the session closes.
pub struct SessionJournal {
    path: PathBuf,
    record: parking_lot::Mutex<SessionRecord>,
}

/// Largest session record read back.
const MAX_RECORD_BYTES: u64 = 64 << 10;

impl SessionJournal {
    pub(crate) fn create(dir: &Path, record: SessionRecord) -> std::io::Result<SessionJournal> {
        std::fs::create_dir_all(dir)?;
        let name = format!("{}.json", record.session_id);
        let journal = SessionJournal { path: dir.join(name), record: record.into() };
        journal.save()?;
        Ok(journal)
    }

    /// Writes the record; the lock is held to the rename, so concurrent saves (a command
    /// starting while the last one's report is read) land in the order they were made.
    fn save(&self) -> std::io::Result<()> {
        let record = self.record.lock();
        let bytes = serde_json::to_vec(&*record).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// The journal of a session taken back after a restart.
    pub(crate) fn reopen(dir: &Path, record: SessionRecord) -> SessionJournal {
        let path = dir.join(format!("{}.json", record.session_id));
        SessionJournal { path, record: record.into() }
    }

    /// Draws a fresh next nonce (the recorded one may have been handed to the shell already).
    pub(crate) fn rotate_next(&self) {
        self.record.lock().next = new_nonce();
        if let Err(e) = self.save() {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record a session");
        }
    }

    /// The next command's nonce; a fresh one is drawn for the one after (recorded with the
    /// command's start by [`SessionJournal::running`]).
    pub(crate) fn take_next(&self) -> String {
        std::mem::replace(&mut self.record.lock().next, new_nonce())
    }

    /// Records the command now running (`None`: the shell is idle).
    pub(crate) fn running(&self, nonce: Option<&str>) {
        self.record.lock().running = nonce.map(str::to_string);
        if let Err(e) = self.save() {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record a session");
        }
    }

    /// The session's backlog file: output nobody waited for, at most `max_bytes` of it.
    pub(crate) fn backlog(&self, max_bytes: u64) -> crate::session_backlog::Backlog {
        crate::session_backlog::Backlog::new(self.path.with_extension("backlog"), max_bytes)
    }

    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(self.path.with_extension("backlog"));
    }

    /// Removes the record of session `session_id` in `dir` and its backlog (a session that
    /// cannot be taken back).
    pub fn forget(dir: &Path, session_id: &str) {
        let _ = std::fs::remove_file(dir.join(format!("{session_id}.json")));
        let _ = std::fs::remove_file(crate::session_backlog::path_in(dir, session_id));
    }

    /// The session records in `dir` (unreadable ones removed, and backlogs no record claims).
    pub fn read_all(dir: &Path) -> Vec<SessionRecord> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut out = Vec::new();
        let mut backlogs = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "backlog") {
                backlogs.push(path);
                continue;
            }
            let read = std::fs::File::open(&path).and_then(|f| {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(f, MAX_RECORD_BYTES),
                    &mut bytes,
                )?;
                serde_json::from_slice::<SessionRecord>(&bytes).map_err(std::io::Error::other)
            });
            match read {
                Ok(record) if path.extension().is_some_and(|e| e == "json") => out.push(record),
                _ => {
                    tracing::warn!(path = %path.display(), "removing an unreadable session record");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        for path in backlogs {
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            if !out.iter().any(|r| r.session_id == stem) {
                let _ = std::fs::remove_file(&path);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};

    /// Waits up to 5 s for the probe to say `want`.
    fn probe_says(pid: i32, pipe: &str, want: bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if shell_waits_for_command(pid, pipe, 1) == want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// A shell waiting for its next command is seen as idle, also after a stop and continue
    /// (what a pause and resume of its sandbox does), when its poll goes on as
    /// `restart_syscall`; a chaos run found a session stuck as running after exactly that.
    #[test]
    fn a_shell_polling_for_input_is_idle_also_after_a_stop() {
        let (read, _write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let pipe = pipe_name(&read).expect("pipe name");
        let mut shell = std::process::Command::new("busybox")
            .args(["sh", "-c", "read -r line"])
            .stdin(std::process::Stdio::from(read))
            .spawn()
            .expect("busybox sh");
        let pid = i32::try_from(shell.id()).expect("pid");
        assert!(probe_says(pid, &pipe, true), "{}", shell_state(pid));
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("stop");
        std::thread::sleep(Duration::from_millis(50));
        kill(Pid::from_raw(pid), Signal::SIGCONT).expect("continue");
        assert!(probe_says(pid, &pipe, true), "after a stop: {}", shell_state(pid));
        let _ = shell.kill();
        let _ = shell.wait();
    }
}
