//! The control plane's own connections to nodes: it forwards creates and one-shot calls with
//! an admin token it signs for each node.

use std::collections::HashMap;
use std::net::SocketAddr;

use brig_proto::{ErrorCode, Reply, Request, WireError};
use brig_transport::{CertPin, ClientConnection};
use tokio::sync::Mutex;

use crate::registry::NodeEntry;

#[derive(Default)]
pub struct NodeLinks {
    conns: Mutex<HashMap<u32, (String, ClientConnection)>>,
}

impl std::fmt::Debug for NodeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeLinks")
    }
}

impl NodeLinks {
    /// Sends `request` to the node and returns its reply. A node that cannot be reached
    /// answers `Unavailable` (placement then tries another).
    pub async fn request(
        &self,
        node: &NodeEntry,
        token: impl FnOnce() -> String,
        request: &Request,
    ) -> Result<Reply, WireError> {
        let conn = self.connection(node, token).await?;
        conn.request(request).await.map_err(|e| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("node {:08x} did not answer: {e}", node.report.status.node_id),
            )
        })
    }

    async fn connection(
        &self,
        node: &NodeEntry,
        token: impl FnOnce() -> String,
    ) -> Result<ClientConnection, WireError> {
        let id = node.report.status.node_id;
        let unavailable =
            |what: String| WireError::new(ErrorCode::Unavailable, format!("node {id:08x}: {what}"));
        let mut conns = self.conns.lock().await;
        if let Some((addr, conn)) = conns.get(&id) {
            if *addr == node.report.addr && !conn.is_closed() {
                return Ok(conn.clone());
            }
        }
        let addr: SocketAddr =
            node.report.addr.parse().map_err(|_| unavailable("bad address".into()))?;
        let pin = CertPin::from_hex(&node.report.cert_sha256)
            .map_err(|e| unavailable(format!("bad certificate pin: {e}")))?;
        let conn = ClientConnection::connect_current(addr, &pin, &token())
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        conns.insert(id, (node.report.addr.clone(), conn.clone()));
        Ok(conn)
    }
}
