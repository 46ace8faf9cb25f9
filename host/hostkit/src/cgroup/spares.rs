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
//!
//! A spare holds its kernel memory (the shrinker map above) while it waits, so spares do not
//! wait for ever: one not taken within the idle time is removed ([`SpareCgroups::trim_idle`],
//! run each second by a thread of the node's, [`TRIM_PER_TICK`] at a time). The bound is
//! sized for a node that ends one wave of sandboxes and starts the next (an RL job's steps):
//! the next wave's creates take the last one's cgroups, and none of them is removed and made
//! again; a node that stops creating gives them back after the idle time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{
    child_cgroups, read_pids, remove_tree, write_if_changed, CgroupLimits, ContainerCgroup, Version,
};

/// Names of spare cgroups start with this.
pub const SPARE_PREFIX: &str = "spare-";

/// Spares removed at most per second by the idle trim: each removal makes the kernel walk every
/// memcg-aware list on the host (two per superblock) while it offlines the memory cgroup, so
/// removing thousands at once would take a core for tens of seconds on a full node.
pub const TRIM_PER_TICK: usize = 20;

/// One spare: its directories (one per hierarchy), and when it was kept.
type Spare = (Instant, Vec<(&'static str, PathBuf)>);

/// The node's spare container cgroups, at most `cap`.
#[derive(Debug)]
pub struct SpareCgroups {
    cap: usize,
    /// Spares, oldest first.
    free: parking_lot::Mutex<Vec<Spare>>,
    /// Spares kept plus those being kept now, so that destroys at once do not pass `cap`.
    held: AtomicUsize,
    next: AtomicU64,
    /// Held while spares taken out of `free` are removed, so that [`SpareCgroups::remove_all`]
    /// returns only once a trim under way is done too (the node removes its parent cgroup next).
    removing: parking_lot::Mutex<()>,
}

/// Whether `name` is a spare's (not a container's).
pub fn is_spare_name(name: &str) -> bool {
    name.starts_with(SPARE_PREFIX)
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
            Ok(()) => renamed.push((*controller, to)),
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
            removing: parking_lot::Mutex::new(()),
        }
    }

    /// How many spares are kept now.
    pub fn len(&self) -> usize {
        self.free.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A spare renamed to a container's directories (`dirs`, one per hierarchy), for the
    /// caller to give its limits: `None` if there is none, or it could not be renamed (it is
    /// removed then).
    pub(super) fn take(
        &self,
        dirs: &[(&'static str, PathBuf)],
    ) -> Option<Vec<(&'static str, PathBuf)>> {
        let name = dirs.first()?.1.file_name()?.to_string_lossy().into_owned();
        let (_, spare) = self.free.lock().pop()?;
        self.held.fetch_sub(1, Ordering::Relaxed);
        rename_all(&spare, &name)
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
        self.free.lock().push((Instant::now(), spare));
        Some(true)
    }

    /// Removes every spare (at shutdown).
    pub fn remove_all(&self) {
        let spares = std::mem::take(&mut *self.free.lock());
        self.remove(spares);
    }

    /// Removes up to `at_most` spares kept `idle` ago or longer, oldest first; returns how many.
    fn trim_idle(&self, idle: Duration, at_most: usize) -> usize {
        let stale: Vec<Spare> = {
            let mut free = self.free.lock();
            let n =
                free.iter().take(at_most).take_while(|(kept, _)| kept.elapsed() >= idle).count();
            free.drain(..n).collect()
        };
        let n = stale.len();
        if n > 0 {
            tracing::debug!(removed = n, "spare cgroups idle too long removed");
        }
        self.remove(stale);
        n
    }

    fn remove(&self, spares: Vec<Spare>) {
        let _removing = self.removing.lock();
        self.held.fetch_sub(spares.len(), Ordering::Relaxed);
        for (_, dirs) in spares {
            for (_, dir) in dirs {
                let _ = remove_tree(&dir);
            }
        }
    }

    /// Starts the thread that removes spares left idle for `idle` ([`TRIM_PER_TICK`] a
    /// second); it ends once `spares` is dropped.
    pub(super) fn start_trimming(spares: &Arc<SpareCgroups>, idle: Duration) {
        let weak: Weak<SpareCgroups> = Arc::downgrade(spares);
        let tick = Duration::from_secs(1);
        let started =
            std::thread::Builder::new().name("spare-cgroup-trim".into()).spawn(move || loop {
                std::thread::sleep(tick);
                let Some(spares) = weak.upgrade() else { return };
                spares.trim_idle(idle, TRIM_PER_TICK);
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "no thread to trim idle spare cgroups; they wait until shutdown");
        }
    }
}

impl ContainerCgroup {
    /// A taken spare's CPU weight and idle policy as a new cgroup has them, and no quota if
    /// the new container has no CPU limit (one it has is written by
    /// [`ContainerCgroup::limit_cpu`], only where it differs).
    pub(super) fn reset_cpu(&self, limits: &CgroupLimits) -> Result<(), super::CgroupError> {
        self.set_best_effort(false)?;
        if let (None, Some(d)) = (limits.cpu_millis, self.dir("cpu")) {
            write_if_changed(&d.join("cpu.cfs_quota_us"), "-1")?;
        }
        Ok(())
    }
}
