//! Containment and observability: egress rules, protected paths, the audit trail.

use brig_proto::{
    AuditEvent, AuditRequest, Placement, ProtectedPath, QosClass, Reply, Request, SandboxInfo,
    SandboxOp,
};
use brig_transport::ClientExchange;

use crate::client::unexpected;
use crate::{Error, Sandbox, SandboxOptions};

impl SandboxOptions {
    /// CPU QoS class (default latency-sensitive). Best-effort sandboxes get the smallest CPU
    /// weight and idle scheduling: bulk setup, background builds.
    pub fn qos(mut self, class: QosClass) -> Self {
        self.request_mut().qos = Some(class);
        self
    }

    /// Which kernel a container runs on: the node's, or a container-host VM's (where the node
    /// has hardware virtualization), so a kernel bug the agent triggers takes down that VM
    /// and not the node. Without it the node's policy decides; `SandboxInfo::placement` says
    /// where it went.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.request_mut().placement = Some(placement);
        self
    }

    /// Gives the sandbox a network link whose egress only these rules let through: service
    /// names the node maps (`pypi`, `debian`, a mirror) and destinations (`10.1.2.3`,
    /// `10.0.0.0/8`, `10.1.2.3:8080`). An empty list gives a link with everything denied,
    /// to be opened later with [`Sandbox::set_egress`]. Without this, a sandbox has only its
    /// own loopback.
    pub fn egress<S: AsRef<str>>(mut self, rules: impl IntoIterator<Item = S>) -> Self {
        self.request_mut().egress =
            Some(rules.into_iter().map(|r| r.as_ref().to_string()).collect());
        self
    }

    /// Makes `path` of the image read-only for the agent: writes, renames and deletes fail,
    /// and its content stays what the image holds.
    pub fn read_only_path(mut self, path: &str) -> Self {
        self.request_mut().protected.push(ProtectedPath { path: path.into(), hidden: false });
        self
    }

    /// Hides `path` of the image from the agent (it appears empty and cannot be written);
    /// [`Sandbox::fork_for_evaluation`] reveals it again, read-only.
    pub fn hidden_path(mut self, path: &str) -> Self {
        self.request_mut().protected.push(ProtectedPath { path: path.into(), hidden: true });
        self
    }
}

impl Sandbox {
    /// Replaces the egress rules now (a task stage: setup open, solve restricted, verify
    /// closed). Open connections stay; new ones follow the new rules.
    pub async fn set_egress<S: AsRef<str>>(
        &self,
        rules: impl IntoIterator<Item = S>,
    ) -> Result<SandboxInfo, Error> {
        let rules = rules.into_iter().map(|r| r.as_ref().to_string()).collect();
        let request =
            Request::Sandbox(SandboxOp::SetEgress { sandbox: self.id().to_string(), rules });
        match self.client().request(&request).await? {
            Reply::Sandbox(info) => Ok(info),
            other => Err(unexpected("set_egress", &other)),
        }
    }

    /// Moves the sandbox to another CPU QoS class now.
    pub async fn set_qos(&self, class: QosClass) -> Result<SandboxInfo, Error> {
        let request = Request::Sandbox(SandboxOp::SetQos { sandbox: self.id().to_string(), class });
        match self.client().request(&request).await? {
            Reply::Sandbox(info) => Ok(info),
            other => Err(unexpected("set_qos", &other)),
        }
    }

    /// The audit trail so far (events after `after_seq`), oldest first.
    pub async fn audit(&self, after_seq: u64) -> Result<Vec<AuditEvent>, Error> {
        let mut stream = self.audit_stream(after_seq, false).await?;
        let mut out = Vec::new();
        while let Some(batch) = stream.next_batch().await? {
            out.extend(batch);
        }
        Ok(out)
    }

    /// The audit trail as a stream; with `follow`, events keep coming as they happen until
    /// the sandbox is gone.
    pub async fn audit_stream(&self, after_seq: u64, follow: bool) -> Result<AuditStream, Error> {
        let request = Request::Sandbox(SandboxOp::Audit(AuditRequest {
            sandbox: self.id().to_string(),
            after_seq,
            follow,
        }));
        let mut exchange = self.client().open(&request).await?;
        exchange.finish_upload()?;
        Ok(AuditStream { exchange, done: false })
    }
}

/// Audit events as the node sends them.
pub struct AuditStream {
    exchange: ClientExchange,
    done: bool,
}

impl AuditStream {
    /// The next batch of events; `None` at the end.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<AuditEvent>>, Error> {
        next_batch(&mut self.exchange, &mut self.done, "audit", |reply| match reply {
            Reply::Audit(batch) => Ok(batch),
            other => Err(Box::new(other)),
        })
        .await
    }
}

/// The next batch of a stream of batches (`batch` takes its kind of reply, or gives the reply
/// back): `None` once the server ended it (or it failed, or an odd reply came, reported once).
pub(crate) async fn next_batch<T>(
    exchange: &mut ClientExchange,
    done: &mut bool,
    request: &'static str,
    batch: impl FnOnce(Reply) -> Result<Vec<T>, Box<Reply>>,
) -> Result<Option<Vec<T>>, Error> {
    if *done {
        return Ok(None);
    }
    let reply = match exchange.next_reply().await? {
        Some(Reply::Done) | None => {
            *done = true;
            return Ok(None);
        }
        Some(reply) => reply,
    };
    match batch(reply).map_err(|r| *r) {
        Ok(items) => Ok(Some(items)),
        Err(Reply::Error(e)) => {
            *done = true;
            Err(e.into())
        }
        Err(other) => {
            *done = true;
            Err(unexpected(request, &other))
        }
    }
}
