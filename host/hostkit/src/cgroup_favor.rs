//! The cgroup2 `favordynmods` flag: cgroup migrations that never wait for an RCU grace period.
//!
//! Every exec moves its process into the exec's cgroups (a write to `cgroup.procs`). A
//! migration takes the kernel's `cgroup_threadgroup_rwsem` for writing, and that lock, unless
//! it is kept in its slow mode, waits for an RCU grace period whenever it has been idle for one.
//! At 10,000 containers a traced exec's child waited 143 ms there, blocked right after it
//! started and woken by the RCU grace-period thread (`docs/density.md`). With `favordynmods`
//! on the cgroup2 hierarchy the lock stays in its slow mode: migrations never wait for a grace
//! period, and forks and exits take a read lock instead of a per-CPU counter. The flag is
//! host-wide (one lock for every hierarchy, v1 ones too) and only a cgroup2 mount can be
//! remounted with it, so it is set on the host's cgroup2 mount (`/sys/fs/cgroup` or, on a
//! hybrid host, `/sys/fs/cgroup/unified`).

use std::path::{Path, PathBuf};

use crate::cgroup::CgroupError;

const FEATURES: &str = "/sys/kernel/cgroup/features";
const OPTION: &str = "favordynmods";

/// The cgroup2 mount `favordynmods` was set on, with the options it had, to put back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FavoredMount {
    pub mount_point: PathBuf,
    pub options: String,
}

/// A cgroup2 mount in `/proc/self/mountinfo`: its mount point and super options.
fn cgroup2_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split_whitespace();
        if fs.next()? != "cgroup2" {
            return None;
        }
        let options = fs.nth(1).unwrap_or("").to_string();
        let point = mount.split_whitespace().nth(4)?;
        Some((PathBuf::from(point.replace("\\040", " ")), options))
    })
}

/// The file system's own super options, to remount with (`rw`/`ro` are the mount's).
fn without_rw(options: &str) -> String {
    options
        .split(',')
        .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
        .collect::<Vec<_>>()
        .join(",")
}

/// [`without_rw`], and the flag.
fn with_flag(options: &str) -> String {
    let own = without_rw(options);
    if own.is_empty() {
        OPTION.to_string()
    } else {
        format!("{own},{OPTION}")
    }
}

/// Sets `favordynmods` on the host's cgroup2 mount. `None` when there is nothing to do or
/// undo: the kernel lacks the flag, no cgroup2 hierarchy is mounted, or it is set already.
pub fn favor_dynamic_modifications() -> Result<Option<FavoredMount>, CgroupError> {
    let features = std::fs::read_to_string(FEATURES).unwrap_or_default();
    if !features.split_whitespace().any(|f| f == OPTION) {
        return Ok(None);
    }
    let info = Path::new("/proc/self/mountinfo");
    let mountinfo = std::fs::read_to_string(info).map_err(|source| CgroupError::Io {
        what: "read",
        path: info.into(),
        source,
    })?;
    let Some((mount_point, options)) = cgroup2_mount(&mountinfo) else { return Ok(None) };
    if options.split(',').any(|o| o == OPTION) {
        return Ok(None);
    }
    remount(&mount_point, &with_flag(&options))?;
    Ok(Some(FavoredMount { mount_point, options }))
}

/// Puts the mount's options back as [`favor_dynamic_modifications`] found them.
pub fn restore(favored: &FavoredMount) {
    if let Err(e) = remount(&favored.mount_point, &without_rw(&favored.options)) {
        tracing::warn!(error = %e, "cannot clear favordynmods on the cgroup2 mount");
    }
}

fn remount(point: &Path, data: &str) -> Result<(), CgroupError> {
    use nix::mount::{mount, MsFlags};
    mount(None::<&str>, point, None::<&str>, MsFlags::MS_REMOUNT, Some(data))
        .map_err(|e| CgroupError::Io { what: "remount", path: point.to_owned(), source: e.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn the_cgroup2_mount_and_its_own_options_are_found_and_kept() {
        let (point, options) = cgroup2_mount(HYBRID).expect("cgroup2");
        assert_eq!(point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(options, "rw,nsdelegate");
        assert_eq!(with_flag(&options), "nsdelegate,favordynmods");
        assert_eq!(without_rw(&options), "nsdelegate");
        assert_eq!(with_flag("rw"), "favordynmods");
        assert!(
            cgroup2_mount("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu").is_none()
        );
    }
}
