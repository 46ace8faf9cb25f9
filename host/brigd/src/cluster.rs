//! The cluster roles: `brigd node` (a node that heartbeats to control-plane replicas and admits
//! clients holding node tokens they signed) and `brigd control` (a control-plane replica).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use brig_control::{AccessTokens, ControlConfig, ControlPlane, StateStore};
use brig_node::{Node, Principal};
use brig_proto::{ControlOp, NodeReport, Reply, Request};
use brig_transport::{CertPin, ClientConnection, Exchange, Identity, Server, Service};
use parking_lot::RwLock;

/// A control-plane replica a node reports to: its address and certificate fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlAddr {
    pub addr: SocketAddr,
    pub cert_sha256: String,
}

impl std::str::FromStr for ControlAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, pin) = s.split_once('=').ok_or("expected ADDR=CERT_SHA256")?;
        let addr = addr.trim().parse().map_err(|e| format!("{addr}: {e}"))?;
        CertPin::from_hex(pin.trim()).map_err(|e| e.to_string())?;
        Ok(ControlAddr { addr, cert_sha256: pin.trim().to_string() })
    }
}

/// How often a node reports to each replica.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// The node role's service: local admin tokens, or node tokens the control plane signed.
pub struct ClusterNode {
    pub tokens: AccessTokens,
    pub node: Node,
    /// Public keys of the control plane, learned from heartbeat replies.
    pub keys: Arc<RwLock<Vec<Vec<u8>>>>,
}

impl Service for ClusterNode {
    type Principal = Principal;

    async fn authenticate(&self, token: &str) -> Option<Principal> {
        if brig_control::signing::is_node_token(token) {
            let keys = self.keys.read().clone();
            let node_id = self.node.node_id();
            return match brig_control::signing::verify(token, &keys, node_id, now_unix_ms()) {
                Ok(claims) if claims.admin => Some(Principal::Admin),
                Ok(claims) => claims.project.map(Principal::Project),
                Err(e) => {
                    tracing::info!(error = %e, "node token refused");
                    None
                }
            };
        }
        self.tokens.verify(token).then_some(Principal::Admin)
    }

    async fn serve(&self, principal: &Principal, request: Request, exchange: Exchange) {
        crate::serve_node(&self.node, principal, request, exchange).await;
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Reports to one replica once a second until aborted, reconnecting as needed, and keeps the
/// replica's public key in `keys`.
pub async fn heartbeat_loop(
    node: Node,
    control: ControlAddr,
    join_token: String,
    advertise: SocketAddr,
    fingerprint: String,
    keys: Arc<RwLock<Vec<Vec<u8>>>>,
) {
    let mut conn: Option<ClientConnection> = None;
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    let mut failing = false;
    loop {
        tick.tick().await;
        if conn.as_ref().is_none_or(ClientConnection::is_closed) {
            conn = match CertPin::from_hex(&control.cert_sha256) {
                Ok(pin) => ClientConnection::connect_current(control.addr, &pin, &join_token)
                    .await
                    .map_err(|e| {
                        if !failing {
                            tracing::warn!(control = %control.addr, error = %e, "control plane unreachable");
                        }
                        failing = true;
                    })
                    .ok(),
                Err(_) => None,
            };
        }
        let Some(c) = &conn else { continue };
        let report = NodeReport {
            status: node.status().await,
            addr: advertise.to_string(),
            cert_sha256: fingerprint.clone(),
            images: node.image_access(),
            live_by_project: node.live_by_project(),
        };
        match c.request(&Request::Control(ControlOp::NodeHeartbeat(Box::new(report)))).await {
            Ok(Reply::ClusterKey(key)) => {
                if failing {
                    tracing::info!(control = %control.addr, "reporting to the control plane");
                    failing = false;
                }
                let mut keys = keys.write();
                if !keys.contains(&key.public_key) {
                    keys.push(key.public_key);
                }
            }
            Ok(other) => {
                tracing::warn!(control = %control.addr, reply = ?other, "heartbeat refused");
                failing = true;
            }
            Err(e) => {
                tracing::debug!(control = %control.addr, error = %e, "heartbeat lost");
                conn = None;
            }
        }
    }
}

/// Options of the control role.
#[derive(Debug, Clone)]
pub struct ControlOptions {
    /// etcd endpoints; empty keeps the cluster state in `<state>/cluster.json`.
    pub etcd: Vec<String>,
    pub config: ControlConfig,
}

/// Runs a control-plane replica until `shutdown` completes.
pub async fn run_control(
    listen: SocketAddr,
    state: &Path,
    opts: ControlOptions,
    e2b: &brig_e2b::E2bConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let tokens = AccessTokens::load_or_create(&state.join("access-token"))?;
    let identity = Identity::load_or_create(
        &state.join("tls"),
        &["localhost".to_string(), listen.ip().to_string()],
    )?;
    let store = if opts.etcd.is_empty() {
        StateStore::file(&state.join("cluster.json"))
    } else {
        StateStore::etcd(&opts.etcd).await.context("connecting to etcd")?
    };
    let primary: Vec<String> = tokens.primary().into_iter().collect();
    let plane = ControlPlane::open(opts.config, store.clone(), &primary)
        .await
        .context("opening the cluster state")?;
    let server = Server::bind(listen, &identity)?;
    let local = server.local_addr()?;
    let replica_id = format!("{}-{}", local, std::process::id());
    let lease = store.announce_replica(&replica_id, &local.to_string()).await?;
    let upkeep = tokio::spawn(plane.clone().maintain());
    // The E2B API of a replica places through it and reaches sandboxes on their nodes, as
    // any client of the cluster does.
    // Project tokens live in the cluster's state: unknown keys are asked about.
    let keys = brig_e2b::KeyCheck::AskDaemon;
    let (e2b, e2b_envd) =
        crate::start_e2b(e2b, state, local, &identity.fingerprint(), keys).await?;
    let endpoint = crate::Endpoint {
        addr: local,
        cert_sha256: identity.fingerprint(),
        cert_path: Identity::cert_path(&state.join("tls")),
        protocol: brig_proto::PROTOCOL_VERSION,
        pid: std::process::id(),
        metrics: None,
        e2b,
        e2b_envd,
    };
    endpoint.write(state)?;
    tracing::info!(addr = %local, store = ?store, "brigd control listening");
    server.run(plane, shutdown).await;
    upkeep.abort();
    if let Some(lease) = lease {
        lease.abort();
    }
    crate::Endpoint::remove(state);
    Ok(())
}
