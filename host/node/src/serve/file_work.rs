//! File work off the async runtime. A sandbox's files are the sandbox's to shape: a path may
//! be a FIFO nobody opens, a file on a lazy layer whose server stalls, a tree of a million
//! entries. Every file operation of a tier whose files the node reaches itself
//! ([`FileAccess::Local`]) runs on the blocking pool, never on an async worker, within:
//! - a bound per sandbox (`limits.file_ops_per_sandbox`) and one per node
//!   (`limits.file_ops_per_node`), held by the blocking work itself until it returns, so a
//!   sandbox whose operations hang holds a few threads of the pool, never all of them;
//! - a deadline (`limits.file_op_deadline_ms`): the request answers then, with a typed error,
//!   whatever the thread is still waiting for.
//!
//! Tiers whose files live in a guest ([`FileAccess::Guest`]) already bound every agent reply
//! with a byte cap and a deadline, and are called as they are.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brig_core::sandbox::{FileAccess, Sandbox, SandboxError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::limits::Limit;
use crate::table::sandboxes::SandboxEntry;
use crate::{Node, NodeError};

/// The node-wide side of the bound, made once with the node.
pub(crate) struct FileWorkGate {
    node: Arc<Semaphore>,
    node_max: usize,
    per_sandbox: usize,
    deadline: Duration,
}

impl FileWorkGate {
    pub(crate) fn new(limits: &crate::LimitsConfig) -> FileWorkGate {
        FileWorkGate {
            node: Arc::new(Semaphore::new(limits.file_ops_per_node)),
            node_max: limits.file_ops_per_node,
            per_sandbox: limits.file_ops_per_sandbox,
            deadline: Duration::from_millis(limits.file_op_deadline_ms),
        }
    }

    /// How long a file operation may take.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Runs `work` on the blocking pool holding one permit of `own` (the sandbox's bound,
    /// `file_ops_per_sandbox` permits) and one of the node's, each waited for at most the
    /// deadline, and answers within the deadline.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        own: Arc<Semaphore>,
        what: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NodeError> {
        let permits = self.permits(own).await?;
        let task = tokio::task::spawn_blocking(move || {
            // Held until the work returns, however long after the request gave up on it.
            let _permits = permits;
            work()
        });
        match tokio::time::timeout(self.deadline, task).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(join)) => Err(NodeError::Io {
                what: what.to_string(),
                source: std::io::Error::other(join.to_string()),
            }),
            Err(_) => {
                tracing::warn!(what, "a file operation passed its deadline");
                Err(NodeError::FileDeadline { what: what.to_string(), after: self.deadline })
            }
        }
    }

    async fn permits(
        &self,
        own: Arc<Semaphore>,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), NodeError> {
        let busy = || Limit::FileOpsPerSandbox.reached(self.per_sandbox);
        let mine = tokio::time::timeout(self.deadline, own.acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        let full = || Limit::FileOpsPerNode.reached(self.node_max);
        let node = tokio::time::timeout(self.deadline, self.node.clone().acquire_owned())
            .await
            .map_err(|_| full())?
            .map_err(|_| full())?;
        Ok((mine, node))
    }
}

impl Node {
    /// Runs `work` on the blocking pool within the sandbox's and the node's bounds and the
    /// deadline; `what` names it in the error a late operation gets.
    pub(crate) async fn file_work<T: Send + 'static>(
        &self,
        entry: &SandboxEntry,
        what: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NodeError> {
        let gate = &self.inner.file_work;
        let own = entry.file_ops(gate.per_sandbox);
        gate.run(own, what, work).await.inspect_err(|e| {
            if matches!(e, NodeError::FileDeadline { .. }) {
                tracing::warn!(sandbox = %entry.id, "a file operation of this sandbox is late");
            }
        })
    }

    /// A file operation of `entry`'s tier: on the blocking pool (see [`Node::file_work`]) for
    /// tiers whose files are local, as it is for the others; the tier's failure as the node
    /// reports it.
    pub(crate) async fn tier_file_op<T, Fut>(
        &self,
        entry: &SandboxEntry,
        what: &str,
        op: impl FnOnce(Arc<dyn Sandbox>) -> Fut + Send + 'static,
    ) -> Result<T, NodeError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, SandboxError>> + Send + 'static,
    {
        let sandbox = entry.sandbox.clone();
        let result = if sandbox.capabilities().files == FileAccess::Local {
            let runtime = tokio::runtime::Handle::current();
            self.file_work(entry, what, move || runtime.block_on(op(sandbox))).await?
        } else {
            op(sandbox).await
        };
        result.map_err(|e| entry.fail(e))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn gate(deadline_ms: u64) -> FileWorkGate {
        FileWorkGate::new(&crate::LimitsConfig {
            file_ops_per_sandbox: 2,
            file_ops_per_node: 3,
            file_op_deadline_ms: deadline_ms,
            ..Default::default()
        })
    }

    /// Work that hangs answers at the deadline, holds its sandbox's permits until it returns,
    /// and leaves other sandboxes free to work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hanging_work_answers_at_the_deadline_and_holds_only_its_sandboxs_share() {
        let gate = Arc::new(gate(200));
        let hostile = Arc::new(Semaphore::new(2));
        let (release, hang) = std::sync::mpsc::channel::<()>();
        let hang = Arc::new(parking_lot::Mutex::new(hang));
        let started = Instant::now();
        let mut stuck = Vec::new();
        for _ in 0..2 {
            let (gate, own, hang) = (gate.clone(), hostile.clone(), hang.clone());
            stuck.push(tokio::spawn(async move {
                gate.run(own, "fifo", move || {
                    let _ = hang.lock().recv();
                })
                .await
            }));
        }
        for task in stuck {
            let result = task.await.expect("join");
            assert!(matches!(result, Err(NodeError::FileDeadline { .. })), "{result:?}");
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        // Its two permits are still held by the hung work: a third operation is refused.
        let third = gate.run(hostile.clone(), "third", || ()).await;
        assert!(
            matches!(third, Err(NodeError::Limit { limit: Limit::FileOpsPerSandbox, .. })),
            "{third:?}"
        );
        // Another sandbox works at once (the node has one permit left).
        let other = Arc::new(Semaphore::new(2));
        let t = Instant::now();
        assert_eq!(gate.run(other, "bystander", || 7).await.expect("bystander"), 7);
        // Far below the 200 ms deadline the hung work took (a loaded machine schedules late).
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // Once the hung work returns, the sandbox may work again.
        drop(release);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(gate.run(hostile, "again", || 1).await.expect("again"), 1);
    }
}
