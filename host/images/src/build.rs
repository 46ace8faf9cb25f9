//! Staging directory trees for layers (from a directory, a tarball, busybox or debootstrap) and
//! turning them into EROFS images with `mkfs.erofs`.
//!
//! File ownership is shifted by the runtime's id base as a layer is staged (uid 0 becomes
//! 100000, …), so container root — host uid 100000 in its user namespace — owns what root
//! owned, with no idmapped mounts needed. Images are uncompressed, so reads are served straight
//! from the page cache that all containers share.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{tool} failed: {detail}")]
    Tool { tool: &'static str, detail: String },
    #[error("cannot run {tool} (is it installed?)")]
    Missing {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> BuildError + 'a {
    move |source| BuildError::Io { what, path: path.to_owned(), source }
}

pub(crate) fn run(tool: &'static str, command: &mut Command) -> Result<(), BuildError> {
    let out = command.output().map_err(|source| BuildError::Missing { tool, source })?;
    if !out.status.success() {
        let mut detail = String::from_utf8_lossy(&out.stderr).into_owned();
        detail.truncate(2000);
        return Err(BuildError::Tool {
            tool,
            detail: format!("{}: {}", out.status, detail.trim()),
        });
    }
    Ok(())
}

/// A scratch directory, removed on drop.
#[derive(Debug)]
pub struct Staging(PathBuf);

impl Staging {
    /// A fresh directory inside `parent`.
    pub fn new_in(parent: &Path) -> Result<Staging, BuildError> {
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        let dir =
            parent.join(format!(".staging-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir(&dir).map_err(io("create", &dir))?;
        Ok(Staging(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the staging directories under `parent` whose process is gone (a build, import or
/// checkpoint cut short by a crash); returns how many. Directories of live processes (another
/// tool building into the same store) are left alone.
pub fn sweep_staging(parent: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(parent) else { return 0 };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(".staging-")) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if alive && pid != Some(std::process::id()) {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove staging"),
        }
    }
    if removed > 0 {
        tracing::info!(removed, dir = %parent.display(), "removed staging a crash left behind");
    }
    removed
}

/// Adds `base` to the owner and group of everything under `root` that is below it, keeping
/// setuid/setgid bits (chown clears them).
pub fn shift_ownership(root: &Path, base: u32) -> Result<(), BuildError> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        let (uid, gid) = (meta.uid(), meta.gid());
        if uid < base || gid < base {
            let new = |id: u32| if id < base { id + base } else { id };
            std::os::unix::fs::lchown(&path, Some(new(uid)), Some(new(gid)))
                .map_err(io("chown", &path))?;
            if !meta.file_type().is_symlink() && meta.mode() & 0o6000 != 0 {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(
                    &path,
                    std::fs::Permissions::from_mode(meta.mode() & 0o7777),
                )
                .map_err(io("chmod", &path))?;
            }
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(io("read", &path))? {
                stack.push(entry.map_err(io("read", &path))?.path());
            }
        }
    }
    Ok(())
}

/// Copies a directory tree (ownership, modes, links, xattrs kept) into `dest`.
pub fn stage_dir(src: &Path, dest: &Path) -> Result<(), BuildError> {
    run("cp", Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(dest))
}

/// Unpacks a tarball (plain or compressed, as tar detects) into `dest`.
pub fn stage_tar(tar: &Path, dest: &Path) -> Result<(), BuildError> {
    run(
        "tar",
        Command::new("tar")
            .arg("-x")
            .arg("-p")
            .arg("--numeric-owner")
            .arg("--xattrs")
            .arg("-f")
            .arg(tar)
            .arg("-C")
            .arg(dest),
    )
}

/// A tiny base: static busybox with its applets, /etc/passwd and the usual directories.
pub fn stage_busybox(root: &Path) -> Result<(), BuildError> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or_else(|| BuildError::Missing {
        tool: "busybox",
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "install busybox-static"),
    })?;
    for d in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "etc",
        "root",
        "home/agent",
        "tmp",
        "var/tmp",
        "proc",
        "sys",
        "dev",
        "workspace",
    ] {
        std::fs::create_dir_all(root.join(d)).map_err(io("create", &root.join(d)))?;
    }
    std::fs::copy(busybox, root.join("bin/busybox")).map_err(io("copy", busybox))?;
    let list = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|source| BuildError::Missing { tool: "busybox", source })?;
    for applet in
        String::from_utf8_lossy(&list.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox")
    {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
    }
    let passwd = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n";
    std::fs::write(root.join("etc/passwd"), passwd)
        .map_err(io("write", &root.join("etc/passwd")))?;
    std::fs::write(root.join("etc/group"), "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n")
        .map_err(io("write", &root.join("etc/group")))?;
    std::os::unix::fs::chown(root.join("home/agent"), Some(1000), Some(1000))
        .map_err(io("chown", root))?;
    use std::os::unix::fs::PermissionsExt;
    for t in ["tmp", "var/tmp"] {
        std::fs::set_permissions(root.join(t), std::fs::Permissions::from_mode(0o1777))
            .map_err(io("chmod", root))?;
    }
    Ok(())
}

/// A Debian base by debootstrap (minbase plus `packages`), without apt caches.
pub fn stage_debian(
    root: &Path,
    suite: &str,
    mirror: &str,
    packages: &[&str],
) -> Result<(), BuildError> {
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase");
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(suite).arg(root).arg(mirror);
    run("debootstrap", &mut cmd)?;
    for cache in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        if let Ok(entries) = std::fs::read_dir(root.join(cache)) {
            for e in entries.flatten().filter(|e| e.path().is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    std::fs::create_dir_all(root.join("workspace")).map_err(io("create", root))
}

/// Adds an ordinary user (uid 1000, home `/home/NAME`, bash) to a staged Debian tree; where
/// the tree has sudo, the user may use it without a password (as E2B's base template's).
pub fn add_user(root: &Path, name: &str) -> Result<(), BuildError> {
    let mut cmd = Command::new("chroot");
    cmd.arg(root).args(["useradd", "-m", "-u", "1000", "-s", "/bin/bash", name]);
    run("chroot", &mut cmd)?;
    let sudoers = root.join("etc/sudoers.d");
    if sudoers.is_dir() {
        use std::os::unix::fs::PermissionsExt;
        let file = sudoers.join(name);
        std::fs::write(&file, format!("{name} ALL=(ALL:ALL) NOPASSWD: ALL\n"))
            .map_err(io("write", &file))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440))
            .map_err(io("chmod", &file))?;
    }
    Ok(())
}

/// A self-contained EROFS image of `dir` at `out`, written atomically.
pub fn mkfs_plain(dir: &Path, out: &Path) -> Result<(), BuildError> {
    let tmp = out.with_extension("erofs.tmp");
    run("mkfs.erofs", Command::new("mkfs.erofs").arg("--quiet").arg(&tmp).arg(dir))?;
    std::fs::rename(&tmp, out).map_err(io("rename", out))
}

/// An EROFS image of `dir` split in two: metadata in `meta`, file data in `blob`, chunked at
/// `chunk_bytes` (see [`crate::erofs`]).
pub fn mkfs_chunked(
    dir: &Path,
    meta: &Path,
    blob: &Path,
    chunk_bytes: u64,
) -> Result<(), BuildError> {
    run(
        "mkfs.erofs",
        Command::new("mkfs.erofs")
            .arg("--quiet")
            .arg(format!("--chunksize={chunk_bytes}"))
            .arg(format!("--blobdev={}", blob.display()))
            .arg(meta)
            .arg(dir),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_of_dead_processes_is_swept_and_live_ones_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dead = dir.path().join(".staging-999999999-0000abcd");
        std::fs::create_dir_all(dead.join("root/x")).expect("dead");
        // pid 1 is always alive and never ours.
        let live = dir.path().join(".staging-1-0000abcd");
        std::fs::create_dir(&live).expect("live");
        let other = dir.path().join("keep");
        std::fs::create_dir(&other).expect("other");
        assert_eq!(sweep_staging(dir.path()), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
    }
}
