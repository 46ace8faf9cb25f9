//! A microVM's life beyond create and destroy, through its VMM's control socket:
//!
//! - **pause**: the VMM saves the VM (memory, vCPU and device state) under
//!   `saved/<id>-<n>/` and exits, so a paused VM holds no memory at all; its writable disk
//!   stays where it is. **resume** starts a VMM from that snapshot (memory mapped
//!   copy-on-write, as any spawn) and waits for the agent; the guest goes on where it stopped,
//!   processes and all.
//! - **fork**: the VMM saves the running VM and copies its writable disk while the vCPU is
//!   stopped, then lets it run on; each child resumes from that snapshot with its own copy of
//!   the disk and a fresh identity. The children share the snapshot's memory pages until they
//!   write them.
//! - **stats** and **reclaim**: memory the VMM holds, and the balloon (free-page reporting
//!   returns what the guest frees by itself; a target inflates the balloon to take more).
//!
//! Saved snapshots are counted by the VMs mapping them and removed when the last one goes.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use brig_vmm_api::control::{self as control_api, ControlReply, ControlRequest};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::{io, locked, Disks, MicroVm, VmNet, VmTier, VmTierError};

/// Under the tier's directory: snapshots saved by pauses and forks.
pub(crate) const SAVED_DIR: &str = "saved";

/// How long a VMM may take to save a VM.
const SAVE_LIMIT: Duration = Duration::from_secs(120);

/// What a VMM reports about its memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmStats {
    /// The VMM process's resident memory (guest memory it touched plus its own).
    pub rss_kib: u64,
    /// The balloon's target and what the guest says it holds.
    pub balloon_target_mib: u64,
    pub balloon_actual_mib: u64,
    /// Memory the guest reported free and the VMM discarded, in all.
    pub reported_mib: u64,
}

/// Sends one request to a VMM's control socket; its reply, or the error it gave. The reply is
/// read with a line cap and within `limit`: a VMM is no more trusted than its guest.
async fn control(
    path: &Path,
    request: &ControlRequest,
    limit: Duration,
) -> Result<ControlReply, VmTierError> {
    let exchange = async {
        let stream = UnixStream::connect(path)
            .await
            .map_err(io(format!("connecting to {}", path.display())))?;
        let (read, mut write) = stream.into_split();
        let line = control_api::encode_line(request);
        write.write_all(line.as_bytes()).await.map_err(io("control request"))?;
        let mut reply = Vec::new();
        BufReader::new(read)
            .take(control_api::MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut reply)
            .await
            .map_err(io("control reply"))?;
        Ok::<_, VmTierError>(reply)
    };
    let line = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| VmTierError::Control(format!("no answer to {request:?} in {limit:?}")))??;
    if line.is_empty() {
        return Err(VmTierError::Control(format!("the VMM closed the socket on {request:?}")));
    }
    let reply = std::str::from_utf8(&line)
        .map_err(|_| VmTierError::Control("a control reply that is not UTF-8".into()))
        .and_then(|l| {
            control_api::decode_line::<ControlReply>(l)
                .map_err(|e| VmTierError::Control(format!("unreadable control reply: {e}")))
        })?;
    match reply {
        ControlReply::Error { message } => Err(VmTierError::Control(message)),
        reply => Ok(reply),
    }
}

/// A reply of the wrong kind (a VMM that answers out of turn).
fn unexpected(request: &str, reply: &ControlReply) -> VmTierError {
    VmTierError::Control(format!("the VMM answered {request} with {reply:?}"))
}

impl VmTier {
    /// A new saved-snapshot directory for `id`.
    fn saved_dir(&self, id: &str) -> PathBuf {
        let n = self.next_saved.fetch_add(1, Ordering::Relaxed);
        self.cfg.dir.join(SAVED_DIR).join(format!("{id}-{n}"))
    }

    /// Counts `count` more VMs mapping saved snapshot `dir`.
    pub(crate) fn hold(&self, dir: &Path, count: usize) {
        *locked(&self.saved).entry(dir.to_owned()).or_default() += count;
    }

    /// One VM fewer maps `dir`; a saved snapshot nobody maps is removed (environment
    /// snapshots are not counted and stay).
    pub(crate) fn release(&self, dir: &Path) {
        let mut saved = locked(&self.saved);
        let Some(count) = saved.get_mut(dir) else { return };
        *count = count.saturating_sub(1);
        if *count == 0 {
            saved.remove(dir);
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Memory figures from `vm`'s VMM.
    pub async fn stats(&self, vm: &MicroVm) -> Result<VmStats, VmTierError> {
        if vm.is_paused() {
            return Ok(VmStats::default());
        }
        match control(&vm.control, &ControlRequest::Stats {}, Duration::from_secs(5)).await? {
            ControlReply::Stats { rss_kib, balloon } => {
                let balloon = balloon.unwrap_or_default();
                Ok(VmStats {
                    rss_kib,
                    balloon_target_mib: balloon.target_mib,
                    balloon_actual_mib: balloon.actual_mib,
                    reported_mib: balloon.reported_mib,
                })
            }
            other => Err(unexpected("stats", &other)),
        }
    }

    /// Asks `vm`'s guest to give up `mib` of memory into its balloon (0 gives it all back);
    /// the guest does so in its own time (see [`VmTier::stats`]).
    pub async fn set_balloon(&self, vm: &MicroVm, mib: u64) -> Result<(), VmTierError> {
        if vm.is_paused() {
            return Err(VmTierError::Paused);
        }
        let request = ControlRequest::Balloon { target_mib: mib };
        match control(&vm.control, &request, Duration::from_secs(5)).await? {
            ControlReply::Done => Ok(()),
            other => Err(unexpected("a balloon target", &other)),
        }
    }

    /// Saves `vm` and stops its VMM; returns the bytes of memory that frees.
    pub async fn pause(&self, vm: &MicroVm) -> Result<u64, VmTierError> {
        if vm.is_paused() {
            return Ok(0);
        }
        let freed = self.stats(vm).await.map(|s| s.rss_kib << 10).unwrap_or(0);
        // The agent's connections end with the VMM; its kept commands and sessions stay in the
        // saved guest, and the node takes them back after the resume (`recover_kept`). From
        // here a kept command's hang-up detaches it instead of ending it.
        vm.saving.store(true, Ordering::SeqCst);
        let dir = self.saved_dir(&vm.id);
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(io("saved snapshots"))?;
        }
        let saved =
            match control(&vm.control, &ControlRequest::Pause { dir: dir.clone() }, SAVE_LIMIT)
                .await
            {
                Ok(ControlReply::Saved { .. }) => Ok(()),
                Ok(other) => Err(unexpected("pause", &other)),
                Err(e) => Err(e),
            };
        if let Err(e) = saved {
            vm.saving.store(false, Ordering::SeqCst);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        vm.paused.store(true, Ordering::SeqCst);
        // The VMM exits on its own once it answered.
        if let Some(mut process) = vm.process.lock().await.take() {
            process.end_within(Duration::from_secs(10)).await;
        }
        *locked(&vm.pid) = None;
        let _ = std::fs::remove_file(self.cfg.dir.join(format!("{}.pid", vm.id)));
        self.remove_cgroup(&vm.id);
        self.hold(&dir, 1);
        let before = std::mem::replace(&mut *locked(&vm.memory_from), dir);
        self.release(&before);
        tracing::debug!(vm = %vm.id, freed, "microvm paused");
        Ok(freed)
    }

    /// Starts a paused `vm` again from where it stopped.
    pub async fn resume(&self, vm: &MicroVm) -> Result<(), VmTierError> {
        if !vm.is_paused() {
            return Ok(());
        }
        vm.paused.store(false, Ordering::SeqCst);
        if let Err(e) = self.spawn_vmm(vm).await {
            self.stop_vmm(vm).await;
            vm.paused.store(true, Ordering::SeqCst);
            return Err(e);
        }
        // Commands and sessions the agent kept through the pause are the node's to take back.
        vm.saving.store(false, Ordering::SeqCst);
        tracing::debug!(vm = %vm.id, "microvm resumed");
        Ok(())
    }

    /// Clones `vm` into one new VM per child in `children`: same memory, processes and files
    /// at the moment of the fork, then each its own. A running parent goes on running. A VM
    /// with a network device needs a tap for each child (its own namespace and link: the
    /// guest keeps its address, which is the same behind every tap).
    pub async fn fork(
        &self,
        vm: &MicroVm,
        children: &[(String, Option<VmNet>)],
    ) -> Result<Vec<Result<MicroVm, VmTierError>>, VmTierError> {
        if vm.net.is_some() && children.iter().any(|(_, net)| net.is_none()) {
            return Err(VmTierError::Unsupported(
                "forking a networked VM into a child without a tap",
            ));
        }
        let (dir, disk) = if vm.is_paused() {
            // The saved snapshot and the disk as the pause left them.
            let dir = locked(&vm.memory_from).clone();
            (dir, vm.disks.clone())
        } else {
            let dir = self.saved_dir(&vm.id);
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(io("saved snapshots"))?;
            }
            let request = ControlRequest::Snapshot { dir: dir.clone() };
            let saved = match control(&vm.control, &request, SAVE_LIMIT).await {
                Ok(ControlReply::Saved { .. }) => Ok(()),
                Ok(other) => Err(unexpected("snapshot", &other)),
                Err(e) => Err(e),
            };
            if let Err(e) = saved {
                // The VMM's own account of what went wrong, if it died.
                let log = std::fs::read_to_string(&vm.log).unwrap_or_default();
                let tail: String =
                    log.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect();
                return Err(VmTierError::Control(format!("{e}; VMM log: {tail}")));
            }
            // The VMM copied the writable disk (`disk-0`) while the vCPU stood still.
            let disk = vm.disks.as_ref().map(|d| Disks {
                writable: d.writable.as_ref().map(|_| dir.join("disk-0")),
                ..d.clone()
            });
            (dir, disk)
        };
        self.hold(&dir, children.len());
        let mut made = Vec::with_capacity(children.len());
        for (child, net) in children {
            // start_from takes over one hold; a failed start gives it back through destroy.
            let started = self.start_from(child, &dir, disk.clone(), net.clone()).await;
            if let Ok(vm) = &started {
                // A child starts with its parent's kept commands, which are not its own.
                crate::agent_link::kill_all_kept(&vm.uds).await;
            }
            made.push(started);
        }
        if !vm.is_paused() {
            // The fork point's own disk copy is not needed once every child has its copy.
            let _ = std::fs::remove_file(dir.join("disk-0"));
        }
        Ok(made)
    }
}
