//! Staging an OCI image (an OCI image layout, or a `docker save` archive) as one directory
//! tree, applying each layer's whiteouts to the ones below it.
//!
//! ```text
//! docker save:  manifest.json → [{ "Layers": ["<id>/layer.tar", …] }]
//! OCI layout:   index.json → manifest blob → { "layers": [{ "digest": "sha256:…" }, …] }
//! whiteouts:    dir/.wh.NAME removes dir/NAME below; dir/.wh..wh..opq empties dir below
//! ```
//! All layers of one image are flattened into one Brig layer (consecutive layers of an image
//! are rarely useful on their own); base, workspace and toolkit layers stay separate.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::build::{io, run, BuildError};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

#[derive(Deserialize)]
struct DockerManifest {
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct OciIndex {
    manifests: Vec<OciDescriptor>,
}

#[derive(Deserialize)]
struct OciManifest {
    layers: Vec<OciDescriptor>,
}

#[derive(Deserialize)]
struct OciDescriptor {
    digest: String,
}

fn bad(path: &Path, why: impl Into<String>) -> BuildError {
    BuildError::Tool { tool: "oci import", detail: format!("{}: {}", path.display(), why.into()) }
}

fn blob_path(root: &Path, digest: &str) -> Result<PathBuf, BuildError> {
    let (algo, hex) =
        digest.split_once(':').ok_or_else(|| bad(root, format!("bad digest {digest:?}")))?;
    if algo != "sha256" || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(root, format!("unsupported digest {digest:?}")));
    }
    Ok(root.join("blobs").join(algo).join(hex))
}

/// The layer tarballs of the image unpacked at `root`, bottom first.
fn layer_files(root: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let docker = root.join("manifest.json");
    if docker.exists() {
        let text = std::fs::read(&docker).map_err(io("read", &docker))?;
        let manifests: Vec<DockerManifest> =
            serde_json::from_slice(&text).map_err(|e| bad(&docker, e.to_string()))?;
        let first =
            manifests.into_iter().next().ok_or_else(|| bad(&docker, "no image in the archive"))?;
        return first.layers.iter().map(|l| safe_join(root, l)).collect();
    }
    let index_path = root.join("index.json");
    let text = std::fs::read(&index_path).map_err(|_| {
        bad(root, "neither manifest.json (docker save) nor index.json (OCI layout)")
    })?;
    let index: OciIndex =
        serde_json::from_slice(&text).map_err(|e| bad(&index_path, e.to_string()))?;
    let first =
        index.manifests.first().ok_or_else(|| bad(&index_path, "no manifest in the index"))?;
    let manifest_path = blob_path(root, &first.digest)?;
    let text = std::fs::read(&manifest_path).map_err(io("read", &manifest_path))?;
    let manifest: OciManifest =
        serde_json::from_slice(&text).map_err(|e| bad(&manifest_path, e.to_string()))?;
    manifest.layers.iter().map(|l| blob_path(root, &l.digest)).collect()
}

/// Joins an archive-relative path, refusing anything that leaves `root`.
fn safe_join(root: &Path, rel: &str) -> Result<PathBuf, BuildError> {
    let p = Path::new(rel);
    if p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(bad(root, format!("layer path {rel:?} leaves the archive")));
    }
    Ok(root.join(p))
}

/// Stages the image at `source` (a directory or an archive of one) into `dest`.
pub fn stage_oci(source: &Path, dest: &Path, scratch: &Path) -> Result<(), BuildError> {
    let unpacked;
    let root = if source.is_dir() {
        source.to_path_buf()
    } else {
        unpacked = scratch.join("archive");
        std::fs::create_dir_all(&unpacked).map_err(io("create", &unpacked))?;
        run("tar", Command::new("tar").arg("-xf").arg(source).arg("-C").arg(&unpacked))?;
        unpacked.clone()
    };
    for layer in layer_files(&root)? {
        apply_layer(&layer, dest)?;
    }
    Ok(())
}

/// Applies one layer tarball onto `dest`: whiteouts first, then the layer's files.
fn apply_layer(layer: &Path, dest: &Path) -> Result<(), BuildError> {
    let listing = Command::new("tar")
        .arg("-tf")
        .arg(layer)
        .output()
        .map_err(|source| BuildError::Missing { tool: "tar", source })?;
    if !listing.status.success() {
        return Err(bad(layer, String::from_utf8_lossy(&listing.stderr).trim().to_string()));
    }
    for entry in String::from_utf8_lossy(&listing.stdout).lines() {
        let entry = entry.trim_start_matches("./");
        let (dir, name) = match entry.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", entry),
        };
        if name == OPAQUE {
            let target = safe_join(dest, dir)?;
            if let Ok(children) = std::fs::read_dir(&target) {
                for c in children.flatten() {
                    remove_any(&c.path())?;
                }
            }
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let target = safe_join(dest, format!("{dir}/{hidden}").trim_start_matches('/'))?;
            remove_any(&target)?;
        }
    }
    run(
        "tar",
        Command::new("tar")
            .arg("-x")
            .arg("-p")
            .arg("--numeric-owner")
            .arg("--exclude=.wh.*")
            .arg("--exclude=*/.wh.*")
            .arg("-f")
            .arg(layer)
            .arg("-C")
            .arg(dest),
    )
}

fn remove_any(path: &Path) -> Result<(), BuildError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(io("remove", path)),
        Ok(_) => std::fs::remove_file(path).map_err(io("remove", path)),
        Err(_) => Ok(()),
    }
}
