//! brigd: the Brig daemon. One binary, three roles: `all` (control plane and node in one
//! process, what a single machine needs), `node` and `control` (see [`cluster`]).
//!
//! State directory layout (default `$XDG_DATA_HOME/brig`, e.g. `~/.local/share/brig`):
//! ```text
//! access-token        tokens that admit clients, one per line (0600)
//! tls/cert.der|pem    self-signed certificate clients pin; tls/key.der (0600)
//! endpoint.json       where this daemon listens and its certificate fingerprint
//! fncall/             tool components, precompiled cache, workspaces
//! sandboxes/          one record per live sandbox
//! ```
#![forbid(unsafe_code)]

pub mod cluster;
pub mod endpoint;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use brig_control::AccessTokens;
use brig_node::{Node, NodeConfig, Principal};
use brig_proto::Request;
use brig_transport::{Exchange, Identity, Server, Service};

pub use endpoint::Endpoint;

static REQUEST_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The all-in-one service: the control plane admits clients, the node serves them.
pub struct AllInOne {
    tokens: AccessTokens,
    node: Node,
}

impl Service for AllInOne {
    type Principal = Principal;

    async fn authenticate(&self, token: &str) -> Option<Principal> {
        self.tokens.verify(token).then_some(Principal::Admin)
    }

    async fn serve(&self, principal: &Principal, request: Request, exchange: Exchange) {
        serve_node(&self.node, principal, request, exchange).await;
    }
}

/// Serves one request on the node, under a span per request: node → tier backend log under it.
pub(crate) async fn serve_node(
    node: &Node,
    principal: &Principal,
    request: Request,
    exchange: Exchange,
) {
    use tracing::Instrument;
    let id = REQUEST_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let span = tracing::debug_span!("request", id, kind = request.kind());
    node.serve_as(principal, request, exchange).instrument(span).await;
}

/// Which role the daemon runs.
#[derive(Debug, Clone)]
pub enum RoleOptions {
    /// Control plane and node in one process.
    All,
    /// A node of a cluster, reporting to these control-plane replicas.
    Node {
        controls: Vec<cluster::ControlAddr>,
        /// Admits the node at the control plane (an admin access token of the cluster).
        join_token: String,
        /// The address clients reach this node at (default: the bound address).
        advertise: Option<SocketAddr>,
    },
    /// A control-plane replica.
    Control(cluster::ControlOptions),
}

/// Everything brigd needs to start.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    pub tools_dirs: Vec<PathBuf>,
    pub node: NodeConfig,
    /// Address of the Prometheus metrics endpoint; `None` serves none.
    pub metrics: Option<SocketAddr>,
    pub role: RoleOptions,
    /// The E2B-compatible API (`[e2b]`); its listeners may be `off`.
    pub e2b: brig_e2b::E2bConfig,
}

/// The default state directory: `$BRIG_STATE_DIR`, else `<user data dir>/brig`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BRIG_STATE_DIR") {
        return PathBuf::from(dir);
    }
    dirs::data_dir().unwrap_or_else(|| PathBuf::from("/var/lib")).join("brig")
}

/// Reads a TOML configuration: the node's settings, and the E2B API's under `[e2b]`.
pub fn load_config(path: &Path) -> anyhow::Result<(NodeConfig, brig_e2b::E2bConfig)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let e2b = match table.remove("e2b") {
        Some(section) => {
            section.try_into().with_context(|| format!("parsing [e2b] in {}", path.display()))?
        }
        None => brig_e2b::E2bConfig::default(),
    };
    let node = toml::Value::Table(table)
        .try_into()
        .with_context(|| format!("parsing {}", path.display()))?;
    Ok((node, e2b))
}

/// Starts the E2B-compatible API in front of this daemon (as a client of its QUIC endpoint,
/// with the daemon's own token); returns its addresses, or none when it is off.
pub(crate) async fn start_e2b(
    config: &brig_e2b::E2bConfig,
    state: &Path,
    quic: SocketAddr,
    fingerprint: &str,
    keys: brig_e2b::KeyCheck,
) -> anyhow::Result<(Option<SocketAddr>, Option<SocketAddr>)> {
    if config.listen_addr()?.is_none() && config.envd_listen_addr()?.is_none() {
        return Ok((None, None));
    }
    let token = brig_sdk::read_token(&state.join("access-token"))?;
    let mut addr = quic;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let connect =
        brig_sdk::ConnectOptions::new(addr, brig_sdk::Pin::Sha256(fingerprint.to_string()), token);
    let gateway = brig_e2b::Gateway::new(config.clone(), connect, keys, state)?;
    Ok(gateway.start().await?)
}

/// Runs the all-in-one daemon until `shutdown` completes.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let state = &opts.state_dir;
    create_private_dir(state)?;
    if let RoleOptions::Control(control) = &opts.role {
        return cluster::run_control(opts.listen, state, control.clone(), &opts.e2b, shutdown)
            .await;
    }
    let tokens = AccessTokens::load_or_create(&state.join("access-token"))?;
    let tls_dir = state.join("tls");
    let names = vec!["localhost".to_string(), opts.listen.ip().to_string()];
    let identity = Identity::load_or_create(&tls_dir, &names)?;
    let node = Node::open(opts.node.clone(), state).await?;
    for dir in &opts.tools_dirs {
        let added = node
            .fncall()
            .add_tools_from_dir(dir)
            .await
            .with_context(|| format!("registering tools from {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), tools = added.len(), "built-in tools registered");
    }
    let server = Server::bind(opts.listen, &identity)?
        .limit_open_requests(opts.node.limits.streams_per_connection);
    let local = server.local_addr()?;
    let (metrics_addr, metrics_task) = match opts.metrics {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                let bound = listener.local_addr()?;
                let task = tokio::spawn(serve_metrics(listener, node.clone()));
                tracing::info!(addr = %bound, "metrics on http://{bound}/metrics");
                (Some(bound), Some(task))
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "metrics endpoint not served");
                (None, None)
            }
        },
        None => (None, None),
    };
    // The all-in-one daemon admits exactly its token file, so the gateway checks API keys
    // against it alone; a node also takes the control plane's signed tokens.
    let keys = match opts.role {
        RoleOptions::All => brig_e2b::KeyCheck::TokenFile(state.join("access-token")),
        _ => brig_e2b::KeyCheck::AskDaemon,
    };
    let (e2b, e2b_envd) = start_e2b(&opts.e2b, state, local, &identity.fingerprint(), keys).await?;
    let endpoint = Endpoint {
        addr: local,
        cert_sha256: identity.fingerprint(),
        cert_path: Identity::cert_path(&tls_dir),
        protocol: brig_proto::PROTOCOL_VERSION,
        pid: std::process::id(),
        metrics: metrics_addr,
        e2b,
        e2b_envd,
    };
    endpoint.write(state)?;
    tracing::info!(addr = %local, state_dir = %state.display(), fingerprint = %endpoint.cert_sha256, "brigd listening");
    let reaper = node.spawn_reaper();
    let census = node.spawn_stray_census();
    let sampler = node.spawn_usage_sampler();
    match &opts.role {
        RoleOptions::Node { controls, join_token, advertise } => {
            let keys = Arc::new(parking_lot::RwLock::new(Vec::new()));
            let beats: Vec<_> = controls
                .iter()
                .map(|control| {
                    tokio::spawn(cluster::heartbeat_loop(
                        node.clone(),
                        control.clone(),
                        join_token.clone(),
                        advertise.unwrap_or(local),
                        endpoint.cert_sha256.clone(),
                        keys.clone(),
                    ))
                })
                .collect();
            let service = Arc::new(cluster::ClusterNode { tokens, node: node.clone(), keys });
            server.run(service, shutdown).await;
            beats.iter().for_each(|b| b.abort());
        }
        _ => {
            let service = Arc::new(AllInOne { tokens, node: node.clone() });
            server.run(service, shutdown).await;
        }
    }
    reaper.abort();
    census.abort();
    sampler.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
    node.shutdown().await;
    Endpoint::remove(state);
    tracing::info!("brigd stopped");
    Ok(())
}

/// Serves `GET /metrics` (Prometheus text) on `listener`, on the same HTTP stack as the E2B
/// API (axum over hyper).
async fn serve_metrics(listener: tokio::net::TcpListener, node: Node) {
    use axum::http::header;
    let app =
        axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let node = node.clone();
                async move {
                    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], node.render_metrics())
                }
            }),
        );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!(error = %e, "metrics endpoint stopped");
    }
}

fn create_private_dir(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .with_context(|| format!("creating state directory {}", path.display()))
}
