//! Volumes across a cluster. A volume lives on one node and its id names that node
//! (`vol-<node>-<hex>`), so the control plane keeps nothing per volume: a create is placed
//! like a sandbox's (the node admits it); a list gathers every node's; an operation naming a
//! volume by name finds it on the nodes first (as the caller's project sees them); clients
//! reach a volume by id on its node directly (`Route` takes a volume id too). A sandbox that
//! mounts volumes is placed on the node that holds them, or the create says why not.

use brig_proto::{CreateRequest, ErrorCode, Reply, Request, VolumeInfo, VolumeOp, WireError};
use brig_sched::Demand;

use crate::plane::{err, Caller, ControlPlane};

/// The node a volume id names (`vol-<8 hex>-…`).
pub fn node_of_volume(id: &str) -> Option<u32> {
    let hex = id.strip_prefix("vol-")?.get(..8)?;
    u32::from_str_radix(hex, 16).ok()
}

impl ControlPlane {
    /// Every node's volumes the caller's project sees.
    async fn all_volumes(&self, caller: &Caller) -> Result<Vec<VolumeInfo>, WireError> {
        let project = caller.project().map(str::to_string);
        let request = Request::Volume(VolumeOp::List { project });
        let mut all = Vec::new();
        for entry in self.registry.up_nodes(None) {
            let node = entry.report.status.node_id;
            let token = || self.node_token(node, None, true).0;
            match self.links.request(&entry, token, &request).await {
                Ok(Reply::Volumes(list)) => all.extend(list),
                Ok(Reply::Error(e)) => return Err(e),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(node = format_args!("{node:08x}"), error = %e, "volume list skipped a node")
                }
            }
        }
        all.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        Ok(all)
    }

    /// The id of the volume `name_or_id` names for the caller (by name: the caller's
    /// project's volume of that name).
    async fn volume_id(&self, caller: &Caller, name_or_id: &str) -> Result<String, WireError> {
        let all = self.all_volumes(caller).await?;
        let found = all.iter().find(|v| v.id == name_or_id).or_else(|| {
            all.iter().find(|v| v.name == name_or_id && v.project.as_deref() == caller.project())
        });
        found
            .map(|v| v.id.clone())
            .ok_or_else(|| err(ErrorCode::NotFound, format!("no volume {name_or_id}")))
    }

    /// Volume requests that reach the control plane: creates, lists, and those naming a
    /// volume by name (by id, clients go to its node).
    pub(crate) async fn volume(
        &self,
        caller: &Caller,
        mut op: VolumeOp,
    ) -> Result<Reply, WireError> {
        match &mut op {
            VolumeOp::Create(req) => {
                req.project = caller.project().map(str::to_string).or(req.project.take());
                let demand = Demand {
                    tier: brig_core::Tier::Container,
                    image: None,
                    memory_mib: 0,
                    cpu_millis: 0,
                };
                Ok(self.placed(demand, &Request::Volume(op), None).await?.0)
            }
            VolumeOp::List { .. } => Ok(Reply::Volumes(self.all_volumes(caller).await?)),
            VolumeOp::Write(_) | VolumeOp::Read { .. } => Err(err(
                ErrorCode::BadRequest,
                "a volume's file moves between the client and its node: name the volume by id",
            )),
            other => {
                let Some(volume) = other.volume_mut() else {
                    return Err(err(ErrorCode::BadRequest, "no volume named"));
                };
                *volume = self.volume_id(caller, volume).await?;
                let node = node_of_volume(volume)
                    .ok_or_else(|| err(ErrorCode::BadRequest, format!("bad volume id {volume}")))?;
                let entry = self.registry.up(node).map_err(|state| {
                    err(
                        ErrorCode::Unavailable,
                        format!("the node {node:08x} of the volume is {state:?}"),
                    )
                })?;
                let token = || self.node_token(node, None, true).0;
                self.links.request(&entry, token, &Request::Volume(op)).await
            }
        }
    }

    /// The node holding every volume `req` mounts (their names made ids), or why none can
    /// take the sandbox.
    pub(crate) async fn volumes_node(
        &self,
        caller: &Caller,
        req: &mut CreateRequest,
    ) -> Result<Option<u32>, WireError> {
        if req.volumes.is_empty() {
            return Ok(None);
        }
        let mut node = None;
        for mount in &mut req.volumes {
            mount.volume = self.volume_id(caller, &mount.volume).await?;
            let holder = node_of_volume(&mount.volume).ok_or_else(|| {
                err(ErrorCode::BadRequest, format!("bad volume id {}", mount.volume))
            })?;
            match node {
                Some(n) if n != holder => {
                    return Err(err(
                        ErrorCode::BadRequest,
                        format!(
                            "the sandbox's volumes are on different nodes ({n:08x} and \
                             {holder:08x}); a sandbox mounts volumes of one node"
                        ),
                    ))
                }
                _ => node = Some(holder),
            }
        }
        Ok(node)
    }
}
