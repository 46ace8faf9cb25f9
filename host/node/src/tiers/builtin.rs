//! The tiers built into the node as [`TierBackend`]s: fncall workspaces, containers on the
//! node's kernel, containers in container-host VMs, microVMs and full VMs. Each is a thin
//! face over its tier's glue in this folder; what they make is the tier crate's `Sandbox`.

use std::sync::Arc;

use brig_container::record::{ContainerRecord, RECORD_KIND as CONTAINER};
use brig_core::records::RecordError;
use brig_core::sandbox::{BoxFuture, Sandbox, TierRecord};
use brig_core::{SandboxId, Tier};
use brig_fncall::FncallSandbox;
use brig_proto::{CreateRequest, Placement};
use brig_vmtier::records::{HOSTED_RECORD_KIND as HOSTED, MACHINE_RECORD_KIND as MACHINE};
use brig_vmtier::{HostedRecord, MachineRecord, VmSandbox};

use crate::tiers::registry::{CreatePlan, Created, TierBackend};
use crate::{Node, NodeError};

/// The body of the record a backend of `tier` takes back, read by `read`.
fn body_of<T>(
    tier: Tier,
    record: Option<&TierRecord>,
    read: fn(&TierRecord) -> Result<T, RecordError>,
) -> Result<T, NodeError> {
    let unavailable = |why: String| NodeError::TierUnavailable { tier, why };
    let record = record.ok_or_else(|| unavailable("no record of its tier".into()))?;
    read(record).map_err(|e| unavailable(e.to_string()))
}

/// What a container asks of admission, on the node's kernel or in a container-host VM.
fn container_asks(node: &Node, request: &CreateRequest) -> (u64, u64) {
    crate::tiers::container::requested(&node.inner.config.container, &request.limits)
}

/// Takes back a microVM or full VM of `tier` from its machine record.
async fn adopt_machine(
    node: &Node,
    id: &SandboxId,
    tier: Tier,
    record: Option<&TierRecord>,
) -> Result<Arc<dyn Sandbox>, NodeError> {
    let machine = body_of(tier, record, MachineRecord::from_tier)?;
    node.adopt_vm(id, tier, &machine).await
}

/// Tool-call workspaces on Wasmtime, in process: their spec is enough to open them again.
pub(crate) struct Fncall;

impl TierBackend for Fncall {
    fn tier(&self) -> Tier {
        Tier::Fncall
    }
    fn record_kind(&self) -> Option<&'static str> {
        None
    }
    fn offered(&self, _node: &Node) -> bool {
        true
    }
    fn create<'a>(
        &'a self,
        node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>> {
        Box::pin(async move {
            let fncall = &node.inner.fncall;
            let ws = fncall.create_workspace(&plan.id.to_string())?;
            Ok(Created::new(Arc::new(FncallSandbox::new(ws, fncall.clone()))))
        })
    }
    fn adopt<'a>(
        &'a self,
        node: &'a Node,
        id: &'a SandboxId,
        _record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>> {
        Box::pin(async move {
            let fncall = &node.inner.fncall;
            let ws = fncall.open_workspace(&id.to_string())?;
            Ok(Arc::new(FncallSandbox::new(ws, fncall.clone())) as Arc<dyn Sandbox>)
        })
    }
}

/// Containers on the node's kernel.
pub(crate) struct HostContainers;

impl TierBackend for HostContainers {
    fn tier(&self) -> Tier {
        Tier::Container
    }
    fn places(&self, placement: Option<Placement>) -> bool {
        placement != Some(Placement::Vm)
    }
    fn record_kind(&self) -> Option<&'static str> {
        Some(CONTAINER)
    }
    fn offered(&self, node: &Node) -> bool {
        node.inner.containers.is_ok()
    }
    fn mounts_volumes(&self) -> bool {
        true
    }
    fn takes_egress(&self) -> bool {
        true
    }
    fn asks(&self, node: &Node, request: &CreateRequest) -> (u64, u64) {
        container_asks(node, request)
    }
    fn admitted_by_use(&self) -> bool {
        true
    }
    fn create<'a>(
        &'a self,
        node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>> {
        Box::pin(async move {
            let store = node.inner.store.as_ref().ok().map(Arc::as_ref);
            // An image of a registry (`oci:REF`) the store lacks is pulled first.
            let registry_ref = plan
                .request
                .image
                .as_deref()
                .and_then(|i| i.strip_prefix(crate::environments::pulls::REGISTRY_PREFIX));
            let pulled;
            let req = match registry_ref {
                Some(reference) => {
                    let store = node.store()?;
                    let config = node.inner.config.images.registries.pull_config();
                    let pulls = &node.inner.pulls;
                    let env = crate::environments::pulls::registry_image(
                        &store, &config, pulls, reference,
                    )
                    .await?;
                    pulled = CreateRequest { image: Some(env), ..plan.request.clone() };
                    &pulled
                }
                None => plan.request,
            };
            let container = node.container_tier()?.create(plan.id, req, store, plan.binds).await?;
            Ok(Created::new(Arc::new(container)))
        })
    }
    fn remove_orphans<'a>(&'a self, node: &'a Node, adopted: &'a [String]) -> BoxFuture<'a, usize> {
        Box::pin(async move { node.container_tier().map_or(0, |t| t.remove_orphans(adopted)) })
    }
    fn adopt<'a>(
        &'a self,
        node: &'a Node,
        id: &'a SandboxId,
        record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>> {
        Box::pin(async move {
            let record = body_of(self.tier(), record, ContainerRecord::from_tier)?;
            let store = node.inner.store.as_ref().ok().map(Arc::as_ref);
            let container = node.container_tier()?.attach(id, &record, store).await?;
            Ok(Arc::new(container) as Arc<dyn Sandbox>)
        })
    }
}

/// Containers in the node's container-host VMs.
pub(crate) struct VmContainers;

impl TierBackend for VmContainers {
    fn tier(&self) -> Tier {
        Tier::Container
    }
    fn places(&self, placement: Option<Placement>) -> bool {
        placement == Some(Placement::Vm)
    }
    fn record_kind(&self) -> Option<&'static str> {
        Some(HOSTED)
    }
    fn offered(&self, node: &Node) -> bool {
        node.inner.container_hosts.is_ok()
    }
    // Taken so that its create refuses them with the tier's own words ("not yet for
    // containers in a container-host VM"), as before the registry.
    fn takes_egress(&self) -> bool {
        true
    }
    fn asks(&self, node: &Node, request: &CreateRequest) -> (u64, u64) {
        container_asks(node, request)
    }
    fn admitted_by_use(&self) -> bool {
        true
    }
    fn create<'a>(
        &'a self,
        node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>> {
        Box::pin(async move {
            let hosts = node.container_hosts()?;
            let cfg = &node.inner.config.container;
            let sandbox =
                crate::tiers::container_host::create(hosts, plan.id, plan.request, cfg).await?;
            Ok(Created::new(Arc::new(sandbox)))
        })
    }
    fn remove_orphans<'a>(&'a self, node: &'a Node, adopted: &'a [String]) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            match &node.inner.container_hosts {
                Ok(hosts) => hosts.remove_orphans(adopted).await,
                Err(_) => 0,
            }
        })
    }
    fn adopt<'a>(
        &'a self,
        node: &'a Node,
        id: &'a SandboxId,
        record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>> {
        Box::pin(async move {
            let record = body_of(self.tier(), record, HostedRecord::from_tier)?;
            node.adopt_hosted(id, &record).await
        })
    }
}

/// One KVM microVM per sandbox.
pub(crate) struct Microvms;

impl TierBackend for Microvms {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }
    fn record_kind(&self) -> Option<&'static str> {
        Some(MACHINE)
    }
    fn offered(&self, node: &Node) -> bool {
        node.inner.vmtier.is_ok()
    }
    fn create<'a>(
        &'a self,
        node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>> {
        Box::pin(async move {
            let vm = node.create_microvm(plan.id, plan.request.image.as_deref()).await?;
            let sandbox = VmSandbox::new(vm, node.vmtier()?.clone(), self.tier());
            Ok(Created::new(Arc::new(sandbox)))
        })
    }
    fn remove_orphans<'a>(&'a self, node: &'a Node, adopted: &'a [String]) -> BoxFuture<'a, usize> {
        Box::pin(async move { node.vmtier().map_or(0, |t| t.remove_orphans(adopted)) })
    }
    fn adopt<'a>(
        &'a self,
        node: &'a Node,
        id: &'a SandboxId,
        record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>> {
        Box::pin(adopt_machine(node, id, self.tier(), record))
    }
}

/// Whole OS images with their own init, one VM each.
pub(crate) struct Fullvms;

impl TierBackend for Fullvms {
    fn tier(&self) -> Tier {
        Tier::Fullvm
    }
    fn record_kind(&self) -> Option<&'static str> {
        Some(MACHINE)
    }
    fn offered(&self, node: &Node) -> bool {
        node.inner.fullvm.is_ok()
    }
    fn takes_egress(&self) -> bool {
        true
    }
    fn create<'a>(
        &'a self,
        node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>> {
        Box::pin(async move {
            // Its link is made with it: its VMM attaches to the tap at start.
            let dests = plan.egress.as_ref().map(|(_, d)| d.clone());
            let (vm, slot) = node.create_fullvm(plan.id, dests).await?;
            let sandbox = VmSandbox::new(vm, node.fullvm_tier()?.clone(), self.tier());
            Ok(Created { sandbox: Arc::new(sandbox), net_slot: slot })
        })
    }
    fn remove_orphans<'a>(&'a self, node: &'a Node, adopted: &'a [String]) -> BoxFuture<'a, usize> {
        Box::pin(async move { node.fullvm_tier().map_or(0, |t| t.remove_orphans(adopted)) })
    }
    fn adopt<'a>(
        &'a self,
        node: &'a Node,
        id: &'a SandboxId,
        record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>> {
        Box::pin(adopt_machine(node, id, self.tier(), record))
    }
}
