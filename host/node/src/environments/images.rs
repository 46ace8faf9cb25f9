//! Layer store requests: import (uploaded or node-local), list, inspect, tag, remove, verify,
//! GC, environments, and checkpoints of container sandboxes.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

use brig_images::backend::{Backend, BackendSpec};
use brig_images::{ImportSource, LayerStore, StoreConfig};
use brig_proto::{ImageFormat, ImageImportRequest, ImageStats, LayerInfo, Reply};
use brig_transport::Exchange;
use tokio::io::AsyncWriteExt;

use crate::NodeError;

/// The layer store.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesConfig {
    pub enabled: bool,
    pub backend: BlobBackendConfig,
    /// Local chunk cache; default `<state>/chunk-cache`.
    pub cache_dir: Option<PathBuf>,
    pub cache_max_mib: u64,
    /// Verified chunks kept in memory.
    pub cache_memory_mib: u64,
    /// Where `image pull` may fetch from and how.
    pub registries: RegistriesConfig,
}

/// Registries images are pulled from (`[images.registries]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RegistriesConfig {
    /// Registries (`host:port`) spoken to over plain HTTP; none by default.
    pub insecure: Vec<String>,
    /// Credentials, by registry.
    pub credentials: Vec<RegistryCredential>,
    /// PEM files of CAs trusted besides the system's (a registry with a private CA).
    pub ca_files: Vec<PathBuf>,
    /// Mirrors by registry (`"docker.io" = ["mirror.local:5000"]`), tried in order before
    /// the registry itself.
    pub mirrors: std::collections::BTreeMap<String, Vec<String>>,
    /// Most uncompressed bytes of one layer and of one image.
    pub max_layer_mib: u64,
    pub max_image_mib: u64,
}

impl Default for RegistriesConfig {
    fn default() -> Self {
        RegistriesConfig {
            insecure: Vec::new(),
            credentials: Vec::new(),
            ca_files: Vec::new(),
            mirrors: Default::default(),
            max_layer_mib: 32 * 1024,
            max_image_mib: 64 * 1024,
        }
    }
}

/// A registry's user and password (`[[images.registries.credentials]]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistryCredential {
    pub registry: String,
    pub username: String,
    pub password: String,
}

impl RegistriesConfig {
    /// The puller's settings.
    pub fn pull_config(&self) -> brig_registry::PullConfig {
        brig_registry::PullConfig {
            insecure: self.insecure.clone(),
            credentials: self
                .credentials
                .iter()
                .map(|c| (c.registry.clone(), c.username.clone(), c.password.clone()))
                .collect(),
            ca_files: self.ca_files.clone(),
            mirrors: self.mirrors.iter().map(|(r, m)| (r.clone(), m.clone())).collect(),
            max_layer_bytes: self.max_layer_mib << 20,
            max_image_bytes: self.max_image_mib << 20,
            ..brig_registry::PullConfig::default()
        }
    }
}

/// Where layer data lives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum BlobBackendConfig {
    /// A directory; default `<state>/blobs`.
    Local { dir: Option<PathBuf> },
    /// An S3-compatible object store.
    S3(brig_images::backend::S3Config),
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            enabled: true,
            backend: BlobBackendConfig::Local { dir: None },
            cache_dir: None,
            cache_max_mib: 10 * 1024,
            cache_memory_mib: 64,
            registries: RegistriesConfig::default(),
        }
    }
}

/// Largest archive accepted as an upload.
const MAX_UPLOAD_BYTES: u64 = 64 << 30;

/// Opens the node's layer store, or says why there is none.
pub(crate) fn open_store(
    config: &ImagesConfig,
    state_dir: &std::path::Path,
    run_dir: &std::path::Path,
    id_base: u32,
) -> Result<Arc<LayerStore>, String> {
    if !config.enabled {
        return Err("disabled in the node configuration".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Err("brigd is not running as root (the store mounts FUSE and EROFS)".into());
    }
    let backend_spec = match &config.backend {
        BlobBackendConfig::Local { dir } => {
            BackendSpec::Local { dir: dir.clone().unwrap_or_else(|| state_dir.join("blobs")) }
        }
        BlobBackendConfig::S3(s3) => BackendSpec::S3(s3.clone()),
    };
    let backend = Backend::open(&backend_spec).map_err(|e| crate::error::chain(&e))?;
    let store = LayerStore::open(
        StoreConfig {
            dir: state_dir.join("layers"),
            lazy_mount: run_dir.join("lazy"),
            cache_dir: config.cache_dir.clone().unwrap_or_else(|| state_dir.join("chunk-cache")),
            cache_max_bytes: config.cache_max_mib << 20,
            cache_memory_bytes: (config.cache_memory_mib << 20) as usize,
            id_base,
            lazy_server_bin: lazy_server_bin(),
            backend_spec,
        },
        backend,
    )
    .map_err(|e| crate::error::chain(&e))?;
    Ok(Arc::new(store))
}

pub(crate) fn layer_to_wire(l: brig_images::LayerInfo) -> LayerInfo {
    LayerInfo {
        name: l.name,
        version: l.version,
        digest: l.digest,
        data_bytes: l.data_bytes,
        meta_bytes: l.meta_bytes,
        chunks: l.chunks,
        files: l.files,
        created_unix_ms: l.created_unix_ms,
        source: l.source,
        new_chunks: l.new_chunks,
    }
}

/// `brig-lazyfs`, next to brigd.
fn lazy_server_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("brig-lazyfs")))
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/brig-lazyfs"))
}

pub(crate) async fn stats(store: &LayerStore) -> ImageStats {
    let s = store.stats().await;
    ImageStats {
        backend: store.backend().kind().to_string(),
        fetched_bytes: s.fetched_bytes,
        fetched_chunks: s.fetched_chunks,
        cache_bytes: s.cache_bytes,
        corrupt_chunks: s.corrupt_chunks,
    }
}

/// Imports a layer from an upload on `exchange` or a node-local path.
pub(crate) async fn import(
    store: &LayerStore,
    req: ImageImportRequest,
    exchange: &mut Exchange,
) -> Result<Reply, NodeError> {
    let _upload_file;
    let path = match &req.node_path {
        Some(p) => PathBuf::from(p),
        None => {
            if req.format == ImageFormat::Dir {
                exchange.refuse_upload();
                return Err(NodeError::BadImage(
                    req.name.clone(),
                    "upload a directory as a tarball".into(),
                ));
            }
            let file = brig_images::build::Staging::new_in(&store.work_dir())?;
            let path = file.path().join("upload");
            let mut out = tokio::fs::File::create(&path)
                .await
                .map_err(|source| NodeError::Io { what: "upload file".into(), source })?;
            let mut total = 0u64;
            while let Some(chunk) = exchange.read_upload().await? {
                total += chunk.len() as u64;
                if total > MAX_UPLOAD_BYTES {
                    exchange.refuse_upload();
                    return Err(NodeError::UploadTooLarge(MAX_UPLOAD_BYTES));
                }
                out.write_all(&chunk)
                    .await
                    .map_err(|source| NodeError::Io { what: "upload file".into(), source })?;
            }
            out.flush()
                .await
                .map_err(|source| NodeError::Io { what: "upload file".into(), source })?;
            _upload_file = file;
            path
        }
    };
    let source = match req.format {
        ImageFormat::Dir => ImportSource::Dir(path),
        ImageFormat::Tar => ImportSource::Tar(path),
        ImageFormat::Oci => ImportSource::Oci(path),
        ImageFormat::Erofs => ImportSource::Erofs(path),
    };
    Ok(Reply::Layer(layer_to_wire(store.import(&req.name, req.version, source).await?)))
}

/// Packs a sandbox's writable layer into a new store layer, without `scrub` paths. The sandbox
/// is frozen while its changes are copied, so the layer is a consistent point in time. The
/// layer's source says what it goes on top of: `checkpoint of ID on IMAGE`.
pub(crate) async fn checkpoint(
    store: &LayerStore,
    entry: &crate::table::sandboxes::SandboxEntry,
    req: brig_proto::CheckpointRequest,
) -> Result<brig_images::LayerInfo, NodeError> {
    entry.require(brig_core::sandbox::Op::Checkpoint)?;
    entry.sandbox.writable_layer().map_err(|e| entry.fail(e))?;
    for path in &req.scrub {
        if path.split('/').any(|p| p == "..") {
            return Err(NodeError::BadImage(path.clone(), "scrub paths may not contain ..".into()));
        }
    }
    let staging = brig_images::build::Staging::new_in(&store.work_dir())?;
    let target = staging.path().join("root");
    let task = |e: tokio::task::JoinError| NodeError::Io {
        what: "checkpoint task".into(),
        source: std::io::Error::other(e),
    };
    tokio::fs::create_dir(&target)
        .await
        .map_err(|source| NodeError::Io { what: "checkpoint staging".into(), source })?;
    entry.sandbox.freeze(true).await.map_err(|e| entry.fail(e))?;
    // Asked for again now it is frozen: the path may run through the container's shim, which
    // cannot exit (and give its pid away) until the container thaws.
    let upper = match entry.sandbox.writable_layer() {
        Ok(upper) => upper,
        Err(e) => {
            let _ = entry.sandbox.freeze(false).await;
            return Err(entry.fail(e));
        }
    };
    let (from, to) = (upper, target.clone());
    let copied = tokio::task::spawn_blocking(move || brig_images::build::stage_dir(&from, &to))
        .await
        .map_err(task);
    let thawed = entry.sandbox.freeze(false).await.map_err(|e| entry.fail(e));
    copied??;
    thawed?;
    let scrub = req.scrub;
    tokio::task::spawn_blocking(move || {
        for path in scrub {
            let victim = target.join(path.trim_start_matches('/'));
            let _ = if victim.is_dir() {
                std::fs::remove_dir_all(&victim)
            } else {
                std::fs::remove_file(&victim)
            };
        }
    })
    .await
    .map_err(task)?;
    let image = entry.spec().image.unwrap_or_default();
    let source = ImportSource::Shifted(staging, format!("checkpoint of {} on {image}", entry.id));
    Ok(store.import(&req.name, req.version, source).await?)
}
