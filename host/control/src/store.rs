//! Durable cluster state: the signing key, access grants and projects. Control-plane replicas
//! keep no per-sandbox state; this is all they share. In a cluster it lives in etcd (a
//! replicated store we do not have to write); in the all-in-one default, in a local JSON file.
//!
//! ```text
//! etcd key                      value
//! /brig/signing-key             hex PKCS#8 Ed25519 key (first replica to start creates it)
//! /brig/grants/<sha256(token)>  {"project": "team/a" | null, "admin": bool}
//! /brig/projects/<name>         {"max_live": n | null, "max_creates_per_sec": n | null}
//! /brig/replicas/<id>           replica address, under a 5 s lease (counts live replicas)
//! ```
//! Access tokens are stored only as their SHA-256, so reading the store does not reveal them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use brig_proto::ProjectLimits;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const KEY: &str = "/brig/signing-key";
const GRANTS: &str = "/brig/grants/";
const PROJECTS: &str = "/brig/projects/";
const REPLICAS: &str = "/brig/replicas/";
/// How long a replica stays counted after its last lease renewal.
const REPLICA_LEASE_SECS: i64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cluster state file {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster state file {0} is not valid JSON")]
    Corrupt(PathBuf, #[source] serde_json::Error),
    #[error("etcd at {endpoints}")]
    Etcd {
        endpoints: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("etcd value under {0} is malformed")]
    BadValue(String),
}

/// What an access token admits its holder to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The project its sandboxes are charged to; `None` for the root (admin) project.
    pub project: Option<String>,
    /// May manage projects, tokens, tools and images, and act for nodes.
    pub admin: bool,
}

/// Everything the store holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    pub signing_key: Option<String>,
    pub grants: BTreeMap<String, Grant>,
    pub projects: BTreeMap<String, ProjectLimits>,
}

/// SHA-256 of a token's secret, hex: how grants are keyed (`e2b_<hex>` and `<hex>` are one
/// token).
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(brig_proto::hello::token_secret(token).as_bytes()))
}

/// Where the cluster state lives.
#[derive(Clone)]
pub enum StateStore {
    File(PathBuf, std::sync::Arc<tokio::sync::Mutex<()>>),
    Etcd { client: Box<etcd_client::Client>, endpoints: String },
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateStore::File(path, _) => write!(f, "file {}", path.display()),
            StateStore::Etcd { endpoints, .. } => write!(f, "etcd {endpoints}"),
        }
    }
}

impl StateStore {
    pub fn file(path: &Path) -> StateStore {
        StateStore::File(path.to_owned(), Default::default())
    }

    pub async fn etcd(endpoints: &[String]) -> Result<StateStore, StoreError> {
        let joined = endpoints.join(",");
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(3))
            .with_timeout(std::time::Duration::from_secs(5));
        let client = etcd_client::Client::connect(endpoints, Some(opts))
            .await
            .map_err(|source| StoreError::Etcd { endpoints: joined.clone(), source })?;
        Ok(StateStore::Etcd { client: Box::new(client), endpoints: joined })
    }

    fn etcd_err(endpoints: &str) -> impl FnOnce(etcd_client::Error) -> StoreError + '_ {
        move |source| StoreError::Etcd { endpoints: endpoints.to_string(), source }
    }

    /// The whole state (replicas refresh their cache with it).
    pub async fn load(&self) -> Result<ClusterState, StoreError> {
        match self {
            StateStore::File(path, _) => read_file(path),
            StateStore::Etcd { client, endpoints } => {
                let mut c = (**client).clone();
                let resp = c
                    .get("/brig/", Some(GetOptions::new().with_prefix()))
                    .await
                    .map_err(Self::etcd_err(endpoints))?;
                let mut state = ClusterState::default();
                for kv in resp.kvs() {
                    let key = kv.key_str().map_err(|_| StoreError::BadValue("key".into()))?;
                    let bad = || StoreError::BadValue(key.to_string());
                    if key == KEY {
                        state.signing_key = Some(kv.value_str().map_err(|_| bad())?.to_string());
                    } else if let Some(hash) = key.strip_prefix(GRANTS) {
                        let grant = serde_json::from_slice(kv.value()).map_err(|_| bad())?;
                        state.grants.insert(hash.to_string(), grant);
                    } else if let Some(name) = key.strip_prefix(PROJECTS) {
                        let limits = serde_json::from_slice(kv.value()).map_err(|_| bad())?;
                        state.projects.insert(name.to_string(), limits);
                    }
                }
                Ok(state)
            }
        }
    }

    /// The cluster's signing key; the first caller's `fresh` key wins, atomically.
    pub async fn signing_key_or_init(&self, fresh: &[u8]) -> Result<Vec<u8>, StoreError> {
        let fresh_hex = hex::encode(fresh);
        let stored = match self {
            StateStore::File(path, lock) => {
                let _guard = lock.lock().await;
                let mut state = read_file(path)?;
                let key = state.signing_key.get_or_insert(fresh_hex).clone();
                write_file(path, &state)?;
                key
            }
            StateStore::Etcd { client, endpoints } => {
                let mut c = (**client).clone();
                let txn = Txn::new()
                    .when([Compare::create_revision(KEY, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(KEY, fresh_hex.clone(), None)])
                    .or_else([TxnOp::get(KEY, None)]);
                let resp = c.txn(txn).await.map_err(Self::etcd_err(endpoints))?;
                if resp.succeeded() {
                    fresh_hex
                } else {
                    let existing = resp.op_responses().into_iter().find_map(|op| match op {
                        TxnOpResponse::Get(get) => {
                            get.kvs().first().and_then(|kv| kv.value_str().ok().map(str::to_string))
                        }
                        _ => None,
                    });
                    existing.ok_or_else(|| StoreError::BadValue(KEY.into()))?
                }
            }
        };
        hex::decode(&stored).map_err(|_| StoreError::BadValue(KEY.into()))
    }

    /// One grant, read through (a token another replica just made).
    pub async fn grant(&self, hash: &str) -> Result<Option<Grant>, StoreError> {
        match self {
            StateStore::File(path, _) => Ok(read_file(path)?.grants.get(hash).cloned()),
            StateStore::Etcd { client, endpoints } => {
                let key = format!("{GRANTS}{hash}");
                let resp = (**client).clone().get(key.clone(), None).await;
                let resp = resp.map_err(Self::etcd_err(endpoints))?;
                match resp.kvs().first() {
                    Some(kv) => serde_json::from_slice(kv.value())
                        .map(Some)
                        .map_err(|_| StoreError::BadValue(key)),
                    None => Ok(None),
                }
            }
        }
    }

    pub async fn put_grant(&self, hash: &str, grant: &Grant) -> Result<(), StoreError> {
        let json = serde_json::to_string(grant).unwrap_or_default();
        self.put(GRANTS, hash, json, |state| {
            state.grants.insert(hash.to_string(), grant.clone());
        })
        .await
    }

    pub async fn put_project(&self, name: &str, limits: &ProjectLimits) -> Result<(), StoreError> {
        let json = serde_json::to_string(limits).unwrap_or_default();
        self.put(PROJECTS, name, json, |state| {
            state.projects.insert(name.to_string(), *limits);
        })
        .await
    }

    async fn put(
        &self,
        prefix: &str,
        name: &str,
        json: String,
        in_file: impl FnOnce(&mut ClusterState),
    ) -> Result<(), StoreError> {
        match self {
            StateStore::File(path, lock) => {
                let _guard = lock.lock().await;
                let mut state = read_file(path)?;
                in_file(&mut state);
                write_file(path, &state)
            }
            StateStore::Etcd { client, endpoints } => {
                let mut c = (**client).clone();
                c.put(format!("{prefix}{name}"), json, None)
                    .await
                    .map_err(Self::etcd_err(endpoints))?;
                Ok(())
            }
        }
    }

    /// Announces this replica for as long as the returned task runs; its key vanishes within
    /// seconds of the replica dying.
    pub async fn announce_replica(
        &self,
        id: &str,
        addr: &str,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, StoreError> {
        let StateStore::Etcd { client, endpoints } = self else { return Ok(None) };
        let mut c = (**client).clone();
        let lease =
            c.lease_grant(REPLICA_LEASE_SECS, None).await.map_err(Self::etcd_err(endpoints))?.id();
        c.put(format!("{REPLICAS}{id}"), addr, Some(PutOptions::new().with_lease(lease)))
            .await
            .map_err(Self::etcd_err(endpoints))?;
        let (mut keeper, _stream) =
            c.lease_keep_alive(lease).await.map_err(Self::etcd_err(endpoints))?;
        Ok(Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Err(e) = keeper.keep_alive().await {
                    tracing::warn!(error = %e, "replica lease renewal failed");
                }
            }
        })))
    }

    /// Control-plane replicas alive now (1 without etcd).
    pub async fn replica_count(&self) -> Result<usize, StoreError> {
        let StateStore::Etcd { client, endpoints } = self else { return Ok(1) };
        let resp = (**client)
            .clone()
            .get(REPLICAS, Some(GetOptions::new().with_prefix().with_count_only()))
            .await
            .map_err(Self::etcd_err(endpoints))?;
        Ok(usize::try_from(resp.count()).unwrap_or(1).max(1))
    }
}

fn read_file(path: &Path) -> Result<ClusterState, StoreError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(path.to_owned(), e))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClusterState::default()),
        Err(source) => Err(StoreError::File { path: path.to_owned(), source }),
    }
}

/// Writes via a temporary file and rename, mode 0600 (it names the signing key).
fn write_file(path: &Path, state: &ClusterState) -> Result<(), StoreError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| StoreError::File { path: path.to_owned(), source };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(&serde_json::to_vec_pretty(state).unwrap_or_default()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_store_keeps_the_first_key_and_grants() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = StateStore::file(&dir.path().join("cluster.json"));
        let first = store.signing_key_or_init(b"first").await.expect("init");
        assert_eq!(first, b"first");
        assert_eq!(store.signing_key_or_init(b"second").await.expect("again"), b"first");
        let grant = Grant { project: Some("team/a".into()), admin: false };
        store.put_grant(&token_hash("t"), &grant).await.expect("grant");
        assert_eq!(store.grant(&token_hash("t")).await.expect("read"), Some(grant));
        assert_eq!(store.grant(&token_hash("u")).await.expect("read"), None);
        let limits = ProjectLimits { max_live: Some(3), max_creates_per_sec: None };
        store.put_project("team", &limits).await.expect("project");
        assert_eq!(store.load().await.expect("load").projects.get("team"), Some(&limits));
        assert_eq!(store.replica_count().await.expect("count"), 1);
    }
}
