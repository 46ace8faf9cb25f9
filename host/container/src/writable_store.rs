//! The node's disk-backed store of containers' writable layers. Where the kernel has XFS
//! project quotas: one sparse image file in the node's state directory, formatted XFS and
//! loop-mounted once per node with project quotas.
//!
//! ```text
//! <state>/writable.xfs           sparse image (mkfs.xfs once)
//! <run>/writable/                its mount: loop, prjquota, nodev, nosuid, private
//! <run>/writable/c/<name>/       one container's writable layer: its own project id
//!                                (inherited), a project quota of its disk size; bound at
//!                                <run>/c/<name>/upper (see `crate::rootfs`)
//! ```
//! A full layer gives the writer ENOSPC (XFS enforces the project quota, and `statfs` inside
//! shows the quota as the disk's size); its pages are page cache the kernel writes back, not
//! memory pinned in the container's cgroup as a tmpfs's are. A bind mount is no superblock of
//! its own. The mount outlives brigd: a node started again finds it, reads the project ids
//! back from the directories, and keeps the layers of the containers it re-attaches.
//!
//! Where the kernel has no XFS quotas (`CONFIG_XFS_QUOTA` off, as in some VM kernels), each
//! layer is an image of its own instead: `<state>/writable-layers/<name>.ext4`, sparse, of the
//! disk size, ext4 without a journal (a sparse copy of a template formatted once per size),
//! loop-mounted at `<run>/c/<name>/upper`. The same ENOSPC, at the price of a loop device
//! and a superblock per container (the tmpfs's superblock, so the count stays).

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use parking_lot::Mutex;

use crate::xfs_quota::{self, XfsQuotaError};

/// The smallest image `mkfs.xfs` formats (300 MiB) and then some.
pub const MIN_STORE_BYTES: u64 = 512 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed for {path}: {output}")]
    Command { command: &'static str, path: PathBuf, output: String },
    #[error("cannot bind a writable layer at {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot make the store's mount at {path} private")]
    Private {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("the store's size {0} bytes is below the smallest XFS ({MIN_STORE_BYTES} bytes)")]
    TooSmall(u64),
    #[error("project quotas are not enforced on the store at {0}")]
    NoQuota(PathBuf),
    #[error("no project id left on the store")]
    NoIds,
    #[error(transparent)]
    Quota(#[from] XfsQuotaError),
}

impl StoreError {
    /// Whether the node's disk (where the store or the layer images are) is full: the
    /// create is refused for want of space, not for a fault.
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
            StoreError::Command { output, .. } => output.contains("No space left on device"),
            _ => false,
        }
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io { what, path: path.to_owned(), source }
}

/// Where the store's image lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The image file (created sparse and formatted if missing); per-layer images, where the
    /// kernel has no XFS quotas, go in `writable-layers` beside it.
    pub image: PathBuf,
    /// Its size: the most all writable layers together may hold.
    pub size_bytes: u64,
    /// Where the kernel has no XFS project quotas: an ext4 image per layer (`true`), which
    /// costs a create ~10 ms (a sparse copy and a loop mount), or no store (`false`: the
    /// runtime keeps layers in memory).
    pub images_fallback: bool,
}

/// Written (with the reason) when this boot's kernel refused a store with project quotas; in
/// the host's run directory, so a reboot (perhaps into another kernel) tries again.
const QUOTA_REFUSED: &str = "/run/brig/writable-store-refused";

/// How the store keeps layers apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Directories with project quotas on one XFS mount.
    ProjectQuota,
    /// An ext4 image per layer, loop-mounted.
    Images,
}

/// Project ids in use, by container.
#[derive(Debug, Default)]
struct Ids {
    by_name: HashMap<String, u32>,
    used: BTreeSet<u32>,
    /// Where the next search starts: ids are not reused at once (the blocks of a removed
    /// layer may still be counted against its id for a moment).
    next: u32,
}

/// Ids from 1 (0 is every file outside a layer) below this.
const MAX_ID: u32 = u32::MAX - 1;

impl Ids {
    fn allocate(&mut self, name: &str) -> Result<u32, StoreError> {
        let mut id = self.next.max(1);
        for _ in 0..=self.used.len() {
            if id > MAX_ID {
                id = 1;
            }
            if !self.used.contains(&id) {
                self.used.insert(id);
                self.by_name.insert(name.to_string(), id);
                self.next = id + 1;
                return Ok(id);
            }
            id += 1;
        }
        Err(StoreError::NoIds)
    }

    fn release(&mut self, name: &str) -> Option<u32> {
        let id = self.by_name.remove(name)?;
        self.used.remove(&id);
        Some(id)
    }
}

/// The node's writable store, mounted.
#[derive(Debug)]
pub struct WritableStore {
    kind: StoreKind,
    /// The XFS mount, or the directory of per-layer images.
    point: PathBuf,
    /// The XFS mount's root, for quota calls.
    root: Option<OwnedFd>,
    ids: Mutex<Ids>,
    /// Held while a template image is made: a template is never replaced while copied.
    templates: Mutex<()>,
}

/// The extension of per-layer images.
const IMAGE_EXT: &str = "ext4";

fn open_dir(path: &Path) -> Result<OwnedFd, StoreError> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| StoreError::Io { what: "open", path: path.to_owned(), source: e.into() })
}

/// Whether `point` is an XFS mount in this process's mount table.
fn is_xfs_mount(point: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let point = point.to_string_lossy();
    table.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (left, right) = (halves.next().unwrap_or(""), halves.next().unwrap_or(""));
        left.split(' ').nth(4) == Some(&*point) && right.split(' ').next() == Some("xfs")
    })
}

fn run(command: &'static str, args: &[&std::ffi::OsStr], path: &Path) -> Result<(), StoreError> {
    let output = std::process::Command::new(command)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| StoreError::Command {
            command,
            path: path.to_owned(),
            output: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(StoreError::Command { command, path: path.to_owned(), output: text })
}

impl WritableStore {
    /// Mounts the store at `point` (made if missing), or finds it mounted by an earlier run;
    /// where the kernel has no XFS quotas, a store of per-layer images instead.
    pub fn open(config: &StoreConfig, point: &Path) -> Result<WritableStore, StoreError> {
        // A kernel that refused the store once this boot refuses it again: without the images
        // fallback, a node does not make and drop a store at every start.
        if !config.images_fallback && Path::new(QUOTA_REFUSED).exists() {
            return Err(StoreError::NoQuota(point.to_owned()));
        }
        match Self::open_quota(config, point) {
            Ok(store) => Ok(store),
            Err(e) if !config.images_fallback => {
                if let Some(dir) = Path::new(QUOTA_REFUSED).parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = std::fs::write(QUOTA_REFUSED, brig_core::sandbox::chain(&e));
                Err(e)
            }
            Err(e) => {
                let images = config.image.with_file_name("writable-layers");
                let error = brig_core::sandbox::chain(&e);
                tracing::info!(%error, dir = %images.display(), "no XFS store with project quotas; an image per writable layer");
                let _ = std::fs::remove_dir(point);
                Self::open_images(&images)
                    .inspect_err(|_| tracing::warn!(%error, "the XFS store failed first"))
            }
        }
    }

    fn open_images(dir: &Path) -> Result<WritableStore, StoreError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("restrict", dir))?;
        run("mkfs.ext4", &["-V".as_ref()], dir)?;
        Ok(WritableStore {
            kind: StoreKind::Images,
            point: dir.to_owned(),
            root: None,
            ids: Mutex::default(),
            templates: Mutex::default(),
        })
    }

    fn open_quota(config: &StoreConfig, point: &Path) -> Result<WritableStore, StoreError> {
        std::fs::create_dir_all(point).map_err(io("create", point))?;
        if !is_xfs_mount(point) {
            Self::mount_image(config, point)?;
        } else {
            tracing::info!(point = %point.display(), "writable store mounted by an earlier run");
        }
        let root = open_dir(point)?;
        // Quota calls fail with ESRCH where project quotas are not on.
        if xfs_quota::block_quota(root.as_fd(), 0).is_err() {
            drop(root);
            let _ = umount2(point, MntFlags::MNT_DETACH);
            return Err(StoreError::NoQuota(point.to_owned()));
        }
        let dirs = point.join("c");
        {
            use std::os::unix::fs::DirBuilderExt;
            let made = std::fs::DirBuilder::new().mode(0o700).create(&dirs);
            match made {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(io("create", &dirs)(e))
                }
                _ => {}
            }
        }
        let store = WritableStore {
            kind: StoreKind::ProjectQuota,
            point: point.to_owned(),
            root: Some(root),
            ids: Mutex::default(),
            templates: Mutex::default(),
        };
        // Ids of the layers an earlier run left (kept containers' among them).
        let mut ids = Ids::default();
        for name in store.names() {
            let dir = store.dir_of(&name);
            match open_dir(&dir).and_then(|fd| Ok(xfs_quota::project_id(fd.as_fd())?)) {
                Ok(id) if id != 0 => {
                    ids.used.insert(id);
                    ids.by_name.insert(name, id);
                    ids.next = ids.next.max(id + 1);
                }
                other => tracing::warn!(dir = %dir.display(), ?other, "a layer without an id"),
            }
        }
        *store.ids.lock() = ids;
        // One layer made and removed before any container's depends on it.
        let probe = ".probe";
        let tried = store.create(probe, 1 << 20, 0).and_then(|_| store.remove(probe));
        if let Err(e) = tried {
            let _ = store.remove(probe);
            drop(store);
            let _ = umount2(point, MntFlags::MNT_DETACH);
            return Err(e);
        }
        Ok(store)
    }

    fn mount_image(config: &StoreConfig, point: &Path) -> Result<(), StoreError> {
        let image = &config.image;
        if config.size_bytes < MIN_STORE_BYTES {
            return Err(StoreError::TooSmall(config.size_bytes));
        }
        if !image.exists() {
            if let Some(parent) = image.parent() {
                std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            let fresh = image.with_extension("new");
            let file = std::fs::File::create(&fresh).map_err(io("create", &fresh))?;
            // Sparse: the node's disk holds what the layers hold, not the whole size.
            file.set_len(config.size_bytes).map_err(io("size", &fresh))?;
            drop(file);
            let made = run("mkfs.xfs", &["-q".as_ref(), "-f".as_ref(), fresh.as_os_str()], &fresh);
            if let Err(e) = made {
                let _ = std::fs::remove_file(&fresh);
                return Err(e);
            }
            std::fs::rename(&fresh, image).map_err(io("rename", &fresh))?;
            tracing::info!(image = %image.display(), size_bytes = config.size_bytes, "made the writable store");
        }
        // mount(8) sets up the loop device with autoclear: it goes with the last unmount.
        let options = "loop,prjquota,nodev,nosuid,noatime";
        let args: [&std::ffi::OsStr; 6] = [
            "-t".as_ref(),
            "xfs".as_ref(),
            "-o".as_ref(),
            options.as_ref(),
            image.as_os_str(),
            point.as_os_str(),
        ];
        if let Err(e) = run("mount", &args, image) {
            // A kernel without XFS quotas refuses `prjquota`: the image is of no use here.
            let _ = std::fs::remove_file(image);
            return Err(e);
        }
        // Kept out of the containers' copies of the mount table.
        mount(None::<&str>, point, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>).map_err(
            |source| {
                let _ = umount2(point, MntFlags::MNT_DETACH);
                StoreError::Private { path: point.to_owned(), source }
            },
        )?;
        tracing::info!(image = %image.display(), point = %point.display(), "mounted the writable store");
        Ok(())
    }

    /// How the store keeps layers apart.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// Where the store is mounted (or its images are).
    pub fn point(&self) -> &Path {
        &self.point
    }

    /// Container `name`'s layer: its directory on the XFS store, or its image.
    pub fn dir_of(&self, name: &str) -> PathBuf {
        match self.kind {
            StoreKind::ProjectQuota => self.point.join("c").join(name),
            StoreKind::Images => self.point.join(format!("{name}.{IMAGE_EXT}")),
        }
    }

    /// The containers with a layer on the store.
    pub fn names(&self) -> Vec<String> {
        let dir = match self.kind {
            StoreKind::ProjectQuota => self.point.join("c"),
            StoreKind::Images => self.point.clone(),
        };
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        let names = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned());
        match self.kind {
            StoreKind::ProjectQuota => names.collect(),
            // Templates and images being made start with a dot.
            StoreKind::Images => names
                .filter(|n| !n.starts_with('.'))
                .filter_map(|n| n.strip_suffix(&format!(".{IMAGE_EXT}")).map(str::to_string))
                .collect(),
        }
    }

    /// Makes container `name`'s layer of `bytes`, its root owned by `owner`, and mounts it at
    /// `target` (nodev, nosuid): its directory bound there, or its image loop-mounted.
    pub fn attach(
        &self,
        name: &str,
        bytes: u64,
        owner: u32,
        target: &Path,
    ) -> Result<(), StoreError> {
        match self.kind {
            StoreKind::ProjectQuota => {
                let layer = self.create(name, bytes, owner)?;
                // A bind mount: no superblock of its own.
                let bound =
                    mount(Some(&layer), target, None::<&str>, MsFlags::MS_BIND, None::<&str>);
                bound.map_err(|source| StoreError::Mount { path: target.to_owned(), source })?;
                let flags = MsFlags::MS_BIND
                    | MsFlags::MS_REMOUNT
                    | MsFlags::MS_NODEV
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NOATIME;
                mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
                    .map_err(|source| StoreError::Mount { path: target.to_owned(), source })
            }
            StoreKind::Images => {
                let image = self.dir_of(name);
                let _ = std::fs::remove_file(&image);
                let made = (|| {
                    let template = self.template(bytes, owner)?;
                    // A sparse copy of a formatted image (8 ms) instead of a mkfs (70-90 ms).
                    let args: [&std::ffi::OsStr; 3] =
                        ["--sparse=always".as_ref(), template.as_os_str(), image.as_os_str()];
                    run("cp", &args, &image)?;
                    let options = "loop,nodev,nosuid,noatime";
                    let args: [&std::ffi::OsStr; 6] = [
                        "-t".as_ref(),
                        "ext4".as_ref(),
                        "-o".as_ref(),
                        options.as_ref(),
                        image.as_os_str(),
                        target.as_os_str(),
                    ];
                    run("mount", &args, &image)
                })();
                if made.is_err() {
                    let _ = std::fs::remove_file(&image);
                }
                made
            }
        }
    }

    /// A formatted, empty image of `bytes` whose root `owner` owns, made once per size and
    /// owner (`.template-<bytes>-<owner>.ext4`, not a layer).
    fn template(&self, bytes: u64, owner: u32) -> Result<PathBuf, StoreError> {
        let template = self.point.join(format!(".template-{bytes}-{owner}.{IMAGE_EXT}"));
        let _making = self.templates.lock();
        if template.exists() {
            return Ok(template);
        }
        let fresh = self.point.join(format!(".new-{}.{IMAGE_EXT}", rand::random::<u64>()));
        let made = (|| {
            let file = std::fs::File::create(&fresh).map_err(io("create", &fresh))?;
            file.set_len(bytes).map_err(io("size", &fresh))?;
            drop(file);
            let root = format!("root_owner={owner}:{owner},nodiscard");
            let args: [&std::ffi::OsStr; 11] = [
                "-q".as_ref(),
                "-F".as_ref(),
                "-b".as_ref(),
                "4096".as_ref(),
                "-m".as_ref(),
                "0".as_ref(),
                "-O".as_ref(),
                "^has_journal".as_ref(),
                "-E".as_ref(),
                root.as_ref(),
                fresh.as_os_str(),
            ];
            run("mkfs.ext4", &args, &fresh)?;
            std::fs::rename(&fresh, &template).map_err(io("rename", &fresh))
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&fresh);
        }
        made.map(|()| template)
    }

    /// Container `name`'s project id, if it has a layer.
    pub fn project_of(&self, name: &str) -> Option<u32> {
        self.ids.lock().by_name.get(name).copied()
    }

    /// A project's block limit and usage in bytes (`None`: no quota at all).
    pub fn quota_of(&self, id: u32) -> Result<Option<(u64, u64)>, StoreError> {
        match &self.root {
            Some(root) => Ok(xfs_quota::block_quota(root.as_fd(), id)?),
            None => Ok(None),
        }
    }

    fn set_limit(&self, id: u32, bytes: u64) -> Result<(), StoreError> {
        match &self.root {
            Some(root) => Ok(xfs_quota::set_block_limit(root.as_fd(), id, bytes)?),
            None => Ok(()),
        }
    }

    /// Makes container `name`'s layer directory: owned by `owner`, its own project id, a
    /// quota of `bytes`. A layer of the same name left from before is removed first.
    fn create(&self, name: &str, bytes: u64, owner: u32) -> Result<PathBuf, StoreError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.dir_of(name);
        if dir.exists() || self.project_of(name).is_some() {
            self.remove(name)?;
        }
        let id = self.ids.lock().allocate(name)?;
        let made = (|| {
            std::fs::DirBuilder::new().mode(0o755).create(&dir).map_err(io("create", &dir))?;
            std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).map_err(io("chown", &dir))?;
            xfs_quota::set_project(open_dir(&dir)?.as_fd(), id)?;
            self.set_limit(id, bytes)?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = self.remove(name);
            return Err(e);
        }
        tracing::debug!(container = name, project = id, bytes, "made a writable layer");
        Ok(dir)
    }

    /// Removes container `name`'s layer and clears its quota (blocking: the layer may be
    /// large; call off the async workers).
    pub fn remove(&self, name: &str) -> Result<(), StoreError> {
        let dir = self.dir_of(name);
        if self.kind == StoreKind::Images {
            // A loop device still reading it keeps the blocks until it is released.
            return match std::fs::remove_file(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &dir)(e)),
                _ => Ok(()),
            };
        }
        let id =
            self.ids.lock().by_name.get(name).copied().or_else(|| {
                open_dir(&dir).ok().and_then(|fd| xfs_quota::project_id(fd.as_fd()).ok())
            });
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &dir)(e)),
        }
        if let Some(id) = id.filter(|&id| id != 0) {
            self.set_limit(id, 0)?;
        }
        self.ids.lock().release(name);
        Ok(())
    }

    /// Unmounts the store if no layer is on it (a node that keeps containers across its
    /// restart leaves it mounted for the next run).
    pub fn unmount_if_empty(&self) {
        if !self.names().is_empty() {
            return;
        }
        if self.kind == StoreKind::Images {
            if let Ok(entries) = std::fs::read_dir(&self.point) {
                for e in
                    entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with('.'))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
            let _ = std::fs::remove_dir(&self.point);
            return;
        }
        let _ = umount2(&self.point, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.point);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_not_reused_at_once_and_wrap() {
        let mut ids = Ids::default();
        assert_eq!(ids.allocate("a").ok(), Some(1));
        assert_eq!(ids.allocate("b").ok(), Some(2));
        assert_eq!(ids.release("a"), Some(1));
        assert_eq!(ids.allocate("c").ok(), Some(3));
        ids.next = MAX_ID;
        assert_eq!(ids.allocate("d").ok(), Some(MAX_ID));
        assert_eq!(ids.allocate("e").ok(), Some(1));
        assert_eq!(ids.allocate("f").ok(), Some(4));
        assert_eq!(ids.release("zz"), None);
    }
}
