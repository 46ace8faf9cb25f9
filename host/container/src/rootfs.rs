//! A container's root filesystem: read-only EROFS layers, mounted once per node and shared by
//! every container that uses them, under an overlayfs with a per-container writable upper.
//!
//! ```text
//! <run>/layers/<key>/              EROFS image mounted read-only (file-backed: no loop device)
//! <run>/c/<id>/upper/              the writable layer: upper/ and work/ for overlay
//! <run>/c/<id>/rootfs/             overlay: lowerdir = toolkit:workspace:base (top first)
//! ```
//! The writable layer is on the node's disk-backed store ([`crate::writable_store`]): a
//! directory with an XFS project quota of the disk size bound here, or an ext4 image of that
//! size loop-mounted here; filling the disk gives the writer ENOSPC and costs the container no
//! pinned memory. Where the node has no store (and in a container-host VM's guest) it is a
//! size-capped tmpfs whose pages are charged to the container's memory cgroup (a disk larger
//! than the memory limit fills into the OOM killer). Once the container is built (from clones of these mounts), the host-side mounts are detached: the
//! container's mount namespace keeps them alive, and the host mount table stays small however
//! many containers run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::writable_store::{StoreError, WritableStore};

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("layer image {0} does not exist")]
    MissingLayer(PathBuf),
    #[error("cannot mount layer image {image} (is it an EROFS image?)")]
    LayerMount {
        image: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot {what} at {path}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the writable layer on the node's store")]
    Store(#[from] StoreError),
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io { what, path: path.to_owned(), source }
}

fn mnt<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> RootfsError + 'a {
    move |source| RootfsError::Mount { what, path: path.to_owned(), source }
}

/// A read-only layer: a self-contained EROFS image, or a meta image whose file data is on a
/// separate blob device (a lazily served file of the layer store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSource {
    pub image: PathBuf,
    pub device: Option<PathBuf>,
}

impl LayerSource {
    pub fn image(image: impl Into<PathBuf>) -> Self {
        LayerSource { image: image.into(), device: None }
    }
}

/// A rootfs directory being assembled: removed (unmounted first) when dropped before
/// [`Unfinished::done`], so a step that fails leaves nothing behind.
struct Unfinished<'a>(&'a Path, Option<&'a Arc<WritableStore>>);

impl Unfinished<'_> {
    fn done(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Err(e) = Rootfs::at(self.0).with_store(self.1.cloned()).remove() {
            tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove an unfinished rootfs");
        }
    }
}

/// Read-only layer mounts shared by all containers of a node.
#[derive(Debug)]
pub struct LayerMounts {
    dir: PathBuf,
    /// Mount points by image and data device.
    mounted: Mutex<HashMap<(PathBuf, Option<DeviceId>), PathBuf>>,
}

/// A data device's device and inode numbers.
type DeviceId = (u64, u64);

impl LayerMounts {
    pub fn new(dir: &Path) -> Result<LayerMounts, RootfsError> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        let layers = LayerMounts { dir: dir.to_owned(), mounted: Mutex::new(HashMap::new()) };
        // Mounts left by an earlier run are not tracked: detach them.
        layers.unmount_dirs();
        Ok(layers)
    }

    fn unmount_dirs(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for e in entries.flatten() {
            let point = e.path();
            if is_mount_point(&point) {
                let _ = umount2(&point, MntFlags::MNT_DETACH);
            }
            let _ = std::fs::remove_dir(&point);
        }
    }

    /// Detaches every layer mount (containers still running keep theirs alive).
    pub fn unmount_all(&self) {
        self.mounted.lock().clear();
        self.unmount_dirs();
    }

    /// Mounts a layer (once) and returns its mount point.
    pub fn mount(&self, layer: &LayerSource) -> Result<PathBuf, RootfsError> {
        let image = layer
            .image
            .canonicalize()
            .map_err(|_| RootfsError::MissingLayer(layer.image.to_owned()))?;
        // A data device is known by the file it is now: a lazy file system server started
        // again serves the same path from a new mount, and a layer mounted over the old one
        // reads from a dead device.
        let device = match &layer.device {
            Some(d) => {
                use std::os::unix::fs::MetadataExt;
                let m = std::fs::metadata(d).map_err(|_| RootfsError::MissingLayer(d.clone()))?;
                Some((m.dev(), m.ino()))
            }
            None => None,
        };
        let mut mounted = self.mounted.lock();
        if let Some(point) = mounted.get(&(image.clone(), device)) {
            return Ok(point.clone());
        }
        // The same image over an earlier device: containers that have it keep it.
        mounted.retain(|(other, _), point| {
            let stale = *other == image;
            if stale {
                let _ = umount2(point.as_path(), MntFlags::MNT_DETACH);
            }
            !stale
        });
        let meta = std::fs::metadata(&image).map_err(io("stat", &image))?;
        let key = layer_key(&image, &meta, device);
        let point = self.dir.join(key);
        std::fs::create_dir_all(&point).map_err(io("create", &point))?;
        if !is_mount_point(&point) {
            let options = layer.device.as_ref().map(|d| format!("device={}", d.display()));
            mount(
                Some(&image),
                &point,
                Some("erofs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
                options.as_deref(),
            )
            .map_err(|source| RootfsError::LayerMount { image: image.clone(), source })?;
            // Keep layer mounts out of every container's copy of the mount table.
            mount(None::<&str>, &point, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>)
                .map_err(mnt("make layer mount private", &point))?;
        }
        mounted.insert((image, device), point.clone());
        Ok(point)
    }
}

/// Names a layer mount by image path, size and modification time, and its data device, so a
/// rebuilt image or a new device gets a fresh mount instead of a stale one.
fn layer_key(image: &Path, meta: &std::fs::Metadata, device: Option<DeviceId>) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut h = Sha256::new();
    h.update(image.as_os_str().as_encoded_bytes());
    h.update(meta.len().to_le_bytes());
    h.update(meta.mtime().to_le_bytes());
    h.update(meta.mtime_nsec().to_le_bytes());
    if let Some((dev, ino)) = device {
        h.update(dev.to_le_bytes());
        h.update(ino.to_le_bytes());
    }
    hex::encode(&h.finalize()[..12])
}

fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), path.parent().map(std::fs::metadata)) {
        (Ok(me), Some(Ok(parent))) => me.dev() != parent.dev(),
        _ => false,
    }
}

/// The directory on the writable layer that becomes the container's /dev.
pub const DEV_DIR: &str = "dev";
/// The empty directory on the writable layer bound over masked directories.
pub const EMPTY_DIR: &str = "empty";

/// A container's writable layer: its size, and the node's store it is on (`None`: a tmpfs).
#[derive(Debug, Clone)]
pub struct Upper {
    pub disk_bytes: u64,
    pub store: Option<Arc<WritableStore>>,
}

/// One container's assembled root filesystem on the host.
#[derive(Debug)]
pub struct Rootfs {
    dir: PathBuf,
    /// The store its writable layer is on (removed with it), if not a tmpfs.
    store: Option<Arc<WritableStore>>,
    /// The writable upper directory, held open so it stays reachable after the host-side
    /// mounts are detached (for checkpoints).
    upper: Option<std::os::fd::OwnedFd>,
    /// Or a path through the shim's descriptor of it (see [`Rootfs::with_upper_link`]).
    upper_link: Option<PathBuf>,
}

impl Rootfs {
    /// Builds `<dir>/rootfs` from `layers` (mount points, bottom first) and a fresh writable
    /// layer (`upper`), owned by `owner` (host uid of container root).
    /// `seed`: a writable layer to start from (a fork's parent's), copied before mounting.
    /// `protect`: paths covered by read-only or hiding mounts (see [`crate::protect`]).
    pub fn assemble(
        dir: &Path,
        layers: &[PathBuf],
        upper_spec: &Upper,
        owner: u32,
        hostname: &str,
        seed: Option<&Path>,
        protect: &crate::protect::Protections,
    ) -> Result<Rootfs, RootfsError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(io("create", dir))?;
        let store = upper_spec.store.clone();
        let mut rootfs =
            Rootfs { dir: dir.to_owned(), store: store.clone(), upper: None, upper_link: None };
        // A step that fails (a protected path missing from the image, a full disk while a
        // fork's layer is copied) leaves nothing mounted or on disk.
        let unfinished = Unfinished(dir, upper_spec.store.as_ref());
        let upper_mnt = dir.join("upper");
        let merged = rootfs.path();
        for d in [&upper_mnt, &merged] {
            std::fs::create_dir_all(d).map_err(io("create", d))?;
        }
        let size = upper_spec.disk_bytes.max(1 << 20);
        match &store {
            Some(store) => {
                let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
                store.attach(&name.unwrap_or_default(), size, owner, &upper_mnt)?;
            }
            None => mount(
                Some("brig-upper"),
                &upper_mnt,
                Some("tmpfs"),
                MsFlags::MS_NODEV,
                Some(format!("size={size},mode=0755,uid={owner},gid={owner}").as_str()),
            )
            .map_err(mnt("mount tmpfs upper", &upper_mnt))?,
        }
        let (upper, work) = (upper_mnt.join("upper"), upper_mnt.join("work"));
        // /dev and the empty directory masks are bound from: on the writable layer, not tmpfs
        // mounts of their own (a superblock per container each).
        let (dev, empty) = (upper_mnt.join(DEV_DIR), upper_mnt.join(EMPTY_DIR));
        for d in [&upper, &work, &dev] {
            std::fs::create_dir(d).map_err(io("create", d))?;
            std::os::unix::fs::chown(d, Some(owner), Some(owner)).map_err(io("chown", d))?;
        }
        std::fs::DirBuilder::new().mode(0o555).create(&empty).map_err(io("create", &empty))?;
        if let Some(seed) = seed {
            let status = std::process::Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", seed.display()))
                .arg(&upper)
                .status()
                .map_err(io("copy the writable layer from", seed))?;
            if !status.success() {
                return Err(RootfsError::Io {
                    what: "copy the writable layer from",
                    path: seed.to_owned(),
                    source: std::io::Error::other(format!("cp: {status}")),
                });
            }
        }
        let lower: Vec<String> = layers.iter().rev().map(|p| p.display().to_string()).collect();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            work.display()
        );
        mount(Some("overlay"), &merged, Some("overlay"), MsFlags::empty(), Some(options.as_str()))
            .map_err(mnt("mount overlay", &merged))?;
        mount(None::<&str>, &merged, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>)
            .map_err(mnt("make rootfs private", &merged))?;
        rootfs.write_identity(hostname, owner)?;
        if !protect.binds.is_empty() {
            crate::protect::bind(&merged, &protect.binds, owner)?;
        }
        if !protect.paths.is_empty() {
            let pristine = match layers {
                [only] => only.clone(),
                _ => {
                    let view = dir.join("pristine");
                    std::fs::create_dir_all(&view).map_err(io("create", &view))?;
                    let lower: Vec<String> =
                        layers.iter().rev().map(|p| p.display().to_string()).collect();
                    let options = format!("lowerdir={}", lower.join(":"));
                    mount(
                        Some("overlay"),
                        &view,
                        Some("overlay"),
                        MsFlags::MS_RDONLY,
                        Some(options.as_str()),
                    )
                    .map_err(mnt("mount the image view", &view))?;
                    view
                }
            };
            crate::protect::apply(dir, &merged, &pristine, protect, owner)?;
        }
        let fd = rustix::fs::open(
            &upper,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| RootfsError::Io {
            what: "open",
            path: upper.clone(),
            source: e.into(),
        })?;
        rootfs.upper = Some(fd);
        unfinished.done();
        Ok(rootfs)
    }

    /// The rootfs directory of an earlier run (to re-attach to or remove it).
    pub fn at(dir: &Path) -> Rootfs {
        Rootfs { dir: dir.to_owned(), store: None, upper: None, upper_link: None }
    }

    /// With the store its writable layer is on (removed with it by [`Rootfs::remove`]).
    pub fn with_store(mut self, store: Option<Arc<WritableStore>>) -> Rootfs {
        self.store = store;
        self
    }

    /// With the upper directory's descriptor (handed over on re-attach by a shim from before
    /// `FromShim::ReattachedAt`).
    pub fn with_upper(mut self, upper: std::os::fd::OwnedFd) -> Rootfs {
        self.upper = Some(upper);
        self.upper_link = None;
        self
    }

    /// Reaches the upper directory through `link` (the shim's descriptor of it,
    /// `/proc/<shim>/fd/<n>`) from now on, instead of a descriptor of this process: the node
    /// holds one descriptor per container, not three, and 10,000 containers fit its limit.
    pub fn with_upper_link(mut self, link: PathBuf) -> Rootfs {
        self.upper = None;
        self.upper_link = Some(link);
        self
    }

    /// The writable layer's directory that becomes /dev.
    pub fn dev_dir(&self) -> PathBuf {
        self.dir.join("upper").join(DEV_DIR)
    }

    /// The writable layer's empty directory, bound over masked directories.
    pub fn empty_dir(&self) -> PathBuf {
        self.dir.join("upper").join(EMPTY_DIR)
    }

    /// The container's run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A path to the writable upper directory (the container's changes, with overlay
    /// whiteouts for what it deleted), through this process's descriptor: valid for this
    /// process and the root-owned tools it runs.
    pub fn upper_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        let pid = std::process::id();
        match &self.upper {
            Some(fd) => Some(PathBuf::from(format!("/proc/{pid}/fd/{}", fd.as_raw_fd()))),
            None => self.upper_link.clone(),
        }
    }

    /// The merged root (host path, valid until [`Rootfs::detach`]).
    pub fn path(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// /etc/hostname and /etc/hosts for the container's name, and a fresh /etc/machine-id
    /// (a fork must not share its parent's).
    fn write_identity(&self, hostname: &str, owner: u32) -> Result<(), RootfsError> {
        let merged = self.path();
        if !crate::protect::exists_inside(&merged, "/etc") {
            return Ok(());
        }
        let hosts =
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n");
        let mut files = vec![("hostname", format!("{hostname}\n")), ("hosts", hosts)];
        if crate::protect::exists_inside(&merged, "/etc/machine-id") {
            files.push(("machine-id", format!("{}\n", hex::encode(rand::random::<[u8; 16]>()))));
        }
        for (name, content) in files {
            // Resolved inside the rootfs: a symlinked /etc (a fork copies its parent's
            // writable layer) cannot send these writes to the host.
            crate::protect::write_inside(&merged, "/etc", name, content.as_bytes(), owner)?;
        }
        Ok(())
    }

    /// Detaches the host-side mounts once the container's namespace holds them.
    pub fn detach(&self) {
        for d in [self.path(), self.dir.join("upper"), self.dir.join("pristine")] {
            let _ = umount2(&d, MntFlags::MNT_DETACH);
        }
    }

    /// Detaches what is still mounted and removes the directory, and the writable layer on
    /// the node's store (blocking: a layer may hold gigabytes).
    pub fn remove(&self) -> Result<(), RootfsError> {
        self.detach();
        let removed = match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RootfsError::Io { what: "remove", path: self.dir.clone(), source: e }),
        };
        if let (Some(store), Some(name)) = (&self.store, self.dir.file_name()) {
            store.remove(&name.to_string_lossy())?;
        }
        removed
    }

    /// What [`Rootfs::remove`] does, as a job for a blocking thread.
    pub fn remover(&self) -> impl FnOnce() -> Result<(), RootfsError> + Send + 'static {
        let rootfs = Rootfs::at(&self.dir).with_store(self.store.clone());
        move || rootfs.remove()
    }
}
