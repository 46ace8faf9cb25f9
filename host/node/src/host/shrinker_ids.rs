//! Memory cgroup shrinker ids, raised once per boot before the node fills.
//!
//! Every superblock registers a shrinker that works per memory cgroup, with an id, and every
//! memory cgroup holds a map (`shrinker_info`) sized by the largest id the host has had since
//! it booted. When a new superblock takes an id past that size, the kernel grows the map of
//! every memory cgroup on the host (`expand_shrinker_info`: a new map each, zeroed and copied),
//! under the lock that every superblock and memory cgroup creation takes. A container has five
//! superblocks and a memory cgroup, so a node filling after a boot grows the maps every 13
//! creates or so, each time over all the containers it already has: the total is cubic in the
//! fill. On this machine, freshly booted, it was 13.7% of all CPU at 1,500 containers and
//! 25.7% at 9,000 (`docs/density.md`). The largest id only falls at reboot.
//!
//! So the node raises it at start, while few memory cgroups exist: a thread of its own, in a
//! private mount namespace, mounts that many empty ramfs instances on directories of a scratch
//! tmpfs and ends; the namespace, with every mount in it, goes with the thread. The host's
//! namespace never sees them. 54,000 took 1.25 s and 209 MiB for that time here.
//!
//! The cost: from then on every memory cgroup's map is as large as a full node's (0.78 MiB
//! for 10,000 containers' ids), which a node that fills once pays anyway. One record per boot
//! (`<run root>/shrinker-ids.json`: the boot id and the ids reserved), under a lock, keeps the
//! node's later starts, and other nodes of the host, from doing it again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use serde::{Deserialize, Serialize};

/// Superblocks one container registers: its overlay, the tmpfs under it, proc, devpts and its
/// IPC namespace's mqueue (a container with protected paths has one more, not counted).
pub const SUPERBLOCKS_PER_CONTAINER: u64 = 5;

/// Where the kernel says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The record and the boot id are a few dozen bytes.
const READ_CAP: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ShrinkerIdsError {
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {what}")]
    Kernel {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("cannot mount superblock {done} of {ids} (mounts of a namespace are capped by fs.mount-max)")]
    Mount {
        done: u64,
        ids: u64,
        #[source]
        source: nix::Error,
    },
    #[error("the thread that holds the superblocks panicked")]
    Panicked,
}

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> ShrinkerIdsError + 'a {
    move |source| ShrinkerIdsError::Io { what, path: path.to_owned(), source }
}

/// What [`ShrinkerIds::reserve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// Held `ids` superblocks at once, taking `took`.
    Now { ids: u64, took: Duration },
    /// This boot already has `ids` reserved (by this node earlier or another).
    Already { ids: u64 },
}

/// The record of one boot's reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShrinkerIdsRecord {
    pub boot_id: String,
    pub ids: u64,
}

/// The host's reservation record, in the parent of a run directory.
#[derive(Debug, Clone)]
pub struct ShrinkerIds {
    root: PathBuf,
}

impl ShrinkerIds {
    pub fn beside(run_dir: &Path) -> ShrinkerIds {
        ShrinkerIds { root: run_dir.parent().unwrap_or(run_dir).to_owned() }
    }

    fn record_path(&self) -> PathBuf {
        self.root.join("shrinker-ids.json")
    }

    /// The record, if it is of this boot (an unreadable one counts as none).
    pub fn this_boot(&self) -> Option<ShrinkerIdsRecord> {
        let record: ShrinkerIdsRecord =
            serde_json::from_str(&read_capped(&self.record_path()).ok()?).ok()?;
        (record.boot_id == boot_id().ok()?).then_some(record)
    }

    /// Makes the largest shrinker id of this boot at least `ids` above the ids in use, unless
    /// this boot's record already has as many. Blocks for the time it takes (about a second
    /// for 50,000); the node calls it from a thread of its own.
    pub fn reserve(&self, ids: u64) -> Result<Reserved, ShrinkerIdsError> {
        let lock_path = self.root.join("shrinker-ids.lock");
        let _lock =
            crate::host::host_files::lock_exclusive(&lock_path).map_err(io("lock", &lock_path))?;
        if let Some(done) = self.this_boot().filter(|r| r.ids >= ids) {
            return Ok(Reserved::Already { ids: done.ids });
        }
        let boot_id = boot_id()?;
        let scratch = self.root.join("shrinker-ids");
        std::fs::create_dir_all(&scratch).map_err(io("create", &scratch))?;
        let began = Instant::now();
        let holder = scratch.clone();
        std::thread::Builder::new()
            .name("brig-shrinker-ids".into())
            .spawn(move || hold_superblocks(&holder, ids))
            .map_err(io("start a thread for", &scratch))?
            .join()
            .map_err(|_| ShrinkerIdsError::Panicked)??;
        let took = began.elapsed();
        let record = ShrinkerIdsRecord { boot_id, ids };
        let path = self.record_path();
        let text = serde_json::to_string(&record).unwrap_or_default();
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(io("write", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("write", &path))?;
        Ok(Reserved::Now { ids, took })
    }
}

/// On the calling thread, which must be one of its own that ends after: moves it into a
/// private mount namespace and mounts `ids` empty ramfs instances there, each on a directory of
/// a scratch tmpfs on `scratch`. They go when the thread ends.
fn hold_superblocks(scratch: &Path, ids: u64) -> Result<(), ShrinkerIdsError> {
    let kernel = |what| move |source| ShrinkerIdsError::Kernel { what, source };
    unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS)
        .map_err(kernel("enter a mount namespace of its own"))?;
    let rec_private = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
    mount(None::<&str>, "/", None::<&str>, rec_private, None::<&str>)
        .map_err(kernel("make the mount namespace private"))?;
    let quiet = MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID;
    mount(Some("brig-shrinker-ids"), scratch, Some("tmpfs"), quiet, Some("mode=0700,size=64k"))
        .map_err(kernel("mount the scratch tmpfs"))?;
    let mut dir = scratch.to_path_buf();
    for done in 0..ids {
        dir.push(done.to_string());
        std::fs::create_dir(&dir).map_err(io("create", &dir))?;
        mount(Some("brig-shrinker-id"), &dir, Some("ramfs"), quiet, None::<&str>)
            .map_err(|source| ShrinkerIdsError::Mount { done, ids, source })?;
        dir.pop();
    }
    Ok(())
}

fn read_capped(path: &Path) -> Result<String, ShrinkerIdsError> {
    crate::host::host_files::read_capped(path, READ_CAP).map_err(io("read", path))
}

fn boot_id() -> Result<String, ShrinkerIdsError> {
    Ok(read_capped(Path::new(BOOT_ID))?.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mounting needs root; without it the tests say so and pass.
    fn can_mount() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            eprintln!("skipped: needs root to mount");
        }
        root
    }

    fn mounts() -> usize {
        std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo").lines().count()
    }

    #[test]
    fn reserving_holds_superblocks_out_of_sight_once_per_boot() {
        if !can_mount() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let ids = ShrinkerIds::beside(&dir.path().join("run"));
        let before = mounts();
        let first = ids.reserve(200).expect("reserve");
        assert!(matches!(first, Reserved::Now { ids: 200, .. }), "{first:?}");
        // The host's namespace never had them, and the scratch directory is empty in it.
        assert_eq!(mounts(), before);
        let scratch = dir.path().join("shrinker-ids");
        assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 0);
        let record = ids.this_boot().expect("record of this boot");
        assert_eq!((record.ids, record.boot_id), (200, boot_id().expect("boot id")));
        // Again for as many or fewer: nothing to do; for more: done again.
        assert_eq!(ids.reserve(200).expect("again"), Reserved::Already { ids: 200 });
        assert_eq!(ids.reserve(50).expect("fewer"), Reserved::Already { ids: 200 });
        assert!(matches!(ids.reserve(300).expect("more"), Reserved::Now { ids: 300, .. }));
        // A record of another boot, or garbage, is none.
        let path = dir.path().join("shrinker-ids.json");
        std::fs::write(&path, r#"{"boot_id":"another","ids":1000}"#).expect("old record");
        assert_eq!(ids.this_boot(), None);
        std::fs::write(&path, "not json").expect("garbage");
        assert_eq!(ids.this_boot(), None);
        assert!(matches!(ids.reserve(100).expect("after garbage"), Reserved::Now { .. }));
    }

    #[test]
    fn a_mount_the_kernel_refuses_is_a_typed_error() {
        if !can_mount() {
            return;
        }
        // A scratch path that does not exist: the scratch mount fails, in the thread's own
        // namespace, and nothing is recorded.
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing");
        let err =
            std::thread::spawn(move || hold_superblocks(&missing, 10)).join().expect("thread");
        assert!(matches!(err, Err(ShrinkerIdsError::Kernel { .. })), "{err:?}");
    }
}
