//! VMs a tier's directory still has files for: `<id>.pid` (and `.sock`, `.ctl`, `.log`,
//! `.disk`, and the `.sessions` directory) and, while it runs, the `brig-vmm` process serving it. A node finds those whose
//! sandbox it no longer has ([`VmTier::stray_vms`]) and stops and removes them
//! ([`remove_vm`]). Environment snapshots (`env-*`) are the tier's own and not listed.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::{VmTier, VmmId};

/// The files a VM has in its tier's directory, by extension (`sessions` is a directory).
const VM_FILES: [&str; 6] = ["pid", "sock", "ctl", "log", "disk", crate::session::SESSIONS_EXT];

/// Ids of the VMs (sandboxes and warm VMMs, not environment snapshots) with files in `dir`.
pub fn vm_ids(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut ids: Vec<String> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| VM_FILES.iter().any(|ext| e == *ext)))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|id| !id.starts_with("env-"))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The `brig-vmm` serving VM `id` of `dir`, if it runs: the process its pid file names, with
/// the start time recorded there, so a reused pid is never taken for it.
pub fn vmm_of(dir: &Path, id: &str) -> Option<VmmId> {
    VmmId::read(&dir.join(format!("{id}.pid"))).filter(VmmId::alive)
}

/// Stops VM `id`'s VMM, if it runs, and removes its files.
pub fn remove_vm(dir: &Path, id: &str) {
    if let Some(vmm) = vmm_of(dir, id) {
        vmm.kill();
    }
    for ext in VM_FILES {
        let path = dir.join(format!("{id}.{ext}"));
        if path.is_dir() {
            let _ = std::fs::remove_dir_all(path);
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A sandbox VM the node does not have: its id and what is left of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrayVm {
    pub id: String,
    pub parts: Vec<String>,
}

impl VmTier {
    /// Sandbox VMs (ids `sb-…`; snapshot and warm VMs are the tier's own) with files in this
    /// tier's directory that are not in `live`, leaving out any with a file younger than
    /// `min_age`.
    pub fn stray_vms(&self, live: &HashSet<String>, min_age: Duration) -> Vec<StrayVm> {
        let dir = &self.cfg.dir;
        let now = SystemTime::now();
        let mut out = Vec::new();
        for id in vm_ids(dir).into_iter().filter(|id| id.starts_with("sb-") && !live.contains(id)) {
            let touched = VM_FILES
                .iter()
                .filter_map(|ext| std::fs::symlink_metadata(dir.join(format!("{id}.{ext}"))).ok())
                .filter_map(|m| m.modified().ok())
                .max();
            if touched.is_some_and(|t| now.duration_since(t).unwrap_or_default() < min_age) {
                continue;
            }
            let mut parts: Vec<String> = vmm_of(dir, &id)
                .map(|vmm| format!("process {} (brig-vmm)", vmm.pid))
                .into_iter()
                .collect();
            parts.extend(
                VM_FILES
                    .iter()
                    .map(|ext| dir.join(format!("{id}.{ext}")))
                    .filter(|p| p.exists())
                    .map(|p| format!("file {}", p.display())),
            );
            out.push(StrayVm { id, parts });
        }
        out
    }

    /// Stops and removes stray VM `id` (which must not be live).
    pub fn remove_stray_vm(&self, id: &str) {
        remove_vm(&self.cfg.dir, id);
        self.remove_cgroup(id);
        tracing::info!(vm = id, "removed a stray VM");
    }
}
