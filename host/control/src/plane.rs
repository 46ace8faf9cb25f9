//! The control plane as a QUIC service: node heartbeats, placement of creates and one-shot
//! calls, routes to nodes, projects and tokens. It keeps no per-sandbox state: a sandbox id
//! names its node, and everything after the create goes from the SDK to that node directly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use brig_core::{NodeId, SandboxId};
use brig_proto::{
    CallRequest, CallerInfo, ClusterKey, CreateRequest, ErrorCode, ListRequest, NodeRoute,
    ProjectInfo, ProjectLimits, Reply, Request, WireError,
};
use brig_proto::{ControlOp, NodeOp, SandboxOp, ToolOp};
use brig_sched::{Demand, Placer, Strategy};
use brig_transport::{Exchange, Service};
use parking_lot::{Mutex, RwLock};

use crate::links::NodeLinks;
use crate::quota::Quotas;
use crate::registry::{NodeState, Registry};
use crate::signing::{Claims, Signer};
use crate::store::{token_hash, ClusterState, Grant, StateStore, StoreError};

/// How a control-plane replica runs.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// A node silent this long is down.
    pub down_after: Duration,
    /// Choices per placement.
    pub k: usize,
    /// Lifetime of node tokens handed to clients.
    pub token_ttl: Duration,
    /// Placement attempts before giving up (each on a node that did not refuse yet).
    pub attempts: usize,
    pub seed: u64,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            down_after: Duration::from_secs(3),
            k: 2,
            token_ttl: Duration::from_secs(3600),
            attempts: 3,
            seed: rand::random(),
        }
    }
}

/// Who a control-plane connection acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Operators and nodes.
    Admin,
    Project(String),
}

impl Caller {
    pub(crate) fn project(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Project(p) => Some(p),
        }
    }
}

pub struct ControlPlane {
    cfg: ControlConfig,
    store: StateStore,
    state: RwLock<ClusterState>,
    /// Bumped, under `state`'s write lock, by every write this replica makes to its cached
    /// state; a refresh whose read began before such a write does not replace the cache (its
    /// read may predate the write).
    cache_writes: AtomicU64,
    signer: Signer,
    pub(crate) registry: Registry,
    placer: Mutex<Placer>,
    quotas: Quotas,
    pub(crate) links: NodeLinks,
    replicas: AtomicUsize,
    started: Instant,
}

fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn err(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

impl ControlPlane {
    /// Opens the replica: reads (or creates) the cluster's signing key and state, and admits
    /// `bootstrap_tokens` as admin.
    pub async fn open(
        cfg: ControlConfig,
        store: StateStore,
        bootstrap_tokens: &[String],
    ) -> Result<Arc<ControlPlane>, StoreError> {
        let fresh = Signer::generate_pkcs8().map_err(|_| StoreError::BadValue("key".into()))?;
        let key = store.signing_key_or_init(&fresh).await?;
        let signer = Signer::from_pkcs8(&key).map_err(|_| StoreError::BadValue("key".into()))?;
        for token in bootstrap_tokens {
            let hash = token_hash(token);
            if store.grant(&hash).await?.is_none() {
                store.put_grant(&hash, &Grant { project: None, admin: true }).await?;
            }
        }
        let state = store.load().await?;
        let placer = Placer::new(Strategy::PowerOfK(cfg.k), cfg.seed);
        Ok(Arc::new(ControlPlane {
            registry: Registry::new(cfg.down_after),
            cfg,
            store,
            state: RwLock::new(state),
            cache_writes: AtomicU64::new(0),
            signer,
            placer: Mutex::new(placer),
            quotas: Quotas::default(),
            links: NodeLinks::default(),
            replicas: AtomicUsize::new(1),
            started: Instant::now(),
        }))
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Background upkeep: marks silent nodes down, refreshes the durable state and the replica
    /// count. Runs until dropped.
    pub async fn maintain(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut n = 0u64;
        loop {
            tick.tick().await;
            for node in self.registry.sweep() {
                tracing::warn!(
                    node = format_args!("{node:08x}"),
                    "node stopped heartbeating: down"
                );
            }
            n += 1;
            if n.is_multiple_of(4) {
                let writes_before = self.cache_writes.load(Ordering::Acquire);
                match self.store.load().await {
                    Ok(state) => {
                        let mut cached = self.state.write();
                        if self.cache_writes.load(Ordering::Acquire) == writes_before {
                            *cached = state;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cluster state not refreshed"),
                }
                if let Ok(count) = self.store.replica_count().await {
                    self.replicas.store(count, Ordering::Relaxed);
                }
            }
        }
    }

    /// Changes the cached state after a write to the store, so that a refresh already in
    /// flight (which may have read the store before the write) does not undo it.
    fn write_cache(&self, change: impl FnOnce(&mut ClusterState)) {
        let mut cached = self.state.write();
        change(&mut cached);
        self.cache_writes.fetch_add(1, Ordering::AcqRel);
    }

    pub fn store(&self) -> &StateStore {
        &self.store
    }

    pub(crate) fn node_token(
        &self,
        node: u32,
        project: Option<&str>,
        admin: bool,
    ) -> (String, u64) {
        let expires_unix_ms = now_unix_ms() + self.cfg.token_ttl.as_millis() as u64;
        let claims = Claims { node, project: project.map(str::to_string), admin, expires_unix_ms };
        (self.signer.sign(&claims), expires_unix_ms)
    }

    fn route(&self, entry: &crate::registry::NodeEntry, caller: &Caller) -> NodeRoute {
        let node = entry.report.status.node_id;
        let (token, expires_unix_ms) =
            self.node_token(node, caller.project(), *caller == Caller::Admin);
        NodeRoute {
            node,
            addr: entry.report.addr.clone(),
            cert_sha256: entry.report.cert_sha256.clone(),
            token,
            expires_unix_ms,
        }
    }

    async fn handle(&self, caller: &Caller, request: Request) -> Result<Reply, WireError> {
        let admin_only = || match caller {
            Caller::Admin => Ok(()),
            Caller::Project(_) => {
                Err(err(ErrorCode::PermissionDenied, "this needs an admin token"))
            }
        };
        match request {
            Request::Control(ControlOp::NodeHeartbeat(report)) => {
                admin_only()?;
                let node = report.status.node_id;
                if self.registry.heartbeat(*report) {
                    tracing::info!(node = format_args!("{node:08x}"), "node up");
                }
                let now = self.now_ms();
                self.placer.lock().heartbeat(NodeId(node), now, 30_000);
                self.quotas.heartbeat(node, now);
                Ok(Reply::ClusterKey(ClusterKey { public_key: self.signer.public_key() }))
            }
            Request::Sandbox(SandboxOp::Create(req)) => self.create(caller, *req).await,
            Request::Tool(ToolOp::Call(call)) => self.call(caller, call).await,
            Request::Volume(op) => self.volume(caller, op).await,
            Request::Sandbox(SandboxOp::Events(req)) if req.sandbox.is_none() => {
                self.events(caller, req).await
            }
            Request::Control(ControlOp::Route { sandbox })
                if crate::volumes::node_of_volume(&sandbox).is_some() =>
            {
                let node = crate::volumes::node_of_volume(&sandbox).unwrap_or_default();
                match self.registry.up(node) {
                    Ok(entry) => Ok(Reply::Route(self.route(&entry, caller))),
                    Err(state) => Err(lost(&sandbox, node, state)),
                }
            }
            Request::Control(ControlOp::Route { sandbox }) => {
                let id: SandboxId = sandbox
                    .parse()
                    .map_err(|e: brig_core::IdError| err(ErrorCode::BadRequest, e.to_string()))?;
                match self.registry.up(id.node().0) {
                    Ok(entry) => Ok(Reply::Route(self.route(&entry, caller))),
                    Err(state) => Err(lost(&sandbox, id.node().0, state)),
                }
            }
            Request::Control(ControlOp::Routes { tier }) => Ok(Reply::Routes(
                self.registry.up_nodes(Some(tier)).iter().map(|e| self.route(e, caller)).collect(),
            )),
            Request::Control(ControlOp::ClusterStatus) => {
                Ok(Reply::Cluster(self.registry.summaries()))
            }
            Request::Sandbox(SandboxOp::List(req)) => self.list(caller, req).await,
            Request::Node(NodeOp::Whoami) => Ok(Reply::Caller(CallerInfo {
                project: caller.project().map(str::to_string),
                admin: *caller == Caller::Admin,
            })),
            Request::Control(ControlOp::ProjectPut { name, limits }) => {
                admin_only()?;
                valid_project(&name)?;
                self.store.put_project(&name, &limits).await.map_err(unavailable)?;
                self.write_cache(|s| {
                    s.projects.insert(name, limits);
                });
                Ok(Reply::Done)
            }
            Request::Control(ControlOp::ProjectList) => {
                let live = self.registry.live_by_project();
                let state = self.state.read();
                let visible = |name: &str| match caller.project() {
                    None => true,
                    Some(p) => name == p || name.starts_with(&format!("{p}/")),
                };
                Ok(Reply::Projects(
                    state
                        .projects
                        .iter()
                        .filter(|(name, _)| visible(name))
                        .map(|(name, limits)| ProjectInfo {
                            name: name.clone(),
                            limits: *limits,
                            live: live.get(name).copied().unwrap_or(0),
                        })
                        .collect(),
                ))
            }
            Request::Control(ControlOp::TokenCreate { project }) => {
                admin_only()?;
                valid_project(&project)?;
                let token = brig_proto::hello::e2b_key(&hex::encode(rand::random::<[u8; 32]>()));
                let grant = Grant { project: Some(project), admin: false };
                let hash = token_hash(&token);
                self.store.put_grant(&hash, &grant).await.map_err(unavailable)?;
                self.write_cache(|s| {
                    s.grants.insert(hash, grant);
                });
                Ok(Reply::Token { token })
            }
            other => match other.sandbox() {
                Some(sandbox) => Err(err(
                    ErrorCode::BadRequest,
                    format!(
                        "the control plane does not serve {} requests: send them to the node \
                         that owns {sandbox} (ask Route for it)",
                        other.kind()
                    ),
                )),
                None => Err(err(
                    ErrorCode::BadRequest,
                    format!(
                        "the control plane does not serve {} requests; ask a node",
                        other.kind()
                    ),
                )),
            },
        }
    }

    fn limits(&self) -> HashMap<String, ProjectLimits> {
        self.state.read().projects.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    async fn create(&self, caller: &Caller, mut req: CreateRequest) -> Result<Reply, WireError> {
        // A sandbox that mounts volumes goes to the node that holds them.
        let only = self.volumes_node(caller, &mut req).await?;
        let project = caller.project().map(str::to_string).or(req.project.clone());
        req.project = project.clone();
        // The control plane relays one reply: a create through it tells of no pull.
        req.pull_progress = false;
        if let Some(p) = &project {
            let live = self.registry.live_by_project();
            let replicas = self.replicas.load(Ordering::Relaxed);
            self.quotas
                .admit(p, &self.limits(), &live, replicas)
                .map_err(|e| err(ErrorCode::QuotaExceeded, e.to_string()))?;
            self.quotas.reserve(p);
        }
        let tier = req.tier.unwrap_or(brig_proto::Tier::Fncall);
        let demand = Demand {
            tier: crate::registry::tier(tier),
            image: req.image.as_deref().map(base_image),
            memory_mib: match tier {
                brig_proto::Tier::Fncall => 0,
                _ => req.limits.memory_mib.unwrap_or(512),
            },
            cpu_millis: match tier {
                brig_proto::Tier::Fncall => 0,
                _ => req.limits.cpu_millis.unwrap_or(1000),
            },
        };
        let request = Request::Sandbox(SandboxOp::Create(Box::new(req)));
        let result = self.placed(demand, &request, only).await;
        let now = self.now_ms();
        match result {
            Ok((Reply::Sandbox(info), entry)) => {
                if let Some(p) = &project {
                    self.quotas.settle(p, Some(entry.report.status.node_id), now);
                }
                Ok(Reply::Placed { sandbox: info, route: self.route(&entry, caller) })
            }
            Ok((other, _)) => {
                if let Some(p) = &project {
                    self.quotas.settle(p, None, now);
                }
                Err(err(ErrorCode::Internal, format!("node answered create with {other:?}")))
            }
            Err(e) => {
                if let Some(p) = &project {
                    self.quotas.settle(p, None, now);
                }
                Err(e)
            }
        }
    }

    async fn call(&self, caller: &Caller, call: CallRequest) -> Result<Reply, WireError> {
        if let Some(p) = caller.project() {
            let replicas = self.replicas.load(Ordering::Relaxed);
            // One-shot calls count against the creation rate; they are never live for long.
            self.quotas
                .admit(p, &self.limits(), &HashMap::new(), replicas)
                .map_err(|e| err(ErrorCode::QuotaExceeded, e.to_string()))?;
        }
        let demand =
            Demand { tier: brig_core::Tier::Fncall, image: None, memory_mib: 0, cpu_millis: 0 };
        Ok(self.placed(demand, &Request::Tool(ToolOp::Call(call)), None).await?.0)
    }

    /// Places `request` and forwards it, trying other nodes while nodes refuse for capacity or
    /// cannot be reached; with `only`, on that node or nowhere (it holds the volumes).
    pub(crate) async fn placed(
        &self,
        demand: Demand,
        request: &Request,
        only: Option<u32>,
    ) -> Result<(Reply, crate::registry::NodeEntry), WireError> {
        let mut exclude = Vec::new();
        if let Some(only) = only {
            exclude = self.registry.views().iter().map(|v| v.id).filter(|n| n.0 != only).collect();
        }
        let mut last = None;
        for _ in 0..self.cfg.attempts {
            let views = self.registry.views();
            let placement =
                self.placer.lock().place(&views, &demand, &exclude, self.now_ms()).map_err(
                    |e| match (last.take(), only) {
                        (Some(last), _) => last,
                        (None, Some(n)) => err(
                            ErrorCode::ResourceExhausted,
                            format!(
                            "node {n:08x}, which holds the sandbox's volumes, cannot take it: {e}"
                        ),
                        ),
                        (None, None) => err(ErrorCode::ResourceExhausted, e.to_string()),
                    },
                )?;
            let node = placement.node.0;
            let Ok(entry) = self.registry.up(node) else {
                self.placer.lock().refused(placement);
                exclude.push(placement.node);
                continue;
            };
            let token = || self.node_token(node, None, true).0;
            match self.links.request(&entry, token, request).await {
                Ok(Reply::Error(e)) if e.code.retryable() => {
                    tracing::debug!(node = format_args!("{node:08x}"), error = %e, "node refused");
                    self.placer.lock().refused(placement);
                    exclude.push(placement.node);
                    last = Some(e);
                }
                Ok(Reply::Error(e)) => {
                    self.placer.lock().refused(placement);
                    return Err(e);
                }
                Ok(reply) => {
                    self.placer.lock().confirmed(placement, self.now_ms());
                    return Ok((reply, entry));
                }
                Err(e) => {
                    self.placer.lock().refused(placement);
                    exclude.push(placement.node);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| err(ErrorCode::ResourceExhausted, "no node accepted it")))
    }

    async fn list(&self, caller: &Caller, mut req: ListRequest) -> Result<Reply, WireError> {
        if let Some(p) = caller.project() {
            req.project = Some(p.to_string());
        }
        let request = Request::Sandbox(SandboxOp::List(req));
        let mut all = Vec::new();
        for entry in self.registry.up_nodes(None) {
            let node = entry.report.status.node_id;
            let token = || self.node_token(node, None, true).0;
            match self.links.request(&entry, token, &request).await {
                Ok(Reply::Sandboxes(list)) => all.extend(list),
                Ok(Reply::Error(e)) => return Err(e),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "list skipped a node"),
            }
        }
        Ok(Reply::Sandboxes(all))
    }

    fn caller_for(&self, grant: &Grant) -> Caller {
        match (&grant.project, grant.admin) {
            (_, true) | (None, _) => Caller::Admin,
            (Some(p), false) => Caller::Project(p.clone()),
        }
    }
}

/// `debian-12@3+ws` → `debian-12`: the image placement filters on.
fn base_image(image: &str) -> String {
    let first = image.split('+').next().unwrap_or(image);
    first.split('@').next().unwrap_or(first).to_string()
}

fn valid_project(name: &str) -> Result<(), WireError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.split('/').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if ok {
        Ok(())
    } else {
        Err(err(
            ErrorCode::BadRequest,
            format!("{name:?} is not a project name (letters, digits, - and _, nested with /)"),
        ))
    }
}

fn unavailable(e: StoreError) -> WireError {
    err(ErrorCode::Unavailable, format!("cluster store: {e}"))
}

fn lost(sandbox: &str, node: u32, state: NodeState) -> WireError {
    match state {
        NodeState::Unknown => {
            err(ErrorCode::NotFound, format!("no node {node:08x} in this cluster holds {sandbox}"))
        }
        NodeState::Down { silent_for } => err(
            ErrorCode::SandboxLost,
            format!(
                "sandbox {sandbox} failed: its node {node:08x} stopped heartbeating {:.1} s ago",
                silent_for.as_secs_f64()
            ),
        ),
    }
}

impl Service for ControlPlane {
    type Principal = Caller;

    async fn authenticate(&self, token: &str) -> Option<Caller> {
        let hash = token_hash(token);
        let cached = self.state.read().grants.get(&hash).cloned();
        let grant = match cached {
            Some(g) => g,
            // A token another replica made a moment ago: read it through.
            None => {
                let g = self.store.grant(&hash).await.ok().flatten()?;
                self.write_cache(|s| {
                    s.grants.insert(hash, g.clone());
                });
                g
            }
        };
        Some(self.caller_for(&grant))
    }

    async fn serve(&self, caller: &Caller, request: Request, mut exchange: Exchange) {
        use tracing::Instrument;
        let span = tracing::debug_span!("control", kind = request.kind());
        if request.has_upload() {
            exchange.refuse_upload();
        }
        let reply = self.handle(caller, request).instrument(span).await;
        let reply = reply.unwrap_or_else(Reply::Error);
        let _ = exchange.reply(&reply).await;
        exchange.finish();
    }

    fn hello_message(&self) -> String {
        format!("brigd control {}", env!("CARGO_PKG_VERSION"))
    }
}
