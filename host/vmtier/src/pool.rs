//! Warm VMMs: `brig-vmm standby` processes started ahead, already jailed and with their KVM VM
//! and guest memory created, each waiting on stdin for the snapshot to resume. Taking one
//! skips process start, KVM VM creation and the memory mapping on the path to a running
//! sandbox (with the purpose-built guest, `brig-bench microvm` measures ~0.4 ms into a waiting
//! VM against ~2 ms for a fresh process). A waiting VMM holds almost no memory: its guest
//! memory is reserved, not touched. The pool refills as VMMs are taken.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use brig_vmm_api::launch::LaunchConfig;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};

use crate::{io, locked, VmTier, VmTierError};

/// One waiting VMM, killed if dropped still waiting (a VMM it became is not: a VM the node
/// keeps outlives the daemon).
#[derive(Debug)]
pub(crate) struct Standby {
    child: Option<Child>,
    stdin: ChildStdin,
    /// Its console log and pid file, renamed to the VM's when it is taken.
    pub log: PathBuf,
    pub pid_file: PathBuf,
}

impl Standby {
    /// Hands the waiting VMM its launch (a resume, no tap); it restores and runs from there.
    pub async fn resume(mut self, launch: &LaunchConfig) -> Result<Child, VmTierError> {
        let line = launch.to_line();
        self.stdin.write_all(line.as_bytes()).await.map_err(io("handing a warm VMM its VM"))?;
        self.child.take().ok_or_else(|| VmTierError::Agent("a warm VMM taken twice".into()))
    }

    /// Its pid, while it waits.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    fn waiting(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

impl VmTier {
    /// Starts one waiting VMM.
    fn start_standby(&self) -> Result<Standby, VmTierError> {
        let n = self.next_standby.fetch_add(1, Ordering::Relaxed);
        let name = format!("standby-{n}");
        let log = self.cfg.dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).map_err(io("standby log"))?;
        let mut child = tokio::process::Command::new(&self.cfg.vmm)
            .arg("standby")
            .args(["--mem-mib", &self.cfg.mem_mib.to_string()])
            .args(["--vcpus", &self.cfg.vcpus.to_string()])
            .arg("--jail")
            .arg("--jail-writable")
            .arg(&self.cfg.dir)
            .stdin(std::process::Stdio::piped())
            .stdout(log_file.try_clone().map_err(io("standby log"))?)
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .map_err(io(format!("starting {}", self.cfg.vmm.display())))?;
        let stdin = child.stdin.take().ok_or_else(|| VmTierError::Agent("no stdin".into()))?;
        let pid_file = self.cfg.dir.join(format!("{name}.pid"));
        if let Some(id) = child.id().and_then(crate::VmmId::of) {
            let _ = id.write(&pid_file);
        }
        Ok(Standby { child: Some(child), stdin, log, pid_file })
    }

    /// Tops the pool up to its size.
    pub(crate) fn refill(&self) {
        while locked(&self.pool).len() < self.cfg.warm {
            match self.start_standby() {
                Ok(standby) => locked(&self.pool).push(standby),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a warm VMM");
                    return;
                }
            }
        }
    }

    /// A waiting VMM that is still alive, if the pool has one.
    pub(crate) fn take_standby(&self) -> Option<Standby> {
        loop {
            let mut standby = locked(&self.pool).pop()?;
            if standby.waiting() {
                return Some(standby);
            }
            tracing::warn!(log = %standby.log.display(), "a warm VMM died while waiting");
            let _ = std::fs::remove_file(&standby.pid_file);
        }
    }
}
