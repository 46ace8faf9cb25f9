//! Lifecycle events across a cluster: each node keeps its own journal, so a read through the
//! control plane gathers every node's (as the caller's project sees them) and merges them by
//! time. Following events as they happen is a node's (ask each node).

use brig_proto::{ErrorCode, EventsRequest, Reply, Request, SandboxOp, WireError};

use crate::plane::{err, Caller, ControlPlane};

impl ControlPlane {
    pub(crate) async fn events(
        &self,
        caller: &Caller,
        mut req: EventsRequest,
    ) -> Result<Reply, WireError> {
        if req.follow {
            return Err(err(
                ErrorCode::BadRequest,
                "events are followed on each node: the control plane gathers reads only",
            ));
        }
        if let Some(p) = caller.project() {
            req.project = Some(p.to_string());
        }
        let limit = req.limit;
        let newest_first = req.newest_first;
        let request = Request::Sandbox(SandboxOp::Events(req));
        let mut all = Vec::new();
        for entry in self.registry.up_nodes(None) {
            let node = entry.report.status.node_id;
            let token = || self.node_token(node, None, true).0;
            match self.links.request(&entry, token, &request).await {
                Ok(Reply::Events(events)) => all.extend(events),
                Ok(Reply::Error(e)) => return Err(e),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(node = format_args!("{node:08x}"), error = %e, "events skipped a node")
                }
            }
        }
        all.sort_by_key(|e| (e.unix_ms, e.seq));
        if limit > 0 && all.len() > limit as usize {
            let extra = all.len() - limit as usize;
            if newest_first {
                all.drain(..extra);
            } else {
                all.truncate(limit as usize);
            }
        }
        Ok(Reply::Events(all))
    }
}
