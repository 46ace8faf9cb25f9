//! A VM's VMM process: one this daemon started (its child, which it can wait for) or one a
//! daemon before it started and this one adopted (known by pid and start time only).
//!
//! A VMM is told from a later process given the same pid by its start time (clock ticks after
//! boot), which its pid file `<id>.pid` holds beside the pid: `"<pid> <start>\n"`.

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use brig_container::runtime::process_start_time;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running VMM.
#[derive(Debug)]
pub(crate) enum VmmProcess {
    /// Started by this daemon.
    Started(tokio::process::Child),
    /// Started by an earlier daemon, proven the same process (see [`VmTier::adopt`]).
    ///
    /// [`VmTier::adopt`]: crate::VmTier::adopt
    Adopted(VmmId),
}

/// A process's pid and start time: the pair names one process for the host's uptime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmId {
    pub pid: u32,
    pub start: u64,
}

impl VmmId {
    /// The process now running as `pid`.
    pub fn of(pid: u32) -> Option<VmmId> {
        let start = process_start_time(i32::try_from(pid).ok()?)?;
        Some(VmmId { pid, start })
    }

    /// Whether this process still runs: the pid has the same start time and is not a zombie
    /// (one read of its stat: requests to a VM ask this first).
    pub fn alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        // After the command name's closing parenthesis: the state (Z is a zombie) first, the
        // start time 20 fields on (field 22 of the whole line).
        let Some((_, rest)) = stat.rsplit_once(')') else { return false };
        let mut fields = rest.split_whitespace();
        let running = fields.next().is_some_and(|state| !matches!(state, "Z" | "X"));
        running && fields.nth(18).and_then(|s| s.parse().ok()) == Some(self.start)
    }

    /// SIGKILL, only if it is still this process.
    pub fn kill(&self) {
        if self.alive() {
            if let Ok(pid) = i32::try_from(self.pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }

    /// Waits until it has ended (or is a zombie nobody here can reap), at most `limit`;
    /// whether it ended.
    pub async fn ended_within(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while self.alive() {
            if started.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Writes the pid file at `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, format!("{} {}\n", self.pid, self.start))
    }

    /// The pid file at `path`: pid and start time (a pid alone, from older daemons, has start
    /// time 0, which no live process matches).
    pub fn read(path: &Path) -> Option<VmmId> {
        let text = std::fs::read(path).ok()?;
        if text.len() > 64 {
            return None;
        }
        let text = String::from_utf8(text).ok()?;
        let mut fields = text.split_whitespace();
        let pid = fields.next()?.parse().ok()?;
        let start = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        Some(VmmId { pid, start })
    }
}

/// How long a killed VMM gets to end before the caller goes on without it.
const KILL_LIMIT: Duration = Duration::from_secs(10);

impl VmmProcess {
    /// A VMM this daemon just spawned.
    pub fn started(child: tokio::process::Child) -> (VmmProcess, Option<VmmId>) {
        let id = child.id().and_then(VmmId::of);
        (VmmProcess::Started(child), id)
    }

    /// How it ended, if it has and this daemon can know (an adopted VMM's status went to its
    /// old parent).
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        match self {
            VmmProcess::Started(child) => child.try_wait().ok().flatten(),
            VmmProcess::Adopted(_) => None,
        }
    }

    /// Waits for it to end by itself, at most `limit`; then kills it.
    pub async fn end_within(&mut self, limit: Duration) {
        match self {
            VmmProcess::Started(child) => {
                if tokio::time::timeout(limit, child.wait()).await.is_err() {
                    let _ = child.start_kill();
                    // A process stuck in the kernel (uninterruptible sleep) does not die of
                    // SIGKILL until it leaves it: the caller is not held hostage by it.
                    if tokio::time::timeout(KILL_LIMIT, child.wait()).await.is_err() {
                        tracing::warn!(pid = ?child.id(), "a killed VMM has not ended; going on without it");
                    }
                }
            }
            VmmProcess::Adopted(id) => {
                if !id.ended_within(limit).await {
                    id.kill();
                    id.ended_within(KILL_LIMIT).await;
                }
            }
        }
    }

    /// Kills it and waits for it to end.
    pub async fn kill(&mut self) {
        self.end_within(Duration::ZERO).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_names_one_process() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("vm.pid");
        let me = VmmId::of(std::process::id()).expect("our own start time");
        me.write(&path).expect("pid file written");
        assert_eq!(VmmId::read(&path), Some(me));
        assert!(me.alive());
        // The same pid with another start time is another process.
        assert!(!VmmId { start: me.start + 1, ..me }.alive());
        // A pid file from before start times were kept proves nothing.
        std::fs::write(&path, format!("{}", me.pid)).expect("old pid file written");
        let old = VmmId::read(&path).expect("an old pid file is read");
        assert_eq!(old.start, 0);
        assert!(!old.alive());
        std::fs::write(&path, "x".repeat(100)).expect("long pid file written");
        assert_eq!(VmmId::read(&path), None);
    }

    #[tokio::test]
    async fn an_adopted_process_is_killed_and_seen_to_end() {
        // Not this test's child once it is "adopted": only pid and start time are used.
        let child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep started");
        let id = VmmId::of(child.id()).expect("its start time");
        let mut adopted = VmmProcess::Adopted(id);
        assert!(id.alive());
        // Reap it from a thread as its real parent would.
        let reaper = std::thread::spawn(move || {
            let mut child = child;
            child.wait()
        });
        adopted.kill().await;
        assert!(!id.alive());
        assert!(reaper.join().expect("reaper thread").is_ok());
        assert_eq!(adopted.try_exit_status(), None);
    }
}
