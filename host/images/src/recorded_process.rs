//! Processes brigd starts and records in the run directory (the lazy file system's server and
//! its device keeper), so that a restarted brigd can prove one is its own before it adopts it:
//! the same pid with the same start time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long brigd waits for a process it killed to be gone.
const END_DEADLINE: Duration = Duration::from_secs(5);

/// A process brigd started and recorded, so that a restarted brigd can prove it is its own.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct PidRecord {
    pub(crate) pid: i32,
    pub(crate) start_time: u64,
}

impl PidRecord {
    /// `pid`, with the start time it has now (`None` if it is gone).
    pub(crate) fn of(pid: i32) -> Option<PidRecord> {
        start_time(pid).map(|start_time| PidRecord { pid, start_time })
    }

    /// Still this process: same pid, same start time, not a zombie.
    pub(crate) fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }

    /// Kills the process if it is still this one and waits (bounded) until it is gone; `false`
    /// if it is still there.
    pub(crate) fn end(&self) -> bool {
        if self.alive() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let gone = Instant::now() + END_DEADLINE;
        while self.alive() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(10));
        }
        !self.alive()
    }
}

/// The start time of `pid` (clock ticks since boot, field 22 of `/proc/<pid>/stat`); `None`
/// if it is gone or dead and not yet reaped (a zombie serves nothing). brig-container's
/// `process_start_time` reads the same field but counts zombies; this crate depends on no
/// other Brig crate.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Writes `value` as JSON to `path` whole (`<path>.tmp` renamed over it).
pub(crate) fn write_record(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_has_no_start_time_and_a_live_process_does() {
        let mut child = std::process::Command::new("sleep").arg("10").spawn().expect("sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let own = start_time(i32::try_from(std::process::id()).expect("pid"));
        assert!(own.is_some_and(|t| t > 0));
        assert!(start_time(pid).is_some());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
            .expect("kill");
        // Not reaped yet: a zombie.
        let deadline = Instant::now() + Duration::from_secs(5);
        while start_time(pid).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(start_time(pid).is_none(), "a zombie counted as alive");
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "reaped too early");
        child.wait().expect("reap");
    }
}
