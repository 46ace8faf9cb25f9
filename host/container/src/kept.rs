//! Commands that outlive the node: their shim holds a copy of the read ends of each command's
//! output ([`ToShim::SpawnKeeping`]), so a node that dies does not kill them with SIGPIPE (a
//! writer blocks on a full pipe instead), and hands the copies to the node that reconnects
//! ([`FromShim::ReattachedKeeping`], then one [`FromShim::KeptFds`] per command). The node
//! takes them back by exec id when it rebuilds the command from its spool (`crate::spool`).
//!
//! [`ToShim::SpawnKeeping`]: crate::shim_proto::ToShim::SpawnKeeping

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::runtime::RuntimeError;
use crate::shim_conn::ShimConn;
use crate::shim_proto::{ExitInfo, FromShim, KeptSpawn};

/// How long a reconnecting node waits for each kept command's descriptors.
const KEPT_FDS_TIMEOUT: Duration = Duration::from_secs(5);
/// Most descriptors one kept process has (a session shell's five pipes).
const MAX_KEPT_FDS: usize = 5;

/// A command started for an earlier run of the node, as its shim handed it back.
pub struct KeptOutput {
    /// Host pid.
    pub pid: i32,
    /// Its output's read ends: stdout then stderr, or its terminal.
    pub fds: Vec<OwnedFd>,
    /// The write end of its streamed stdin, while the node had it open.
    pub input: Option<OwnedFd>,
    /// Its exit, reported once (already sent if it ended while no node was connected).
    pub exit: oneshot::Receiver<ExitInfo>,
}

/// Receives the descriptors of each command in `kept`, in order, and registers for the exits
/// of those still running. Call before the connection's dispatcher runs.
pub(crate) async fn receive(
    shim: &Arc<ShimConn>,
    kept: Vec<KeptSpawn>,
) -> Result<HashMap<u64, KeptOutput>, RuntimeError> {
    let mut out = HashMap::with_capacity(kept.len());
    for spawn in kept {
        let (msg, fds) = tokio::time::timeout(KEPT_FDS_TIMEOUT, shim.recv_with_fds())
            .await
            .map_err(|_| RuntimeError::StartTimeout(KEPT_FDS_TIMEOUT))??;
        let with_input = match msg {
            FromShim::KeptFds { exec_id } if exec_id == spawn.exec_id => false,
            FromShim::KeptFdsInput { exec_id } if exec_id == spawn.exec_id => true,
            other => {
                let want = spawn.exec_id;
                return Err(RuntimeError::Setup(format!(
                    "shim sent {other:?} where the descriptors of command {want} belong"
                )));
            }
        };
        let mut fds = fds;
        if fds.len() <= usize::from(with_input) || fds.len() > MAX_KEPT_FDS {
            let n = fds.len();
            return Err(RuntimeError::Setup(format!("shim sent {n} descriptors for a command")));
        }
        let input = if with_input { fds.pop() } else { None };
        let exit = match spawn.exit {
            Some(status) => {
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(status);
                rx
            }
            None => shim.expect_exit(spawn.exec_id),
        };
        out.insert(spawn.exec_id, KeptOutput { pid: spawn.pid, fds, input, exit });
    }
    Ok(out)
}

impl crate::runtime::Container {
    /// Whether its spools are due a sweep of long-finished commands (at most once a minute:
    /// a sweep stats every spool); marks them swept.
    pub fn spool_sweep_due(&self) -> bool {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let now = EPOCH.get_or_init(std::time::Instant::now).elapsed().as_secs()
            + crate::runtime::SPOOL_SWEEP_SECS;
        let last = self.spool_swept.load(std::sync::atomic::Ordering::Relaxed);
        now >= last + crate::runtime::SPOOL_SWEEP_SECS
            && self
                .spool_swept
                .compare_exchange(
                    last,
                    now,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Notes that the command spooled at `path` finished: the oldest finished spools past
    /// [`crate::spool::FINISHED_KEPT`] are removed.
    pub fn spool_finished(&self, path: std::path::PathBuf) {
        self.finished_spools.push(path);
    }

    /// Takes back process `exec_id`, started for an earlier run of the node in exec cgroup
    /// `cgroup` ([`Process::cgroup_name`]): the process, its output's read ends and its
    /// stdin's write end if that was kept. `None` if its shim did not keep it.
    pub fn reclaim_process(
        &self,
        exec_id: u64,
        cgroup: &str,
    ) -> Option<(crate::runtime::Process, Vec<OwnedFd>, Option<OwnedFd>)> {
        let kept = self.kept.lock().remove(&exec_id)?;
        let Some(cgroup) = self.cgroup.exec_named(cgroup) else {
            tracing::warn!(
                container = self.name,
                exec_id,
                cgroup,
                "a kept process's exec cgroup is gone"
            );
            return None;
        };
        let pool = self.exec_cgroups.clone();
        let keeper = Some(self.shim.clone());
        let process = crate::runtime::Process {
            exec_id,
            pid: kept.pid,
            exit: kept.exit,
            cgroup,
            pool,
            keeper,
        };
        Some((process, kept.fds, kept.input))
    }

    /// Lets go of the kept processes nobody claimed (their output has nowhere to go: they get
    /// end of pipe on their next write, as if the node had not kept them).
    pub async fn release_unclaimed(&self) -> usize {
        let unclaimed: Vec<u64> = self.kept.lock().drain().map(|(id, _)| id).collect();
        for exec_id in &unclaimed {
            let _ =
                self.shim.send(&crate::shim_proto::ToShim::ReleaseKept { exec_id: *exec_id }).await;
        }
        unclaimed.len()
    }
}
