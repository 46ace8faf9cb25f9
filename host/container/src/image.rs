//! Building read-only layer images (EROFS) from a directory, a tarball, busybox or debootstrap.
//!
//! File ownership is shifted by the runtime's id base as the image is built (uid 0 becomes
//! 100000, …), so container root — host uid 100000 in its user namespace — owns what root
//! owned, with no idmapped mounts needed. Images are plain `mkfs.erofs` output, uncompressed so
//! reads are served straight from the page cache that all containers share.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
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

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ImageError + 'a {
    move |source| ImageError::Io { what, path: path.to_owned(), source }
}

fn run(tool: &'static str, command: &mut Command) -> Result<(), ImageError> {
    let out = command.output().map_err(|source| ImageError::Missing { tool, source })?;
    if !out.status.success() {
        let mut detail = String::from_utf8_lossy(&out.stderr).into_owned();
        detail.truncate(2000);
        return Err(ImageError::Tool {
            tool,
            detail: format!("{}: {}", out.status, detail.trim()),
        });
    }
    Ok(())
}

/// A scratch directory next to the output, removed on drop.
struct Staging(PathBuf);

impl Staging {
    fn next_to(out: &Path) -> Result<Staging, ImageError> {
        let parent = out.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        let dir = parent.join(format!(".staging-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir(&dir).map_err(io("create", &dir))?;
        Ok(Staging(dir))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Adds `base` to the owner and group of everything under `root`, keeping setuid/setgid bits
/// (chown clears them).
pub fn shift_ownership(root: &Path, base: u32) -> Result<(), ImageError> {
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

/// `mkfs.erofs` of `dir` into `out`, atomically.
fn mkfs(dir: &Path, out: &Path) -> Result<(), ImageError> {
    let tmp = out.with_extension("erofs.tmp");
    run("mkfs.erofs", Command::new("mkfs.erofs").arg("--quiet").arg(&tmp).arg(dir))?;
    std::fs::rename(&tmp, out).map_err(io("rename", out))
}

/// Builds a layer image from a directory tree (copied; the source is left as it is).
pub fn from_dir(src: &Path, out: &Path, base: u32) -> Result<(), ImageError> {
    let staging = Staging::next_to(out)?;
    run("cp", Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(&staging.0))?;
    shift_ownership(&staging.0, base)?;
    mkfs(&staging.0, out)
}

/// Builds a layer image from a tarball (plain or compressed, as tar detects).
pub fn from_tar(tar: &Path, out: &Path, base: u32) -> Result<(), ImageError> {
    let staging = Staging::next_to(out)?;
    run(
        "tar",
        Command::new("tar")
            .arg("-x")
            .arg("-p")
            .arg("--numeric-owner")
            .arg("-f")
            .arg(tar)
            .arg("-C")
            .arg(&staging.0),
    )?;
    shift_ownership(&staging.0, base)?;
    mkfs(&staging.0, out)
}

/// A tiny base: static busybox with its applets, /etc/passwd and the usual directories.
pub fn busybox(out: &Path, base: u32) -> Result<(), ImageError> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or_else(|| ImageError::Missing {
        tool: "busybox",
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "install busybox-static"),
    })?;
    let staging = Staging::next_to(out)?;
    let root = &staging.0;
    for d in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "etc",
        "root",
        "home",
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
        .map_err(|source| ImageError::Missing { tool: "busybox", source })?;
    for applet in
        String::from_utf8_lossy(&list.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox")
    {
        let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        .map_err(io("write", &root.join("etc/passwd")))?;
    std::fs::write(root.join("etc/group"), "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n")
        .map_err(io("write", &root.join("etc/group")))?;
    std::fs::create_dir_all(root.join("home/agent")).map_err(io("create", root))?;
    std::os::unix::fs::chown(root.join("home/agent"), Some(1000), Some(1000))
        .map_err(io("chown", root))?;
    use std::os::unix::fs::PermissionsExt;
    for t in ["tmp", "var/tmp"] {
        std::fs::set_permissions(root.join(t), std::fs::Permissions::from_mode(0o1777))
            .map_err(io("chmod", root))?;
    }
    shift_ownership(root, base)?;
    mkfs(root, out)
}

/// A Debian base by debootstrap (minbase plus `packages`), without apt caches.
pub fn debian(
    out: &Path,
    base: u32,
    suite: &str,
    mirror: &str,
    packages: &[&str],
) -> Result<(), ImageError> {
    let staging = Staging::next_to(out)?;
    let root = staging.0.join("root");
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase");
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(suite).arg(&root).arg(mirror);
    run("debootstrap", &mut cmd)?;
    for cache in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let dir = root.join(cache);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.path().is_file() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    std::fs::create_dir_all(root.join("workspace")).map_err(io("create", &root))?;
    shift_ownership(&root, base)?;
    mkfs(&root, out)
}
