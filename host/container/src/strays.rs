//! What is left on the host of containers the node no longer has: their cgroups (and any
//! process still in them), run directories, mounts and spools. Found by name against the
//! node's live containers (and their writable layers on the node's store); removed the way a
//! restart removes orphans.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::rootfs::Rootfs;
use crate::runtime::Runtime;

/// One container's leftovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrayContainer {
    pub name: String,
    /// What was found, one line each (`cgroup /sys/fs/…`, `mount /run/brig/…`, `process 123
    /// (sh)`, `run directory …`, `spool …`).
    pub parts: Vec<String>,
}

/// Every mount point on the host (this process's view).
fn mount_points() -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().filter_map(|l| l.split(' ').nth(4)).map(str::to_string).collect()
}

/// The mount points in `mounts` under `prefix`, deepest first.
fn under(mounts: &[String], prefix: &Path) -> Vec<String> {
    let prefix = format!("{}/", prefix.display());
    let mut points: Vec<String> =
        mounts.iter().filter(|p| p.starts_with(&prefix)).cloned().collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

impl Runtime {
    fn container_dir(&self, name: &str) -> PathBuf {
        self.config.run_dir.join("c").join(name)
    }

    fn names_in(dir: &Path) -> BTreeSet<String> {
        let Ok(entries) = std::fs::read_dir(dir) else { return BTreeSet::new() };
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    /// Containers with something on the host that are not in `live`, leaving out any touched
    /// in the last `min_age` (a create under way has its directories before the node lists
    /// it).
    pub fn stray_containers(
        &self,
        live: &HashSet<String>,
        min_age: Duration,
    ) -> Vec<StrayContainer> {
        let mut names = Self::names_in(&self.config.run_dir.join("c"));
        names.extend(Self::names_in(&self.config.spool_root()));
        names.extend(self.cgroups.names());
        if let Some(store) = &self.store {
            names.extend(store.names());
        }
        let now = SystemTime::now();
        // One read of the mount table for the whole scan.
        let mounts = mount_points();
        let mut out = Vec::new();
        for name in names.into_iter().filter(|n| !live.contains(n)) {
            let cgroup = self.cgroups.attach(&name);
            let dir = self.container_dir(&name);
            let mut places: Vec<(&str, PathBuf)> =
                cgroup.existing_dirs().into_iter().map(|d| ("cgroup", d)).collect();
            let layer = self.store.as_ref().map(|s| ("writable layer", s.dir_of(&name)));
            places.extend(
                [("run directory", dir.clone()), ("spool", self.config.spool_root().join(&name))]
                    .into_iter()
                    .chain(layer)
                    .filter(|(_, p)| p.exists()),
            );
            let newest = places.iter().filter_map(|(_, p)| modified(p)).max();
            if newest.is_some_and(|t| now.duration_since(t).unwrap_or_default() < min_age) {
                continue;
            }
            let mut parts: Vec<String> = cgroup
                .tree_pids()
                .into_iter()
                .map(|pid| format!("process {pid} ({})", comm(pid)))
                .collect();
            parts.extend(under(&mounts, &dir).into_iter().map(|m| format!("mount {m}")));
            parts.extend(places.iter().map(|(what, p)| format!("{what} {}", p.display())));
            out.push(StrayContainer { name, parts });
        }
        out
    }

    /// Removes what is left of container `name` (which must not be live): kills what runs in
    /// its cgroups, unmounts and removes its run directory, removes its cgroups and spool.
    pub fn remove_stray_container(&self, name: &str) {
        let cgroup = self.cgroups.attach(name);
        cgroup.kill_all();
        let dir = self.container_dir(name);
        if let Err(e) = Rootfs::at(&dir).with_store(self.store.clone()).remove() {
            tracing::warn!(container = name, error = %e, "cannot remove a stray rootfs");
        }
        // Whatever mount the rootfs did not know of (a FUSE or bind mount) goes too.
        for point in under(&mount_points(), &dir) {
            let _ = nix::mount::umount2(point.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = cgroup.remove();
        let _ = std::fs::remove_dir_all(self.config.spool_root().join(name));
        tracing::info!(container = name, "removed a stray container's leftovers");
    }
}
