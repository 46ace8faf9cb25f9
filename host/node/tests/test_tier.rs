//! A tier defined here alone, registered with one line (`Node::open_with`): a sandbox of it
//! is created, used, taken back after the node restarts, and destroyed, through the node's
//! requests, with no change to brig-node. It shows what a new tier needs: a `Sandbox`, a
//! `TierBackend`, and that line.
//!
//! The test tier keeps each sandbox as a directory of the test's; its record names the
//! directory. It registers as the microVM tier, which this machine does not offer itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::files::{Entry, EntryKind};
use brig_core::sandbox::{
    ready, BoxFuture, Capabilities, FileAccess, ForkKind, Op, PauseKind, Persistence, RecordError,
    Sandbox, SandboxError, TierRecord,
};
use brig_core::{SandboxId, Tier};
use brig_node::{CreatePlan, Created, Node, NodeConfig, NodeError, TierBackend};
use brig_proto::{CreateRequest, FileKind, FileOp, Reply, Request, SandboxOp};
use serde::{Deserialize, Serialize};

const KIND: &str = "test-dir";

#[derive(Serialize, Deserialize)]
struct DirRecord {
    dir: PathBuf,
}

/// A sandbox that is a directory.
struct DirSandbox {
    dir: PathBuf,
}

impl DirSandbox {
    fn path(&self, path: &str) -> Result<PathBuf, SandboxError> {
        if path.split('/').any(|c| c == "..") {
            return Err(SandboxError::BadRequest("`..` in a path".into()));
        }
        Ok(self.dir.join(path.trim_start_matches('/')))
    }
}

impl Sandbox for DirSandbox {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            &[Op::Files],
            FileAccess::Guest,
            PauseKind::Nothing,
            ForkKind::No,
            Persistence::Record,
        )
    }
    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        let entry = self.path(path).and_then(|p| {
            let meta = std::fs::metadata(&p).map_err(|e| SandboxError::Io {
                kind: e.kind(),
                message: format!("{path}: {e}"),
            })?;
            Ok(Entry {
                path: path.to_string(),
                kind: if meta.is_dir() { EntryKind::Dir } else { EntryKind::File },
                size: meta.len(),
                mode: 0o755,
                modified_unix_ms: 0,
                uid: 0,
                gid: 0,
                metadata: Default::default(),
            })
        });
        ready(entry)
    }
    fn mkdir<'a>(
        &'a self,
        path: &'a str,
        _parents: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        ready(self.path(path).and_then(|p| {
            std::fs::create_dir_all(p)
                .map_err(|e| SandboxError::Io { kind: e.kind(), message: e.to_string() })
        }))
    }
    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        let _ = std::fs::remove_dir_all(&self.dir);
        ready(Ok(()))
    }
    fn record(&self) -> Result<Option<TierRecord>, RecordError> {
        TierRecord::new(KIND, 1, &DirRecord { dir: self.dir.clone() }).map(Some)
    }
}

/// The tier: sandboxes as directories under `root`.
struct DirTier {
    root: PathBuf,
}

impl TierBackend for DirTier {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }
    fn record_kind(&self) -> Option<&'static str> {
        Some(KIND)
    }
    fn offered(&self, _node: &Node) -> bool {
        true
    }
    fn create<'a>(
        &'a self,
        _node: &'a Node,
        plan: CreatePlan<'a>,
    ) -> BoxFuture<'a, Result<Created, NodeError>> {
        let dir = self.root.join(plan.id.to_string());
        let made = std::fs::create_dir_all(&dir)
            .map(|()| Created::new(Arc::new(DirSandbox { dir })))
            .map_err(|source| NodeError::Io { what: "test tier".into(), source });
        ready(made)
    }
    fn adopt<'a>(
        &'a self,
        _node: &'a Node,
        _id: &'a SandboxId,
        record: Option<&'a TierRecord>,
    ) -> BoxFuture<'a, Result<Arc<dyn Sandbox>, NodeError>> {
        let adopted = record
            .ok_or("no record")
            .and_then(|r| r.body::<DirRecord>(KIND, 1).map_err(|_| "not a test-dir record"))
            .map(|r| Arc::new(DirSandbox { dir: r.dir }) as Arc<dyn Sandbox>)
            .map_err(|why| NodeError::TierUnavailable { tier: Tier::Microvm, why: why.into() });
        ready(adopted)
    }
}

async fn open(state: &Path, root: &Path) -> Node {
    let mut config = NodeConfig::default();
    config.container.enabled = false;
    config.images.enabled = false;
    // The one line that registers the tier.
    let tiers: Vec<Arc<dyn TierBackend>> = vec![Arc::new(DirTier { root: root.to_owned() })];
    Node::open_with(config, state, tiers).await.expect("node")
}

async fn stat(node: &Node, sandbox: &str, path: &str) -> Result<FileKind, NodeError> {
    let op = FileOp::Stat { sandbox: sandbox.into(), path: path.into() };
    match node.handle(Request::File(op)).await? {
        Some(Reply::Stat(entry)) => Ok(entry.kind),
        other => panic!("stat answered {other:?}"),
    }
}

#[tokio::test]
async fn a_tier_of_the_tests_is_created_used_restored_and_destroyed() {
    let state = tempfile::tempdir().expect("state");
    let root = tempfile::tempdir().expect("sandboxes");
    let node = open(state.path(), root.path()).await;
    assert!(node.tiers().contains(&Tier::Microvm), "the registered tier is offered");
    let create = CreateRequest { tier: Some(brig_proto::Tier::Microvm), ..Default::default() };
    let id = match node.handle(Request::Sandbox(SandboxOp::Create(Box::new(create)))).await {
        Ok(Some(Reply::Sandbox(info))) => info.id,
        other => panic!("create answered {other:?}"),
    };
    let mkdir = FileOp::Mkdir { sandbox: id.clone(), path: "/work/a".into(), parents: true };
    node.handle(Request::File(mkdir)).await.expect("mkdir");
    assert_eq!(stat(&node, &id, "/work/a").await.expect("stat"), FileKind::Dir);

    // The node restarts: the sandbox comes back from its tier's record.
    node.shutdown().await;
    drop(node);
    let node = open(state.path(), root.path()).await;
    assert_eq!(stat(&node, &id, "/work/a").await.expect("stat after restart"), FileKind::Dir);

    let destroy = SandboxOp::Destroy { sandbox: id.clone() };
    node.handle(Request::Sandbox(destroy)).await.expect("destroy");
    assert!(!root.path().join(&id).exists(), "its directory is gone with it");
    assert!(stat(&node, &id, "/work/a").await.is_err(), "a destroyed sandbox answers no more");
    node.shutdown().await;
}
