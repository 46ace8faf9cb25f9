//! Brig's layer store: independently versioned, content-addressed layers (base, workspace,
//! toolkit), composed at sandbox creation, with file data loaded on demand.
//!
//! ```text
//! import (dir | tar | OCI | EROFS | container upper)
//!   └▶ staging tree ─▶ mkfs.erofs --blobdev ─▶ meta image (node-local)  +  data blob
//!                                              └▶ re-laid into 256 KiB chunks ─▶ backend
//! sandbox create: layer refs ─▶ meta image + lazy blob file (FUSE) ─▶ EROFS mount
//!                                              └▶ chunk cache (bounded, verified) ◀─ backend
//! ```
//! Metadata stays on the node; chunks are named by their SHA-256 and shared by every layer
//! that contains them; a sandbox reads only the chunks it touches.
#![deny(unsafe_code)]

pub mod backend;
pub mod build;
pub mod cache;
pub mod catalog;
pub mod device_keeper;
pub mod erofs;
pub mod fuse_takeover;
pub mod layout;
pub mod lazy_server;
pub mod lazyfs;
pub mod oci;
mod recorded_process;
mod store;

pub use catalog::EnvConfig;
pub use store::{GcReport, ImportSource, LayerInfo, LayerStore, ResolvedLayer, StoreConfig};

/// Errors of the layer store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("layer name {0:?} is invalid (kind/name of [a-z0-9._-])")]
    BadName(String),
    #[error("layer reference {0:?} is invalid (name, name@version or sha256:<hex>)")]
    BadReference(String),
    #[error("no layer {0}")]
    NoLayer(String),
    #[error("no environment {0}")]
    NoEnv(String),
    #[error("{0} already names another layer")]
    VersionTaken(String),
    #[error("layer {0} is in use by a sandbox")]
    InUse(String),
    #[error("layer {layer} is damaged: {detail}")]
    Damaged { layer: String, detail: String },
    #[error(transparent)]
    Build(#[from] build::BuildError),
    #[error(transparent)]
    Backend(#[from] backend::BackendError),
    #[error(transparent)]
    Cache(#[from] cache::CacheError),
    #[error("image format: {0}")]
    Format(#[from] erofs::ErofsError),
    #[error(transparent)]
    Mount(#[from] lazyfs::MountError),
    #[error(transparent)]
    LazyServer(#[from] lazy_server::LazyServerError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}
