//! The lazy blob file system: a FUSE mount with one read-only file per layer, `<digest>.blob`,
//! whose bytes are the layer's store chunks at their slots, fetched only when read.
//!
//! ```text
//! <run>/lazy/<layer digest>.blob     size = slots × 256 KiB; slot i = chunk i, zeros after
//!        ▲ read(offset, len)
//!   EROFS (file-backed, device=…) ◀── container reads a file
//! ```
//! Reads are answered from [`ChunkCache`] on the async runtime, so a slow fetch holds up only
//! the reads that need that chunk. Nothing ever waits for a whole layer.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, MountOption, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request, SessionACL,
};
use parking_lot::RwLock;

use crate::cache::ChunkCache;
use crate::fuse_takeover::{take_over, Relay};
use crate::layout::SLOT_BYTES;

const ROOT: u64 = 1;
const TTL: Duration = Duration::from_secs(3600);

/// A chunk as a layer lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkEntry {
    pub digest: String,
    pub len: u64,
}

#[derive(Default)]
struct Files {
    by_name: HashMap<String, u64>,
    by_ino: HashMap<u64, (String, Arc<Vec<ChunkEntry>>)>,
    next_ino: u64,
}

/// The file table as kept on disk.
#[derive(serde::Serialize, serde::Deserialize)]
struct Table<F> {
    next_ino: u64,
    files: Vec<F>,
}

#[derive(serde::Serialize)]
struct TableEntry<'a> {
    ino: u64,
    name: &'a str,
    chunks: &'a [ChunkEntry],
}

#[derive(serde::Deserialize)]
struct OwnedTableEntry {
    ino: u64,
    name: String,
    chunks: Vec<ChunkEntry>,
}

impl Files {
    /// Writes the table whole (temporary file renamed over), so a server taking over the mount
    /// answers for the same inodes.
    fn save(&self, path: &Path) -> std::io::Result<()> {
        let files = self
            .by_ino
            .iter()
            .map(|(ino, (name, chunks))| TableEntry { ino: *ino, name, chunks })
            .collect();
        let table = Table { next_ino: self.next_ino, files };
        let bytes = serde_json::to_vec(&table).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }

    fn load(path: &Path) -> std::io::Result<Files> {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)?.take(MAX_TABLE_BYTES + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_TABLE_BYTES {
            return Err(std::io::Error::other("the lazy file table is over its cap"));
        }
        let table: Table<OwnedTableEntry> =
            serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
        let mut files = Files { next_ino: table.next_ino.max(ROOT + 1), ..Default::default() };
        for entry in table.files {
            files.next_ino = files.next_ino.max(entry.ino + 1);
            files.by_name.insert(entry.name.clone(), entry.ino);
            files.by_ino.insert(entry.ino, (entry.name, Arc::new(entry.chunks)));
        }
        Ok(files)
    }
}

/// Largest file table a server taking over reads (a layer's chunk list is about 80 bytes a
/// chunk).
const MAX_TABLE_BYTES: u64 = 256 << 20;

/// The mounted file system. Unmounted when dropped.
pub struct LazyFs {
    mountpoint: PathBuf,
    files: Arc<RwLock<Files>>,
    /// Where the file table is kept for a server that takes over.
    table: PathBuf,
    /// The `/dev/fuse` descriptor this process serves on.
    device_fd: RawFd,
    /// Set when this process took the mount over from a server that died.
    relay: Option<Relay>,
    _session: fuser::BackgroundSession,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot mount the lazy blob file system at {path}")]
pub struct MountError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn session_config() -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName("brig-lazy".into()),
        MountOption::Subtype("brig".into()),
    ];
    // The kernel reads the blobs on behalf of whichever container process faulted a page.
    config.acl = SessionACL::All;
    config.n_threads = Some(2);
    config
}

impl LazyFs {
    /// Mounts at `mountpoint`, serving chunks from `cache` with tasks on `runtime`; the file
    /// table is kept in `table`.
    pub fn mount(
        mountpoint: &Path,
        table: &Path,
        cache: Arc<ChunkCache>,
        runtime: tokio::runtime::Handle,
    ) -> Result<LazyFs, MountError> {
        let err = |source| MountError { path: mountpoint.to_owned(), source };
        // Mounts left by crashed runs (a dead one answers ENOTCONN, even to mkdir) would make
        // this one fail or stack on them: take them all off first.
        detach_stale(mountpoint);
        std::fs::create_dir_all(mountpoint).map_err(err)?;
        let files = Files { next_ino: ROOT + 1, ..Default::default() };
        files.save(table).map_err(err)?;
        let files = Arc::new(RwLock::new(files));
        let fs = Fs { files: files.clone(), cache, runtime };
        let session = fuser::Session::new(fs, mountpoint, &session_config()).map_err(err)?;
        let device_fd = session.as_fd().as_raw_fd();
        let session = session.spawn().map_err(err)?;
        Ok(LazyFs {
            mountpoint: mountpoint.to_owned(),
            files,
            table: table.to_owned(),
            device_fd,
            relay: None,
            _session: session,
        })
    }

    /// Serves the mount at `mountpoint` whose server died, on `device` (its `/dev/fuse` file, kept
    /// open by brigd), with the file table that server kept in `table`.
    pub fn take_over(
        device: OwnedFd,
        mountpoint: &Path,
        table: &Path,
        cache: Arc<ChunkCache>,
        runtime: tokio::runtime::Handle,
    ) -> Result<LazyFs, MountError> {
        let err = |source| MountError { path: mountpoint.to_owned(), source };
        let files = Arc::new(RwLock::new(Files::load(table).map_err(err)?));
        let (session_end, relay) = take_over(device).map_err(|e| err(std::io::Error::other(e)))?;
        let fs = Fs { files: files.clone(), cache, runtime };
        let config = session_config();
        let session =
            fuser::Session::from_fd(fs, session_end, config.acl, config).map_err(err)?.spawn();
        Ok(LazyFs {
            mountpoint: mountpoint.to_owned(),
            files,
            table: table.to_owned(),
            device_fd: relay.device_fd(),
            relay: Some(relay),
            _session: session.map_err(err)?,
        })
    }

    /// The `/dev/fuse` descriptor this process serves on (brigd keeps a copy of it).
    pub fn device_fd(&self) -> RawFd {
        self.device_fd
    }

    /// Publishes a layer's blob; returns its path.
    pub fn add(&self, name: &str, chunks: Vec<ChunkEntry>) -> std::io::Result<PathBuf> {
        let file = format!("{name}.blob");
        let mut files = self.files.write();
        if !files.by_name.contains_key(&file) {
            let ino = files.next_ino;
            files.next_ino += 1;
            files.by_name.insert(file.clone(), ino);
            files.by_ino.insert(ino, (file.clone(), Arc::new(chunks)));
            if let Err(e) = files.save(&self.table) {
                files.by_name.remove(&file);
                files.by_ino.remove(&ino);
                return Err(e);
            }
        }
        Ok(self.mountpoint.join(file))
    }

    /// Withdraws a layer's blob (mounts using it keep working until they go).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        let file = format!("{name}.blob");
        let mut files = self.files.write();
        if let Some(ino) = files.by_name.remove(&file) {
            files.by_ino.remove(&ino);
            files.save(&self.table)?;
        }
        Ok(())
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        // A taken-over mount is not fuser's to unmount; detached, the connection ends once no
        // layer holds a blob, and the relay with it.
        if self.relay.is_some() {
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Detaches every mount stacked at `mountpoint` (at most 16).
fn detach_stale(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let parent_dev = mountpoint.parent().and_then(|p| std::fs::metadata(p).ok()).map(|m| m.dev());
    for _ in 0..16 {
        let mounted = match std::fs::metadata(mountpoint) {
            Ok(m) => Some(m.dev()) != parent_dev,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        };
        if !mounted || nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH).is_err() {
            return;
        }
        tracing::info!(path = %mountpoint.display(), "detached a lazy mount left by an earlier run");
    }
}

struct Fs {
    files: Arc<RwLock<Files>>,
    cache: Arc<ChunkCache>,
    runtime: tokio::runtime::Handle,
}

fn attr(ino: u64, size: u64, dir: bool) -> FileAttr {
    let now = SystemTime::UNIX_EPOCH;
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind: if dir { FileType::Directory } else { FileType::RegularFile },
        perm: if dir { 0o555 } else { 0o444 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Fs {
    fn file_attr(&self, ino: u64) -> Option<FileAttr> {
        if ino == ROOT {
            return Some(attr(ROOT, 0, true));
        }
        let files = self.files.read();
        files.by_ino.get(&ino).map(|(_, chunks)| attr(ino, chunks.len() as u64 * SLOT_BYTES, false))
    }
}

impl fuser::Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = (parent.0 == ROOT)
            .then(|| self.files.read().by_name.get(&*name.to_string_lossy()).copied())
            .flatten();
        match ino.and_then(|ino| self.file_attr(ino)) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.file_attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.files.read().by_ino.contains_key(&ino.0) {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Some(chunks) = self.files.read().by_ino.get(&ino.0).map(|(_, c)| c.clone()) else {
            reply.error(Errno::ENOENT);
            return;
        };
        let cache = self.cache.clone();
        self.runtime.spawn(async move {
            let total = chunks.len() as u64 * SLOT_BYTES;
            let end = (offset + u64::from(size)).min(total);
            let mut out = vec![0u8; end.saturating_sub(offset) as usize];
            let mut pos = offset;
            while pos < end {
                let slot = (pos / SLOT_BYTES) as usize;
                let within = pos % SLOT_BYTES;
                let take = (SLOT_BYTES - within).min(end - pos);
                let entry = &chunks[slot];
                if within < entry.len {
                    match cache.get(&entry.digest).await {
                        Ok(bytes) => {
                            let avail = (entry.len - within).min(take) as usize;
                            let dst = (pos - offset) as usize;
                            let src = within as usize;
                            if src + avail <= bytes.len() {
                                out[dst..dst + avail].copy_from_slice(&bytes[src..src + avail]);
                            }
                        }
                        Err(e) => {
                            tracing::error!(chunk = %entry.digest, error = %e, "layer read failed");
                            reply.error(Errno::EIO);
                            return;
                        }
                    }
                }
                pos += take;
            }
            reply.data(&out);
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let mut entries: Vec<(u64, FileType, String)> =
            vec![(ROOT, FileType::Directory, ".".into()), (ROOT, FileType::Directory, "..".into())];
        let mut files: Vec<(u64, String)> =
            self.files.read().by_ino.iter().map(|(ino, (name, _))| (*ino, name.clone())).collect();
        files.sort();
        entries.extend(files.into_iter().map(|(ino, name)| (ino, FileType::RegularFile, name)));
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacked_mounts_left_behind_are_all_detached() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let point = dir.path().join("lazy");
        std::fs::create_dir(&point).expect("mkdir");
        for _ in 0..3 {
            nix::mount::mount(
                Some("tmpfs"),
                &point,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .expect("mount");
        }
        detach_stale(&point);
        let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
        assert!(!mounts.contains(point.to_str().expect("utf-8")), "{mounts}");
        // A plain directory is left as it is.
        detach_stale(&point);
        assert!(point.is_dir());
    }
}
