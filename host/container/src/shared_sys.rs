//! One read-only sysfs for all of a node's containers.
//!
//! A sysfs shows the network namespace of whoever mounted it, so each container used to mount
//! its own: a superblock per container. The kernel keeps a per-memory-cgroup array with a slot
//! per superblock shrinker, so that cost grows with containers × superblocks (10 GiB of
//! kmalloc-1k at 10,000 containers), and each sysfs mount also walks every other sysfs
//! superblock. Instead the node mounts one sysfs from a network namespace of its own that
//! holds only a loopback device, and containers bind it read-only: they see the machine's
//! devices and CPUs, and in `/sys/class/net` only `lo`.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

#[derive(Debug, thiserror::Error)]
pub enum SharedSysError {
    #[error("cannot create {0}")]
    Create(PathBuf, #[source] std::io::Error),
    #[error("cannot enter a new network namespace")]
    Unshare(#[source] nix::Error),
    #[error("cannot mount sysfs at {0}")]
    Mount(PathBuf, #[source] nix::Error),
    #[error("the mounting thread failed")]
    Thread,
}

/// The shared sysfs and the network namespace it shows (held open, so its `lo` stays).
pub struct SharedSys {
    pub path: PathBuf,
    _netns: OwnedFd,
}

/// Mounts the shared sysfs at `at`. One an earlier run left there is detached first
/// (containers still using it keep it); its namespace went with that run.
pub fn mount_at(at: &Path) -> Result<SharedSys, SharedSysError> {
    std::fs::create_dir_all(at).map_err(|e| SharedSysError::Create(at.to_owned(), e))?;
    unmount(at);
    let target = at.to_owned();
    // A network namespace is per thread: enter a fresh one on a thread of its own, which ends
    // right after. The mount lands in the node's mount namespace, which threads share.
    let netns = std::thread::spawn(move || -> Result<OwnedFd, SharedSysError> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(SharedSysError::Unshare)?;
        let netns = std::fs::File::open("/proc/thread-self/ns/net")
            .map_err(|e| SharedSysError::Create(PathBuf::from("/proc/thread-self/ns/net"), e))?;
        let flags =
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("sysfs"), &target, Some("sysfs"), flags, None::<&str>)
            .map_err(|e| SharedSysError::Mount(target.clone(), e))?;
        // Its own peer group would carry the containers' mounts back: keep it private.
        mount(None::<&str>, &target, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>)
            .map_err(|e| SharedSysError::Mount(target.clone(), e))?;
        Ok(netns.into())
    })
    .join()
    .map_err(|_| SharedSysError::Thread)??;
    Ok(SharedSys { path: at.to_owned(), _netns: netns })
}

/// Detaches the shared sysfs (containers that outlive the node keep their bind).
pub fn unmount(at: &Path) {
    while is_sysfs(at) {
        if umount2(at, MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
}

fn is_sysfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC)
}
