//! Operations that must finish or be undone, never left half done by a crash: before a fork
//! makes its children the node writes an intent naming them, and removes it once the fork has
//! returned. A node that starts and finds an intent rolls the fork back: the children it lists
//! are destroyed (no client was told of them), and the parent, frozen for the copy, is thawed
//! by restore's check of frozen-but-running sandboxes.
//!
//! ```text
//! <state>/ops/fork-<parent>.json   { parent, children }   written before, removed after
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::NodeError;

/// An intent file is a handful of ids; anything bigger is not ours.
const MAX_INTENT_BYTES: u64 = 64 << 10;

/// A fork under way.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ForkIntent {
    pub parent: String,
    pub children: Vec<String>,
}

/// The node's directory of intents.
pub(crate) struct Intents {
    dir: PathBuf,
}

/// An intent on disk; dropping it removes the file (the operation finished or was undone).
pub(crate) struct IntentFile {
    path: PathBuf,
}

impl Drop for IntentFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove an intent");
        }
    }
}

impl Intents {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn open(dir: &Path) -> Result<Intents, NodeError> {
        std::fs::create_dir_all(dir).map_err(|source| NodeError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        Ok(Intents { dir: dir.to_path_buf() })
    }

    /// Records a fork before it makes anything (written whole, then renamed into place, and
    /// synced: the children may be recorded right after).
    pub fn begin_fork(&self, intent: &ForkIntent) -> Result<IntentFile, NodeError> {
        let path = self.dir.join(format!("fork-{}.json", intent.parent));
        let tmp = path.with_extension("json.tmp");
        let io = |source| NodeError::Io { what: format!("write {}", path.display()), source };
        let bytes = serde_json::to_vec(intent).map_err(|e| io(std::io::Error::other(e)))?;
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(io)?;
        Ok(IntentFile { path })
    }

    /// Forks a crash cut short, each with the file that records it (dropping it removes the
    /// file). Files that cannot be read as intents are reported and removed.
    pub fn pending_forks(&self) -> Vec<(ForkIntent, IntentFile)> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let file = IntentFile { path: path.clone() };
            if name.ends_with(".tmp") {
                continue; // dropping `file` removes a write cut short
            }
            match read_capped(&path).and_then(|b| serde_json::from_slice(&b).ok()) {
                Some(intent) if name.starts_with("fork-") => out.push((intent, file)),
                _ => tracing::warn!(path = %path.display(), "removing an unreadable intent"),
            }
        }
        out
    }
}

fn read_capped(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).ok()?;
    file.take(MAX_INTENT_BYTES + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= MAX_INTENT_BYTES).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_is_pending_until_dropped_and_junk_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let intents = Intents::open(dir.path()).expect("open");
        let intent = ForkIntent { parent: "p".into(), children: vec!["a".into(), "b".into()] };
        let file = intents.begin_fork(&intent).expect("begin");
        std::fs::write(dir.path().join("fork-x.json"), b"not json").expect("junk");
        std::fs::write(dir.path().join("fork-y.json.tmp"), b"{").expect("cut short");
        // A crash: the file stays.
        std::mem::forget(file);
        let pending = intents.pending_forks();
        assert_eq!(pending.iter().map(|(i, _)| i.clone()).collect::<Vec<_>>(), vec![intent]);
        drop(pending);
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }
}
