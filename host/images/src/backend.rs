//! Where chunks and layer metadata live: a local directory (the embedded default) or any
//! S3-compatible object store, both through the `object_store` crate.
//!
//! ```text
//! chunks/<sha256>            one store chunk (≤ 256 KiB), named by the digest of its bytes
//! layers/<digest>.meta       a layer's EROFS meta image
//! layers/<digest>.json       a layer's record (chunk list), so other nodes can use it
//! ```

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("blob {0} is missing from the backend")]
    Missing(String),
    #[error("backend {kind} failed on {key}")]
    Store {
        kind: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("cannot open backend: {0}")]
    Config(String),
}

/// S3 connection settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    pub endpoint: String,
    pub bucket: String,
    #[serde(default = "default_region")]
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Path-style URLs (`endpoint/bucket/key`), as most S3-compatible servers want.
    #[serde(default = "yes")]
    pub path_style: bool,
}

fn default_region() -> String {
    "us-east-1".into()
}
fn yes() -> bool {
    true
}

/// Where a backend is, in a form another process can be given (the lazy file system's server).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum BackendSpec {
    /// A directory on this machine.
    Local { dir: std::path::PathBuf },
    /// An S3-compatible object store.
    S3(S3Config),
}

/// A blob backend.
#[derive(Clone)]
pub struct Backend {
    store: Arc<dyn ObjectStore>,
    kind: &'static str,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("kind", &self.kind).finish()
    }
}

impl Backend {
    /// Opens the backend `spec` names.
    pub fn open(spec: &BackendSpec) -> Result<Backend, BackendError> {
        match spec {
            BackendSpec::Local { dir } => Backend::local(dir),
            BackendSpec::S3(config) => Backend::s3(config),
        }
    }

    /// A directory on this machine.
    pub fn local(dir: &std::path::Path) -> Result<Backend, BackendError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| BackendError::Config(format!("{}: {e}", dir.display())))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| BackendError::Config(e.to_string()))?;
        Ok(Backend { store: Arc::new(store), kind: "local" })
    }

    /// An S3-compatible object store.
    pub fn s3(config: &S3Config) -> Result<Backend, BackendError> {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(!config.path_style)
            .build()
            .map_err(|e| BackendError::Config(e.to_string()))?;
        Ok(Backend { store: Arc::new(store), kind: "s3" })
    }

    pub fn kind(&self) -> &'static str {
        self.kind
    }

    fn err(&self, key: &str) -> impl FnOnce(object_store::Error) -> BackendError + '_ {
        let key = key.to_string();
        move |source| match source {
            object_store::Error::NotFound { .. } => BackendError::Missing(key),
            source => BackendError::Store { kind: self.kind, key, source },
        }
    }

    /// Stores `bytes` under `key` unless something is there already (content-addressed keys
    /// make that something identical). Returns whether it wrote.
    pub async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<bool, BackendError> {
        if self.exists(key).await? {
            return Ok(false);
        }
        self.put(key, bytes).await?;
        Ok(true)
    }

    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), BackendError> {
        self.store
            .put(&StorePath::from(key), PutPayload::from(bytes))
            .await
            .map_err(self.err(key))?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Bytes, BackendError> {
        let got = self.store.get(&StorePath::from(key)).await.map_err(self.err(key))?;
        got.bytes().await.map_err(self.err(key))
    }

    pub async fn exists(&self, key: &str) -> Result<bool, BackendError> {
        match self.store.head(&StorePath::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err(key)(e)),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), BackendError> {
        match self.store.delete(&StorePath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(key)(e)),
        }
    }

    /// Keys under `prefix` with their sizes.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, BackendError> {
        let p = StorePath::from(prefix);
        let mut stream = self.store.list(Some(&p));
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item.map_err(self.err(prefix))?;
            out.push((meta.location.to_string(), meta.size));
        }
        Ok(out)
    }
}

/// Backend key of a chunk.
pub fn chunk_key(digest: &str) -> String {
    format!("chunks/{digest}")
}
