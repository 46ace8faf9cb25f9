//! The node daemon's request handling: it owns the tier backends and the sandboxes on this node,
//! turns wire requests into backend calls, and backend results into replies.
//!
//! ```text
//! transport ──Request──▶ Node::serve ──▶ fncall backend (one-shot calls, tools)
//!                            │        ├─▶ sandbox table  (ids, specs, TTLs, execs, sessions; persisted)
//!                            │        │     └─▶ Arc<dyn brig_core::Sandbox> of the sandbox's tier
//!                            │        └─▶ layer store    (images, environments, checkpoints)
//!                            └──Reply──▶ transport
//! ```
//! Every tier is reached through the one sandbox interface; a tier is a `TierBackend` in the
//! node's registry (`tiers::registry`: the built-in ones, and any given to
//! [`Node::open_with`]), chosen by tier and placement for a create and by record kind for a
//! restore, and what a tier cannot do is a typed refusal from its capabilities.
//! A node is the source of truth for its sandboxes: it rebuilds its table from its state
//! directory on start, and destroys sandboxes whose idle TTL passes.
#![forbid(unsafe_code)]

mod config;
mod convert;
mod environments;
mod error;
mod execs;
mod host;
mod lifecycle;
mod limits;
mod policy;
#[cfg(test)]
mod routing_tests;
mod serve;
mod table;
mod tiers;

use environments::{images, pulls};
use policy::egress;
use serve::{file_work, files};
use table::intents;
use tiers::{container_host, fullvm, microvm};

pub use config::{NodeConfig, OnExit};
pub use environments::images::{BlobBackendConfig, ImagesConfig};
pub use environments::volumes;
pub use error::NodeError;
pub use host::{metrics, shrinker_ids, swap, usage_history};
pub use limits::LimitsConfig;
pub use policy::admission::AdmissionConfig;
pub use policy::lifecycle_events;
pub use table::scope::{Principal, PROJECT_LABEL};
pub use tiers::container::ContainerConfig;
pub use tiers::container_host::{ContainerHostConfig, PlacementPolicy};
pub use tiers::registry::{CreatePlan, Created, TierBackend};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use brig_core::{IdleAction, SandboxId, Tier};
use brig_fncall::FncallBackend;
use brig_proto::{AuditKind, NodeOp, Reply, Request, SandboxInfo, SandboxState};
use brig_transport::Exchange;

use crate::host::metrics::Metrics;
use crate::policy::audit::AuditLog;
use crate::tiers::container::ContainerTier;
use brig_core::sandbox::{Condition, Op, Persistence};

use crate::table::sandboxes::{Gone, SandboxEntry, SandboxTable};

/// One node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    config: NodeConfig,
    fncall: FncallBackend,
    /// `Err` says why this node offers no containers.
    containers: Result<ContainerTier, String>,
    /// The microVM tier, or why this node does not offer it.
    vmtier: Result<Arc<brig_vmtier::VmTier>, String>,
    /// The full-VM tier, or why this node does not offer it.
    fullvm: Result<Arc<brig_vmtier::VmTier>, String>,
    /// Container-host VMs for containers on a guest's kernel, or why there are none.
    container_hosts: Result<Arc<brig_vmtier::hosts::ContainerHosts>, String>,
    /// `Err` says why this node has no layer store.
    store: Result<Arc<brig_images::LayerStore>, String>,
    sandboxes: SandboxTable,
    /// Unique to this daemon's state directory: names its run directory, cgroups, network.
    tag: String,
    run_dir: PathBuf,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    egress: egress::EgressState,
    /// The node's zram swap, if configured.
    zram: Option<swap::ZramSwap>,
    /// Admission's bounds and what the node's containers were last measured to use.
    admission: Arc<policy::admission::Admission>,
    /// Forks under way, recorded so a crash in one is rolled back at the next start.
    intents: intents::Intents,
    /// Clients following audit trails now (bounded by `limits.audit_followers`).
    audit_followers: limits::Gauge,
    /// Clients following the lifecycle journal now (bounded by `limits.event_followers`).
    event_followers: limits::Gauge,
    /// The bounds and deadline of file work on the blocking pool.
    file_work: file_work::FileWorkGate,
    /// Registry pulls creates are waiting for, by reference: concurrent creates of one image
    /// the node has not seen share one pull (`images::registry_image`).
    pulls: pulls::PullsInFlight,
    /// Volumes sandboxes mount (`volumes`).
    volumes: volumes::Volumes,
    /// Every sandbox's lifecycle events in one sequence (`lifecycle_events`).
    journal: lifecycle_events::LifecycleJournal,
    /// The tiers, by tier and placement, and by record kind (`tiers::registry`).
    tiers: tiers::registry::TierRegistry,
}

impl Node {
    /// Opens the node's state under `state_dir` and restores the sandboxes recorded there.
    pub async fn open(config: NodeConfig, state_dir: &Path) -> Result<Node, NodeError> {
        Node::open_with(config, state_dir, Vec::new()).await
    }

    /// As [`Node::open`], with tiers of the caller's besides the node's own: each looked up
    /// before the built-in ones, for creates and for records alike.
    pub async fn open_with(
        config: NodeConfig,
        state_dir: &Path,
        tiers: Vec<Arc<dyn TierBackend>>,
    ) -> Result<Node, NodeError> {
        raise_fd_limit();
        let fncall = FncallBackend::open(config.fncall.clone(), &state_dir.join("fncall"))?;
        let zram = swap::ZramSwap::ensure(&config.swap, state_dir)?;
        // One run directory and cgroup parent per daemon state directory, so daemons sharing a
        // host never collide.
        let tag = hex::encode(
            &<sha2::Sha256 as sha2::Digest>::digest(state_dir.as_os_str().as_encoded_bytes())[..4],
        );
        let run_dir =
            config.container.run_dir.clone().unwrap_or_else(|| Path::new("/run/brig").join(&tag));
        let cgroup_parent = format!("brig-{:x}-{tag}", config.node_id);
        let survive = config.on_exit == OnExit::Keep;
        let containers =
            ContainerTier::open(&config.container, state_dir, &run_dir, &cgroup_parent, survive);
        match &containers {
            Ok(_) => tracing::info!("container tier ready"),
            Err(why) => tracing::warn!(%why, "container tier not offered"),
        }
        let store =
            images::open_store(&config.images, state_dir, &run_dir, config.container.id_base);
        match &store {
            Ok(s) => tracing::info!(backend = s.backend().kind(), "layer store ready"),
            Err(why) => tracing::warn!(%why, "layer store not available"),
        }
        let vmtier = microvm::open(&config.microvm, state_dir);
        let fullvm = fullvm::open(&config.fullvm, state_dir);
        let container_hosts =
            container_host::open(&config.container_host, &config.container, state_dir);
        let sandboxes = SandboxTable::new(&state_dir.join("sandboxes"))?;
        let audit = Arc::new(AuditLog::open(&state_dir.join("audit"))?);
        let journal = lifecycle_events::LifecycleJournal::open(state_dir);
        let intents = intents::Intents::open(&state_dir.join("ops"))?;
        let file_work = file_work::FileWorkGate::new(&config.limits);
        let volumes = volumes::Volumes::open(
            config.volumes.clone(),
            config.node_id,
            state_dir,
            &run_dir,
            config.container.id_base,
            config.limits.file_ops_per_sandbox,
        )?;
        let admission = Arc::new(policy::admission::Admission::new(config.admission.clone()));
        let node = Node {
            inner: Arc::new(Inner {
                config,
                fncall,
                containers,
                vmtier,
                fullvm,
                container_hosts,
                store,
                sandboxes,
                tag,
                run_dir,
                audit,
                metrics: Arc::default(),
                egress: egress::EgressState::default(),
                admission,
                audit_followers: limits::Gauge::default(),
                event_followers: limits::Gauge::default(),
                file_work,
                pulls: Default::default(),
                intents,
                zram,
                volumes,
                journal,
                tiers: tiers::registry::TierRegistry::new(tiers),
            }),
        };
        node.restore().await;
        Ok(node)
    }

    /// Tiers this node offers.
    pub fn tiers(&self) -> Vec<Tier> {
        self.inner.tiers.offered(self)
    }

    pub fn fncall(&self) -> &FncallBackend {
        &self.inner.fncall
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    /// Ends the node. With `on_exit = destroy` every container and VM goes with it; with
    /// `keep` (the default) they keep running and the next run of the node takes them back.
    pub async fn shutdown(&self) {
        if self.inner.config.on_exit == OnExit::Destroy {
            let containers: Vec<_> = self
                .inner
                .sandboxes
                .list(&[])
                .into_iter()
                .filter(|e| {
                    matches!(
                        e.sandbox.capabilities().persistence,
                        Persistence::Record | Persistence::Machine | Persistence::Hosted
                    )
                })
                .collect();
            let gone = || Gone::Expired("the node shut down".into());
            futures::future::join_all(containers.iter().map(|e| self.destroy(&e.id, gone()))).await;
        }
        self.inner.fncall.shutdown();
        if let Ok(containers) = &self.inner.containers {
            containers.shutdown();
        }
        // Kept with `on_exit = keep`: a restarted node adopts them with their containers.
        if self.inner.config.on_exit == OnExit::Destroy {
            if let Ok(hosts) = &self.inner.container_hosts {
                hosts.shutdown().await;
            }
        }
        self.close_network();
        self.unmount_volumes();
        // With no container left to read lazily served layers, their mount and the run
        // directory go too (a restart would detach the mount anyway).
        let kept = self
            .inner
            .sandboxes
            .list(&[])
            .iter()
            .any(|e| e.sandbox.capabilities().persistence == Persistence::Record);
        if !kept {
            if let Ok(store) = &self.inner.store {
                if let Err(e) = store.stop_lazy_server().await {
                    tracing::warn!(error = %e, "cannot stop the lazy file system server");
                }
            }
            let lazy = self.inner.run_dir.join("lazy");
            let _ = nix::mount::umount2(&lazy, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(&lazy);
            let files = ["log", "sock", "pid", "files", "tmp", "keeper", "pid.tmp", "keeper.tmp"];
            for file in files.map(|f| format!("lazyfs.{f}")) {
                let _ = std::fs::remove_file(self.inner.run_dir.join(file));
            }
            let _ = std::fs::remove_dir(&self.inner.run_dir);
        }
    }

    /// The Prometheus text exposition of this node's metrics (live gauges refreshed first).
    pub fn render_metrics(&self) -> String {
        let m = &self.inner.metrics;
        let sandboxes = self.inner.sandboxes.all();
        let counts =
            metrics::live_counts(sandboxes.iter().map(|e| (e.tier, e.paused_unix_ms().is_some())));
        for ((tier, state), n) in counts {
            m.live.get_or_create(&metrics::LiveLabels { tier, state }).set(n);
        }
        self.refresh_qos_metrics(&self.capacity());
        let reserved = shrinker_ids::ShrinkerIds::beside(&self.inner.run_dir).this_boot();
        m.shrinker_ids_reserved
            .set(reserved.map_or(0, |r| i64::try_from(r.ids).unwrap_or(i64::MAX)));
        if let Ok(containers) = &self.inner.containers {
            let spares = containers.runtime().spare_cgroups();
            m.spare_cgroups.set(i64::try_from(spares).unwrap_or(i64::MAX));
        }
        m.encode()
    }

    /// Serves one request for `principal`: scoped to its project, then as [`Node::serve`].
    pub async fn serve_as(&self, principal: &Principal, request: Request, mut exchange: Exchange) {
        let kind = request.kind();
        let upload = request.has_upload();
        if let Request::Node(NodeOp::Whoami) = request {
            let project = match principal {
                Principal::Admin => None,
                Principal::Project(p) => Some(p.clone()),
            };
            let admin = project.is_none();
            let _ = exchange.reply(&Reply::Caller(brig_proto::CallerInfo { project, admin })).await;
            exchange.finish();
            return;
        }
        match self.authorize(principal, request) {
            Ok(request) => self.serve(request, exchange).await,
            Err(e) => {
                if upload {
                    exchange.refuse_upload();
                }
                let code = e.to_wire().code.as_str();
                self.inner
                    .metrics
                    .refusals
                    .get_or_create(&metrics::RefusalLabels { kind, code })
                    .inc();
                let _ = exchange.error(e.to_wire()).await;
                exchange.finish();
            }
        }
    }

    /// Serves one request on its exchange: routed by family ([`Node::route`]), audited where it
    /// touched a sandbox's files, counted, and answered.
    pub async fn serve(&self, request: Request, mut exchange: Exchange) {
        let kind = request.kind();
        self.inner.metrics.requests.get_or_create(&metrics::KindLabel { kind }).inc();
        let file_op = files::audited_op(&request);
        let upload = request.has_upload();
        let result = self.route(request, Some(&mut exchange)).await;
        if result.is_err() && upload {
            // An upload the failed request did not read to its end: the client's further
            // writes fail instead of waiting (what `serve_as` does for a refused request).
            exchange.refuse_upload();
        }
        if let Some((sandbox, op, path)) = file_op {
            let bytes = match &result {
                Ok(Some(Reply::Written { bytes })) => *bytes,
                _ => 0,
            };
            self.audit_if_live(
                &sandbox,
                AuditKind::File { op: op.into(), path, bytes, ok: result.is_ok() },
            );
        }
        if let Err(e) = &result {
            let code = e.to_wire().code.as_str();
            self.inner.metrics.refusals.get_or_create(&metrics::RefusalLabels { kind, code }).inc();
        }
        let outcome = match &result {
            Ok(Some(reply)) => exchange.reply(reply).await,
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::debug!(request = kind, error = %e, "request failed");
                exchange.error(e.to_wire()).await
            }
        };
        if let Err(e) = outcome {
            tracing::debug!(request = kind, error = %e, "cannot send reply");
            // Sandboxes made for a client that is gone, who never heard of them: nobody could
            // use or destroy them, so they go now.
            for id in made_sandboxes(kind, &result) {
                self.destroy(&id, Gone::Destroyed).await;
                // Logged once the sandbox and its record are gone.
                tracing::warn!(sandbox = %id, request = kind, "the client left before the reply; destroyed");
            }
        }
        exchange.finish();
    }

    fn store(&self) -> Result<Arc<brig_images::LayerStore>, NodeError> {
        self.inner.store.clone().map_err(NodeError::NoStore)
    }

    /// What this node reports about itself.
    pub async fn status(&self) -> brig_proto::NodeStatus {
        let images = match &self.inner.store {
            Ok(store) => Some(images::stats(store).await),
            Err(_) => None,
        };
        brig_proto::NodeStatus {
            node_id: self.inner.config.node_id,
            tiers: self.tiers().into_iter().map(convert::tier_to_wire).collect(),
            sandboxes: self.inner.sandboxes.len() as u64,
            images,
            capacity: self.capacity(),
            daemon_rss_bytes: own_rss_bytes(),
            swap: self.inner.zram.as_ref().map(|z| {
                let stats = z.stats();
                brig_proto::SwapStatus {
                    device: z.name.clone(),
                    size_bytes: stats.disksize_bytes,
                    stored_bytes: stats.orig_data_bytes,
                    ram_used_bytes: stats.mem_used_bytes,
                }
            }),
        }
    }

    fn container_tier(&self) -> Result<&ContainerTier, NodeError> {
        self.inner
            .containers
            .as_ref()
            .map_err(|why| NodeError::TierUnavailable { tier: Tier::Container, why: why.clone() })
    }

    async fn exec_attach(
        &self,
        sandbox: &str,
        exec_id: u64,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let entry = self.live(sandbox).await?;
        entry.require(Op::Exec)?;
        let reply = entry.execs.attach(exec_id, exchange).await;
        entry.touch();
        reply
    }

    async fn tool_add(
        &self,
        name: &str,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let limit = brig_fncall::MAX_COMPONENT_BYTES;
        let bytes = match exchange.read_upload_to_end(limit).await {
            Ok(bytes) => bytes,
            Err(brig_transport::TransportError::Frame(brig_proto::FrameError::TooLarge(_))) => {
                exchange.refuse_upload();
                return Err(NodeError::UploadTooLarge(limit as u64));
            }
            Err(e) => return Err(e.into()),
        };
        let summary = self.inner.fncall.add_tool(name, bytes).await?;
        Ok(Some(Reply::Tool(convert::tool_to_wire(summary))))
    }
}

/// Thousands of sandboxes need tens of thousands of descriptors (shim sockets, roots, cgroup
/// files): raise the soft limit as far as the process may.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let want = 1 << 20;
    if setrlimit(Resource::RLIMIT_NOFILE, want, want).is_err() {
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

fn info(node: &Node, entry: &SandboxEntry) -> SandboxInfo {
    let spec = entry.spec();
    let paused = entry.paused_unix_ms();
    let state = match entry.sandbox.condition() {
        Condition::Failed => SandboxState::Failed,
        Condition::Running if paused.is_some() => SandboxState::Paused,
        Condition::Running => SandboxState::Running,
    };
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    SandboxInfo {
        id: entry.id.to_string(),
        tier: convert::tier_to_wire(entry.tier),
        state,
        labels: spec.labels,
        created_unix_ms: entry.created_unix_ms,
        last_used_unix_ms: entry.last_used_unix_ms(),
        idle_ttl_ms: ms(spec.idle_ttl),
        idle_action: match spec.idle_action {
            IdleAction::Pause => brig_proto::IdleAction::Pause,
            IdleAction::Destroy => brig_proto::IdleAction::Destroy,
            IdleAction::PauseFilesOnly => brig_proto::IdleAction::PauseFilesOnly,
        },
        paused_ttl_ms: spec.paused_ttl.map(ms),
        max_lifetime_ms: spec.max_lifetime.map(ms),
        paused_unix_ms: paused,
        image: spec.image,
        usage: None,
        address: spec.net_slot.and_then(|slot| node.sandbox_address(slot)),
        egress: spec.egress.map(|rules| rules.iter().map(|r| r.to_string()).collect()),
        qos: convert::qos_to_wire(spec.qos),
        placement: entry.sandbox.placement(),
        volumes: spec
            .volumes
            .iter()
            .map(|v| brig_proto::VolumeMount {
                volume: v.volume.clone(),
                path: v.path.clone(),
                read_only: v.read_only,
            })
            .collect(),
        paused_files_only: paused.is_some() && entry.paused_files_only(),
    }
}

/// This process's resident memory (`/proc/self/statm`), or 0 where it cannot be read.
fn own_rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// The sandboxes a create or fork made, which its reply acknowledges.
fn made_sandboxes(kind: &str, result: &Result<Option<Reply>, NodeError>) -> Vec<SandboxId> {
    let ids: Vec<&str> = match (kind, result) {
        ("create", Ok(Some(Reply::Sandbox(info)))) => vec![&info.id],
        ("fork", Ok(Some(Reply::Sandboxes(kids)))) => kids.iter().map(|k| k.id.as_str()).collect(),
        _ => Vec::new(),
    };
    ids.into_iter().filter_map(|id| id.parse().ok()).collect()
}
