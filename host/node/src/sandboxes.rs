//! The node's table of live sandboxes, persisted so a restarted node finds them again, plus a
//! bounded memory of recently destroyed ones so a client hears *why* its sandbox is gone.
//!
//! ```text
//! <state>/sandboxes/<id>.json     id, spec, creation time (one small file per sandbox)
//! ```

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use brig_core::{SandboxId, SandboxSpec};
use brig_fncall::Workspace;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::NodeError;

/// How many destroyed sandboxes are remembered.
const TOMBSTONES: usize = 65_536;

/// The tier-specific part of a sandbox. Dispatch is by exhaustive `match`.
pub(crate) enum TierHandle {
    Fncall(Workspace),
    Container(crate::container::ContainerSandbox),
}

impl TierHandle {
    /// Where the sandbox's files are, for the file API.
    pub fn file_root(&self) -> crate::files::FileRoot<'_> {
        match self {
            TierHandle::Fncall(ws) => crate::files::FileRoot::Workspace(ws),
            TierHandle::Container(c) => crate::files::FileRoot::Container(
                brig_container::files::RootDir::new(c.container.root(), c.container.id_base()),
            ),
        }
    }
}

pub(crate) struct SandboxEntry {
    pub id: SandboxId,
    pub spec: SandboxSpec,
    pub created_unix_ms: u64,
    last_used_unix_ms: AtomicU64,
    pub handle: TierHandle,
}

impl SandboxEntry {
    pub fn new(id: SandboxId, spec: SandboxSpec, created_unix_ms: u64, handle: TierHandle) -> Self {
        SandboxEntry {
            id,
            spec,
            created_unix_ms,
            last_used_unix_ms: AtomicU64::new(created_unix_ms),
            handle,
        }
    }

    pub fn touch(&self) {
        self.last_used_unix_ms.store(now_unix_ms(), Ordering::Relaxed);
    }

    pub fn last_used_unix_ms(&self) -> u64 {
        self.last_used_unix_ms.load(Ordering::Relaxed)
    }

    pub fn idle_deadline_unix_ms(&self) -> u64 {
        let ttl = u64::try_from(self.spec.idle_ttl.as_millis()).unwrap_or(u64::MAX);
        self.last_used_unix_ms().saturating_add(ttl)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxRecord {
    pub id: SandboxId,
    pub spec: SandboxSpec,
    pub created_unix_ms: u64,
}

pub(crate) struct SandboxTable {
    dir: PathBuf,
    live: RwLock<HashMap<SandboxId, Arc<SandboxEntry>>>,
    gone: Mutex<Tombstones>,
}

#[derive(Default)]
struct Tombstones {
    order: VecDeque<SandboxId>,
    reasons: HashMap<SandboxId, Gone>,
}

/// Why a sandbox left the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Destroyed because a client asked.
    Destroyed,
    /// Destroyed by the node because a lifetime limit fired; the text says which.
    Expired(String),
}

impl SandboxTable {
    pub fn new(dir: &Path) -> Result<SandboxTable, NodeError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| NodeError::Io { what: dir.display().to_string(), source })?;
        Ok(SandboxTable { dir: dir.to_owned(), live: RwLock::default(), gone: Mutex::default() })
    }

    /// Records persisted by an earlier run of the node.
    pub fn saved_records(&self) -> Vec<SandboxRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path).map(|b| serde_json::from_slice::<SandboxRecord>(&b)) {
                Ok(Ok(record)) => out.push(record),
                _ => tracing::warn!(path = %path.display(), "unreadable sandbox record skipped"),
            }
        }
        out
    }

    fn record_path(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn len(&self) -> usize {
        self.live.read().len()
    }

    /// Adds a sandbox; `persist` writes its record (false when restoring from one).
    pub fn insert(
        &self,
        entry: SandboxEntry,
        persist: bool,
    ) -> Result<Arc<SandboxEntry>, NodeError> {
        if persist {
            let record = SandboxRecord {
                id: entry.id,
                spec: entry.spec.clone(),
                created_unix_ms: entry.created_unix_ms,
            };
            let path = self.record_path(&entry.id);
            let bytes = serde_json::to_vec(&record).map_err(|e| NodeError::Io {
                what: "sandbox record".into(),
                source: std::io::Error::other(e),
            })?;
            std::fs::write(&path, bytes)
                .map_err(|source| NodeError::Io { what: path.display().to_string(), source })?;
        }
        let entry = Arc::new(entry);
        self.live.write().insert(entry.id, entry.clone());
        Ok(entry)
    }

    /// Finds a live sandbox by id text.
    pub fn get(&self, id: &str) -> Result<Arc<SandboxEntry>, NodeError> {
        let parsed: SandboxId = id.parse()?;
        if let Some(entry) = self.live.read().get(&parsed) {
            return Ok(entry.clone());
        }
        match self.gone.lock().reasons.get(&parsed) {
            Some(Gone::Expired(reason)) => {
                Err(NodeError::SandboxExpired { id: id.to_string(), reason: reason.clone() })
            }
            Some(Gone::Destroyed) => Err(NodeError::SandboxDestroyed(id.to_string())),
            None => Err(NodeError::SandboxNotFound(id.to_string())),
        }
    }

    /// Takes a sandbox out of the table and forgets its record, remembering why.
    pub fn remove(&self, id: &SandboxId, reason: Gone) -> Option<Arc<SandboxEntry>> {
        let entry = self.live.write().remove(id)?;
        let path = self.record_path(id);
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove sandbox record");
        }
        let mut gone = self.gone.lock();
        if gone.order.len() >= TOMBSTONES {
            if let Some(old) = gone.order.pop_front() {
                gone.reasons.remove(&old);
            }
        }
        gone.order.push_back(*id);
        gone.reasons.insert(*id, reason);
        Some(entry)
    }

    /// Deletes the record of a sandbox that could not be restored.
    pub fn forget(&self, id: &SandboxId) {
        let _ = std::fs::remove_file(self.record_path(id));
    }

    pub fn list(&self, selector: &[(String, String)]) -> Vec<Arc<SandboxEntry>> {
        let mut out: Vec<_> =
            self.live.read().values().filter(|e| e.spec.matches(selector)).cloned().collect();
        out.sort_by_key(|e| (e.created_unix_ms, e.id.to_string()));
        out
    }

    /// Sandboxes whose idle deadline has passed.
    pub fn idle_past(&self, now_unix_ms: u64) -> Vec<Arc<SandboxEntry>> {
        self.live
            .read()
            .values()
            .filter(|e| e.idle_deadline_unix_ms() <= now_unix_ms)
            .cloned()
            .collect()
    }
}

pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
