//! The directory that holds each container's run directory (`<run>/c`), on a tmpfs of the
//! node's own.
//!
//! Every create makes three directories there (the container's, its rootfs mount point and
//! its upper mount point) and every destroy removes them. Where `/run` is a disk file system
//! (ext4 on some hosts), each `mkdir` allocates an on-disk inode and journals it: at 8,000 live
//! containers that was 3.9% of all CPU during a fill (`__ext4_new_inode`). On a tmpfs it is
//! a memory allocation. One tmpfs per node is one superblock, whatever the number of
//! containers.

use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statfs::{statfs, TMPFS_MAGIC};

/// Puts `dir` on a tmpfs unless it is on one already (a tmpfs `/run`, or the mount an earlier
/// run of the node made and left for the containers that outlived it). A non-empty `dir` on
/// another file system is left as it is: it holds containers of a build from before this
/// mount, which re-attach through their paths there.
pub fn mount_tmpfs(dir: &Path) -> Result<(), std::io::Error> {
    if statfs(dir).map_err(std::io::Error::from)?.filesystem_type() == TMPFS_MAGIC {
        return Ok(());
    }
    if std::fs::read_dir(dir)?.next().is_some() {
        tracing::info!(dir = %dir.display(), "container directories stay where earlier runs made them");
        return Ok(());
    }
    // Only directories and sockets live here: no blocks, an inode each.
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("brig-containers"), dir, Some("tmpfs"), flags, Some("mode=0711,size=16m"))
        .map_err(std::io::Error::from)?;
    // A shared parent would carry every container's mounts to its peers: keep it private.
    mount(None::<&str>, dir, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(std::io::Error::from)?;
    Ok(())
}

/// Unmounts the tmpfs [`mount_tmpfs`] made at `dir`, once no container is left in it.
pub fn unmount_if_empty(dir: &Path) {
    let empty = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if empty && is_own_mount(dir) {
        if let Err(e) = umount2(dir, MntFlags::empty()) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot unmount the container directory");
        }
    }
}

/// Whether `dir` is a tmpfs mounted on its parent (not a directory of a tmpfs `/run`).
fn is_own_mount(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let is_tmpfs = statfs(dir).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC);
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    is_tmpfs && dir.parent().is_some_and(|parent| dev(parent) != dev(dir))
}
