//! Lifecycle operations: pause and resume, fork, lifetimes, reattaching to running commands.
//!
//! A paused sandbox keeps its files and its processes (frozen, memory pushed out) and uses no
//! CPU; any request to it resumes it first, so a rollout worker never has to.

use std::time::Duration;

use brig_proto::{
    ExecInfo, ExecOp, IdleAction, Reply, Request, SandboxOp, SessionOp, Target, TtlUpdate,
};

use crate::client::unexpected;
use crate::exec::ExecStream;
use crate::sandbox::millis;
use crate::{Client, Error, Sandbox, SandboxInfo};

fn owned(selector: &[(&str, &str)]) -> Vec<(String, String)> {
    selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// New lifetimes for a sandbox; fields left unset keep their value.
#[derive(Debug, Clone, Default)]
pub struct Lifetimes {
    update: TtlUpdate,
}

impl Lifetimes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Idle TTL: how long without a request before the idle action.
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.update.idle_ttl_ms = Some(millis(ttl));
        self
    }

    /// What the idle TTL does: pause (keep for later) or destroy.
    pub fn idle_action(mut self, action: IdleAction) -> Self {
        self.update.idle_action = Some(action);
        self
    }

    /// Destroy after being paused this long; `None` keeps a paused sandbox until destroyed.
    pub fn paused_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.update.paused_ttl_ms = Some(ttl.map(millis));
        self
    }

    /// Destroy this long after creation, whatever it is doing; `None` removes the limit.
    pub fn max_lifetime(mut self, lifetime: Option<Duration>) -> Self {
        self.update.max_lifetime_ms = Some(lifetime.map(millis));
        self
    }
}

impl Sandbox {
    /// Pauses the sandbox: its processes freeze and stop using CPU, its reclaimable memory is
    /// pushed out. It resumes on the next request, or on [`Sandbox::resume`].
    pub async fn pause(&self) -> Result<(), Error> {
        self.client().pause_target(Target::Sandbox(self.id().to_string())).await.map(drop)
    }

    /// Pauses keeping the files only: every process ends and the sandbox's memory is given
    /// back; [`Sandbox::resume`] (or the next request) starts it with nothing running, as a
    /// cold boot would. Containers serve it.
    pub async fn pause_files_only(&self) -> Result<(), Error> {
        let target = Target::Sandbox(self.id().to_string());
        let request = Request::Sandbox(SandboxOp::PauseFilesOnly(target));
        self.client().affected("pause_files_only", request).await.map(drop)
    }

    /// Resumes a paused sandbox (a no-op on a running one).
    pub async fn resume(&self) -> Result<(), Error> {
        self.client().resume_target(Target::Sandbox(self.id().to_string())).await.map(drop)
    }

    /// Clones the sandbox into `count` children. Each starts from the parent's files at this
    /// moment (the parent is frozen while they are copied) with no processes running, and then
    /// diverges. Children carry the parent's labels plus `forked-from=<parent id>`.
    pub async fn fork(&self, count: u32) -> Result<Vec<Sandbox>, Error> {
        self.fork_labeled(count, &[]).await
    }

    /// [`Sandbox::fork`] with extra labels on the children.
    pub async fn fork_labeled(
        &self,
        count: u32,
        labels: &[(&str, &str)],
    ) -> Result<Vec<Sandbox>, Error> {
        self.fork_request(count, labels, false).await
    }

    /// One child for grading the agent's work: its files as they are now, none of its
    /// processes (nothing the agent left running can tamper with the check), and the hidden
    /// protected paths shown read-only from the image (the tests, the reference answer).
    pub async fn fork_for_evaluation(&self) -> Result<Sandbox, Error> {
        let mut kids = self.fork_request(1, &[("purpose", "evaluation")], true).await?;
        kids.pop().ok_or_else(|| Error::Config("the node returned no evaluation child".into()))
    }

    async fn fork_request(
        &self,
        count: u32,
        labels: &[(&str, &str)],
        evaluation: bool,
    ) -> Result<Vec<Sandbox>, Error> {
        let request = Request::Sandbox(SandboxOp::Fork {
            sandbox: self.id().to_string(),
            count,
            labels: owned(labels),
            evaluation,
        });
        match self.client().request(&request).await? {
            Reply::Sandboxes(children) => Ok(children
                .into_iter()
                .map(|info| Sandbox::new(self.client().clone(), info.id))
                .collect()),
            other => Err(unexpected("fork", &other)),
        }
    }

    /// Changes the sandbox's lifetimes.
    pub async fn set_lifetimes(&self, lifetimes: Lifetimes) -> Result<SandboxInfo, Error> {
        let mut update = lifetimes.update;
        update.sandbox = self.id().to_string();
        match self.client().request(&Request::Sandbox(SandboxOp::SetTtl(update))).await? {
            Reply::Sandbox(info) => Ok(info),
            other => Err(unexpected("set_ttl", &other)),
        }
    }

    /// Streams a command started earlier (by this or another client) again: all the output
    /// the node kept from its start, then the rest as it comes, then its result.
    pub async fn attach(&self, exec_id: u64) -> Result<ExecStream, Error> {
        let request = Request::Exec(ExecOp::Attach { sandbox: self.id().to_string(), exec_id });
        let mut exchange = self.client().open(&request).await?;
        exchange.finish_upload()?;
        ExecStream::started(exchange, "exec_attach").await
    }

    /// Running and recently finished commands.
    pub async fn execs(&self) -> Result<Vec<ExecInfo>, Error> {
        match self
            .client()
            .request(&Request::Exec(ExecOp::List { sandbox: self.id().to_string() }))
            .await?
        {
            Reply::Execs(list) => Ok(list),
            other => Err(unexpected("exec_list", &other)),
        }
    }

    /// Ids of the open shell sessions.
    pub async fn sessions(&self) -> Result<Vec<String>, Error> {
        let request = Request::Session(SessionOp::List { sandbox: self.id().to_string() });
        match self.client().request(&request).await? {
            Reply::Sessions(list) => Ok(list),
            other => Err(unexpected("session_list", &other)),
        }
    }
}

impl Client {
    async fn affected(&self, what: &'static str, request: Request) -> Result<Vec<String>, Error> {
        match self.request(&request).await? {
            Reply::Affected(ids) => Ok(ids),
            other => Err(unexpected(what, &other)),
        }
    }

    async fn pause_target(&self, target: Target) -> Result<Vec<String>, Error> {
        self.affected("pause", Request::Sandbox(SandboxOp::Pause(target))).await
    }

    async fn resume_target(&self, target: Target) -> Result<Vec<String>, Error> {
        self.affected("resume", Request::Sandbox(SandboxOp::Resume(target))).await
    }

    /// Pauses every sandbox whose labels include all of `selector` (e.g. a training job's
    /// rollouts when the trainer is preempted); returns their ids.
    pub async fn pause_matching(&self, selector: &[(&str, &str)]) -> Result<Vec<String>, Error> {
        self.pause_target(Target::Labels(owned(selector))).await
    }

    /// Pauses every sandbox whose labels include all of `selector` keeping its files only
    /// ([`Sandbox::pause_files_only`]); returns their ids.
    pub async fn pause_files_only_matching(
        &self,
        selector: &[(&str, &str)],
    ) -> Result<Vec<String>, Error> {
        let target = Target::Labels(owned(selector));
        self.affected("pause_files_only", Request::Sandbox(SandboxOp::PauseFilesOnly(target))).await
    }

    /// Resumes every sandbox whose labels include all of `selector`.
    pub async fn resume_matching(&self, selector: &[(&str, &str)]) -> Result<Vec<String>, Error> {
        self.resume_target(Target::Labels(owned(selector))).await
    }

    /// Destroys every sandbox whose labels include all of `selector`; an empty selector is
    /// refused (it would destroy everything).
    pub async fn destroy_matching(&self, selector: &[(&str, &str)]) -> Result<Vec<String>, Error> {
        if selector.is_empty() {
            return Err(Error::Config("destroy_matching needs at least one label".into()));
        }
        self.affected(
            "destroy_matching",
            Request::Sandbox(SandboxOp::DestroyMatching { labels: owned(selector) }),
        )
        .await
    }
}
