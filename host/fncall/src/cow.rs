//! Copy-on-write workspaces: a fork's children share the parent's files through overlayfs
//! instead of copying them.
//!
//! ```text
//! <workspaces>/<key>            a plain directory, or the overlay mount of a layered workspace
//! <workspaces>/.cow/<key>/      upper/ (its own changes), work/ (overlayfs), lowers (layer ids)
//! <workspaces>/.frozen/<id>/    a read-only layer shared by every workspace that lists it
//! ```
//!
//! A fork freezes the parent first: a plain parent's directory becomes a frozen layer, a layered
//! parent's upper does (unless it is empty, so forking again adds no layer). The parent is then
//! remounted over the frozen stack and each child gets an overlay of its own over the same
//! stack. Nothing is copied; a write copies up only the file it touches. Layers are counted by
//! the workspaces that list them and removed when the last one goes. A stack deeper than
//! [`MAX_DEPTH`], a path overlayfs cannot name, or a node without the right to mount makes
//! [`Layers::fork`] fail, and the caller copies instead.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use parking_lot::Mutex;

use crate::FncallError;

/// Most frozen layers under one workspace; a deeper fork copies instead.
pub const MAX_DEPTH: usize = 16;

/// Why a copy-on-write fork did not happen.
#[derive(Debug)]
pub(crate) enum ForkError {
    /// Nothing changed; copying is the way (no right to mount, too deep, an unnameable path).
    CannotShare(FncallError),
    /// It failed part way; the parent is as it was or layered, and no child exists.
    Failed(FncallError),
}

impl From<FncallError> for ForkError {
    fn from(e: FncallError) -> ForkError {
        ForkError::Failed(e)
    }
}

/// The frozen layers of one node's workspaces and how many workspaces use each.
pub(crate) struct Layers {
    root: PathBuf,
    refs: Mutex<HashMap<String, usize>>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FncallError + '_ {
    move |source| FncallError::Io { path: path.to_owned(), source }
}

fn cannot(path: &Path, why: impl Into<String>) -> FncallError {
    FncallError::Io { path: path.to_owned(), source: std::io::Error::other(why.into()) }
}

fn mkdir_private(path: &Path) -> Result<(), FncallError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(io(path))
}

impl Layers {
    pub(crate) fn new(root: PathBuf) -> Layers {
        Layers { root, refs: Mutex::new(HashMap::new()) }
    }

    fn merged(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn cow(&self, key: &str) -> PathBuf {
        self.root.join(".cow").join(key)
    }

    fn frozen(&self, id: &str) -> PathBuf {
        self.root.join(".frozen").join(id)
    }

    /// The frozen layers under `key`, top first; `None` for a plain workspace.
    pub(crate) fn lowers(&self, key: &str) -> Result<Option<Vec<String>>, FncallError> {
        let path = self.cow(key).join("lowers");
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.lines().map(str::to_owned).collect())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(FncallError::Io { path, source }),
        }
    }

    fn write_lowers(&self, key: &str, lowers: &[String]) -> Result<(), FncallError> {
        let dir = self.cow(key);
        let tmp = dir.join("lowers.tmp");
        std::fs::write(&tmp, lowers.join("\n")).map_err(io(&tmp))?;
        let path = dir.join("lowers");
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// Detaches every workspace overlay (at shutdown: the next start mounts them again, see
    /// [`Layers::adopt`]; a state directory removed after a stop must not leave mounts
    /// behind). Returns how many were mounted.
    pub(crate) fn unmount_all(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.root.join(".cow")) else { return 0 };
        let mut count = 0;
        for key in entries.flatten().filter_map(|e| e.file_name().into_string().ok()) {
            if self.is_mounted(&key) && self.unmount(&key).is_ok() {
                count += 1;
            }
        }
        count
    }

    fn is_mounted(&self, key: &str) -> bool {
        let (Ok(root), Ok(merged)) =
            (std::fs::metadata(&self.root), std::fs::metadata(self.merged(key)))
        else {
            return false;
        };
        root.dev() != merged.dev()
    }

    fn mount(&self, key: &str, lowers: &[String]) -> Result<(), FncallError> {
        let cow = self.cow(key);
        let lower: Vec<String> =
            lowers.iter().map(|id| self.frozen(id).display().to_string()).collect();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            cow.join("upper").display(),
            cow.join("work").display()
        );
        let target = self.merged(key);
        nix::mount::mount(
            Some("brig-workspace"),
            &target,
            Some("overlay"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| FncallError::Io { path: target, source: e.into() })
    }

    fn unmount(&self, key: &str) -> Result<(), FncallError> {
        let target = self.merged(key);
        match nix::mount::umount2(&target, MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
            Err(e) => Err(FncallError::Io { path: target, source: e.into() }),
        }
    }

    /// A fresh upper and work directory for `key`.
    fn fresh_cow(&self, key: &str) -> Result<(), FncallError> {
        let cow = self.cow(key);
        for sub in ["upper", "work"] {
            let dir = cow.join(sub);
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
            }
            mkdir_private(&dir)?;
        }
        Ok(())
    }

    fn take_refs(&self, lowers: &[String]) {
        let mut refs = self.refs.lock();
        for id in lowers {
            *refs.entry(id.clone()).or_default() += 1;
        }
    }

    /// Drops one use of each layer, removing layers no workspace uses any more.
    fn drop_refs(&self, lowers: &[String]) {
        let mut unused = Vec::new();
        {
            let mut refs = self.refs.lock();
            for id in lowers {
                if let Some(n) = refs.get_mut(id) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        refs.remove(id);
                        unused.push(id.clone());
                    }
                }
            }
        }
        for id in unused {
            let path = self.frozen(&id);
            if let Err(e) = std::fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %e, "removing an unused layer");
            }
        }
    }

    /// Freezes `parent`'s files as they are now and returns the stack its children share.
    fn freeze(&self, parent: &str) -> Result<Vec<String>, ForkError> {
        let cow = self.cow(parent);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id = format!("{parent}-{nanos:x}");
        let frozen_root = self.root.join(".frozen");
        std::fs::create_dir_all(&frozen_root).map_err(io(&frozen_root))?;
        match self.lowers(parent)? {
            None => {
                // A plain directory becomes the first layer; the parent is remounted over it.
                let merged = self.merged(parent);
                let frozen = self.frozen(&id);
                self.fresh_cow(parent)?;
                std::fs::rename(&merged, &frozen).map_err(io(&merged))?;
                let lowers = vec![id];
                let remounted = mkdir_private(&merged)
                    .and_then(|()| self.write_lowers(parent, &lowers))
                    .and_then(|()| self.mount(parent, &lowers));
                if let Err(e) = remounted {
                    // Put the parent back as it was: nothing changed, so the caller may copy.
                    let _ = std::fs::remove_dir(&merged);
                    let _ = std::fs::rename(&frozen, &merged);
                    let _ = std::fs::remove_dir_all(&cow);
                    return Err(ForkError::CannotShare(e));
                }
                self.take_refs(&lowers);
                Ok(lowers)
            }
            Some(lowers) => {
                let upper = cow.join("upper");
                let empty = std::fs::read_dir(&upper).map_err(io(&upper))?.next().is_none();
                if empty {
                    return Ok(lowers);
                }
                if lowers.len() >= MAX_DEPTH {
                    let why = format!("more than {MAX_DEPTH} layers");
                    return Err(ForkError::CannotShare(cannot(&upper, why)));
                }
                self.unmount(parent).map_err(ForkError::CannotShare)?;
                let frozen = self.frozen(&id);
                if let Err(e) = std::fs::rename(&upper, &frozen) {
                    let _ = self.mount(parent, &lowers);
                    return Err(ForkError::Failed(FncallError::Io { path: upper, source: e }));
                }
                let mut stack = vec![id];
                stack.extend(lowers);
                self.fresh_cow(parent)?;
                self.write_lowers(parent, &stack)?;
                self.take_refs(&stack[..1]);
                self.mount(parent, &stack)?;
                Ok(stack)
            }
        }
    }

    /// Gives each of `children` a workspace sharing `parent`'s files copy-on-write.
    pub(crate) fn fork(&self, parent: &str, children: &[String]) -> Result<(), ForkError> {
        if [",", ":"].iter().any(|c| self.root.to_string_lossy().contains(c)) {
            let why = "overlayfs cannot name a path with ',' or ':'";
            return Err(ForkError::CannotShare(cannot(&self.root, why)));
        }
        let stack = self.freeze(parent)?;
        let mut made: Vec<&str> = Vec::with_capacity(children.len());
        for child in children {
            let listed = self.fresh_cow(child).and_then(|()| self.write_lowers(child, &stack));
            if listed.is_ok() {
                self.take_refs(&stack);
            }
            let mounted = listed
                .and_then(|()| mkdir_private(&self.merged(child)))
                .and_then(|()| self.mount(child, &stack));
            if let Err(e) = mounted {
                for done in made.into_iter().chain([child.as_str()]) {
                    let _ = self.remove(done);
                    let _ = std::fs::remove_dir_all(self.cow(done));
                    let _ = std::fs::remove_dir(self.merged(done));
                }
                return Err(ForkError::Failed(e));
            }
            made.push(child);
        }
        Ok(())
    }

    /// Serves a layered workspace again after a restart: counts its layers and mounts it if
    /// it is not mounted (after a reboot). A plain workspace is left as it is.
    pub(crate) fn adopt(&self, key: &str) -> Result<(), FncallError> {
        let Some(lowers) = self.lowers(key)? else { return Ok(()) };
        if !self.is_mounted(key) {
            self.mount(key, &lowers)?;
        }
        self.take_refs(&lowers);
        Ok(())
    }

    /// Removes a layered workspace: its mount, its upper and its use of each layer. `Ok(false)`
    /// if `key` is a plain workspace (the caller removes the directory).
    pub(crate) fn remove(&self, key: &str) -> Result<bool, FncallError> {
        let Some(lowers) = self.lowers(key)? else { return Ok(false) };
        self.unmount(key)?;
        let cow = self.cow(key);
        std::fs::remove_dir_all(&cow).map_err(io(&cow))?;
        let merged = self.merged(key);
        match std::fs::remove_dir(&merged) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(FncallError::Io { path: merged, source }),
        }
        self.drop_refs(&lowers);
        Ok(true)
    }

    /// Removes frozen layers no adopted workspace lists (left by a fork or destroy that a
    /// crash cut short). Call once every workspace has been adopted.
    pub(crate) fn sweep(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.root.join(".frozen")) else { return 0 };
        let refs = self.refs.lock();
        let mut removed = 0;
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if !refs.contains_key(&id) && std::fs::remove_dir_all(entry.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Frozen layers in use (for tests and metrics).
    pub(crate) fn layer_count(&self) -> usize {
        self.refs.lock().len()
    }
}
