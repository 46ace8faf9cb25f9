//! A container session's record on disk, so a restarted node takes the session back
//! (`crate::session`, `crate::kept`), and how to tell from the outside whether its shell is
//! between commands.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use brig_hostkit::slot_file::SlotFile;

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
/// `read` of it, or polling) with fd 0 being the command pipe `pipe` (the driver reads
/// commands with `<&3`, which puts that pipe on fd 0 for the read) and nothing in the pipe, in
/// any of `samples` looks 5 ms apart, so a shell between writing one command's report and
/// reading the next counts as idle. A command written to the pipe that the shell has not read
/// yet (a slow or just-resumed guest has not run it) is not idle.
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
        if on_pipe && waiting && !unread_input(pid) {
            return true;
        }
    }
    false
}

/// Whether the shell `pid`'s fd 0 holds bytes it has not read (looked at through a reader of
/// its own, opened by `/proc`; one that cannot be opened counts as empty).
fn unread_input(pid: i32) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/0"))
        .is_ok_and(|reader| rustix::io::ioctl_fionread(&reader).is_ok_and(|n| n > 0))
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
/// finish, removed when the session closes. It is rewritten in place (`brig_hostkit::slot_file`): a
/// new file renamed over it at every command cost an inode and a block each time.
pub struct SessionJournal {
    path: PathBuf,
    record: parking_lot::Mutex<SessionRecord>,
    /// The newest slot's sequence number; `None` after a restart until the first save reads
    /// it. The file is opened per save, not held: a node may hold thousands of sessions.
    seq: parking_lot::Mutex<Option<u64>>,
}

/// Largest session record read back (a file of the format before slots).
const MAX_RECORD_BYTES: u64 = 64 << 10;

impl SessionJournal {
    pub(crate) fn create(dir: &Path, record: SessionRecord) -> std::io::Result<SessionJournal> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.json", record.session_id));
        let seq = SlotFile::create(&path)?.seq();
        let journal = SessionJournal { path, record: record.into(), seq: Some(seq).into() };
        journal.save()?;
        Ok(journal)
    }

    /// Writes the record; the record's lock is held to the write, so concurrent saves (a
    /// command starting while the last one's report is read) land in the order they were made.
    fn save(&self) -> std::io::Result<()> {
        let record = self.record.lock();
        let bytes = serde_json::to_vec(&*record).map_err(std::io::Error::other)?;
        // Not made again once removed: a session closed while a save raced it stays closed.
        let mut seq = self.seq.lock();
        let mut file = match *seq {
            Some(last) => SlotFile::at(&self.path, last)?,
            None => SlotFile::open(&self.path)?,
        };
        file.write(&bytes)?;
        *seq = Some(file.seq());
        Ok(())
    }

    /// The journal of a session taken back after a restart.
    pub(crate) fn reopen(dir: &Path, record: SessionRecord) -> SessionJournal {
        let path = dir.join(format!("{}.json", record.session_id));
        SessionJournal { path, record: record.into(), seq: None.into() }
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
            let read = read_record(&path);
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

/// A record file: its newest slot, or the whole file as JSON (the format before slots).
fn read_record(path: &Path) -> std::io::Result<SessionRecord> {
    let bytes = brig_hostkit::slot_file::read_record(path, MAX_RECORD_BYTES)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};

    #[test]
    fn a_record_is_rewritten_in_place_and_read_back_also_in_the_old_format() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let record = |id: &str| SessionRecord {
            session_id: id.into(),
            spawn_id: 7,
            cgroup: "brig/sb-1/e7".into(),
            running: None,
            next: "n0".into(),
        };
        let journal = SessionJournal::create(dir.path(), record("s1")).expect("create");
        let path = dir.path().join("s1.json");
        let ino = std::fs::metadata(&path).expect("stat").ino();
        for nonce in [Some("a"), None, Some("b")] {
            journal.running(nonce);
        }
        assert_eq!(std::fs::metadata(&path).expect("stat").ino(), ino, "the same file");
        let running = |id: &str, nonce: Option<&str>| SessionRecord {
            running: nonce.map(str::to_string),
            ..record(id)
        };
        assert_eq!(SessionJournal::read_all(dir.path()), vec![running("s1", Some("b"))]);
        // A restarted node takes it back and goes on writing it.
        let again = SessionJournal::reopen(dir.path(), running("s1", Some("b")));
        again.running(None);
        assert_eq!(SessionJournal::read_all(dir.path()), vec![running("s1", None)]);
        // A record a node before slots wrote is read too.
        let old = serde_json::to_vec(&record("s2")).expect("json");
        std::fs::write(dir.path().join("s2.json"), old).expect("write");
        let mut all = SessionJournal::read_all(dir.path());
        all.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        assert_eq!(all, vec![running("s1", None), record("s2")]);
        // Closed, it is not made again by a save that comes after.
        again.remove();
        again.running(Some("c"));
        assert!(!path.exists());
    }

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

    /// A busybox shell running `script` with a pipe as stdin (and stdout piped), seen idle,
    /// then stopped: the shell, its pid, the pipe's name and its write end.
    fn stopped_while_idle(script: &str) -> (std::process::Child, i32, String, OwnedFd) {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let pipe = pipe_name(&read).expect("pipe name");
        let shell = std::process::Command::new("busybox")
            .args(["sh", "-c", script])
            .stdin(std::process::Stdio::from(read))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("busybox sh");
        let pid = i32::try_from(shell.id()).expect("pid");
        assert!(probe_says(pid, &pipe, true), "{}", shell_state(pid));
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("stop");
        std::thread::sleep(Duration::from_millis(50));
        (shell, pid, pipe, write)
    }

    /// A shell waiting for its next command is seen as idle, also after a stop and continue
    /// (what a pause and resume of its sandbox does), when its poll goes on as
    /// `restart_syscall`; a chaos run found a session stuck as running after exactly that.
    #[test]
    fn a_shell_polling_for_input_is_idle_also_after_a_stop() {
        let (mut shell, pid, pipe, _write) = stopped_while_idle("read -r line");
        kill(Pid::from_raw(pid), Signal::SIGCONT).expect("continue");
        assert!(probe_says(pid, &pipe, true), "after a stop: {}", shell_state(pid));
        let _ = shell.kill();
        let _ = shell.wait();
    }

    /// A command in the pipe that the shell has not read yet is not idle: the shell, blocked
    /// reading, is stopped before it runs again (as a slow or just-resumed guest leaves it).
    #[test]
    fn a_shell_with_an_unread_command_is_not_idle() {
        let (shell, pid, pipe, write) = stopped_while_idle("read -r line; echo \"$line\"");
        nix::unistd::write(&write, b"echo hi\n").expect("a command");
        assert!(
            !shell_waits_for_command(pid, &pipe, 3),
            "idle with a command unread: {}",
            shell_state(pid)
        );
        kill(Pid::from_raw(pid), Signal::SIGCONT).expect("continue");
        let out = shell.wait_with_output().expect("the shell's end");
        assert_eq!(out.stdout, b"echo hi\n");
    }
}
