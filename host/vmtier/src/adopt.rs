//! Taking VMs back after the daemon restarts. A VM's VMM runs in a process group of its own
//! and outlives the daemon; what the node needs to find it again is the sandbox's
//! [`MachineRecord`] (disks, network, the snapshot its memory comes from, paused or not) and
//! the VMM's pid file in the tier's directory (pid and start time).
//!
//! ```text
//! restart ─▶ VmTier::adopt(id, record)        for each recorded VM
//!              pid file names a live process with that start time
//!              └─ its control socket's peer is that pid, and it answers ─▶ running, adopted
//!              no VMM, recorded paused, saved snapshot there ─▶ paused (resumes on demand)
//!              otherwise ─▶ VmTierError::Lost (the node forgets the sandbox)
//!          ─▶ VmTier::remove_orphans(adopted)  stops every other VMM of the tier (warm ones
//!              included), removes their files and cgroups, saved snapshots no VM maps, and
//!              environment snapshots made for another kernel, VMM or machine size
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::records::MachineRecord;
use tokio::net::UnixStream;

use crate::lifecycle::SAVED_DIR;
use crate::vmm_process::{VmmId, VmmProcess};
use crate::{locked, strays, Disks, MicroVm, VmNet, VmTier, VmTierError};

/// In an environment snapshot's directory: what it was made for (see
/// [`VmTier::environment_fingerprint`]); written last, so a snapshot cut short has none.
pub(crate) const ENV_MARKER: &str = "made-for";

/// How long an adopted VMM has to answer on its control socket.
const ADOPT_LIMIT: Duration = Duration::from_secs(5);

impl MicroVm {
    /// What a restarted daemon needs to adopt this VM back.
    pub fn record(&self) -> MachineRecord {
        let disks = self.disks.clone();
        MachineRecord {
            memory_from: locked(&self.memory_from).clone(),
            layers: disks.as_ref().map(|d| d.layers.clone()).unwrap_or_default(),
            writable: disks.as_ref().and_then(|d| d.writable.clone()),
            cow_base: disks.and_then(|d| d.cow_base),
            net: self.net.as_ref().map(|n| (n.netns.clone(), n.tap.clone())),
            paused: self.is_paused(),
        }
    }
}

/// FNV-1a, 64 bits: stable across builds, which a restarted daemon needs.
pub(crate) fn fnv64(text: &str) -> u64 {
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A file as a fingerprint sees it: path, size and modification time.
fn file_identity(path: &Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let len = meta.as_ref().map(|m| m.len()).unwrap_or(0);
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}:{len}:{mtime}", path.display())
}

impl VmTier {
    /// What every environment snapshot of this tier depends on besides its layers: the
    /// kernel, initramfs and VMM files, the command line and the machine's size.
    pub(crate) fn config_fingerprint(&self) -> String {
        let c = &self.cfg;
        format!(
            "kernel={} initrd={} vmm={} cmdline={:?} mem={} vcpus={}",
            file_identity(&c.kernel),
            file_identity(&c.initrd),
            file_identity(&c.vmm),
            c.cmdline,
            c.mem_mib,
            c.vcpus
        )
    }

    /// The marker text of the environment snapshot for layers `key`: the key, then this
    /// tier's [`VmTier::config_fingerprint`].
    pub(crate) fn environment_fingerprint(&self, key: &str) -> String {
        format!("{key}\n{}", self.config_fingerprint())
    }

    /// Takes back VM `id`, which an earlier run of the daemon made and recorded: its VMM if it
    /// still runs and is provably the one started for it, else its saved state if it was
    /// paused. A VM that is neither is [`VmTierError::Lost`].
    pub async fn adopt(&self, id: &str, record: &MachineRecord) -> Result<MicroVm, VmTierError> {
        let dir = &self.cfg.dir;
        // A record is read from disk: everything it names of the VM's own is in this tier's
        // directory, so adoption cannot be steered to another file.
        let ours = |p: &Path| p.starts_with(dir) && !p.components().any(|c| c.as_os_str() == "..");
        // A VM that booted (a container-host VM) maps no snapshot.
        let booted = record.memory_from.as_os_str().is_empty() && !record.paused;
        if !(booted || ours(&record.memory_from))
            || record.writable.as_deref().is_some_and(|w| !ours(w))
        {
            return Err(VmTierError::Lost(format!(
                "its record names files outside {}",
                dir.display()
            )));
        }
        let disks = (!record.layers.is_empty() || record.writable.is_some()).then(|| Disks {
            layers: record.layers.clone(),
            writable: record.writable.clone(),
            cow_base: record.cow_base.clone(),
        });
        let net = record.net.clone().map(|(netns, tap)| VmNet { netns, tap });
        let vm = MicroVm::with_net(dir, id, disks, record.memory_from.clone(), net);
        let pid_file = dir.join(format!("{id}.pid"));
        match VmmId::read(&pid_file).filter(VmmId::alive) {
            Some(vmm) => {
                self.prove_vmm(&vm, vmm).await?;
                *vm.process.lock().await = Some(VmmProcess::Adopted(vmm));
                *locked(&vm.pid) = Some(vmm);
                if record.paused {
                    tracing::warn!(vm = %id, "recorded paused but running: a resume was under way");
                }
            }
            None if record.paused => {
                if !record.memory_from.is_dir() {
                    return Err(VmTierError::Lost(format!(
                        "its saved snapshot {} is gone",
                        record.memory_from.display()
                    )));
                }
                vm.paused.store(true, Ordering::SeqCst);
                for ext in ["pid", "sock", "ctl"] {
                    let _ = std::fs::remove_file(dir.join(format!("{id}.{ext}")));
                }
            }
            None => {
                return Err(VmTierError::Lost("its VMM ended while the node was down".into()));
            }
        }
        if record.memory_from.starts_with(dir.join(SAVED_DIR)) {
            self.hold(&record.memory_from, 1);
        }
        tracing::info!(vm = %id, pid = ?vm.pid(), paused = vm.is_paused(), "VM adopted");
        Ok(vm)
    }

    /// Proves that `vmm` serves `vm`: the process at the other end of the VM's control socket
    /// is that pid, and it answers.
    async fn prove_vmm(&self, vm: &MicroVm, vmm: VmmId) -> Result<(), VmTierError> {
        let not_proven = |why: String| {
            VmTierError::Lost(format!("VMM {} is not provably this VM's: {why}", vmm.pid))
        };
        let stream = tokio::time::timeout(ADOPT_LIMIT, UnixStream::connect(&vm.control))
            .await
            .map_err(|_| not_proven("its control socket does not accept".into()))?
            .map_err(|e| not_proven(format!("its control socket: {e}")))?;
        let peer = stream.peer_cred().map_err(|e| not_proven(format!("peer: {e}")))?.pid();
        if peer != i32::try_from(vmm.pid).ok() {
            return Err(not_proven(format!("the control socket is served by {peer:?}")));
        }
        drop(stream);
        self.stats(vm).await.map_err(|e| not_proven(format!("it does not answer: {e}")))?;
        Ok(())
    }

    /// After adoption: stops every VMM of this tier that is not one of `adopted` and removes
    /// its files and cgroup, saved snapshots no adopted VM maps, and environment snapshots
    /// made for another configuration. Returns how many things it removed.
    pub fn remove_orphans(&self, adopted: &[String]) -> usize {
        let dir = &self.cfg.dir;
        let mut removed = 0;
        // A stray pid file may name an adopted VMM (copied, or left by a crash mid-rename):
        // that process is never stopped for it.
        let serving: Vec<VmmId> = adopted.iter().filter_map(|id| strays::vmm_of(dir, id)).collect();
        for id in strays::vm_ids(dir).into_iter().filter(|id| !adopted.contains(id)) {
            match strays::vmm_of(dir, &id) {
                Some(vmm) if serving.contains(&vmm) => {
                    tracing::warn!(vm = %id, pid = vmm.pid, "a stray pid file names an adopted VMM");
                    let _ = std::fs::remove_file(dir.join(format!("{id}.pid")));
                }
                Some(vmm) => {
                    tracing::warn!(vm = %id, pid = vmm.pid, "stopping a VMM no sandbox record claims");
                }
                None => {}
            }
            strays::remove_vm(dir, &id);
            removed += 1;
        }
        if let Some(cgroups) = &self.cgroups {
            removed += cgroups.remove_all_except(adopted);
        }
        let held: HashSet<PathBuf> = locked(&self.saved).keys().cloned().collect();
        for saved in subdirs(&dir.join(SAVED_DIR)).filter(|p| !held.contains(p)) {
            let _ = std::fs::remove_dir_all(&saved);
            removed += 1;
        }
        let config = self.config_fingerprint();
        let envs = subdirs(dir).filter(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("env-"))
                && std::fs::read_to_string(p.join(ENV_MARKER))
                    .ok()
                    .and_then(|m| m.split_once('\n').map(|(_, c)| c == config))
                    != Some(true)
        });
        for env in envs.collect::<Vec<_>>() {
            let _ = std::fs::remove_dir_all(&env);
            for ext in ["disk", "log", "sock"] {
                let _ = std::fs::remove_file(env.with_extension(ext));
            }
            removed += 1;
        }
        removed
    }
}

/// The directories directly under `dir`.
fn subdirs(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir())
}
