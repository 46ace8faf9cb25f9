//! A build context: the directory a client uploaded (as a tar), read only through paths that
//! stay inside it. COPY sources resolve in it (a `*`/`?` pattern in the last component is
//! expanded), their contents hash into the step's cache key, and they are staged as a layer
//! tree whose parent directories carry the attributes the image already gives them.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::step::CopySpec;

#[derive(Debug, Error)]
pub enum ContextError {
    #[error("the build context has no {0}")]
    Missing(String),
    #[error("{0} leads out of the build context")]
    Escape(String),
    #[error("the build context is not a tar archive: {0}")]
    BadArchive(String),
    #[error("the build context {what} is over its cap of {cap}")]
    TooLarge { what: &'static str, cap: u64 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ContextError {
    let what = what.into();
    move |source| ContextError::Io { what, source }
}

/// Caps on an uploaded context.
#[derive(Debug, Clone, Copy)]
pub struct ContextCaps {
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// Mode and owner of a directory of the image (`None` for one it lacks).
pub type DirAttributes = Option<(u32, u32, u32)>;

/// An unpacked build context.
#[derive(Debug, Clone)]
pub struct Context {
    root: PathBuf,
}

impl Context {
    /// A context already on disk at `root`.
    pub fn at(root: &Path) -> Result<Context, ContextError> {
        let root = root.canonicalize().map_err(io(root.display().to_string()))?;
        Ok(Context { root })
    }

    /// Unpacks a tar of the context into the empty directory `dir`: regular files,
    /// directories, symlinks and hard links only, no path out of `dir`, within `caps`.
    pub fn unpack(tar: impl Read, dir: &Path, caps: ContextCaps) -> Result<Context, ContextError> {
        let mut archive = tar::Archive::new(tar);
        let (mut bytes, mut entries) = (0u64, 0u64);
        let bad = |e: std::io::Error| ContextError::BadArchive(e.to_string());
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            entries += 1;
            bytes += entry.header().size().map_err(bad)?;
            if entries > caps.max_entries {
                return Err(ContextError::TooLarge { what: "entry count", cap: caps.max_entries });
            }
            if bytes > caps.max_bytes {
                return Err(ContextError::TooLarge { what: "size", cap: caps.max_bytes });
            }
            use tar::EntryType as T;
            let kind = entry.header().entry_type();
            if !matches!(kind, T::Regular | T::Directory | T::Symlink | T::Link | T::Continuous) {
                continue;
            }
            let path = entry.path().map_err(bad)?.into_owned();
            if path.components().any(|c| matches!(c, Component::ParentDir | Component::RootDir)) {
                return Err(ContextError::Escape(path.display().to_string()));
            }
            entry.set_preserve_permissions(true);
            // `unpack_in` refuses (false) a path that would land outside `dir`.
            if !entry.unpack_in(dir).map_err(io(path.display().to_string()))? {
                return Err(ContextError::Escape(path.display().to_string()));
            }
        }
        Context::at(dir)
    }

    /// The context's paths `source` names, each checked to resolve inside the context (a
    /// path is returned as named: a link stays a link, copied as one).
    pub fn resolve(&self, source: &str) -> Result<Vec<PathBuf>, ContextError> {
        let relative = source.trim_start_matches('/');
        let relative = if relative.is_empty() { "." } else { relative };
        let path = Path::new(relative);
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(ContextError::Escape(source.into()));
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let candidates = if name.contains(['*', '?']) {
            let parent = self.root.join(path.parent().unwrap_or(Path::new("")));
            let real = self.inside(source, &parent)?;
            let mut found: Vec<PathBuf> = std::fs::read_dir(&real)
                .map_err(io(source))?
                .flatten()
                .filter(|e| e.file_name().to_str().is_some_and(|n| matches(name, n)))
                .map(|e| parent.join(e.file_name()))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(ContextError::Missing(source.into()));
            }
            found
        } else {
            vec![self.root.join(path)]
        };
        for candidate in &candidates {
            self.inside(source, candidate)?;
        }
        Ok(candidates)
    }

    /// `path` with its symlinks resolved, if that stays in the context.
    fn inside(&self, source: &str, path: &Path) -> Result<PathBuf, ContextError> {
        let real = match path.canonicalize() {
            Ok(real) => real,
            // A dangling link, or nothing there: out of the context if its target is.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(path).is_ok() {
                    return Err(ContextError::Escape(source.into()));
                }
                return Err(ContextError::Missing(source.into()));
            }
            Err(e) => return Err(io(source)(e)),
        };
        if !real.starts_with(&self.root) {
            return Err(ContextError::Escape(source.into()));
        }
        Ok(real)
    }

    /// A digest of what `spec` copies: each file's path under its source, kind, mode,
    /// contents or link target (owners are the step's, not the context's).
    pub fn hash(&self, spec: &CopySpec) -> Result<String, ContextError> {
        let mut hasher = Sha256::new();
        for source in &spec.sources {
            for path in self.resolve(source)? {
                hasher.update(source.as_bytes());
                hash_tree(&path, Path::new(""), &mut hasher)?;
            }
        }
        Ok(hex::encode(hasher.finalize()))
    }

    /// Stages what `spec` copies under `out` (a layer's root) at `dest` (absolute), as
    /// Docker's COPY lays it out: a directory's contents go into `dest`; a file goes to
    /// `dest` itself unless `dest` ends in `/` or several sources are copied. Directories
    /// above `dest` take `image_dir`'s attributes where the image has them (so a layer does
    /// not change them), root's 0755 elsewhere.
    pub fn stage(
        &self,
        spec: &CopySpec,
        dest: &str,
        out: &Path,
        image_dir: &dyn Fn(&str) -> DirAttributes,
    ) -> Result<u64, ContextError> {
        let mut paths = Vec::new();
        for source in &spec.sources {
            paths.extend(self.resolve(source)?);
        }
        let into_dir = dest.ends_with('/') || paths.len() > 1;
        let dest = dest.trim_end_matches('/');
        let owner = spec.chown.unwrap_or((0, 0));
        let mut copied = 0u64;
        for path in &paths {
            let meta = std::fs::metadata(path).map_err(io(path.display().to_string()))?;
            let target = if meta.is_dir() {
                dest.to_string()
            } else if into_dir {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
                format!("{dest}/{name}")
            } else {
                dest.to_string()
            };
            let parent = if meta.is_dir() { target.as_str() } else { parent_of(&target) };
            make_parents(out, parent, image_dir)?;
            let at = out.join(target.trim_start_matches('/'));
            if meta.is_dir() {
                copied += copy_tree(path, &at, spec, owner, image_dir(&target).is_some())?;
            } else {
                copied += copy_entry(path, &at, spec, owner)?;
            }
        }
        Ok(copied)
    }

    /// Makes `dir` (absolute) in the layer tree at `out`, with its parents as [`Context::stage`]
    /// makes them (a WORKDIR the image lacks).
    pub fn make_dir(
        out: &Path,
        dir: &str,
        image_dir: &dyn Fn(&str) -> DirAttributes,
    ) -> Result<(), ContextError> {
        make_parents(out, dir, image_dir)
    }
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// Makes `/`, every directory down to `dir` in `out`, each with the image's attributes or
/// root's 0755.
fn make_parents(
    out: &Path,
    dir: &str,
    image_dir: &dyn Fn(&str) -> DirAttributes,
) -> Result<(), ContextError> {
    let mut path = String::new();
    let parts = std::iter::once("").chain(dir.split('/').filter(|p| !p.is_empty() && *p != "."));
    for part in parts {
        if !part.is_empty() {
            path.push('/');
            path.push_str(part);
        }
        let shown = if path.is_empty() { "/" } else { path.as_str() };
        let at = out.join(path.trim_start_matches('/'));
        if !at.exists() {
            std::fs::create_dir(&at).map_err(io(shown))?;
        }
        let (mode, uid, gid) = image_dir(shown).unwrap_or((0o755, 0, 0));
        set_attributes(&at, mode, (uid, gid))?;
    }
    Ok(())
}

fn set_attributes(at: &Path, mode: u32, (uid, gid): (u32, u32)) -> Result<(), ContextError> {
    std::os::unix::fs::lchown(at, Some(uid), Some(gid)).map_err(io(at.display().to_string()))?;
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode & 0o7777))
        .map_err(io(at.display().to_string()))
}

/// Copies one file or link (not following it) to `at`.
fn copy_entry(
    from: &Path,
    at: &Path,
    spec: &CopySpec,
    owner: (u32, u32),
) -> Result<u64, ContextError> {
    let what = || from.display().to_string();
    let meta = std::fs::symlink_metadata(from).map_err(io(what()))?;
    if at.symlink_metadata().is_ok() && !at.is_dir() {
        std::fs::remove_file(at).map_err(io(what()))?;
    }
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(from).map_err(io(what()))?;
        std::os::unix::fs::symlink(&target, at).map_err(io(what()))?;
        std::os::unix::fs::lchown(at, Some(owner.0), Some(owner.1)).map_err(io(what()))?;
        return Ok(1);
    }
    if !meta.is_file() {
        return Ok(0);
    }
    std::fs::copy(from, at).map_err(io(what()))?;
    set_attributes(at, spec.chmod.unwrap_or(meta.mode()), owner)?;
    Ok(1)
}

/// Copies the contents of directory `from` into `at` (made if missing; kept as the image
/// has it if `exists`).
fn copy_tree(
    from: &Path,
    at: &Path,
    spec: &CopySpec,
    owner: (u32, u32),
    exists: bool,
) -> Result<u64, ContextError> {
    let what = || from.display().to_string();
    if !at.exists() {
        std::fs::create_dir(at).map_err(io(what()))?;
    }
    if !exists {
        let mode = std::fs::metadata(from).map_err(io(what()))?.mode();
        set_attributes(at, spec.chmod.unwrap_or(mode), owner)?;
    }
    let mut copied = 0;
    let mut children: Vec<_> = std::fs::read_dir(from).map_err(io(what()))?.flatten().collect();
    children.sort_by_key(|e| e.file_name());
    for child in children {
        let (path, to) = (child.path(), at.join(child.file_name()));
        let kind = child.file_type().map_err(io(what()))?;
        copied += if kind.is_dir() {
            copy_tree(&path, &to, spec, owner, false)?
        } else {
            copy_entry(&path, &to, spec, owner)?
        };
    }
    Ok(copied)
}

/// Feeds `path` (a file, link or directory, not followed below the top) into `hasher`.
fn hash_tree(path: &Path, relative: &Path, hasher: &mut Sha256) -> Result<(), ContextError> {
    let what = || path.display().to_string();
    let meta = std::fs::symlink_metadata(path).map_err(io(what()))?;
    hasher.update(relative.as_os_str().as_encoded_bytes());
    hasher.update([0]);
    hasher.update((meta.mode() & 0o7777).to_le_bytes());
    if meta.file_type().is_symlink() {
        hasher.update(b"l");
        hasher.update(std::fs::read_link(path).map_err(io(what()))?.as_os_str().as_encoded_bytes());
    } else if meta.is_dir() {
        hasher.update(b"d");
        let mut children: Vec<_> = std::fs::read_dir(path).map_err(io(what()))?.flatten().collect();
        children.sort_by_key(|e| e.file_name());
        for child in children {
            hash_tree(&child.path(), &relative.join(child.file_name()), hasher)?;
        }
    } else {
        hasher.update(b"f");
        hasher.update(meta.len().to_le_bytes());
        let mut file = std::fs::File::open(path).map_err(io(what()))?;
        std::io::copy(&mut file, hasher).map_err(io(what()))?;
    }
    Ok(())
}

/// A shell-style pattern of `*` and `?` against a name.
fn matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    go(&p, &n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().expect("dir");
        let root = dir.path();
        std::fs::write(root.join("a.txt"), "a").expect("a");
        std::fs::create_dir_all(root.join("src/sub")).expect("src");
        std::fs::write(root.join("src/main.py"), "print()").expect("main");
        std::fs::write(root.join("src/sub/x"), "x").expect("x");
        std::os::unix::fs::symlink("main.py", root.join("src/link")).expect("link");
        std::os::unix::fs::symlink("/etc/passwd", root.join("out")).expect("out");
        std::os::unix::fs::symlink("../..", root.join("src/up")).expect("up");
        let context = Context::at(root).expect("context");
        (dir, context)
    }

    fn copy(sources: &[&str], dest: &str) -> CopySpec {
        CopySpec {
            sources: sources.iter().map(|s| s.to_string()).collect(),
            dest: dest.into(),
            chown: None,
            owner: None,
            chmod: None,
        }
    }

    #[test]
    fn sources_resolve_inside_the_context_only() {
        let (_dir, c) = context();
        assert_eq!(c.resolve("a.txt").expect("a").len(), 1);
        assert_eq!(c.resolve("*.txt").expect("glob").len(), 1);
        assert!(matches!(c.resolve("out"), Err(ContextError::Escape(_))));
        assert!(matches!(c.resolve("src/up"), Err(ContextError::Escape(_))));
        assert!(matches!(c.resolve("../x"), Err(ContextError::Escape(_))));
        assert!(matches!(c.resolve("none"), Err(ContextError::Missing(_))));
        assert!(matches!(c.resolve("*.none"), Err(ContextError::Missing(_))));
    }

    #[test]
    fn the_hash_follows_contents_and_modes() {
        let (dir, c) = context();
        let spec = copy(&["src"], "/app/");
        let first = c.hash(&spec).expect("hash");
        assert_eq!(first, c.hash(&spec).expect("again"), "stable");
        std::fs::write(dir.path().join("src/sub/x"), "y").expect("change");
        let changed = c.hash(&spec).expect("changed");
        assert_ne!(first, changed);
        std::fs::set_permissions(
            dir.path().join("src/sub/x"),
            std::fs::Permissions::from_mode(0o700),
        )
        .expect("chmod");
        assert_ne!(changed, c.hash(&spec).expect("mode"));
    }

    #[test]
    fn staging_lays_files_out_as_docker_copy_does() {
        let (_dir, c) = context();
        let out = tempfile::tempdir().expect("out");
        let image = |p: &str| (p == "/" || p == "/home").then_some((0o700, 0, 0));
        let mut spec = copy(&["a.txt", "src"], "/home/app/");
        spec.chown = Some((1000, 1000));
        let copied = c.stage(&spec, "/home/app/", out.path(), &image).expect("stage");
        assert_eq!(copied, 5, "a.txt, main.py, link, sub/x and the up link");
        let o = out.path();
        assert_eq!(std::fs::read_to_string(o.join("home/app/a.txt")).expect("a"), "a");
        assert_eq!(std::fs::read_to_string(o.join("home/app/sub/x")).expect("x"), "x");
        assert_eq!(
            std::fs::read_link(o.join("home/app/link")).expect("link").to_str(),
            Some("main.py")
        );
        let home = std::fs::metadata(o.join("home")).expect("home");
        assert_eq!(home.mode() & 0o7777, 0o700, "the image's own directory keeps its mode");
        let app = std::fs::metadata(o.join("home/app")).expect("app");
        assert_eq!(app.uid(), 1000, "the destination it makes belongs to --chown's owner");
        assert_eq!(std::fs::metadata(o.join("home/app/a.txt")).expect("a").uid(), 1000);
        // One file to a file name.
        let out = tempfile::tempdir().expect("out");
        c.stage(&copy(&["a.txt"], "/etc/renamed"), "/etc/renamed", out.path(), &|_| None)
            .expect("file");
        assert!(out.path().join("etc/renamed").is_file());
    }

    #[test]
    fn an_uploaded_context_with_a_path_out_is_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, "ok.txt", &b"x"[..]).expect("ok");
        let bytes = tar.into_inner().expect("tar");
        let dir = tempfile::tempdir().expect("dir");
        let caps = ContextCaps { max_bytes: 1 << 20, max_entries: 10 };
        Context::unpack(&bytes[..], dir.path(), caps).expect("unpack");
        assert!(dir.path().join("ok.txt").is_file());
        let small = ContextCaps { max_bytes: 0, max_entries: 10 };
        let dir = tempfile::tempdir().expect("dir");
        assert!(matches!(
            Context::unpack(&bytes[..], dir.path(), small),
            Err(ContextError::TooLarge { .. })
        ));
    }
}
