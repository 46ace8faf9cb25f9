//! Spare container cgroups (v1 only): a destroyed container's cgroups, emptied, reset and
//! renamed, kept for the next create instead of removed and made again.
//!
//! Making a container's cgroups costs kernel work that grows with what the host has run: a
//! memory cgroup's `mkdir` allocates its shrinker map (1 KiB per 64 of the largest shrinker id
//! the host has had since boot: ~0.8-1 MiB on a node sized for 10,000 containers, and the
//! first write of each new page of it faults in the hypervisor where the node is a VM), its
//! `rmdir` frees it again, and each write of a CFS bandwidth file walks every CPU cgroup on
//! the host (three per create of a small container; `docs/density.md`). A spare has all of
//! that done. Taking one is a `rename` per hierarchy (v1 renames a cgroup within its parent;
//! v2 cannot rename, so a v2 node keeps none), then the limits are written, and the CPU
//! quota only where it differs.
//!
//! What a spare keeps of its last container: pages still charged to it (page cache of files
//! that container was the first to read, which others may be reading), counted as the next
//! container's until they are reclaimed, and its kernel counters that cannot be reset
//! (`pids.events`, throttling in `cpu.stat`). What it does not keep: processes and exec
//! cgroups (a cgroup that still has either is removed, not kept), OOM kills (a cgroup with
//! any is removed: the node reports new ones by the counter), the counters that can be reset
//! (`memory.max_usage_in_bytes`, `memory.failcnt`, `cpuacct.usage`), its weight and idle
//! policy, its limits (written at every create, unlimited where the new container has none),
//! and its freezer state (a frozen cgroup is removed).
//!
//! Spares are named [`SPARE_PREFIX`]`<n>`, which no sandbox id can be. Only the running node
//! has any: it removes them at shutdown, and a node that starts removes every cgroup under
//! its parent it has no container for, spares a crashed run left included.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{
    child_cgroups, read_pids, remove_tree, write_if_changed, CgroupLimits, ContainerCgroup, Version,
};

/// Names of spare cgroups start with this.
pub const SPARE_PREFIX: &str = "spare-";

/// The node's spare container cgroups, at most `cap`.
#[derive(Debug)]
pub struct SpareCgroups {
    cap: usize,
    /// Directories (one per hierarchy) of each spare.
    free: parking_lot::Mutex<Vec<Vec<(&'static str, PathBuf)>>>,
    /// Spares kept plus those being kept now, so that destroys at once do not pass `cap`.
    held: AtomicUsize,
    next: AtomicU64,
}

/// Whether `name` is a spare's (not a container's).
pub fn is_spare_name(name: &str) -> bool {
    name.starts_with(SPARE_PREFIX)
}

/// Sets a cgroup directory's modification time to now: a spare taken for a create under way
/// looks new to the stray scan (`crate::strays`), as a directory made for it would.
fn touch(dir: &std::path::Path) {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let now = TimeSpec::UTIME_NOW;
    let _ = utimensat(nix::fcntl::AT_FDCWD, dir, &now, &now, UtimensatFlags::NoFollowSymlink);
}

/// Renames each of `dirs` to the same place under `name`; on a failure, removes every
/// directory of both names and returns `None`.
fn rename_all(
    dirs: &[(&'static str, PathBuf)],
    name: &str,
) -> Option<Vec<(&'static str, PathBuf)>> {
    let mut renamed = Vec::with_capacity(dirs.len());
    for (controller, dir) in dirs {
        let to = dir.with_file_name(name);
        match std::fs::rename(dir, &to) {
            Ok(()) => {
                touch(&to);
                renamed.push((*controller, to));
            }
            Err(e) => {
                tracing::warn!(from = %dir.display(), to = %to.display(), error = %e,
                    "cannot rename a cgroup; removing it");
                for (_, d) in dirs.iter().chain(renamed.iter()) {
                    let _ = remove_tree(d);
                }
                return None;
            }
        }
    }
    Some(renamed)
}

impl SpareCgroups {
    pub fn new(cap: usize) -> SpareCgroups {
        SpareCgroups {
            cap,
            free: parking_lot::Mutex::new(Vec::new()),
            held: AtomicUsize::new(0),
            next: AtomicU64::new(0),
        }
    }

    /// How many spares are kept now.
    pub fn len(&self) -> usize {
        self.free.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A spare renamed to container `name`'s directories (`dirs`, one per hierarchy), with
    /// the limits of `limits` that are not the CPU quota: `None` if there is none, or it
    /// could not be taken (it is removed then).
    pub(super) fn take(
        &self,
        dirs: &[(&'static str, PathBuf)],
        limits: &CgroupLimits,
    ) -> Option<Vec<(&'static str, PathBuf)>> {
        let spare = self.free.lock().pop()?;
        self.held.fetch_sub(1, Ordering::Relaxed);
        let name = dirs.first()?.1.file_name()?.to_string_lossy().into_owned();
        let taken = rename_all(&spare, &name)?;
        match reset_for(&taken, limits) {
            Ok(()) => Some(taken),
            Err(e) => {
                tracing::warn!(container = %name, error = %e, "cannot reuse a spare cgroup");
                for (_, d) in &taken {
                    let _ = remove_tree(d);
                }
                None
            }
        }
    }

    /// Keeps `cgroup` (its container destroyed, its processes killed) as a spare if there is
    /// room and it qualifies (module docs). `false`: not kept, and left as it was; `true`:
    /// kept, or (a rename failed) removed.
    pub(super) fn keep(&self, cgroup: &ContainerCgroup) -> bool {
        if cgroup.version != Version::V1 {
            return false;
        }
        if self.held.fetch_add(1, Ordering::Relaxed) >= self.cap {
            self.held.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let kept = self.try_keep(cgroup);
        if kept != Some(true) {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        kept.is_some()
    }

    /// [`SpareCgroups::keep`] with a place reserved: `Some(true)` kept, `Some(false)` removed
    /// (a rename failed), `None` not kept and left as it was.
    fn try_keep(&self, cgroup: &ContainerCgroup) -> Option<bool> {
        if cgroup.oom_kills() > 0 || cgroup.is_frozen() {
            return None;
        }
        for (_, dir) in &cgroup.dirs {
            // Exec cgroups go (kept ones are empty; a busy one means a process is left).
            for child in child_cgroups(dir) {
                if remove_tree(&child).is_err() {
                    return None;
                }
            }
            if !read_pids(dir).is_empty() {
                return None;
            }
        }
        let reset = [
            ("memory", "memory.max_usage_in_bytes"),
            ("memory", "memory.failcnt"),
            ("cpuacct", "cpuacct.usage"),
        ];
        for (controller, file) in reset {
            let Some(dir) = cgroup.dir(controller) else { continue };
            if let Err(e) = std::fs::write(dir.join(file), "0") {
                tracing::debug!(file, error = %e, "cannot reset a cgroup counter; not kept");
                return None;
            }
        }
        let name = format!("{SPARE_PREFIX}{}", self.next.fetch_add(1, Ordering::Relaxed));
        let Some(spare) = rename_all(&cgroup.dirs, &name) else {
            // Both names' directories are gone: nothing is left to remove.
            return Some(false);
        };
        self.free.lock().push(spare);
        Some(true)
    }

    /// Removes every spare (at shutdown).
    pub fn remove_all(&self) {
        let spares = std::mem::take(&mut *self.free.lock());
        self.held.fetch_sub(spares.len(), Ordering::Relaxed);
        for dirs in spares {
            for (_, dir) in dirs {
                let _ = remove_tree(&dir);
            }
        }
    }
}

/// Puts a taken spare's limits, weight and idle policy as a new cgroup would have them for
/// `limits` (the CPU quota is written when the container has started, only where it differs).
fn reset_for(
    dirs: &[(&'static str, PathBuf)],
    limits: &CgroupLimits,
) -> Result<(), super::CgroupError> {
    let dir = |c: &str| dirs.iter().find(|(d, _)| *d == c).map(|(_, p)| p.clone());
    if let Some(d) = dir("memory") {
        let limit = limits.memory_bytes.map_or_else(|| "-1".to_string(), |b| b.to_string());
        let file = d.join("memory.limit_in_bytes");
        std::fs::write(&file, limit).map_err(super::io("write", &file))?;
    }
    if let Some(d) = dir("pids") {
        let max = limits.pids.map_or_else(|| "max".to_string(), |n| n.to_string());
        let file = d.join("pids.max");
        std::fs::write(&file, max).map_err(super::io("write", &file))?;
    }
    if let Some(d) = dir("cpu") {
        // An idle group refuses weight changes: leave idle first.
        let idle = d.join("cpu.idle");
        if idle.exists() {
            write_if_changed(&idle, "0")?;
        }
        write_if_changed(&d.join("cpu.shares"), "1024")?;
        if limits.cpu_millis.is_none() {
            write_if_changed(&d.join("cpu.cfs_quota_us"), "-1")?;
        }
    }
    Ok(())
}
