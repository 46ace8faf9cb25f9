//! Where a new container goes: the node's kernel or a container-host VM
//! (`crate::tiers::container_host`).

use std::sync::Arc;

use brig_proto::Placement;

use brig_core::sandbox::Sandbox;
use brig_core::{SandboxId, Tier};
use brig_vmtier::hosts::ContainerHosts;
use brig_vmtier::HostedRecord;

use crate::tiers::container_host::PlacementPolicy;
use crate::{Node, NodeError};

impl Node {
    pub(crate) fn container_hosts(&self) -> Result<&Arc<ContainerHosts>, NodeError> {
        self.inner.container_hosts.as_ref().map_err(|why| NodeError::TierUnavailable {
            tier: brig_core::Tier::Container,
            why: format!("no container-host VMs here: {why}"),
        })
    }

    /// Takes back a container an earlier run placed in a container-host VM (restore).
    pub(crate) async fn adopt_hosted(
        &self,
        id: &SandboxId,
        record: &HostedRecord,
    ) -> Result<Arc<dyn Sandbox>, NodeError> {
        let hosts = self.container_hosts()?;
        let sandbox = hosts
            .adopt(&id.to_string(), record)
            .await
            .map_err(|e| NodeError::sandbox(&id.to_string(), Tier::Container, e))?;
        Ok(Arc::new(sandbox))
    }

    /// Where a new container goes: where the create asks, else the node's policy (`vm` never
    /// falls back to the node's kernel; `host` goes to a VM only where the node's kernel
    /// cannot run containers).
    pub(crate) fn placement_for(&self, asked: Option<Placement>) -> Result<Placement, NodeError> {
        let policy = self.inner.config.container_host.placement;
        let placement = match (asked, policy) {
            (Some(p), _) => p,
            (None, PlacementPolicy::Vm) => Placement::Vm,
            (None, PlacementPolicy::Host) if self.inner.containers.is_err() => {
                if self.inner.container_hosts.is_ok() {
                    Placement::Vm
                } else {
                    Placement::HostKernel
                }
            }
            (None, PlacementPolicy::Host) => Placement::HostKernel,
        };
        match placement {
            Placement::Vm => self.container_hosts().map(|_| placement),
            Placement::HostKernel => self.container_tier().map(|_| placement),
        }
    }
}
