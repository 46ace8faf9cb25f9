//! The node's plain (non-streaming) requests, routed by family: each family has its handler,
//! and a request reaches a tier only through its sandbox's `brig_core::Sandbox`.
//!
//! ```text
//! Request ─▶ family() ─▶ sandbox  (create, status, list, destroy, pause, resume, fork, TTL, QoS, egress)
//!                     ├─▶ exec     (kill, resize, list)
//!                     ├─▶ session  (open, input, interrupt, close, list)
//!                     ├─▶ file     (list, stat, mkdir, remove)
//!                     ├─▶ tool     (one-shot calls, calls in a sandbox, the tool registry)
//!                     ├─▶ image    (the layer store, environments, checkpoints)
//!                     └─▶ node     (status) · streaming and control-plane requests are refused
//! ```

use brig_core::sandbox::Op;
use brig_core::SandboxId;
use brig_proto::{AuditKind, Reply, Request};

use crate::sandboxes::Gone;
use crate::{convert, files, images, info, Node, NodeError};

/// What a request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Sandbox,
    Exec,
    Session,
    File,
    Tool,
    Image,
    Node,
    /// Served with a stream in `Node::serve`, never here.
    Streaming,
    /// For the control plane.
    Control,
}

fn family(request: &Request) -> Family {
    match request {
        Request::Create(_)
        | Request::Status { .. }
        | Request::Destroy { .. }
        | Request::List(_)
        | Request::Pause(_)
        | Request::Resume(_)
        | Request::DestroyMatching { .. }
        | Request::SetTtl(_)
        | Request::Fork { .. }
        | Request::SetQos { .. }
        | Request::SetEgress { .. } => Family::Sandbox,
        Request::ExecKill { .. } | Request::ExecResize { .. } | Request::ExecList { .. } => {
            Family::Exec
        }
        Request::SessionOpen(_)
        | Request::SessionInput { .. }
        | Request::SessionInterrupt { .. }
        | Request::SessionClose { .. }
        | Request::SessionList { .. } => Family::Session,
        Request::FileList { .. }
        | Request::FileStat { .. }
        | Request::FileMkdir { .. }
        | Request::FileRemove { .. } => Family::File,
        Request::Call(_)
        | Request::CallIn { .. }
        | Request::ToolList
        | Request::ToolRemove { .. } => Family::Tool,
        Request::ImageList
        | Request::ImageInspect { .. }
        | Request::ImageTag { .. }
        | Request::ImageRemove { .. }
        | Request::ImageVerify { .. }
        | Request::ImageGc
        | Request::ImageCacheDrop
        | Request::EnvCreate { .. }
        | Request::EnvList
        | Request::Checkpoint(_) => Family::Image,
        Request::NodeStatus => Family::Node,
        Request::FileWrite(_)
        | Request::FileRead(_)
        | Request::ToolAdd { .. }
        | Request::Exec(_)
        | Request::SessionRun { .. }
        | Request::SessionWait { .. }
        | Request::ExecAttach { .. }
        | Request::Audit(_)
        | Request::ImageImport(_) => Family::Streaming,
        Request::NodeHeartbeat(_)
        | Request::Route { .. }
        | Request::Routes { .. }
        | Request::ClusterStatus
        | Request::ProjectPut { .. }
        | Request::ProjectList
        | Request::TokenCreate { .. } => Family::Control,
    }
}

/// A request that reached a handler of another family (a routing bug, not a client's).
fn misrouted(request: &Request) -> NodeError {
    NodeError::Io {
        what: "request routing".into(),
        source: std::io::Error::other(format!("{} reached the wrong handler", request.kind())),
    }
}

impl Node {
    /// Serves a request with no streaming.
    pub(crate) async fn handle(&self, request: Request) -> Result<Option<Reply>, NodeError> {
        let reply = match family(&request) {
            Family::Sandbox => self.handle_sandbox(request).await?,
            Family::Exec => self.handle_exec(request)?,
            Family::Session => self.handle_session(request).await?,
            Family::File => files::small(self, request).await?,
            Family::Tool => self.handle_tool(request).await?,
            Family::Image => self.handle_image(request).await?,
            Family::Node => Reply::NodeStatus(self.status()),
            Family::Streaming => return Err(misrouted(&request)),
            Family::Control => return Err(NodeError::ControlOnly(request.kind())),
        };
        Ok(Some(reply))
    }

    async fn handle_sandbox(&self, request: Request) -> Result<Reply, NodeError> {
        Ok(match request {
            Request::Create(req) => Reply::Sandbox(self.create(req).await?),
            Request::Status { sandbox } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                let mut info = info(self, &entry);
                info.usage = entry.sandbox.usage().await.map(|u| brig_proto::SandboxUsage {
                    cpu_ns: u.cpu_ns,
                    memory_bytes: u.memory_bytes,
                });
                Reply::Sandbox(info)
            }
            Request::Destroy { sandbox } => {
                let id: SandboxId = sandbox.parse()?;
                self.inner.sandboxes.get(&sandbox)?;
                self.destroy(&id, Gone::Destroyed).await;
                Reply::Done
            }
            Request::List(req) => Reply::Sandboxes(
                self.inner.sandboxes.list(&req.labels).iter().map(|e| info(self, e)).collect(),
            ),
            Request::Pause(target) => Reply::Affected(self.pause(&target).await?),
            Request::Resume(target) => Reply::Affected(self.resume(&target).await?),
            Request::DestroyMatching { labels } => {
                Reply::Affected(self.destroy_matching(&labels).await)
            }
            Request::SetTtl(update) => Reply::Sandbox(self.set_ttl(update)?),
            Request::Fork { sandbox, count, labels, evaluation } => {
                Reply::Sandboxes(self.fork(&sandbox, count, labels, evaluation).await?)
            }
            Request::SetQos { sandbox, class } => {
                Reply::Sandbox(self.set_qos(&sandbox, convert::qos_from_wire(class)).await?)
            }
            Request::SetEgress { sandbox, rules } => {
                Reply::Sandbox(self.set_egress(&sandbox, rules).await?)
            }
            other => return Err(misrouted(&other)),
        })
    }

    fn handle_exec(&self, request: Request) -> Result<Reply, NodeError> {
        Ok(match request {
            Request::ExecKill { sandbox, exec_id } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                entry.require(Op::Exec)?;
                entry.execs.kill(exec_id)?;
                Reply::Done
            }
            Request::ExecResize { sandbox, exec_id, size } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                entry.require(Op::Exec)?;
                entry.execs.resize(exec_id, size)?;
                Reply::Done
            }
            Request::ExecList { sandbox } => {
                let entry = self.inner.sandboxes.get(&sandbox)?;
                Reply::Execs(entry.execs.list())
            }
            other => return Err(misrouted(&other)),
        })
    }

    async fn handle_session(&self, request: Request) -> Result<Reply, NodeError> {
        Ok(match request {
            Request::SessionOpen(req) => Reply::Session { session: self.session_open(req).await? },
            Request::SessionInput { sandbox, session, data } => {
                self.session_input(&sandbox, &session, &data).await?;
                Reply::Done
            }
            Request::SessionInterrupt { sandbox, session } => {
                self.session_interrupt(&sandbox, &session).await?;
                Reply::Done
            }
            Request::SessionClose { sandbox, session } => {
                self.session_close(&sandbox, &session).await?;
                Reply::Done
            }
            Request::SessionList { sandbox } => Reply::Sessions(self.session_ids(&sandbox)?),
            other => return Err(misrouted(&other)),
        })
    }

    async fn handle_tool(&self, request: Request) -> Result<Reply, NodeError> {
        let fncall = &self.inner.fncall;
        Ok(match request {
            Request::Call(call) => {
                let report = fncall.call(convert::call_from_wire(call), None).await?;
                Reply::Called(convert::report_to_wire(report))
            }
            Request::CallIn { sandbox, call } => {
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
            Request::ToolList => {
                Reply::Tools(fncall.tools().into_iter().map(convert::tool_to_wire).collect())
            }
            Request::ToolRemove { name } => {
                fncall.remove_tool(&name)?;
                Reply::Done
            }
            other => return Err(misrouted(&other)),
        })
    }

    async fn handle_image(&self, request: Request) -> Result<Reply, NodeError> {
        let store = self.store()?;
        if let Request::Checkpoint(req) = request {
            let entry = self.live(&req.sandbox).await?;
            let layer = images::checkpoint(&store, &entry, req).await?;
            return Ok(Reply::Layer(images::layer_to_wire(layer)));
        }
        images::handle(store.as_ref(), request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_routes_its_own_requests() {
        assert_eq!(family(&Request::NodeStatus), Family::Node);
        assert_eq!(family(&Request::ToolList), Family::Tool);
        assert_eq!(family(&Request::ExecList { sandbox: "s".into() }), Family::Exec);
        assert_eq!(family(&Request::SessionList { sandbox: "s".into() }), Family::Session);
        assert_eq!(family(&Request::ImageGc), Family::Image);
        assert_eq!(family(&Request::ClusterStatus), Family::Control);
        let file = Request::FileStat { sandbox: "s".into(), path: "/".into() };
        assert_eq!(family(&file), Family::File);
        assert!(matches!(misrouted(&file), NodeError::Io { .. }));
    }
}
