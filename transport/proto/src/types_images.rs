//! The layer store and node status.

use serde::{Deserialize, Serialize};

use crate::Tier;

/// Format of an imported layer.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// A directory tree (only with `node_path`; clients upload directories as tar).
    Dir,
    /// A tarball, plain or compressed.
    Tar,
    /// An OCI image layout or a `docker save` archive (directory or tarball).
    Oci,
    /// A self-contained EROFS image.
    Erofs,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ImageImportRequest {
    /// `kind/name`, e.g. `toolkit/harness`.
    pub name: String,
    /// `None` takes the next version.
    pub version: Option<u32>,
    pub format: ImageFormat,
    /// Import from this path on the node instead of an upload (operators).
    pub node_path: Option<String>,
}

/// Pull `reference` (`python:3.12-slim`, `ghcr.io/org/img@sha256:…`, `localhost:5000/x:tag`)
/// from its registry: each image layer becomes a layer of the store, the image an environment.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ImagePullRequest {
    pub reference: String,
    /// The environment's name; `None`: `pulled/<reference>`.
    pub name: Option<String>,
    /// Send [`PullProgress`] replies while it runs, before the `Pulled` one.
    pub progress: bool,
}

/// How far a pull is, layer by layer (bottom first; empty until the manifest is read). Sent
/// before the final reply of a pull or of a create that pulls, when the request asks for it;
/// each is the whole state, so a client may skip any of them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PullProgress {
    pub reference: String,
    pub layers: Vec<PullLayerProgress>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PullLayerProgress {
    /// The layer blob's digest.
    pub digest: String,
    /// Its compressed size.
    pub size: u64,
    pub downloaded: u64,
    pub state: PullLayerState,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullLayerState {
    Waiting,
    Downloading,
    /// Downloaded and checked; being turned into a layer.
    Converting,
    /// The store had it: nothing downloaded.
    Reused,
    Done,
}

impl PullProgress {
    /// Compressed bytes downloaded so far and to download in all (reused layers left out).
    pub fn bytes(&self) -> (u64, u64) {
        let fetched = self.layers.iter().filter(|l| l.state != PullLayerState::Reused);
        fetched.fold((0, 0), |(done, all), l| (done + l.downloaded, all + l.size))
    }
}

/// What a pull made: `env:<name>` creates sandboxes from it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PulledImage {
    pub name: String,
    pub manifest_digest: String,
    /// Bottom first.
    pub layers: Vec<PulledLayer>,
    /// Compressed bytes downloaded.
    pub downloaded_bytes: u64,
    /// The image's own settings (`Env`, `Cmd`, `Entrypoint`, `WorkingDir`, `User`).
    pub env: Vec<String>,
    pub cmd: Vec<String>,
    pub entrypoint: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PulledLayer {
    /// The store's layer (`oci/<hex of the diff digest>`).
    pub layer: String,
    pub diff_id: String,
    /// It was in the store already: nothing downloaded.
    pub reused: bool,
    pub downloaded_bytes: u64,
}

/// A layer in the store.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
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
    /// Chunks the import added to the backend (the rest were already stored).
    pub new_chunks: u64,
}

/// Turn a sandbox's writable layer into a new layer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointRequest {
    pub sandbox: String,
    pub name: String,
    pub version: Option<u32>,
    /// Paths removed before packing (answers, secrets, caches).
    pub scrub: Vec<String>,
}

/// What a node reports about itself.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStatus {
    pub node_id: u32,
    pub tiers: Vec<Tier>,
    pub sandboxes: u64,
    pub images: Option<ImageStats>,
    pub capacity: NodeCapacity,
    /// Resident memory of the daemon process itself (brigd), in bytes.
    pub daemon_rss_bytes: u64,
    /// The node's own compressed swap, if it has one.
    pub swap: Option<SwapStatus>,
}

/// Something on a node's host that belongs to no sandbox the node has.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct StrayObject {
    /// `container`, `vm`, `link`, `record`, `intent` or `temporary file`.
    pub kind: String,
    /// The sandbox (or link, or file) it is named for.
    pub name: String,
    /// What was found, one line each (`cgroup /sys/fs/…`, `mount …`, `process 123 (sh)`).
    pub parts: Vec<String>,
    /// Removed by this request.
    pub removed: bool,
}

/// A node's zram swap device: what it holds and what that costs in RAM.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct SwapStatus {
    pub device: String,
    pub size_bytes: u64,
    /// Uncompressed bytes swapped out to it.
    pub stored_bytes: u64,
    /// RAM it uses for them (compressed, allocator overhead included).
    pub ram_used_bytes: u64,
}

/// What a node has, what its sandboxes ask for and what they use; the admission bounds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeCapacity {
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    /// Memory limits of the node's containers, summed.
    pub memory_requested_bytes: u64,
    /// Memory charged to the node's containers now.
    pub working_set_bytes: u64,
    pub containers: u64,
    pub cpus: u64,
    pub cpu_requested_millis: u64,
    pub memory_overcommit_pct: u64,
    pub cpu_overcommit_pct: u64,
    pub min_free_bytes: u64,
    /// Sandboxes per CPU QoS class.
    pub latency_sensitive: u64,
    pub best_effort: u64,
}

/// Layer store counters.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageStats {
    pub backend: String,
    pub fetched_bytes: u64,
    pub fetched_chunks: u64,
    pub cache_bytes: u64,
    pub corrupt_chunks: u64,
}
