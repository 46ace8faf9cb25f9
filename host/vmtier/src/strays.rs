//! VMs a tier's directory still has files for: `<id>.pid` (and `.sock`, `.ctl`, `.log`,
//! `.disk`) and, while it runs, the `brig-vmm` process serving it. A node finds those whose
//! sandbox it no longer has ([`stray_vms`]) and stops and removes them ([`remove_vm`]).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::VmTier;

/// The files a VM has in its tier's directory, by extension.
const VM_FILES: [&str; 5] = ["pid", "sock", "ctl", "log", "disk"];

/// Ids of the VMs with a pid file in `dir`.
pub fn vm_ids(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pid"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect()
}

/// The pid of the `brig-vmm` serving VM `id` of `dir`, if it runs: only a VMM serving this
/// VM's socket, or a warm one of this tier (its command line names the directory), so a
/// reused pid is never taken for it.
pub fn vmm_of(dir: &Path, id: &str) -> Option<i32> {
    let text = std::fs::read_to_string(dir.join(format!("{id}.pid"))).ok()?;
    let pid: i32 = text.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    let dir_text = dir.to_string_lossy();
    let ours = cmdline.contains(&format!("{id}.sock"))
        || (cmdline.contains("standby") && cmdline.contains(dir_text.as_ref()));
    (cmdline.contains("brig-vmm") && ours).then_some(pid)
}

/// Stops VM `id`'s VMM, if it runs, and removes its files.
pub fn remove_vm(dir: &Path, id: &str) {
    if let Some(pid) = vmm_of(dir, id) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for ext in VM_FILES {
        let _ = std::fs::remove_file(dir.join(format!("{id}.{ext}")));
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
    /// tier's directory that are not in `live`, leaving out any whose pid file is younger than
    /// `min_age`.
    pub fn stray_vms(&self, live: &HashSet<String>, min_age: Duration) -> Vec<StrayVm> {
        let dir = &self.cfg.dir;
        let now = SystemTime::now();
        let mut out = Vec::new();
        for id in vm_ids(dir).into_iter().filter(|id| id.starts_with("sb-") && !live.contains(id)) {
            let pid_file = dir.join(format!("{id}.pid"));
            let born = std::fs::metadata(&pid_file).and_then(|m| m.modified()).ok();
            if born.is_some_and(|t| now.duration_since(t).unwrap_or_default() < min_age) {
                continue;
            }
            let mut parts: Vec<String> = vmm_of(dir, &id)
                .map(|pid| format!("process {pid} (brig-vmm)"))
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
