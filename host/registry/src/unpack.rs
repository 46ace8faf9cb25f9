//! One OCI layer (a tar, gzip- or zstd-compressed or plain) unpacked into a directory that an
//! overlay mount can use as a lower layer on its own: OCI whiteouts become overlay whiteouts.
//!
//! ```text
//! dir/.wh.NAME         → dir/NAME, a character device 0:0 (hides NAME of the layers below)
//! dir/.wh..wh..opq     → dir with trusted.overlay.opaque = "y" (hides all of dir below)
//! /.wh..wh..opq        → the layer hides everything below it (`Unpacked::hides_below`): overlay
//!                        ignores an opaque root, so the image starts at this layer instead
//! ```
//! The uncompressed bytes are hashed on the way (the layer's diff digest, checked against the
//! image config) and counted against a cap, so a compression bomb stops at the cap. Paths with
//! `..` or a leading `/`, and hard links to them, are refused; nothing is written through a
//! symlink (the tar crate checks every parent). Devices and FIFOs are made with `mknod`, owners,
//! modes (setuid too), times and xattrs kept.

use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// Most entries (files, directories, links) one layer may have.
pub const MAX_LAYER_ENTRIES: u64 = 1_000_000;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// How a layer blob is compressed (from its media type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression of a layer media type (OCI or Docker v2); `None` for one that is no
    /// layer Brig can unpack.
    pub fn of_media_type(media_type: &str) -> Option<Compression> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => {
                Some(Compression::Gzip)
            }
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => {
                Some(Compression::Zstd)
            }
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer {layer}: {path:?} leaves the layer's root (`..` or an absolute path)")]
    PathEscape { layer: String, path: String },
    #[error("layer {layer}: it unpacks to more than {cap} bytes, the most a layer may")]
    TooLarge { layer: String, cap: u64 },
    #[error("layer {layer}: it has more than {cap} entries, the most a layer may")]
    TooManyEntries { layer: String, cap: u64 },
    #[error("layer {layer}: unpacked, it is {actual}, but the image says {expected}")]
    DiffDigest { layer: String, expected: String, actual: String },
    #[error("layer {layer}: {what}")]
    Io {
        layer: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// What unpacking a layer found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// `sha256:<hex>` of the uncompressed tar.
    pub diff_id: String,
    pub bytes: u64,
    pub entries: u64,
    /// The layer makes its root opaque: nothing below it shows.
    pub hides_below: bool,
}

/// Counts and hashes what passes through, and fails past `cap` bytes.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
    cap: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.cap {
            return Err(std::io::Error::other(CapReached));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the unpacked-bytes cap is reached")]
struct CapReached;

/// Unpacks the layer blob at `blob` (compressed as `compression`) into `dest` (an empty
/// directory), at most `cap` uncompressed bytes; `layer` names it in errors.
pub fn unpack_layer(
    blob: &Path,
    compression: Compression,
    dest: &Path,
    cap: u64,
    layer: &str,
) -> Result<Unpacked, UnpackError> {
    let io = |what: &str| {
        let (layer, what) = (layer.to_string(), what.to_string());
        move |source: std::io::Error| UnpackError::Io { layer, what, source }
    };
    let file = std::fs::File::open(blob).map_err(io("open the downloaded blob"))?;
    let file = std::io::BufReader::with_capacity(1 << 20, file);
    let decoder: Box<dyn Read> = match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        Compression::Zstd => Box::new(zstd::Decoder::with_buffer(file).map_err(io("zstd"))?),
    };
    let mut hashing = Hashing { inner: decoder, hasher: Sha256::new(), bytes: 0, cap };
    let result = unpack_entries(&mut hashing, dest, layer, MAX_LAYER_ENTRIES);
    // However deep the tar crate wrapped it, a failure past the cap is the cap's.
    let too_large = || UnpackError::TooLarge { layer: layer.to_string(), cap };
    let (entries, hides_below) = match result {
        Ok(found) => found,
        Err(_) if hashing.bytes > cap => return Err(too_large()),
        Err(e) => return Err(e),
    };
    // The tar's end-of-archive blocks are not read by the iterator; the digest covers them.
    let rest = std::io::copy(&mut hashing, &mut std::io::sink());
    match rest {
        Ok(_) => {}
        Err(_) if hashing.bytes > cap => return Err(too_large()),
        Err(e) => return Err(io("read the rest of the layer")(e)),
    }
    let diff_id = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
    Ok(Unpacked { diff_id, bytes: hashing.bytes, entries, hides_below })
}

/// The entry's path inside the layer, or why it is refused.
fn inside(path: &Path, layer: &str) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::Normal(p) => out.push(p),
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(UnpackError::PathEscape {
                    layer: layer.to_string(),
                    path: path.display().to_string(),
                })
            }
        }
    }
    Ok(out)
}

fn unpack_entries(
    reader: &mut dyn Read,
    dest: &Path,
    layer: &str,
    max_entries: u64,
) -> Result<(u64, bool), UnpackError> {
    let io = |what: String| {
        let layer = layer.to_string();
        move |source: std::io::Error| UnpackError::Io { layer, what, source }
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    let (mut count, mut hides_below) = (0u64, false);
    for entry in archive.entries().map_err(io("read the layer".into()))? {
        let mut entry = entry.map_err(io("read an entry".into()))?;
        count += 1;
        if count > max_entries {
            let layer = layer.to_string();
            return Err(UnpackError::TooManyEntries { layer, cap: max_entries });
        }
        let raw = entry.path().map_err(io("an entry's path".into()))?.into_owned();
        let rel = inside(&raw, layer)?;
        if let Some(link) = entry.link_name().map_err(io("a link's target".into()))? {
            if entry.header().entry_type().is_hard_link() {
                inside(&link, layer)?;
            }
        }
        let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let parent = rel.parent().map(Path::to_path_buf).unwrap_or_default();
        if name == OPAQUE {
            if parent.as_os_str().is_empty() {
                hides_below = true;
                continue;
            }
            let dir = dest.join(&parent);
            std::fs::create_dir_all(&dir).map_err(io(format!("make {}", parent.display())))?;
            xattr_set(&dir, "trusted.overlay.opaque", b"y")
                .map_err(io(format!("mark {} opaque", parent.display())))?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let target = dest.join(&parent).join(hidden);
            // A whiteout hides what is below, never what this layer itself has.
            if std::fs::symlink_metadata(&target).is_err() {
                std::fs::create_dir_all(dest.join(&parent))
                    .map_err(io(format!("make {}", parent.display())))?;
                mknod(&target, libc::S_IFCHR, 0)
                    .map_err(io(format!("whiteout {}", rel.display())))?;
            }
            continue;
        }
        let target = dest.join(&rel);
        remove_whiteout(&target);
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            let header = entry.header();
            let mode = header.mode().map_err(io(format!("{} mode", rel.display())))?;
            let dev = |n: std::io::Result<Option<u32>>| n.ok().flatten().unwrap_or(0);
            let rdev = libc::makedev(dev(header.device_major()), dev(header.device_minor()));
            let file_type = if kind.is_character_special() {
                libc::S_IFCHR
            } else if kind.is_block_special() {
                libc::S_IFBLK
            } else {
                libc::S_IFIFO
            };
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir).map_err(io(format!("make {}", dir.display())))?;
            }
            let _ = std::fs::remove_file(&target);
            mknod(&target, file_type | (mode & 0o7777), rdev)
                .map_err(io(format!("make {}", rel.display())))?;
            let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
            let owner = (u32::try_from(uid).ok(), u32::try_from(gid).ok());
            std::os::unix::fs::lchown(&target, owner.0, owner.1)
                .map_err(io(format!("own {}", rel.display())))?;
            continue;
        }
        entry.unpack_in(dest).map_err(io(format!("unpack {}", rel.display())))?;
    }
    Ok((count, hides_below))
}

/// Removes an overlay whiteout this layer made at `path` earlier (a later entry of the same
/// layer puts something there).
fn remove_whiteout(path: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return };
    if meta.file_type().is_char_device() && std::os::unix::fs::MetadataExt::rdev(&meta) == 0 {
        let _ = std::fs::remove_file(path);
    }
}

fn mknod(path: &Path, mode: libc::mode_t, rdev: libc::dev_t) -> std::io::Result<()> {
    let kind = nix::sys::stat::SFlag::from_bits_truncate(mode & libc::S_IFMT);
    let perm = nix::sys::stat::Mode::from_bits_truncate(mode & 0o7777);
    nix::sys::stat::mknod(path, kind, perm, rdev).map_err(std::io::Error::from)
}

fn xattr_set(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let name = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    #[allow(unsafe_code)]
    // SAFETY: both are NUL-terminated strings that outlive the call; `value` is a live slice
    // of `value.len()` bytes.
    let rc = unsafe {
        libc::lsetxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    /// A layer tar built entry by entry.
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Self {
            Layer(tar::Builder::new(Vec::new()))
        }

        fn entry(&mut self, path: &str, kind: tar::EntryType, mode: u32, data: &[u8]) -> &mut Self {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_uid(1000);
            h.set_gid(1000);
            h.set_size(data.len() as u64);
            h.set_mtime(1_700_000_000);
            // Paths are set raw, so tests can write what a hostile layer would.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            self.0.append(&h, data).expect("append");
            self
        }

        fn link(&mut self, path: &str, kind: tar::EntryType, target: &str) -> &mut Self {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(0o777);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(0);
            h.set_link_name(target).expect("link name");
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            self.0.append(&h, std::io::empty()).expect("append");
            self
        }

        fn write(&mut self, dir: &Path) -> PathBuf {
            let bytes = std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()))
                .into_inner()
                .expect("finish");
            let path = dir.join("layer.tar");
            std::fs::write(&path, bytes).expect("write");
            path
        }
    }

    fn unpack(layer: &mut Layer, cap: u64) -> (tempfile::TempDir, Result<Unpacked, UnpackError>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let blob = layer.write(dir.path());
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let result = unpack_layer(&blob, Compression::None, &root, cap, "test");
        (dir, result)
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts_and_files_keep_what_they_are() {
        let mut layer = Layer::new();
        layer
            .entry("etc/", tar::EntryType::Directory, 0o755, b"")
            .entry("etc/hosts", tar::EntryType::Regular, 0o644, b"127.0.0.1 x\n")
            .entry("etc/.wh.passwd", tar::EntryType::Regular, 0o644, b"")
            .entry("opt/.wh..wh..opq", tar::EntryType::Regular, 0o644, b"")
            .entry("opt/kept", tar::EntryType::Regular, 0o644, b"mine")
            .entry("bin/su", tar::EntryType::Regular, 0o4755, b"#!")
            .link("bin/su2", tar::EntryType::Link, "bin/su")
            .link("bin/sh", tar::EntryType::Symlink, "/bin/busybox")
            .entry("dev/null", tar::EntryType::Char, 0o666, b"");
        let (dir, result) = unpack(&mut layer, 1 << 20);
        let unpacked = result.expect("unpack");
        let root = dir.path().join("root");
        assert!(!unpacked.hides_below);
        assert_eq!(unpacked.entries, 9);
        let tar_bytes = std::fs::read(dir.path().join("layer.tar")).expect("tar");
        assert_eq!(unpacked.diff_id, format!("sha256:{}", hex::encode(Sha256::digest(&tar_bytes))));
        assert_eq!(unpacked.bytes, tar_bytes.len() as u64);

        let wh = std::fs::symlink_metadata(root.join("etc/passwd")).expect("whiteout");
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
        assert!(!root.join("etc/.wh.passwd").exists());
        let opaque = xattr::get(root.join("opt"), "trusted.overlay.opaque").expect("xattr");
        assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
        assert_eq!(std::fs::read(root.join("opt/kept")).expect("kept"), b"mine");
        let su = std::fs::metadata(root.join("bin/su")).expect("su");
        assert_eq!(su.permissions().mode() & 0o7777, 0o4755, "setuid kept");
        assert_eq!((su.uid(), su.gid()), (1000, 1000), "owner kept");
        assert_eq!(su.ino(), std::fs::metadata(root.join("bin/su2")).expect("su2").ino());
        assert_eq!(std::fs::read_link(root.join("bin/sh")).expect("sh"), Path::new("/bin/busybox"));
        let null = std::fs::symlink_metadata(root.join("dev/null")).expect("null");
        assert!(null.file_type().is_char_device());
    }

    #[test]
    fn an_opaque_root_hides_everything_below() {
        let mut layer = Layer::new();
        layer.entry(".wh..wh..opq", tar::EntryType::Regular, 0o644, b"").entry(
            "a",
            tar::EntryType::Regular,
            0o644,
            b"a",
        );
        let (_dir, result) = unpack(&mut layer, 1 << 20);
        assert!(result.expect("unpack").hides_below);
    }

    #[test]
    fn escapes_are_refused_with_their_path() {
        for (path, kind, link) in [
            ("../evil", tar::EntryType::Regular, None),
            ("/etc/evil", tar::EntryType::Regular, None),
            ("a/../../evil", tar::EntryType::Regular, None),
            ("ok", tar::EntryType::Link, Some("../../etc/shadow")),
        ] {
            let mut layer = Layer::new();
            match link {
                Some(target) => layer.link(path, kind, target),
                None => layer.entry(path, kind, 0o644, b"x"),
            };
            let (dir, result) = unpack(&mut layer, 1 << 20);
            assert!(matches!(result, Err(UnpackError::PathEscape { .. })), "{path}: {result:?}");
            assert!(!dir.path().join("evil").exists());
        }
        // Nothing is written through a symlink that leads out of the layer.
        let outside = tempfile::tempdir().expect("outside");
        let mut layer = Layer::new();
        let target = outside.path().display().to_string();
        layer.link("out", tar::EntryType::Symlink, &target).entry(
            "out/planted",
            tar::EntryType::Regular,
            0o644,
            b"x",
        );
        let (_dir, result) = unpack(&mut layer, 1 << 20);
        assert!(result.is_err(), "{result:?}");
        assert!(!outside.path().join("planted").exists(), "written through a symlink");
    }

    #[test]
    fn a_compression_bomb_stops_at_the_cap() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut layer = Layer::new();
        layer.entry("zeros", tar::EntryType::Regular, 0o644, &vec![0u8; 8 << 20]);
        let tar_path = layer.write(dir.path());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&std::fs::read(&tar_path).expect("tar")).expect("gzip");
        let blob = dir.path().join("layer.tar.gz");
        std::fs::write(&blob, gz.finish().expect("gzip")).expect("write");
        assert!(std::fs::metadata(&blob).expect("blob").len() < 64 << 10);
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let result = unpack_layer(&blob, Compression::Gzip, &root, 1 << 20, "bomb");
        assert!(matches!(result, Err(UnpackError::TooLarge { cap: 1048576, .. })), "{result:?}");
        let big = unpack_layer(&blob, Compression::Gzip, &root, 16 << 20, "fine").expect("fits");
        assert!(big.bytes > 8 << 20);
    }

    #[test]
    fn entries_past_the_cap_are_refused() {
        let mut layer = Layer::new();
        for i in 0..5 {
            layer.entry(&format!("f{i}"), tar::EntryType::Regular, 0o644, b"");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let blob = layer.write(dir.path());
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let mut file = std::fs::File::open(&blob).expect("blob");
        let result = unpack_entries(&mut file, &root, "many", 3);
        assert!(matches!(result, Err(UnpackError::TooManyEntries { cap: 3, .. })), "{result:?}");
        let mut file = std::fs::File::open(&blob).expect("blob");
        assert_eq!(unpack_entries(&mut file, &root, "many", 5).expect("fits").0, 5);
    }

    #[test]
    fn media_types_name_their_compression() {
        assert_eq!(
            Compression::of_media_type("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::of_media_type("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(Compression::of_media_type("application/vnd.oci.image.config.v1+json"), None);
    }
}
