//! The in-flight overlay: placements a replica made that the node's heartbeats do not show yet.

use std::collections::HashMap;

use brig_core::NodeId;

use crate::{Placement, Resources};

#[derive(Debug, Clone, Copy)]
struct Pending {
    ticket: u64,
    demand: Resources,
    placed_ms: u64,
    confirmed_ms: Option<u64>,
}

/// Per node, the pending placements and their sum.
#[derive(Debug, Default)]
pub struct Overlay {
    next_ticket: u64,
    nodes: HashMap<NodeId, (Resources, Vec<Pending>)>,
}

impl Overlay {
    pub(crate) fn add(&mut self, node: NodeId, demand: Resources, now_ms: u64) -> u64 {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        let (sum, list) = self.nodes.entry(node).or_default();
        *sum = sum.plus(demand);
        list.push(Pending { ticket, demand, placed_ms: now_ms, confirmed_ms: None });
        ticket
    }

    pub(crate) fn confirm(&mut self, placement: Placement, now_ms: u64) {
        if let Some((_, list)) = self.nodes.get_mut(&placement.node) {
            if let Some(p) = list.iter_mut().find(|p| p.ticket == placement.ticket) {
                p.confirmed_ms = Some(now_ms);
            }
        }
    }

    pub(crate) fn remove(&mut self, placement: Placement) {
        self.retain(placement.node, |p| p.ticket != placement.ticket);
    }

    /// Drops what a heartbeat received at `received_ms` already counts, and anything never
    /// confirmed that was placed before `stale_before_ms`.
    pub(crate) fn heartbeat(&mut self, node: NodeId, received_ms: u64, stale_before_ms: u64) {
        self.retain(node, |p| match p.confirmed_ms {
            Some(at) => at > received_ms,
            None => p.placed_ms >= stale_before_ms,
        });
    }

    pub fn total(&self, node: NodeId) -> Resources {
        self.nodes.get(&node).map(|(sum, _)| *sum).unwrap_or_default()
    }

    fn retain(&mut self, node: NodeId, keep: impl Fn(&Pending) -> bool) {
        let Some((sum, list)) = self.nodes.get_mut(&node) else { return };
        list.retain(|p| {
            let kept = keep(p);
            if !kept {
                *sum = sub(*sum, p.demand);
            }
            kept
        });
        if list.is_empty() {
            self.nodes.remove(&node);
        }
    }
}

fn sub(a: Resources, b: Resources) -> Resources {
    Resources {
        memory_mib: a.memory_mib.saturating_sub(b.memory_mib),
        cpu_millis: a.cpu_millis.saturating_sub(b.cpu_millis),
        sandboxes: a.sandboxes.saturating_sub(b.sandboxes),
    }
}
