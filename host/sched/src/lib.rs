//! Placement for the control plane: which node gets a new sandbox.
//!
//! Pure and seeded (no clock, no I/O): the caller passes the time, so the same code runs in the
//! control plane and in `brig-bench sim` at 160 nodes. The shape follows DSec:
//!
//! 1. **Filter**: healthy nodes that offer the tier and can serve the image.
//! 2. **Power-of-k choices**: sample `k` of them, take the least loaded. Load is the largest of
//!    the memory, CPU and sandbox-count ratios (what the node would have after this sandbox),
//!    so the scarcest resource decides.
//! 3. **In-flight overlay**: each control replica adds the placements it made since the node's
//!    last heartbeat to that heartbeat's view, so a burst of thousands of creates between two
//!    heartbeats does not pile onto the node that looked emptiest.
//! 4. **Node admission has the final say**: a refused placement is [`Placer::refused`], and the
//!    caller places again with that node excluded.

#![forbid(unsafe_code)]

mod overlay;

use brig_core::{NodeId, Tier};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use overlay::Overlay;

/// Quantities placement balances: requested (not used) memory and CPU, and a sandbox count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub memory_mib: u64,
    pub cpu_millis: u64,
    pub sandboxes: u64,
}

impl Resources {
    pub(crate) fn plus(self, o: Resources) -> Resources {
        Resources {
            memory_mib: self.memory_mib + o.memory_mib,
            cpu_millis: self.cpu_millis + o.cpu_millis,
            sandboxes: self.sandboxes + o.sandboxes,
        }
    }
}

/// Which images a node can serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageAccess {
    /// The node reads layers from the shared store: any image.
    Store,
    /// Only these local images.
    Only(Vec<String>),
}

/// One node as the last heartbeat described it.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub id: NodeId,
    pub healthy: bool,
    pub tiers: Vec<Tier>,
    pub images: ImageAccess,
    /// What the node admits in all (overcommit included).
    pub capacity: Resources,
    /// What its live sandboxes asked for.
    pub used: Resources,
}

/// What a new sandbox asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub tier: Tier,
    /// The image's base name (container and VM tiers).
    pub image: Option<String>,
    pub memory_mib: u64,
    pub cpu_millis: u64,
}

impl Demand {
    fn resources(&self) -> Resources {
        Resources { memory_mib: self.memory_mib, cpu_millis: self.cpu_millis, sandboxes: 1 }
    }
}

/// A placement the caller must settle: [`Placer::confirmed`] or [`Placer::refused`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub node: NodeId,
    pub ticket: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("no node offers the {0:?} tier")]
    NoTier(Tier),
    #[error("no healthy node offers the {0:?} tier")]
    NoHealthyNode(Tier),
    #[error("no node can serve image {0:?}")]
    NoImage(String),
    #[error("every node that could take it is full")]
    Full,
}

/// How a node is chosen among the eligible ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Sample `k`, take the least loaded.
    PowerOfK(usize),
    /// Uniformly at random (the baseline the simulator compares against).
    Random,
}

/// One control replica's placer: its random source and its in-flight overlay.
#[derive(Debug)]
pub struct Placer {
    strategy: Strategy,
    rng: StdRng,
    overlay: Overlay,
    eligible: Vec<usize>,
}

impl Placer {
    pub fn new(strategy: Strategy, seed: u64) -> Placer {
        Placer {
            strategy,
            rng: StdRng::seed_from_u64(seed),
            overlay: Overlay::default(),
            eligible: Vec::new(),
        }
    }

    /// Chooses a node for `demand` among `nodes`, skipping `exclude` (nodes that already
    /// refused this request), at time `now_ms`.
    pub fn place(
        &mut self,
        nodes: &[NodeView],
        demand: &Demand,
        exclude: &[NodeId],
        now_ms: u64,
    ) -> Result<Placement, PlaceError> {
        self.filter(nodes, demand, exclude)?;
        let chosen = match self.strategy {
            Strategy::Random => self.eligible[self.rng.random_range(0..self.eligible.len())],
            Strategy::PowerOfK(k) => self.least_loaded_of_k(nodes, demand, k.max(1)),
        };
        let node = nodes[chosen].id;
        let ticket = self.overlay.add(node, demand.resources(), now_ms);
        Ok(Placement { node, ticket })
    }

    /// The node created the sandbox; its next heartbeat will count it.
    pub fn confirmed(&mut self, placement: Placement, now_ms: u64) {
        self.overlay.confirm(placement, now_ms);
    }

    /// The node refused (or could not be reached); forget the placement.
    pub fn refused(&mut self, placement: Placement) {
        self.overlay.remove(placement);
    }

    /// A heartbeat from `node` received at `received_ms` now counts what was confirmed
    /// before it; drop those from the overlay. Unconfirmed placements older than
    /// `stale_after_ms` are dropped too (their caller vanished).
    pub fn heartbeat(&mut self, node: NodeId, received_ms: u64, stale_after_ms: u64) {
        self.overlay.heartbeat(node, received_ms, received_ms.saturating_sub(stale_after_ms));
    }

    /// What this replica placed on `node` that no heartbeat shows yet.
    pub fn in_flight(&self, node: NodeId) -> Resources {
        self.overlay.total(node)
    }

    /// The load `node` would have with `extra` on top: the largest resource ratio.
    pub fn load(&self, node: &NodeView, extra: Resources) -> f64 {
        load_ratio(node.capacity, node.used.plus(self.overlay.total(node.id)).plus(extra))
    }

    fn filter(
        &mut self,
        nodes: &[NodeView],
        demand: &Demand,
        exclude: &[NodeId],
    ) -> Result<(), PlaceError> {
        self.eligible.clear();
        let (mut offers, mut healthy, mut has_image) = (false, false, false);
        for (i, n) in nodes.iter().enumerate() {
            if !n.tiers.contains(&demand.tier) {
                continue;
            }
            offers = true;
            if !n.healthy || exclude.contains(&n.id) {
                continue;
            }
            healthy = true;
            if let (Some(image), ImageAccess::Only(list)) = (&demand.image, &n.images) {
                if !list.iter().any(|i| i == image) {
                    continue;
                }
            }
            has_image = true;
            if self.load(n, demand.resources()) > 1.0 {
                continue;
            }
            self.eligible.push(i);
        }
        if !self.eligible.is_empty() {
            return Ok(());
        }
        Err(if !offers {
            PlaceError::NoTier(demand.tier)
        } else if !healthy {
            PlaceError::NoHealthyNode(demand.tier)
        } else if !has_image {
            PlaceError::NoImage(demand.image.clone().unwrap_or_default())
        } else {
            PlaceError::Full
        })
    }

    fn least_loaded_of_k(&mut self, nodes: &[NodeView], demand: &Demand, k: usize) -> usize {
        let n = self.eligible.len();
        let mut best: Option<(f64, usize)> = None;
        // Partial Fisher-Yates: the first k slots become a uniform sample without repeats.
        for slot in 0..k.min(n) {
            let pick = self.rng.random_range(slot..n);
            self.eligible.swap(slot, pick);
            let index = self.eligible[slot];
            let load = self.load(&nodes[index], demand.resources());
            if best.is_none_or(|(b, _)| load < b) {
                best = Some((load, index));
            }
        }
        best.map_or(self.eligible[0], |(_, index)| index)
    }
}

/// Largest of the used/capacity ratios; a resource with no capacity counts as full once used.
pub fn load_ratio(capacity: Resources, used: Resources) -> f64 {
    let ratio = |used: u64, cap: u64| match (used, cap) {
        (0, _) => 0.0,
        (_, 0) => f64::INFINITY,
        (u, c) => u as f64 / c as f64,
    };
    ratio(used.memory_mib, capacity.memory_mib)
        .max(ratio(used.cpu_millis, capacity.cpu_millis))
        .max(ratio(used.sandboxes, capacity.sandboxes))
}

#[cfg(test)]
mod tests;
