//! Cluster mode: when the server is a control-plane replica, creates and one-shot calls go to
//! it, and everything about an existing sandbox goes straight to the node its id names, with
//! the signed route the control plane handed out. A rollout worker that only knows a sandbox id
//! asks the control plane for the route (reconnect by id); a node that stopped answering turns
//! into a clear `SandboxLost` error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use brig_proto::{ControlOp, NodeRoute, Reply, Request, Tier};
use brig_transport::{CertPin, ClientConnection};
use tokio::sync::Mutex;

use crate::Error;

/// Refresh a route this long before its token expires.
const ROUTE_MARGIN_MS: u64 = 60_000;
/// How long a set of direct-call routes is used before asking again.
const CALL_ROUTES_FRESH: Duration = Duration::from_secs(10);

/// How one-shot calls reached a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallHops {
    /// Sent straight to a node on a route the control plane leased.
    pub direct: u64,
    /// Placed and forwarded by the control plane (one extra hop).
    pub via_control: u64,
}

struct NodeLink {
    route: NodeRoute,
    conn: Option<ClientConnection>,
}

#[derive(Default)]
pub(crate) struct ClusterState {
    nodes: Mutex<HashMap<u32, NodeLink>>,
    call_routes: std::sync::RwLock<Option<(Instant, Vec<NodeRoute>)>>,
    refreshing: std::sync::atomic::AtomicBool,
    next_call: AtomicUsize,
    direct: AtomicU64,
    via_control: AtomicU64,
}

fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The node a sandbox id names: `sb-<node, 8 hex>-<16 hex>`.
fn node_of(sandbox: &str) -> Result<u32, Error> {
    let bad = || Error::Server {
        code: brig_proto::ErrorCode::BadRequest,
        message: format!("{sandbox:?} is not a sandbox id (expected sb-<8 hex>-<16 hex>)"),
    };
    // A volume id names its node the same way (`vol-<8 hex>-…`).
    let rest = sandbox.strip_prefix("sb-").or_else(|| sandbox.strip_prefix("vol-"));
    let hex = rest.and_then(|rest| rest.get(..8)).ok_or_else(bad)?;
    u32::from_str_radix(hex, 16).map_err(|_| bad())
}

async fn dial(route: &NodeRoute) -> Result<ClientConnection, Error> {
    let addr: SocketAddr = route
        .addr
        .parse()
        .map_err(|_| Error::Config(format!("node address {:?} is not an address", route.addr)))?;
    let pin = CertPin::from_hex(&route.cert_sha256).map_err(|e| Error::Config(e.to_string()))?;
    ClientConnection::connect_current(addr, &pin, &route.token)
        .await
        .map_err(|source| Error::Connect { addr: route.addr.clone(), source })
}

impl ClusterState {
    pub(crate) async fn remember(&self, route: NodeRoute) {
        let mut nodes = self.nodes.lock().await;
        let keep_conn = nodes.get(&route.node).is_some_and(|l| l.route.addr == route.addr);
        let conn = if keep_conn { nodes.remove(&route.node).and_then(|l| l.conn) } else { None };
        nodes.insert(route.node, NodeLink { route, conn });
    }

    /// A connection to the node holding `sandbox`; `fetch` asks the control plane for a route.
    pub(crate) async fn node_connection<F, Fut>(
        &self,
        sandbox: &str,
        fetch: F,
    ) -> Result<ClientConnection, Error>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<NodeRoute, Error>>,
    {
        let node = node_of(sandbox)?;
        let mut nodes = self.nodes.lock().await;
        let fresh = |l: &NodeLink| l.route.expires_unix_ms > now_unix_ms() + ROUTE_MARGIN_MS;
        if let Some(link) = nodes.get(&node).filter(|l| fresh(l)) {
            if let Some(conn) = link.conn.as_ref().filter(|c| !c.is_closed()) {
                return Ok(conn.clone());
            }
        }
        let route = match nodes.get(&node).filter(|l| fresh(l)) {
            Some(link) => link.route.clone(),
            None => {
                drop(nodes);
                let route = fetch().await?;
                nodes = self.nodes.lock().await;
                route
            }
        };
        let conn = dial(&route).await?;
        nodes.insert(node, NodeLink { route, conn: Some(conn.clone()) });
        Ok(conn)
    }

    /// Forgets the node holding `sandbox` (its connection failed): the next request asks the
    /// control plane again, which says whether the node is down.
    pub(crate) async fn forget(&self, sandbox: &str) {
        if let Ok(node) = node_of(sandbox) {
            self.nodes.lock().await.remove(&node);
        }
    }

    /// A leased route for a direct one-shot call, if one is fresh; whether to refresh.
    pub(crate) fn call_route(&self) -> (Option<NodeRoute>, bool) {
        let routes = self.call_routes.read().unwrap_or_else(|p| p.into_inner());
        match routes.as_ref() {
            Some((at, list)) if !list.is_empty() => {
                let i = self.next_call.fetch_add(1, Ordering::Relaxed) % list.len();
                let stale = at.elapsed() > CALL_ROUTES_FRESH
                    || list[i].expires_unix_ms < now_unix_ms() + ROUTE_MARGIN_MS;
                (Some(list[i].clone()), stale)
            }
            _ => (None, true),
        }
    }

    /// Starts a refresh unless one runs already; `false` if one does.
    pub(crate) fn begin_refresh(&self) -> bool {
        !self.refreshing.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn set_call_routes(&self, routes: Option<Vec<NodeRoute>>) {
        if let Some(routes) = routes {
            *self.call_routes.write().unwrap_or_else(|p| p.into_inner()) =
                Some((Instant::now(), routes));
        }
        self.refreshing.store(false, Ordering::Release);
    }

    /// Drops a leased route that failed, so calls go through the control plane until the
    /// next refresh.
    pub(crate) fn drop_call_route(&self, node: u32) {
        if let Some((_, list)) =
            self.call_routes.write().unwrap_or_else(|p| p.into_inner()).as_mut()
        {
            list.retain(|r| r.node != node);
        }
    }

    pub(crate) async fn call_connection(
        &self,
        route: &NodeRoute,
    ) -> Result<ClientConnection, Error> {
        {
            let nodes = self.nodes.lock().await;
            if let Some(conn) = nodes.get(&route.node).and_then(|l| l.conn.as_ref()) {
                if !conn.is_closed() {
                    return Ok(conn.clone());
                }
            }
        }
        let conn = dial(route).await?;
        let mut nodes = self.nodes.lock().await;
        nodes.insert(route.node, NodeLink { route: route.clone(), conn: Some(conn.clone()) });
        Ok(conn)
    }

    pub(crate) fn count(&self, direct: bool) {
        if direct { &self.direct } else { &self.via_control }.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn hops(&self) -> CallHops {
        CallHops {
            direct: self.direct.load(Ordering::Relaxed),
            via_control: self.via_control.load(Ordering::Relaxed),
        }
    }
}

/// The request a leased-routes refresh sends.
pub(crate) fn routes_request() -> Request {
    Request::Control(ControlOp::Routes { tier: Tier::Fncall })
}

pub(crate) fn routes_from(reply: Reply) -> Option<Vec<NodeRoute>> {
    match reply {
        Reply::Routes(list) => Some(list),
        _ => None,
    }
}

impl crate::Client {
    /// The control plane's view of its nodes.
    pub async fn cluster_status(&self) -> Result<Vec<brig_proto::NodeSummary>, Error> {
        match self.request(&Request::Control(ControlOp::ClusterStatus)).await? {
            Reply::Cluster(nodes) => Ok(nodes),
            other => Err(crate::client::unexpected("cluster_status", &other)),
        }
    }

    /// Creates or changes a project and its limits (admin).
    pub async fn set_project(
        &self,
        name: &str,
        limits: brig_proto::ProjectLimits,
    ) -> Result<(), Error> {
        let request = Request::Control(ControlOp::ProjectPut { name: name.to_string(), limits });
        crate::client::expect_done("project_put", self.request(&request).await?)
    }

    /// Projects with their limits and live sandboxes.
    pub async fn projects(&self) -> Result<Vec<brig_proto::ProjectInfo>, Error> {
        match self.request(&Request::Control(ControlOp::ProjectList)).await? {
            Reply::Projects(list) => Ok(list),
            other => Err(crate::client::unexpected("project_list", &other)),
        }
    }

    /// A new access token for `project` (admin); its holder sees only that project.
    pub async fn create_token(&self, project: &str) -> Result<String, Error> {
        match self
            .request(&Request::Control(ControlOp::TokenCreate { project: project.to_string() }))
            .await?
        {
            Reply::Token { token } => Ok(token),
            other => Err(crate::client::unexpected("token_create", &other)),
        }
    }
}
