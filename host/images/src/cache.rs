//! The node's bounded cache of store chunks, shared by every sandbox on the node.
//!
//! ```text
//! get(digest) ─▶ memory LRU (verified) ─▶ disk LRU <cache>/<digest> (verified on load)
//!                                      └▶ backend chunks/<digest> (verified, then cached)
//! ```
//! A chunk whose bytes do not hash to its name is never served: a corrupt disk copy is dropped
//! and fetched again; a corrupt backend copy is an error ([`CacheError::Corrupt`]). Concurrent
//! misses of one chunk share one fetch. Disk use stays under `max_bytes` by evicting the least
//! recently used chunks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::backend::{chunk_key, Backend, BackendError};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("chunk {digest} from the backend is corrupt (its bytes hash to {actual}); refused")]
    Corrupt { digest: String, actual: String },
    #[error("chunk cache I/O on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Counters for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub fetched_bytes: AtomicU64,
    pub fetched_chunks: AtomicU64,
    pub disk_hits: AtomicU64,
    pub memory_hits: AtomicU64,
    pub corrupt: AtomicU64,
    pub evicted_bytes: AtomicU64,
}

#[derive(Default)]
struct DiskLru {
    entries: HashMap<String, (u64, u64)>,
    order: BTreeMap<u64, String>,
    total: u64,
    tick: u64,
}

impl DiskLru {
    fn touch(&mut self, digest: &str, size: u64) {
        self.tick += 1;
        if let Some((_, old)) = self.entries.insert(digest.to_string(), (size, self.tick)) {
            self.order.remove(&old);
        } else {
            self.total += size;
        }
        self.order.insert(self.tick, digest.to_string());
    }

    fn remove(&mut self, digest: &str) {
        if let Some((size, tick)) = self.entries.remove(digest) {
            self.order.remove(&tick);
            self.total -= size;
        }
    }

    fn oldest(&self) -> Option<String> {
        self.order.values().next().cloned()
    }
}

#[derive(Default)]
struct MemoryLru {
    map: HashMap<String, Bytes>,
    order: VecDeque<String>,
    bytes: usize,
}

pub struct ChunkCache {
    dir: PathBuf,
    max_bytes: u64,
    memory_max: usize,
    backend: Backend,
    disk: Mutex<DiskLru>,
    memory: Mutex<MemoryLru>,
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub stats: CacheStats,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl ChunkCache {
    /// Opens (or creates) the cache in `dir`, indexing what an earlier run left there.
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        memory_max: usize,
        backend: Backend,
    ) -> Result<ChunkCache, CacheError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| CacheError::Io { path: dir.to_owned(), source })?;
        let mut disk = DiskLru::default();
        let mut found: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.len() != 64 {
                    let _ = std::fs::remove_file(e.path());
                    continue;
                }
                if let Ok(meta) = e.metadata() {
                    found.push((
                        meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                        name,
                        meta.len(),
                    ));
                }
            }
        }
        found.sort();
        for (_, name, size) in found {
            disk.touch(&name, size);
        }
        Ok(ChunkCache {
            dir: dir.to_owned(),
            max_bytes,
            memory_max,
            backend,
            disk: Mutex::new(disk),
            memory: Mutex::new(MemoryLru::default()),
            inflight: Mutex::new(HashMap::new()),
            stats: CacheStats::default(),
        })
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Bytes of chunks on disk now.
    pub fn disk_bytes(&self) -> u64 {
        self.disk.lock().total
    }

    /// The verified bytes of chunk `digest`.
    pub async fn get(&self, digest: &str) -> Result<Bytes, CacheError> {
        if let Some(b) = self.memory.lock().map.get(digest).cloned() {
            self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(b);
        }
        let gate = self.inflight.lock().entry(digest.to_string()).or_default().clone();
        let _held = gate.lock().await;
        let result = self.load(digest).await;
        self.inflight.lock().remove(digest);
        result
    }

    async fn load(&self, digest: &str) -> Result<Bytes, CacheError> {
        if let Some(b) = self.memory.lock().map.get(digest).cloned() {
            return Ok(b);
        }
        let path = self.dir.join(digest);
        if let Ok(bytes) = tokio::fs::read(&path).await {
            if sha256_hex(&bytes) == digest {
                self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
                self.disk.lock().touch(digest, bytes.len() as u64);
                let bytes = Bytes::from(bytes);
                self.remember(digest, bytes.clone());
                return Ok(bytes);
            }
            self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(chunk = digest, "corrupt chunk in the local cache; fetching again");
            let _ = tokio::fs::remove_file(&path).await;
            self.disk.lock().remove(digest);
        }
        let bytes = self.backend.get(&chunk_key(digest)).await?;
        let actual = sha256_hex(&bytes);
        if actual != digest {
            self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
            return Err(CacheError::Corrupt { digest: digest.to_string(), actual });
        }
        self.stats.fetched_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.stats.fetched_chunks.fetch_add(1, Ordering::Relaxed);
        self.store(digest, &bytes).await?;
        self.remember(digest, bytes.clone());
        Ok(bytes)
    }

    async fn store(&self, digest: &str, bytes: &Bytes) -> Result<(), CacheError> {
        let path = self.dir.join(digest);
        let tmp = self.dir.join(format!(".{digest}.{:08x}", rand::random::<u32>()));
        let io = |source| CacheError::Io { path: path.clone(), source };
        tokio::fs::write(&tmp, bytes).await.map_err(io)?;
        tokio::fs::rename(&tmp, &path).await.map_err(io)?;
        let victims = {
            let mut disk = self.disk.lock();
            disk.touch(digest, bytes.len() as u64);
            let mut victims = Vec::new();
            while disk.total > self.max_bytes {
                let Some(old) = disk.oldest() else { break };
                if old == digest {
                    break;
                }
                if let Some((size, _)) = disk.entries.get(&old) {
                    self.stats.evicted_bytes.fetch_add(*size, Ordering::Relaxed);
                }
                disk.remove(&old);
                victims.push(old);
            }
            victims
        };
        for v in victims {
            let _ = tokio::fs::remove_file(self.dir.join(v)).await;
        }
        Ok(())
    }

    fn remember(&self, digest: &str, bytes: Bytes) {
        let mut mem = self.memory.lock();
        if mem.map.contains_key(digest) || bytes.len() > self.memory_max {
            return;
        }
        mem.bytes += bytes.len();
        mem.map.insert(digest.to_string(), bytes);
        mem.order.push_back(digest.to_string());
        while mem.bytes > self.memory_max {
            let Some(old) = mem.order.pop_front() else { break };
            if let Some(b) = mem.map.remove(&old) {
                mem.bytes -= b.len();
            }
        }
    }

    /// Forgets every chunk (memory and disk): the next reads are cold.
    pub fn clear(&self) {
        let digests: Vec<String> = {
            let mut disk = self.disk.lock();
            let all = disk.entries.keys().cloned().collect();
            *disk = DiskLru::default();
            all
        };
        *self.memory.lock() = MemoryLru::default();
        for d in digests {
            let _ = std::fs::remove_file(self.dir.join(d));
        }
    }
}
