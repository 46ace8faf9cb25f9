//! The lazy file system's device keeper: a small process of its own (`brig-lazyfs
//! --keep-device`) that holds one more copy of the mount's `/dev/fuse` file and does nothing
//! else. The kernel keeps a FUSE connection, with the reads queued on it, while any copy of
//! its device file is open. brigd holds one, so a server that dies alone is taken over
//! (`crate::lazy_server`); the keeper holds one for when brigd and the server die together
//! (an OOM kill of both, a node agent killing the group): the restarted brigd takes a copy
//! from the keeper and starts a server that takes the mount over, instead of mounting afresh
//! under containers whose layers then fail to read the pages they had not read yet.
//!
//! It is recorded in `<run>/lazyfs.keeper` (pid, start time, and which descriptor is the
//! device), adopted by a restarted brigd when that pid still has that start time, and ended
//! when its connection is given up (the server mounted afresh, or stopped).

use std::io::BufRead;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::fuse_takeover::copy_descriptor;
use crate::recorded_process::{write_record, PidRecord};

/// How long a new keeper has to take its copy and say which descriptor it is.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// What `<run>/lazyfs.keeper` says.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
struct KeeperRecord {
    #[serde(flatten)]
    process: PidRecord,
    /// The keeper's descriptor of the device.
    fd: RawFd,
}

/// What a new keeper prints on its stdout once it holds the device: one JSON line.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeeperReady {
    pub fd: RawFd,
}

/// A running device keeper.
#[derive(Debug)]
pub struct DeviceKeeper {
    record: KeeperRecord,
    path: PathBuf,
}

impl DeviceKeeper {
    /// The keeper recorded at `path`, if it still runs (the same pid with the same start time).
    pub fn adopt(path: &Path) -> Option<DeviceKeeper> {
        let bytes = std::fs::read(path).ok()?;
        let record: KeeperRecord = serde_json::from_slice(&bytes).ok()?;
        record.process.alive().then(|| DeviceKeeper { record, path: path.to_owned() })
    }

    /// Starts `binary --keep-device` with a copy of this process's `device`, its log appended
    /// to `log`, and records it at `path`.
    pub fn start(
        binary: &Path,
        device: &OwnedFd,
        path: &Path,
        log: &Path,
    ) -> std::io::Result<DeviceKeeper> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let mut child = std::process::Command::new(binary)
            .arg("--keep-device")
            .arg(format!("{}:{}", std::process::id(), device.as_raw_fd()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            // brigd's death (its process group killed) does not reach it.
            .process_group(0)
            .spawn()?;
        let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?;
        // The line is read on a thread of its own, so that a keeper that never writes it
        // cannot hold brigd past the deadline.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read =
                std::io::BufReader::new(std::io::Read::take(stdout, 256)).read_line(&mut line);
            let _ = tx.send(read.map(|_| line));
        });
        let ready = match rx.recv_timeout(START_DEADLINE) {
            Ok(Ok(line)) => serde_json::from_str::<KeeperReady>(&line)
                .map_err(|e| std::io::Error::other(format!("the keeper said {line:?}: {e}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other("the keeper did not answer in time")),
        };
        let pid = i32::try_from(child.id()).map_err(std::io::Error::other)?;
        let process = PidRecord::of(pid).filter(|_| ready.is_ok());
        let (ready, process) = match (ready, process) {
            (Ok(ready), Some(process)) => (ready, process),
            (failed, _) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed.err().unwrap_or_else(|| std::io::Error::other("it exited")));
            }
        };
        // Reaps it if it ends while this brigd runs; a later brigd is not its parent.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        let record = KeeperRecord { process, fd: ready.fd };
        let keeper = DeviceKeeper { record, path: path.to_owned() };
        if let Err(e) = write_record(path, &record) {
            keeper.end();
            return Err(e);
        }
        Ok(keeper)
    }

    pub fn pid(&self) -> i32 {
        self.record.process.pid
    }

    pub fn alive(&self) -> bool {
        self.record.process.alive()
    }

    /// A copy of the device it keeps.
    pub fn device(&self) -> std::io::Result<OwnedFd> {
        if !self.alive() {
            return Err(std::io::Error::other("the device keeper is gone"));
        }
        copy_descriptor(self.record.process.pid, self.record.fd)
    }

    /// Ends it (its copy of the device closes) and removes its record.
    pub fn end(self) {
        if !self.record.process.end() {
            tracing::warn!(pid = self.pid(), "the lazy file system's device keeper did not end");
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The keeper's side (`brig-lazyfs --keep-device PID:FD`): takes a copy of `pid`'s descriptor
/// `fd`, says which descriptor it is on stdout, and holds it until killed.
pub fn keep_device(pid: i32, fd: RawFd) -> std::io::Result<()> {
    use std::io::Write;
    let device = copy_descriptor(pid, fd)?;
    let ready = serde_json::to_string(&KeeperReady { fd: device.as_raw_fd() })?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{ready}")?;
    stdout.flush()?;
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_another_process_is_not_adopted() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("lazyfs.keeper");
        let me = PidRecord::of(i32::try_from(std::process::id()).expect("pid")).expect("me");
        let stale =
            KeeperRecord { process: PidRecord { start_time: me.start_time + 1, ..me }, fd: 3 };
        write_record(&path, &stale).expect("write");
        assert!(DeviceKeeper::adopt(&path).is_none(), "another start time is another process");
        write_record(&path, &KeeperRecord { process: me, fd: 3 }).expect("write");
        assert_eq!(DeviceKeeper::adopt(&path).expect("adopted").pid(), me.pid);
        std::fs::write(&path, b"{").expect("write");
        assert!(DeviceKeeper::adopt(&path).is_none(), "a torn record is no keeper");
    }
}
