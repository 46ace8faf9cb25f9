//! The node's plain (non-streaming) requests, routed by family: each family has its handler,
//! and a request reaches a tier only through its sandbox's `brig_core::Sandbox`.
//!
//! ```text
//! Request ─▶ family ───▶ sandbox  (create, status, list, destroy, pause, resume, fork, TTL, QoS, egress)
//!                     ├─▶ exec     (kill, resize, list)
//!                     ├─▶ session  (open, input, interrupt, close, list)
//!                     ├─▶ file     (list, stat, mkdir, remove)
//!                     ├─▶ tool     (one-shot calls, calls in a sandbox, the tool registry)
//!                     ├─▶ image    (the layer store, environments, checkpoints)
//!                     └─▶ node     (status) · streaming and control-plane requests are refused
//! ```

use brig_core::sandbox::Op;
use brig_core::SandboxId;
use brig_proto::{
    AuditKind, ExecOp, ImageOp, NodeOp, Reply, Request, SandboxOp, SessionOp, ToolOp,
};

use crate::environments::images;
use crate::serve::{convert, files};
use crate::table::sandboxes::Gone;
use crate::{info, Node, NodeError};

impl Node {
    /// Serves a request with no streaming.
    pub async fn handle(&self, request: Request) -> Result<Option<Reply>, NodeError> {
        let reply = match request {
            Request::Sandbox(op) => self.handle_sandbox(op).await?,
            Request::Exec(op) => self.handle_exec(op).await?,
            Request::Session(op) => self.handle_session(op).await?,
            Request::File(op) => files::small(self, op).await?,
            Request::Tool(op) => self.handle_tool(op).await?,
            Request::Image(op) => self.handle_image(op).await?,
            Request::Node(NodeOp::Status) => Reply::NodeStatus(self.status().await),
            // Unscoped (no principal): the node's own callers are admin.
            Request::Node(NodeOp::Whoami) => {
                Reply::Caller(brig_proto::CallerInfo { project: None, admin: true })
            }
            Request::Node(NodeOp::Doctor { remove, min_age_secs }) => {
                let node = self.clone();
                let min_age = std::time::Duration::from_secs(u64::from(min_age_secs));
                let found = tokio::task::spawn_blocking(move || node.doctor(remove, min_age));
                Reply::Strays(found.await.map_err(|e| NodeError::Io {
                    what: "doctor".into(),
                    source: std::io::Error::other(e),
                })?)
            }
            Request::Control(op) => return Err(NodeError::ControlOnly(op.kind())),
            Request::Volume(op) => self.handle_volume(op).await?,
        };
        Ok(Some(reply))
    }

    async fn handle_sandbox(&self, op: SandboxOp) -> Result<Reply, NodeError> {
        Ok(match op {
            SandboxOp::Create(req) => Reply::Sandbox(self.create(*req).await?),
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
                let now = crate::table::sandboxes::now_unix_ms();
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
            other => return Err(crate::error::misrouted(other.kind())),
        })
    }

    async fn handle_exec(&self, op: ExecOp) -> Result<Reply, NodeError> {
        Ok(match op {
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
            other => return Err(crate::error::misrouted(other.kind())),
        })
    }

    async fn handle_session(&self, op: SessionOp) -> Result<Reply, NodeError> {
        Ok(match op {
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
            other => return Err(crate::error::misrouted(other.kind())),
        })
    }

    async fn handle_tool(&self, op: ToolOp) -> Result<Reply, NodeError> {
        let fncall = &self.inner.fncall;
        Ok(match op {
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
            other => return Err(crate::error::misrouted(other.kind())),
        })
    }

    async fn handle_image(&self, op: ImageOp) -> Result<Reply, NodeError> {
        let store = self.store()?;
        if let ImageOp::Checkpoint(req) = op {
            let entry = self.live(&req.sandbox).await?;
            let layer = images::checkpoint(&store, &entry, req).await?;
            let what = format!("{}@{}", layer.name, layer.version);
            self.audit_lifecycle(&entry.id.to_string(), "checkpointed", what);
            return Ok(Reply::Layer(images::layer_to_wire(layer)));
        }
        if let ImageOp::Pull(_) | ImageOp::Build(_) = op {
            return Err(crate::error::misrouted(op.kind()));
        }
        images::handle(store.as_ref(), op).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misrouted_request_is_an_internal_error_naming_its_kind() {
        let file = brig_proto::FileOp::Stat { sandbox: "s".into(), path: "/".into() };
        let err = crate::error::misrouted(file.kind());
        assert!(matches!(err, NodeError::Io { .. }));
        assert!(err.to_string().contains("request routing"), "{err}");
    }
}
