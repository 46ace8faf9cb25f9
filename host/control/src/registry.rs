//! The nodes a control-plane replica knows, as their heartbeats describe them. Each replica
//! builds this on its own from the heartbeats every node sends to every replica, so replicas
//! share nothing but the durable store.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use brig_core::{NodeId, Tier};
use brig_proto::{NodeReport, NodeSummary};
use brig_sched::{ImageAccess, NodeView, Resources};
use parking_lot::RwLock;

/// Sandboxes a node is assumed to hold at most, for the count term of the load.
const SANDBOX_SLOTS: u64 = 100_000;

#[derive(Debug, Clone)]
pub struct NodeEntry {
    pub report: NodeReport,
    pub last_seen: Instant,
    /// Whether placement may use it (a heartbeat within the down-after window).
    pub healthy: bool,
}

/// Why a sandbox's node cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    Unknown,
    Down { silent_for: Duration },
}

#[derive(Debug)]
pub struct Registry {
    nodes: RwLock<HashMap<u32, NodeEntry>>,
    down_after: Duration,
}

impl Registry {
    pub fn new(down_after: Duration) -> Registry {
        Registry { nodes: RwLock::new(HashMap::new()), down_after }
    }

    /// Records a heartbeat; `true` when the node is new or comes back from down.
    pub fn heartbeat(&self, report: NodeReport) -> bool {
        let id = report.status.node_id;
        let mut nodes = self.nodes.write();
        let entry = NodeEntry { report, last_seen: Instant::now(), healthy: true };
        let was_healthy = nodes.insert(id, entry).is_some_and(|old| old.healthy);
        !was_healthy
    }

    /// Marks nodes silent for longer than the down-after window; returns the ones that just
    /// went down.
    pub fn sweep(&self) -> Vec<u32> {
        let mut downed = Vec::new();
        for (id, entry) in self.nodes.write().iter_mut() {
            if entry.healthy && entry.last_seen.elapsed() > self.down_after {
                entry.healthy = false;
                downed.push(*id);
            }
        }
        downed
    }

    /// The node, if it is up.
    pub fn up(&self, node: u32) -> Result<NodeEntry, NodeState> {
        match self.nodes.read().get(&node) {
            None => Err(NodeState::Unknown),
            Some(e) if !e.healthy || e.last_seen.elapsed() > self.down_after => {
                Err(NodeState::Down { silent_for: e.last_seen.elapsed() })
            }
            Some(e) => Ok(e.clone()),
        }
    }

    /// Every node as placement sees it.
    pub fn views(&self) -> Vec<NodeView> {
        self.nodes.read().values().map(|e| view(e, self.down_after)).collect()
    }

    /// Healthy nodes (offering `tier`, if given).
    pub fn up_nodes(&self, tier: Option<brig_proto::Tier>) -> Vec<NodeEntry> {
        let mut out: Vec<NodeEntry> = self
            .nodes
            .read()
            .values()
            .filter(|e| e.healthy && e.last_seen.elapsed() <= self.down_after)
            .filter(|e| tier.is_none_or(|t| e.report.status.tiers.contains(&t)))
            .cloned()
            .collect();
        out.sort_by_key(|e| e.report.status.node_id);
        out
    }

    pub fn summaries(&self) -> Vec<NodeSummary> {
        let mut out: Vec<NodeSummary> = self
            .nodes
            .read()
            .values()
            .map(|e| {
                let v = view(e, self.down_after);
                let load = brig_sched::load_ratio(v.capacity, v.used);
                NodeSummary {
                    node: e.report.status.node_id,
                    addr: e.report.addr.clone(),
                    healthy: v.healthy,
                    last_heartbeat_ms_ago: millis(e.last_seen.elapsed()),
                    tiers: e.report.status.tiers.clone(),
                    sandboxes: e.report.status.sandboxes,
                    load_permille: (load * 1000.0).min(u32::MAX as f64) as u32,
                }
            })
            .collect();
        out.sort_by_key(|s| s.node);
        out
    }

    /// Live sandboxes per project on healthy nodes, each counted in its ancestors too.
    pub fn live_by_project(&self) -> HashMap<String, u64> {
        let mut out: HashMap<String, u64> = HashMap::new();
        for e in self.nodes.read().values().filter(|e| e.healthy) {
            for (project, n) in &e.report.live_by_project {
                for name in crate::quota::ancestry(project) {
                    *out.entry(name.to_string()).or_default() += n;
                }
            }
        }
        out
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn view(e: &NodeEntry, down_after: Duration) -> NodeView {
    let s = &e.report.status;
    let c = &s.capacity;
    const MIB: u64 = 1 << 20;
    NodeView {
        id: NodeId(s.node_id),
        healthy: e.healthy && e.last_seen.elapsed() <= down_after,
        tiers: s.tiers.iter().map(|t| tier(*t)).collect(),
        images: match &e.report.images {
            None => ImageAccess::Store,
            Some(list) => ImageAccess::Only(list.clone()),
        },
        capacity: Resources {
            memory_mib: c.memory_total_bytes / MIB * c.memory_overcommit_pct.max(100) / 100,
            cpu_millis: c.cpus * 1000 * c.cpu_overcommit_pct.max(100) / 100,
            sandboxes: SANDBOX_SLOTS,
        },
        used: Resources {
            memory_mib: c.memory_requested_bytes / MIB,
            cpu_millis: c.cpu_requested_millis,
            sandboxes: s.sandboxes,
        },
    }
}

pub fn tier(t: brig_proto::Tier) -> Tier {
    match t {
        brig_proto::Tier::Fncall => Tier::Fncall,
        brig_proto::Tier::Container => Tier::Container,
        brig_proto::Tier::Microvm => Tier::Microvm,
        brig_proto::Tier::Fullvm => Tier::Fullvm,
    }
}
