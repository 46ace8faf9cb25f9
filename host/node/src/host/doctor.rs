//! `brig doctor`: what the node left on the host that belongs to no sandbox it has. Each
//! tier reports its own leftovers by sandbox name (a container's cgroups, processes, mounts,
//! run directory and spool; a VM's VMM and files), the network its links, and the node its
//! full VMs' network namespaces (named with its tag, so another daemon's are not its own) and
//! its files (records, fork intents, temporary files). Anything touched more recently than the
//! asked minimum age is left out: a create or fork under way has its pieces before the node
//! lists the sandbox. Links are listed whatever their age (sysfs keeps no times, and the
//! network holds a slot before it makes the slot's link, so none is ever in flight). What
//! the last scan left is the `brig_stray_objects` metric; a scan runs every minute.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use brig_proto::StrayObject;

use crate::Node;

/// Where `ip netns` keeps named network namespaces.
const NETNS_DIR: &str = "/run/netns";

/// How often the metric is brought up to date, and the age it counts from.
pub(crate) const METRIC_EVERY: Duration = Duration::from_secs(60);

fn older_than(path: &Path, min_age: Duration) -> bool {
    let modified = std::fs::metadata(path).and_then(|m| m.modified());
    modified.is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() >= min_age)
}

fn stray(kind: &str, name: String, parts: Vec<String>, removed: bool) -> StrayObject {
    StrayObject { kind: kind.into(), name, parts, removed }
}

impl Node {
    /// Finds (and with `remove`, removes) what belongs to no live sandbox. Blocking.
    pub(crate) fn doctor(&self, remove: bool, min_age: Duration) -> Vec<StrayObject> {
        let live: HashSet<String> =
            self.inner.sandboxes.all().iter().map(|e| e.id.to_string()).collect();
        let mut found = Vec::new();
        if let Ok(tier) = self.container_tier() {
            let runtime = tier.runtime();
            for c in runtime.stray_containers(&live, min_age) {
                if remove {
                    runtime.remove_stray_container(&c.name);
                }
                found.push(stray("container", c.name, c.parts, remove));
            }
        }
        // The container-host tier's directory has session records of its containers (named
        // after their sandboxes, as VMs are).
        let hosts = self.inner.container_hosts.as_ref().ok().map(|h| h.vm_tier());
        for tier in [self.vmtier().ok(), self.fullvm_tier().ok(), hosts].into_iter().flatten() {
            for vm in tier.stray_vms(&live, min_age) {
                if remove {
                    tier.remove_stray_vm(&vm.id);
                }
                found.push(stray("vm", vm.id, vm.parts, remove));
            }
        }
        for (name, id) in self.vm_netns() {
            if live.contains(&id) || !older_than(&Path::new(NETNS_DIR).join(&name), min_age) {
                continue;
            }
            if remove {
                brig_hostkit::network::remove_vm_netns(&name);
            }
            let parts = vec![format!("network namespace {NETNS_DIR}/{name} (and its tap)")];
            found.push(stray("netns", id, parts, remove));
        }
        if let Some(net) = self.inner.egress.opened() {
            for link in net.stray_links() {
                if remove {
                    net.remove_stray_link(&link);
                }
                let parts = vec![format!("link {link}")];
                found.push(stray("link", link, parts, remove));
            }
        }
        found.extend(self.stray_files(&live, remove, min_age));
        if remove && !found.is_empty() {
            tracing::warn!(removed = found.len(), "removed stray objects");
        }
        let left = found.iter().filter(|s| !s.removed).count();
        self.inner.metrics.stray_objects.set(i64::try_from(left).unwrap_or(i64::MAX));
        found
    }

    /// This node's VM network namespaces: (name, sandbox id).
    fn vm_netns(&self) -> Vec<(String, String)> {
        let prefix = self.netns_prefix();
        let Ok(entries) = std::fs::read_dir(NETNS_DIR) else { return Vec::new() };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter_map(|name| Some((name.clone(), name.strip_prefix(&prefix)?.to_string())))
            .collect()
    }

    /// Records of sandboxes the node does not have, fork intents no fork is writing, and
    /// temporary files a crash left.
    fn stray_files(
        &self,
        live: &HashSet<String>,
        remove: bool,
        min_age: Duration,
    ) -> Vec<StrayObject> {
        let mut found = Vec::new();
        let dirs = [self.inner.sandboxes.dir(), self.inner.intents.dir()];
        for (dir, is_records) in dirs.into_iter().zip([true, false]) {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                if !older_than(&path, min_age) {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                let kind = match name.strip_suffix(".json") {
                    _ if name.ends_with(".tmp") => "temporary file",
                    Some(id) if is_records && !live.contains(id) => "record",
                    Some(_) if !is_records => "intent",
                    _ => continue,
                };
                if remove {
                    let _ = std::fs::remove_file(&path);
                }
                let parts = vec![format!("file {}", path.display())];
                found.push(stray(kind, name, parts, remove));
            }
        }
        found
    }

    /// Keeps `brig_stray_objects` up to date (a scan every [`METRIC_EVERY`], counting
    /// what is older than that), until aborted.
    pub fn spawn_stray_census(&self) -> tokio::task::JoinHandle<()> {
        let node = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRIC_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let scan = node.clone();
                let scan = move || scan.doctor(false, METRIC_EVERY).len();
                let strays = tokio::task::spawn_blocking(scan).await.unwrap_or(0);
                if strays > 0 {
                    tracing::warn!(strays, "stray objects on the host; see `brig doctor`");
                }
            }
        })
    }
}
