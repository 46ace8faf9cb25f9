//! The layer store facade: import, catalog operations, resolution for sandboxes, GC.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::{chunk_key, Backend};
use crate::build::{self, Staging};
use crate::cache::ChunkCache;
use crate::catalog::{validate_name, Catalog, EnvConfig, LayerRecord, Reference};
use crate::layout::{self, SLOT_BYTES};
use crate::lazy_server::{LazyServer, LazyStats, ServerConfig};
use crate::lazyfs::ChunkEntry;
use crate::{erofs, oci, StoreError};

/// Where the store keeps things.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Node-local metadata (catalog, layer records, meta images) and scratch.
    pub dir: PathBuf,
    /// Where the lazy blob file system is mounted (by its server, `brig-lazyfs`, whose socket,
    /// pid record and log sit beside it: `lazyfs.sock`, `lazyfs.pid`, `lazyfs.log`).
    pub lazy_mount: PathBuf,
    /// The `brig-lazyfs` binary.
    pub lazy_server_bin: PathBuf,
    /// The backend, as the server is told it.
    pub backend_spec: crate::backend::BackendSpec,
    /// Local chunk cache directory and its bound.
    pub cache_dir: PathBuf,
    pub cache_max_bytes: u64,
    pub cache_memory_bytes: usize,
    /// Host uid of container root, to shift imported trees by.
    pub id_base: u32,
}

/// Where a layer comes from.
#[derive(Debug)]
pub enum ImportSource {
    Dir(PathBuf),
    Tar(PathBuf),
    /// OCI image layout or `docker save` archive (directory or tarball).
    Oci(PathBuf),
    /// A self-contained EROFS image (e.g. from `brig-mkimage`).
    Erofs(PathBuf),
    /// A tree whose ownership is already shifted (a container's writable layer).
    Shifted(Staging, String),
    /// A tree already unpacked at `root/` of the staging directory, owned as in its image (an
    /// OCI layer from a registry): shifted, then imported.
    Staged(Staging, String),
}

/// What a listing shows about a layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub name: String,
    pub version: u32,
    pub digest: String,
    pub data_bytes: u64,
    pub meta_bytes: u64,
    pub chunks: u64,
    pub files: u64,
    pub created_unix_ms: u64,
    pub source: String,
    /// Chunks this import added to the backend (the rest were already there).
    pub new_chunks: u64,
}

/// A layer ready to mount.
#[derive(Debug, Clone)]
pub struct ResolvedLayer {
    pub digest: String,
    pub meta: PathBuf,
    pub blob: PathBuf,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    pub removed_chunks: u64,
    pub freed_bytes: u64,
    pub removed_layers: u64,
}

pub struct LayerStore {
    config: StoreConfig,
    backend: Backend,
    cache: Arc<ChunkCache>,
    lazy: LazyServer,
    catalog: Mutex<Catalog>,
    records: Mutex<HashMap<String, Arc<LayerRecord>>>,
    in_use: Mutex<HashMap<String, usize>>,
    /// Serializes catalog writes and imports' final step.
    write: tokio::sync::Mutex<()>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

impl LayerStore {
    /// Opens the store, starting its lazy file system's server or adopting the one an earlier
    /// run started (blocks until it answers).
    pub fn open(config: StoreConfig, backend: Backend) -> Result<LayerStore, StoreError> {
        for d in [config.dir.join("layers"), config.dir.join("work")] {
            std::fs::create_dir_all(&d).map_err(io(d.display().to_string()))?;
        }
        crate::build::sweep_staging(&config.dir.join("work"));
        let cache = Arc::new(ChunkCache::open(
            &config.cache_dir,
            config.cache_max_bytes,
            config.cache_memory_bytes,
            backend.clone(),
        )?);
        let server = ServerConfig {
            mountpoint: config.lazy_mount.clone(),
            socket: config.lazy_mount.with_file_name("lazyfs.sock"),
            cache_dir: config.cache_dir.clone(),
            cache_max_bytes: config.cache_max_bytes,
            cache_memory_bytes: config.cache_memory_bytes,
            backend: config.backend_spec.clone(),
            takeover: None,
        };
        let lazy = LazyServer::start_or_adopt(&server, &config.lazy_server_bin)?;
        let catalog_path = config.dir.join("catalog.json");
        let mut catalog: Catalog = match std::fs::read(&catalog_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io(catalog_path.display().to_string())(std::io::Error::other(e)))?,
            Err(_) => Catalog::default(),
        };
        catalog.upgrade();
        Ok(LayerStore {
            config,
            backend,
            cache,
            lazy,
            catalog: Mutex::new(catalog),
            records: Mutex::new(HashMap::new()),
            in_use: Mutex::new(HashMap::new()),
            write: tokio::sync::Mutex::new(()),
        })
    }

    /// Scratch space for staging trees on the same filesystem as the store.
    pub fn work_dir(&self) -> PathBuf {
        self.config.dir.join("work")
    }

    pub fn cache(&self) -> &Arc<ChunkCache> {
        &self.cache
    }

    /// The chunk counters of this process's reads (verify) and the lazy file system's
    /// (containers' reads) together.
    pub async fn stats(&self) -> LazyStats {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.cache.stats;
        let server = self.lazy.stats().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no counters from the lazy file system server");
            LazyStats::default()
        });
        LazyStats {
            fetched_bytes: s.fetched_bytes.load(Relaxed) + server.fetched_bytes,
            fetched_chunks: s.fetched_chunks.load(Relaxed) + server.fetched_chunks,
            corrupt_chunks: s.corrupt.load(Relaxed) + server.corrupt_chunks,
            // Both index the same directory.
            cache_bytes: self.cache.disk_bytes().max(server.cache_bytes),
        }
    }

    /// Forgets every cached chunk, here and in the lazy file system: the next reads are cold.
    pub async fn clear_cache(&self) -> Result<(), StoreError> {
        self.cache.clear();
        Ok(self.lazy.clear_cache().await?)
    }

    /// The lazy file system server's pid.
    pub fn lazy_server_pid(&self) -> i32 {
        self.lazy.pid()
    }

    /// Stops the lazy file system's server (no container reads a layer any more).
    pub async fn stop_lazy_server(&self) -> Result<(), StoreError> {
        Ok(self.lazy.stop().await?)
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    fn save_catalog(&self, catalog: &Catalog) -> Result<(), StoreError> {
        let path = self.config.dir.join("catalog.json");
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(catalog)
            .map_err(|e| io("encode catalog")(std::io::Error::other(e)))?;
        std::fs::write(&tmp, bytes).map_err(io(tmp.display().to_string()))?;
        std::fs::rename(&tmp, &path).map_err(io(path.display().to_string()))
    }

    fn meta_path(&self, digest: &str) -> PathBuf {
        self.config.dir.join("layers").join(format!("{}.meta", hex_of(digest)))
    }

    /// The record of `digest`, from memory, the local disk, or the backend (fetching the meta
    /// image too, for a layer another node imported).
    pub async fn record(&self, digest: &str) -> Result<Arc<LayerRecord>, StoreError> {
        if let Some(r) = self.records.lock().get(digest).cloned() {
            return Ok(r);
        }
        let local = self.config.dir.join("layers").join(format!("{}.json", hex_of(digest)));
        let bytes = match std::fs::read(&local) {
            Ok(b) => b,
            Err(_) => {
                let b = self.backend.get(&format!("layers/{}.json", hex_of(digest))).await?;
                let meta = self.backend.get(&format!("layers/{}.meta", hex_of(digest))).await?;
                std::fs::write(self.meta_path(digest), &meta).map_err(io("write meta"))?;
                std::fs::write(&local, &b).map_err(io("write record"))?;
                b.to_vec()
            }
        };
        let record: LayerRecord = serde_json::from_slice(&bytes).map_err(|e| {
            StoreError::Damaged { layer: digest.to_string(), detail: format!("record: {e}") }
        })?;
        let record = Arc::new(record);
        self.records.lock().insert(digest.to_string(), record.clone());
        Ok(record)
    }

    /// Imports a layer as `name@version` (the next version of `name` when `None`).
    pub async fn import(
        &self,
        name: &str,
        version: Option<u32>,
        source: ImportSource,
    ) -> Result<LayerInfo, StoreError> {
        validate_name(name)?;
        let work = self.config.dir.join("work");
        let (staging, shift, label) = match source {
            ImportSource::Shifted(staging, label) => (staging, false, label),
            ImportSource::Staged(staging, label) => (staging, true, label),
            other => {
                let staging = Staging::new_in(&work)?;
                let root = staging.path().join("root");
                std::fs::create_dir(&root).map_err(io("create staging root"))?;
                let scratch = staging.path().join("scratch");
                std::fs::create_dir(&scratch).map_err(io("create scratch"))?;
                let label = tokio::task::spawn_blocking(move || stage(other, &root, &scratch))
                    .await
                    .map_err(|e| io("staging task")(std::io::Error::other(e)))??;
                (staging, true, label)
            }
        };
        let root = staging.path().join("root");
        let base = self.config.id_base;
        let (meta, slots, blob_path) =
            tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
                if shift {
                    build::shift_ownership(&root, base)?;
                }
                let parent = root.parent().unwrap_or(&root).to_path_buf();
                let meta_path = parent.join("layer.meta");
                let blob_path = parent.join("layer.blob");
                build::mkfs_chunked(&root, &meta_path, &blob_path, SLOT_BYTES)?;
                let mut meta = std::fs::read(&meta_path).map_err(io("read meta image"))?;
                let slots = layout::plan(&mut meta)?;
                Ok((meta, slots, blob_path))
            })
            .await
            .map_err(|e| io("build task")(std::io::Error::other(e)))??;
        let files = erofs::list_paths(&meta).map(|p| p.len() as u64).unwrap_or(0);
        // Upload chunks, deduplicated by digest.
        let blob = std::fs::File::open(&blob_path).map_err(io("open blob"))?;
        let mut chunks = Vec::with_capacity(slots.len());
        let mut new_chunks = 0;
        let mut data_bytes = 0;
        for slot in &slots {
            let bytes = layout::assemble(slot, &blob).map_err(io("read blob"))?;
            let digest = hex::encode(Sha256::digest(&bytes));
            data_bytes += bytes.len() as u64;
            if self.backend.put_if_absent(&chunk_key(&digest), Bytes::from(bytes)).await? {
                new_chunks += 1;
            }
            chunks.push(ChunkEntry { digest, len: slot.len });
        }
        drop(blob);
        drop(staging);
        let mut h = Sha256::new();
        h.update(&meta);
        for c in &chunks {
            h.update(c.digest.as_bytes());
        }
        let digest = format!("sha256:{}", hex::encode(h.finalize()));
        let record = LayerRecord {
            digest: digest.clone(),
            chunks,
            data_bytes,
            meta_bytes: meta.len() as u64,
            files,
            created_unix_ms: now_ms(),
            source: label,
        };
        let record_bytes = serde_json::to_vec(&record)
            .map_err(|e| io("encode record")(std::io::Error::other(e)))?;
        self.backend
            .put(&format!("layers/{}.meta", hex_of(&digest)), Bytes::from(meta.clone()))
            .await?;
        self.backend
            .put(&format!("layers/{}.json", hex_of(&digest)), Bytes::from(record_bytes.clone()))
            .await?;
        std::fs::write(self.meta_path(&digest), &meta).map_err(io("write meta"))?;
        std::fs::write(
            self.config.dir.join("layers").join(format!("{}.json", hex_of(&digest))),
            &record_bytes,
        )
        .map_err(io("write record"))?;
        let _guard = self.write.lock().await;
        let mut catalog = self.catalog.lock().clone();
        let version = catalog.add(name, version, &digest)?;
        self.save_catalog(&catalog)?;
        *self.catalog.lock() = catalog;
        let record = Arc::new(record);
        self.records.lock().insert(digest.clone(), record.clone());
        tracing::info!(layer = %format!("{name}@{version}"), %digest, chunks = record.chunks.len(), new_chunks, "layer imported");
        Ok(info(name, version, &record, new_chunks))
    }

    /// Every tagged layer.
    pub async fn list(&self) -> Result<Vec<LayerInfo>, StoreError> {
        let tags = self.catalog.lock().tags();
        let mut out = Vec::new();
        for (name, version, digest) in tags {
            let record = self.record(&digest).await?;
            out.push(info(&name, version, &record, 0));
        }
        Ok(out)
    }

    /// A layer's record and the paths of its files.
    pub async fn inspect(&self, reference: &str) -> Result<(LayerInfo, Vec<String>), StoreError> {
        let reference = Reference::parse(reference)?;
        let (digest, tag) = self.catalog.lock().resolve(&reference)?;
        let record = self.record(&digest).await?;
        let meta = std::fs::read(self.meta_path(&digest)).map_err(io("read meta"))?;
        let paths = erofs::list_paths(&meta)?;
        let (name, version) = tag.unwrap_or_default();
        Ok((info(&name, version, &record, 0), paths))
    }

    /// The digest `reference` names in this node's catalog (no record or meta read).
    pub fn digest_of(&self, reference: &str) -> Result<String, StoreError> {
        let reference = Reference::parse(reference)?;
        Ok(self.catalog.lock().resolve(&reference)?.0)
    }

    /// Gives an existing layer another name and version.
    pub async fn tag(
        &self,
        reference: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<LayerInfo, StoreError> {
        let reference = Reference::parse(reference)?;
        let _guard = self.write.lock().await;
        let mut catalog = self.catalog.lock().clone();
        let (digest, _) = catalog.resolve(&reference)?;
        let record = self.record(&digest).await?;
        let v = catalog.add(name, version, &digest)?;
        self.save_catalog(&catalog)?;
        *self.catalog.lock() = catalog;
        Ok(info(name, v, &record, 0))
    }

    /// Removes a tag; refused while a sandbox uses the layer. Data goes at the next GC.
    pub async fn remove(&self, reference: &str) -> Result<(), StoreError> {
        let parsed = Reference::parse(reference)?;
        let _guard = self.write.lock().await;
        let mut catalog = self.catalog.lock().clone();
        let (digest, tag) = catalog.resolve(&parsed)?;
        if self.in_use.lock().get(&digest).copied().unwrap_or(0) > 0 {
            return Err(StoreError::InUse(reference.to_string()));
        }
        match tag {
            Some((name, version)) => {
                if let Some(versions) = catalog.layers.get_mut(&name) {
                    versions.remove(&version);
                    if versions.is_empty() {
                        catalog.layers.remove(&name);
                    }
                }
            }
            None => catalog.layers.values_mut().for_each(|v| v.retain(|_, d| *d != digest)),
        }
        self.save_catalog(&catalog)?;
        *self.catalog.lock() = catalog;
        Ok(())
    }

    /// Defines (or redefines) an environment: an ordered list of layer references, base first.
    /// A part that is no store reference names one of the node's own image files
    /// (`debian-12`), as in a create's layer stack; it is resolved when a sandbox starts.
    pub async fn create_env(&self, name: &str, layers: Vec<String>) -> Result<(), StoreError> {
        validate_name(name)?;
        {
            let catalog = self.catalog.lock();
            for l in layers.iter().filter(|l| LayerStore::is_store_reference(l)) {
                catalog.resolve(&Reference::parse(l)?)?;
            }
        }
        let _guard = self.write.lock().await;
        let mut catalog = self.catalog.lock().clone();
        catalog.envs.insert(name.to_string(), layers);
        // A redefined environment starts without the settings of what it was.
        catalog.configs.remove(name);
        self.save_catalog(&catalog)?;
        *self.catalog.lock() = catalog;
        Ok(())
    }

    /// Records in the blob backend that `key` (a content name, e.g. a registry layer's diff
    /// digest) is layer `digest`, so every node sharing the backend finds it
    /// ([`LayerStore::adopt_shared`]).
    pub async fn share_name(&self, key: &str, digest: &str) -> Result<(), StoreError> {
        let key = format!("names/{key}");
        self.backend.put(&key, Bytes::from(digest.to_string())).await?;
        Ok(())
    }

    /// The layer another node shared under `key` ([`LayerStore::share_name`]), named `name` in
    /// this node's catalog too; `None` if no node shared one. Only the layer's record and meta
    /// image are fetched: its data comes chunk by chunk when read.
    pub async fn adopt_shared(
        &self,
        key: &str,
        name: &str,
    ) -> Result<Option<LayerInfo>, StoreError> {
        validate_name(name)?;
        let Ok(bytes) = self.backend.get(&format!("names/{key}")).await else {
            return Ok(None);
        };
        let digest = String::from_utf8_lossy(&bytes).into_owned();
        if !digest.starts_with("sha256:") {
            return Ok(None);
        }
        let record = self.record(&digest).await?;
        let _guard = self.write.lock().await;
        let mut catalog = self.catalog.lock().clone();
        let version = catalog.add(name, None, &digest)?;
        self.save_catalog(&catalog)?;
        *self.catalog.lock() = catalog;
        Ok(Some(info(name, version, &record, 0)))
    }

    /// Sets how the processes of environment `name`'s sandboxes start.
    pub async fn set_env_config(&self, name: &str, config: EnvConfig) -> Result<(), StoreError> {
        let _guard = self.write.lock().await;
        let mut catalog = self.catalog.lock().clone();
        if !catalog.envs.contains_key(name) {
            return Err(StoreError::NoEnv(name.to_string()));
        }
        if config.is_empty() {
            catalog.configs.remove(name);
        } else {
            catalog.configs.insert(name.to_string(), config);
        }
        self.save_catalog(&catalog)?;
        *self.catalog.lock() = catalog;
        Ok(())
    }

    /// How the processes of `spec`'s environment (`env:NAME`) start; the defaults for other
    /// specs.
    pub fn env_config(&self, spec: &str) -> EnvConfig {
        let Some(name) = spec.strip_prefix("env:") else { return EnvConfig::default() };
        self.catalog.lock().configs.get(name).cloned().unwrap_or_default()
    }

    pub fn envs(&self) -> Vec<(String, Vec<String>)> {
        self.catalog.lock().envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Layer references of `spec`: `env:NAME`, or references joined by `+` (base first).
    pub fn expand(&self, spec: &str) -> Result<Vec<String>, StoreError> {
        match spec.strip_prefix("env:") {
            Some(env) => self
                .catalog
                .lock()
                .envs
                .get(env)
                .cloned()
                .ok_or_else(|| StoreError::NoEnv(env.to_string())),
            None => Ok(spec.split('+').map(str::to_string).collect()),
        }
    }

    /// Whether `reference` names something in this store (as opposed to a plain image file).
    pub fn is_store_reference(reference: &str) -> bool {
        reference.contains('/')
            || reference.contains('@')
            || reference.starts_with("sha256:")
            || reference.starts_with("env:")
    }

    /// Resolves references to mountable layers and marks them in use (see [`LayerStore::release`]).
    pub async fn acquire(&self, references: &[String]) -> Result<Vec<ResolvedLayer>, StoreError> {
        let mut out = Vec::new();
        for r in references {
            let (digest, _) = self.catalog.lock().resolve(&Reference::parse(r)?)?;
            let record = self.record(&digest).await?;
            let meta = self.meta_path(&digest);
            if !meta.exists() {
                let bytes = self.backend.get(&format!("layers/{}.meta", hex_of(&digest))).await?;
                std::fs::write(&meta, &bytes).map_err(io("write meta"))?;
            }
            let blob = self.lazy.add(hex_of(&digest), record.chunks.clone()).await?;
            out.push(ResolvedLayer { digest, meta, blob });
        }
        let mut in_use = self.in_use.lock();
        for l in &out {
            *in_use.entry(l.digest.clone()).or_default() += 1;
        }
        Ok(out)
    }

    /// Ends one use of each layer.
    pub fn release(&self, digests: &[String]) {
        let mut in_use = self.in_use.lock();
        for d in digests {
            if let Some(n) = in_use.get_mut(d) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    in_use.remove(d);
                }
            }
        }
    }

    /// Fetches and checks every chunk of a layer; names the first damaged one.
    pub async fn verify(&self, reference: &str) -> Result<LayerInfo, StoreError> {
        let parsed = Reference::parse(reference)?;
        let (digest, tag) = self.catalog.lock().resolve(&parsed)?;
        let record = self.record(&digest).await?;
        for c in &record.chunks {
            self.cache.get(&c.digest).await.map_err(|e| StoreError::Damaged {
                layer: reference.to_string(),
                detail: e.to_string(),
            })?;
        }
        let (name, version) = tag.unwrap_or_default();
        Ok(info(&name, version, &record, 0))
    }

    /// Deletes layer records no name points to and chunks no remaining layer uses.
    pub async fn gc(&self) -> Result<GcReport, StoreError> {
        let _guard = self.write.lock().await;
        let catalog = self.catalog.lock().clone();
        let in_use: HashSet<String> = self.in_use.lock().keys().cloned().collect();
        let mut report = GcReport::default();
        let mut live_chunks = HashSet::new();
        for (key, _) in self.backend.list("layers").await? {
            let Some(file) = key.strip_prefix("layers/") else { continue };
            let Some(hex) = file.strip_suffix(".json") else { continue };
            let digest = format!("sha256:{hex}");
            if catalog.references(&digest) || in_use.contains(&digest) {
                for c in &self.record(&digest).await?.chunks {
                    live_chunks.insert(c.digest.clone());
                }
                continue;
            }
            for ext in ["json", "meta"] {
                self.backend.delete(&format!("layers/{hex}.{ext}")).await?;
                let _ = std::fs::remove_file(
                    self.config.dir.join("layers").join(format!("{hex}.{ext}")),
                );
            }
            self.records.lock().remove(&digest);
            if let Err(e) = self.lazy.remove(hex).await {
                tracing::warn!(layer = hex, error = %e, "the lazy file system keeps a removed layer's blob");
            }
            report.removed_layers += 1;
        }
        for (key, size) in self.backend.list("chunks").await? {
            let Some(d) = key.strip_prefix("chunks/") else { continue };
            if !live_chunks.contains(d) {
                self.backend.delete(&key).await?;
                report.removed_chunks += 1;
                report.freed_bytes += size;
            }
        }
        Ok(report)
    }
}

fn info(name: &str, version: u32, record: &LayerRecord, new_chunks: u64) -> LayerInfo {
    LayerInfo {
        name: name.to_string(),
        version,
        digest: record.digest.clone(),
        data_bytes: record.data_bytes,
        meta_bytes: record.meta_bytes,
        chunks: record.chunks.len() as u64,
        files: record.files,
        created_unix_ms: record.created_unix_ms,
        source: record.source.clone(),
        new_chunks,
    }
}

/// Fills `root` from `source`; returns a label for the record.
fn stage(source: ImportSource, root: &Path, scratch: &Path) -> Result<String, StoreError> {
    Ok(match source {
        ImportSource::Dir(p) => {
            build::stage_dir(&p, root)?;
            "dir".into()
        }
        ImportSource::Tar(p) => {
            build::stage_tar(&p, root)?;
            "tar".into()
        }
        ImportSource::Oci(p) => {
            oci::stage_oci(&p, root, scratch)?;
            "oci".into()
        }
        ImportSource::Erofs(p) => {
            let mnt = scratch.join("mnt");
            std::fs::create_dir_all(&mnt).map_err(io("create mount point"))?;
            nix::mount::mount(
                Some(&p),
                &mnt,
                Some("erofs"),
                nix::mount::MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(|e| io(format!("mount {}", p.display()))(e.into()))?;
            let copied = build::stage_dir(&mnt, root);
            let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
            copied?;
            "erofs".into()
        }
        ImportSource::Shifted(_, label) | ImportSource::Staged(_, label) => label,
    })
}
