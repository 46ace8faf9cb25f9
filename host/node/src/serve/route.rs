//! The node's requests, routed by family: each family's handler takes the op and, where the
//! request came on one, its exchange, and matches every op of its family once (streaming and
//! plain alike). A request reaches a tier only through its sandbox's `brig_core::Sandbox`.
//!
//! ```text
//! Request ─▶ family ───▶ sandbox  (create, status, list, destroy, pause, resume, fork, TTL, QoS,
//!                     │            egress; streamed: audit, events, a port)
//!                     ├─▶ exec     (kill, resize, input, list; streamed: start, attach)
//!                     ├─▶ session  (open, input, interrupt, close, list; streamed: run, wait)
//!                     ├─▶ file     (list, stat, mkdir, remove, metadata; streamed: read, write, watch)
//!                     ├─▶ tool     (one-shot calls, calls in a sandbox, the registry; streamed: add)
//!                     ├─▶ image    (the layer store, environments, checkpoints; streamed: import,
//!                     │            pull, build)
//!                     ├─▶ volume   (create, list, files; streamed: read, write)
//!                     └─▶ node     (status, doctor) · control-plane requests are refused
//! ```

use brig_core::sandbox::Op;
use brig_core::SandboxId;
use brig_proto::{
    AuditKind, ExecOp, ImageOp, NodeOp, Reply, Request, SandboxOp, SessionOp, ToolOp,
};
use brig_transport::Exchange;

use crate::convert;
use crate::environments::{images, pulls};
use crate::serve::files;
use crate::table::sandboxes::Gone;
use crate::{info, Node, NodeError};

/// The exchange a request came on: `None` for [`Node::handle`] (a caller with no stream, such as
/// the routing tests), where a streaming op is refused with [`NodeError::NeedsStream`].
pub(crate) type Conversation<'a> = Option<&'a mut Exchange>;

/// The exchange a streaming op of `kind` needs.
pub(crate) fn stream<'a>(
    exchange: Conversation<'a>,
    kind: &'static str,
) -> Result<&'a mut Exchange, NodeError> {
    exchange.ok_or(NodeError::NeedsStream(kind))
}

impl Node {
    /// Serves a request with no exchange: streaming requests are refused
    /// ([`NodeError::NeedsStream`]).
    pub async fn handle(&self, request: Request) -> Result<Option<Reply>, NodeError> {
        self.route(request, None).await
    }

    /// Routes a request to its family's handler.
    pub(crate) async fn route(
        &self,
        request: Request,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        match request {
            Request::Sandbox(op) => self.sandbox_request(op, exchange).await,
            Request::Exec(op) => self.exec_request(op, exchange).await,
            Request::Session(op) => self.session_request(op, exchange).await,
            Request::File(op) => files::request(self, op, exchange).await,
            Request::Tool(op) => self.tool_request(op, exchange).await,
            Request::Image(op) => self.image_request(op, exchange).await,
            Request::Volume(op) => self.volume_request(op, exchange).await,
            Request::Node(op) => self.node_request(op).await.map(Some),
            Request::Control(op) => Err(NodeError::ControlOnly(op.kind())),
        }
    }

    async fn node_request(&self, op: NodeOp) -> Result<Reply, NodeError> {
        Ok(match op {
            NodeOp::Status => Reply::NodeStatus(self.status().await),
            // Unscoped (no principal): the node's own callers are admin.
            NodeOp::Whoami => Reply::Caller(brig_proto::CallerInfo { project: None, admin: true }),
            NodeOp::Doctor { remove, min_age_secs } => {
                let node = self.clone();
                let min_age = std::time::Duration::from_secs(u64::from(min_age_secs));
                let found = tokio::task::spawn_blocking(move || node.doctor(remove, min_age));
                Reply::Strays(found.await.map_err(|e| NodeError::Io {
                    what: "doctor".into(),
                    source: std::io::Error::other(e),
                })?)
            }
        })
    }

    async fn sandbox_request(
        &self,
        op: SandboxOp,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        let kind = op.kind();
        Ok(Some(match op {
            SandboxOp::Create(req) if req.pull_progress && exchange.is_some() => {
                // A create that pulls its image tells of the pull while it waits.
                let exchange = stream(exchange, kind)?;
                let image = req.image.as_deref().unwrap_or_default();
                let reference = image.strip_prefix(pulls::REGISTRY_PREFIX).map(str::to_string);
                let watch = || reference.as_deref().and_then(|r| self.inner.pulls.watch(r));
                let created = pulls::reporting_progress(exchange, watch, self.create(*req));
                Reply::Sandbox(created.await?)
            }
            SandboxOp::Create(req) => Reply::Sandbox(self.create(*req).await?),
            SandboxOp::Audit(req) => return self.audit_stream(req, stream(exchange, kind)?).await,
            SandboxOp::Events(req) => return self.events(req, stream(exchange, kind)?).await,
            SandboxOp::ConnectPort { sandbox, port } => {
                return self.connect_port(&sandbox, port, stream(exchange, kind)?).await
            }
            SandboxOp::Status { sandbox } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                let mut info = info(self, &entry);
                info.usage = entry.sandbox.usage().await.map(|u| brig_proto::SandboxUsage {
                    cpu_ns: u.cpu_ns,
                    memory_bytes: u.memory_bytes,
                });
                Reply::Sandbox(info)
            }
            SandboxOp::UsageHistory { sandbox, from_unix_ms, to_unix_ms } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                let mut samples = entry.usage_history.lock().between(from_unix_ms, to_unix_ms);
                let now = crate::host::clock::now_unix_ms();
                if to_unix_ms >= now && entry.paused_unix_ms().is_none() {
                    if let Some(used) = entry.sandbox.usage().await {
                        let (cpu_ns, memory_bytes) = (used.cpu_ns, used.memory_bytes);
                        samples.push(brig_proto::UsageSample {
                            unix_ms: now,
                            cpu_ns,
                            memory_bytes,
                        });
                    }
                }
                Reply::UsageHistory(samples)
            }
            SandboxOp::Destroy { sandbox } => {
                let id: SandboxId = sandbox.parse()?;
                self.inner.sandboxes.get(&sandbox)?;
                self.destroy(&id, Gone::Destroyed).await;
                Reply::Done
            }
            SandboxOp::List(req) => Reply::Sandboxes(
                self.inner.sandboxes.list(&req.labels).iter().map(|e| info(self, e)).collect(),
            ),
            SandboxOp::Pause(target) => Reply::Affected(self.pause(&target, false).await?),
            SandboxOp::PauseFilesOnly(target) => Reply::Affected(self.pause(&target, true).await?),
            SandboxOp::Resume(target) => Reply::Affected(self.resume(&target).await?),
            SandboxOp::DestroyMatching { labels } => {
                Reply::Affected(self.destroy_matching(&labels).await)
            }
            SandboxOp::SetTtl(update) => Reply::Sandbox(self.set_ttl(update)?),
            SandboxOp::Fork { sandbox, count, labels, evaluation } => {
                Reply::Sandboxes(self.fork(&sandbox, count, labels, evaluation).await?)
            }
            SandboxOp::SetQos { sandbox, class } => {
                Reply::Sandbox(self.set_qos(&sandbox, convert::qos_from_wire(class)).await?)
            }
            SandboxOp::SetEgress { sandbox, rules } => {
                Reply::Sandbox(self.set_egress(&sandbox, rules).await?)
            }
        }))
    }

    async fn exec_request(
        &self,
        op: ExecOp,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        let kind = op.kind();
        Ok(Some(match op {
            ExecOp::Start(req) => {
                use tracing::Instrument;
                let span = tracing::debug_span!("container_exec", sandbox = %req.sandbox);
                return self.exec(req, stream(exchange, kind)?).instrument(span).await;
            }
            ExecOp::Attach { sandbox, exec_id } => {
                return self.exec_attach(&sandbox, exec_id, stream(exchange, kind)?).await
            }
            ExecOp::Kill { sandbox, exec_id } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                entry.require(Op::Exec)?;
                entry.execs.kill(exec_id)?;
                Reply::Done
            }
            ExecOp::Resize { sandbox, exec_id, size } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                entry.require(Op::Exec)?;
                entry.execs.resize(exec_id, size)?;
                Reply::Done
            }
            ExecOp::Input { sandbox, exec_id, data, close } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                entry.require(Op::Exec)?;
                entry.execs.input(exec_id, data, close).await?;
                entry.touch();
                Reply::Done
            }
            ExecOp::List { sandbox } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                Reply::Execs(entry.execs.list())
            }
        }))
    }

    async fn session_request(
        &self,
        op: SessionOp,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        let kind = op.kind();
        Ok(Some(match op {
            SessionOp::Run { sandbox, session, command, timeout_ms } => {
                let exchange = stream(exchange, kind)?;
                return self
                    .session_stream(&sandbox, &session, Some(&command), timeout_ms, exchange)
                    .await;
            }
            SessionOp::Wait { sandbox, session, timeout_ms } => {
                let exchange = stream(exchange, kind)?;
                return self.session_stream(&sandbox, &session, None, timeout_ms, exchange).await;
            }
            SessionOp::Open(req) => Reply::Session { session: self.session_open(req).await? },
            SessionOp::Input { sandbox, session, data } => {
                self.session_input(&sandbox, &session, &data).await?;
                Reply::Done
            }
            SessionOp::Interrupt { sandbox, session } => {
                self.session_interrupt(&sandbox, &session).await?;
                Reply::Done
            }
            SessionOp::Close { sandbox, session } => {
                self.session_close(&sandbox, &session).await?;
                Reply::Done
            }
            SessionOp::List { sandbox } => Reply::Sessions(self.session_ids(&sandbox)?),
        }))
    }

    async fn tool_request(
        &self,
        op: ToolOp,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        let kind = op.kind();
        let fncall = &self.inner.fncall;
        Ok(Some(match op {
            ToolOp::Add { name } => return self.tool_add(&name, stream(exchange, kind)?).await,
            ToolOp::Call(call) => {
                let report = fncall.call(convert::call_from_wire(call), None).await?;
                Reply::Called(convert::report_to_wire(report))
            }
            ToolOp::CallIn { sandbox, call } => {
                let entry = self.live(&sandbox).await?;
                entry.require(Op::ToolCalls)?;
                let tool = call.tool.clone();
                let started = std::time::Instant::now();
                let call = convert::call_from_wire(call);
                let report = entry.sandbox.call(call).await.map_err(|e| entry.fail(e))?;
                self.inner.metrics.observe_exec("fncall", started.elapsed());
                let outcome = format!("{:?}", report.outcome).to_lowercase();
                self.inner.audit.record(&sandbox, AuditKind::Call { tool, outcome });
                entry.touch();
                Reply::Called(convert::report_to_wire(report))
            }
            ToolOp::List => {
                Reply::Tools(fncall.tools().into_iter().map(convert::tool_to_wire).collect())
            }
            ToolOp::Remove { name } => {
                fncall.remove_tool(&name)?;
                Reply::Done
            }
        }))
    }

    async fn image_request(
        &self,
        op: ImageOp,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        let kind = op.kind();
        // An import's upload, if this fails, is refused by `Node::serve`.
        let store = self.store()?;
        Ok(Some(match op {
            ImageOp::Import(req) => images::import(&store, req, stream(exchange, kind)?).await?,
            ImageOp::Pull(req) => {
                let config = self.inner.config.images.registries.pull_config();
                let pulls = &self.inner.pulls;
                pulls::pull(&store, &config, pulls, req, stream(exchange, kind)?).await?
            }
            ImageOp::Build(req) => self.build_image(req, stream(exchange, kind)?).await?,
            ImageOp::Checkpoint(req) => {
                let entry = self.live(&req.sandbox).await?;
                let layer = images::checkpoint(&store, &entry, req).await?;
                let what = format!("{}@{}", layer.name, layer.version);
                self.audit_lifecycle(&entry.id.to_string(), "checkpointed", what);
                Reply::Layer(images::layer_to_wire(layer))
            }
            ImageOp::List => {
                Reply::Layers(store.list().await?.into_iter().map(images::layer_to_wire).collect())
            }
            ImageOp::Inspect { reference } => {
                let (layer, paths) = store.inspect(&reference).await?;
                Reply::LayerDetails { layer: images::layer_to_wire(layer), paths }
            }
            ImageOp::Tag { reference, name, version } => {
                Reply::Layer(images::layer_to_wire(store.tag(&reference, &name, version).await?))
            }
            ImageOp::Remove { reference } => {
                store.remove(&reference).await?;
                Reply::Done
            }
            ImageOp::Verify { reference } => {
                Reply::Layer(images::layer_to_wire(store.verify(&reference).await?))
            }
            ImageOp::Gc => {
                let r = store.gc().await?;
                Reply::Gc {
                    removed_layers: r.removed_layers,
                    removed_chunks: r.removed_chunks,
                    freed_bytes: r.freed_bytes,
                }
            }
            ImageOp::CacheDrop => {
                store.clear_cache().await?;
                Reply::Done
            }
            ImageOp::EnvCreate { name, layers } => {
                store.create_env(&name, layers).await?;
                Reply::Done
            }
            ImageOp::EnvList => Reply::Envs(store.envs()),
        }))
    }
}
