//! The node's tiers as a registry. Each tier (or one placement of a tier) is a [`TierBackend`]:
//! it makes a sandbox from a create the node has resolved already (limits, egress, volumes,
//! the sandbox's id), takes one back from its record after a restart, and says whether this
//! node offers it. The node picks the backend for a create by tier and placement, and for a
//! record by tier and the record's kind; nothing else in the node switches on the tier to make
//! or restore a sandbox. A new tier is its crate, the core and wire enums, one line in
//! [`builtin`] (or, from outside the node, one in `Node::open_with`'s list) and its config.

use std::sync::Arc;

use brig_core::sandbox::{BoxFuture, Sandbox, TierRecord};
use brig_core::{EgressPolicy, EgressRule, SandboxId, Tier};
use brig_proto::{CreateRequest, Placement};

use crate::{Node, NodeError};

/// A create as the node resolved it, before a tier sees it.
pub struct CreatePlan<'a> {
    pub id: &'a SandboxId,
    pub request: &'a CreateRequest,
    /// Where a container goes (the node's placement policy applied); `None` for other tiers.
    pub placement: Option<Placement>,
    /// Its egress rules and the destinations they resolved to (tiers that take them).
    pub egress: &'a Option<(Vec<EgressRule>, EgressPolicy)>,
    /// Volumes to bind into it (tiers that mount them; see [`TierBackend::mounts_volumes`]).
    pub binds: Vec<brig_container::protect::Bind>,
}

/// A sandbox a tier made, with the network slot of one made with its link (a full VM's).
pub struct Created {
    pub sandbox: Arc<dyn Sandbox>,
    pub net_slot: Option<u32>,
}

impl Created {
    pub fn new(sandbox: Arc<dyn Sandbox>) -> Created {
        Created { sandbox, net_slot: None }
    }
}

/// One tier, or one placement of it, as the node drives it.
pub trait TierBackend: Send + Sync {
    /// The tier its sandboxes are.
    fn tier(&self) -> Tier;
    /// Whether it serves a create of its tier placed so.
    fn places(&self, _placement: Option<Placement>) -> bool {
        true
    }
    /// The kind of [`TierRecord`] its sandboxes keep; `None` when their spec is enough.
    fn record_kind(&self) -> Option<&'static str>;
    /// Whether this node offers it (its kernel, its configuration).
    fn offered(&self, node: &Node) -> bool;
    /// Whether it binds volumes into its sandboxes.
    fn mounts_volumes(&self) -> bool {
        false
    }
    /// Whether its sandboxes take egress rules (a link of their own to the node).
    fn takes_egress(&self) -> bool {
        false
    }
    /// What a create asks of the node, for admission: memory bytes and CPU millis (0 for a
    /// tier the node does not admit by size).
    fn asks(&self, _node: &Node, _request: &CreateRequest) -> (u64, u64) {
        (0, 0)
    }
    /// Whether admission counts its sandboxes by use (the node's measured mean, and what
    /// they ask bounded by the overcommit multiples: `crate::policy::admission::Ask`).
    fn admitted_by_use(&self) -> bool {
        false
    }
    /// Makes the sandbox of a resolved create.
    fn create<'a>(
        &'a self,
        node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>>;
    /// Removes what an earlier run of the node left of this backend's sandboxes that no
    /// record claimed (`adopted`: every id any backend took back at this start, once every
    /// record had its chance); how many it removed.
    fn remove_orphans<'a>(
        &'a self,
        _node: &'a Node,
        _adopted: &'a [String],
    ) -> BoxFuture<'a, usize> {
        Box::pin(async { 0 })
    }
    /// Takes back a sandbox an earlier run of the node made, from its record.
    fn adopt<'a>(
        &'a self,
        node: &'a Node,
        id: &'a SandboxId,
        record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>>;
}

/// The node's backends, looked up in order (ones given to `Node::open_with` first).
pub(crate) struct TierRegistry(Vec<Arc<dyn TierBackend>>);

impl TierRegistry {
    pub fn new(extra: Vec<Arc<dyn TierBackend>>) -> TierRegistry {
        TierRegistry(extra.into_iter().chain(builtin()).collect())
    }

    /// The backend for a create of `tier` placed so: the first that this node offers, else
    /// the first at all (whose create then says why it is not offered).
    pub fn for_create(
        &self,
        node: &Node,
        tier: Tier,
        placement: Option<Placement>,
    ) -> Result<&Arc<dyn TierBackend>, NodeError> {
        let mut serving = self.0.iter().filter(|b| b.tier() == tier && b.places(placement));
        let first = serving.clone().next();
        serving.find(|b| b.offered(node)).or(first).ok_or_else(|| NodeError::TierUnavailable {
            tier,
            why: "no backend for this placement".into(),
        })
    }

    /// The backend that takes back a sandbox of `tier` whose record is of `kind`.
    pub fn for_record(
        &self,
        tier: Tier,
        kind: Option<&str>,
    ) -> Result<&Arc<dyn TierBackend>, NodeError> {
        self.0.iter().find(|b| b.tier() == tier && b.record_kind() == kind).ok_or_else(|| {
            let why = match kind {
                Some(kind) => format!("no backend takes back a {kind} record"),
                None => "its record has no part of its tier".into(),
            };
            NodeError::TierUnavailable { tier, why }
        })
    }

    /// Every backend, in lookup order.
    pub fn all(&self) -> &[Arc<dyn TierBackend>] {
        &self.0
    }

    /// The tiers this node offers, in [`Tier::ALL`]'s order.
    pub fn offered(&self, node: &Node) -> Vec<Tier> {
        Tier::ALL
            .into_iter()
            .filter(|t| self.0.iter().any(|b| b.tier() == *t && b.offered(node)))
            .collect()
    }
}

/// The tiers built into the node.
fn builtin() -> Vec<Arc<dyn TierBackend>> {
    use crate::tiers::builtin::{Fncall, Fullvms, HostContainers, Microvms, VmContainers};
    vec![
        Arc::new(Fncall),
        Arc::new(HostContainers),
        Arc::new(VmContainers),
        Arc::new(Microvms),
        Arc::new(Fullvms),
    ]
}
