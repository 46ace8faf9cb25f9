//! The gateway's shared state: the API keys it serves (see [`crate::keys`]), the daemon's own
//! client for envd requests, the secret behind envd access tokens, and the routes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use brig_sdk::{Client, ConnectOptions};

use crate::connect::ConnectError;
use crate::keys::{KeyCheck, KeyError, Keys, Served};
use crate::E2bConfig;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("[e2b] configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the gateway's secret at {path}")]
    Secret {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// How long a sandbox seen running is taken to be running without asking again.
const RUNNING_FRESH: std::time::Duration = std::time::Duration::from_secs(2);
/// Most sandboxes remembered as recently running.
const RUNNING_REMEMBERED: usize = 1 << 16;

/// Sandboxes the gateway made, resumed or found running in the last [`RUNNING_FRESH`]: envd
/// requests to them skip the status round trip that tells a paused or gone sandbox (whose
/// requests must fail) from a running one. The gateway's own pause and kill forget at once;
/// a sandbox ended by its node inside the window fails its request with the node's error.
#[derive(Default)]
pub(crate) struct RecentlyRunning(parking_lot::Mutex<HashMap<String, std::time::Instant>>);

impl RecentlyRunning {
    pub(crate) fn mark(&self, id: &str) {
        let mut seen = self.0.lock();
        if seen.len() >= RUNNING_REMEMBERED {
            seen.retain(|_, at| at.elapsed() < RUNNING_FRESH);
            if seen.len() >= RUNNING_REMEMBERED {
                seen.clear();
            }
        }
        seen.insert(id.to_string(), std::time::Instant::now());
    }

    pub(crate) fn forget(&self, id: &str) {
        self.0.lock().remove(id);
    }

    pub(crate) fn fresh(&self, id: &str) -> bool {
        self.0.lock().get(id).is_some_and(|at| at.elapsed() < RUNNING_FRESH)
    }
}

/// The E2B gateway. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) inner: Arc<Inner>,
    /// Serving E2B's debug layout (the envd listener): `debug_sandbox_id` is the gateway's own
    /// debug sandbox and needs no access token, as a local envd would.
    pub(crate) debug_layout: bool,
}

pub(crate) struct Inner {
    pub(crate) config: E2bConfig,
    /// Where brigd listens and how to trust it (its own token for envd requests).
    connect: ConnectOptions,
    admin: tokio::sync::OnceCell<Client>,
    keys: Keys,
    key: ring::hmac::Key,
    pub(crate) processes: crate::process::Processes,
    pub(crate) watchers: crate::watch::Watchers,
    pub(crate) lifetimes: crate::api::Lifetimes,
    /// The sandbox behind `debug_sandbox_id` on the debug layout, made on first use.
    debug_sandbox: tokio::sync::Mutex<Option<String>>,
    /// Sandboxes seen running moments ago (see [`RecentlyRunning`]).
    pub(crate) running: RecentlyRunning,
    /// Each sandbox's share of the requests open to the node (`crate::budget`).
    pub(crate) budgets: crate::budget::SandboxBudgets,
    /// Images whose sandboxes were found to have E2B's `user` already (see `api::ensure_user`).
    pub(crate) images_with_user: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Templates built through the API, and their builds in progress.
    pub(crate) templates: crate::templates::Templates,
    pub(crate) template_builds: crate::template_builds::TemplateBuilds,
    pub(crate) facts: crate::facts::SandboxFacts,
    /// Owner and group names of each sandbox's files.
    pub(crate) owner_names: crate::owners::OwnerNames,
    /// Requests and connections open to each sandbox's ports.
    pub(crate) port_load: crate::ports::PortLoad,
    /// Held while the code-interpreter template is built (`crate::code_interpreter`).
    pub(crate) code_interpreter_build: tokio::sync::Mutex<()>,
    /// The port routes' pooled connections to sandbox ports, made on first use.
    pub(crate) port_client: tokio::sync::OnceCell<crate::ports::PortClient>,
    /// Lifecycle webhooks and their deliveries' counts (`crate::webhooks`).
    pub(crate) webhooks: crate::webhooks::Webhooks,
}

impl Gateway {
    /// A gateway in front of the brigd `connect` names (with the daemon's own access token),
    /// checking API keys as `keys` says; its token secret lives in `state_dir/e2b-secret`
    /// (made on first start, 0600).
    pub fn new(
        config: E2bConfig,
        connect: ConnectOptions,
        keys: KeyCheck,
        state_dir: &Path,
    ) -> Result<Gateway, GatewayError> {
        let secret = load_or_create_secret(&state_dir.join("e2b-secret"))?;
        let keys = Keys::new(keys, &connect.token);
        Ok(Gateway {
            debug_layout: false,
            inner: Arc::new(Inner {
                config,
                connect,
                admin: tokio::sync::OnceCell::new(),
                keys,
                key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
                processes: Default::default(),
                watchers: Default::default(),
                lifetimes: Default::default(),
                debug_sandbox: tokio::sync::Mutex::new(None),
                images_with_user: Default::default(),
                running: Default::default(),
                budgets: Default::default(),
                templates: crate::templates::Templates::open(state_dir),
                template_builds: Default::default(),
                facts: Default::default(),
                owner_names: Default::default(),
                port_load: Default::default(),
                code_interpreter_build: tokio::sync::Mutex::new(()),
                port_client: tokio::sync::OnceCell::new(),
                webhooks: crate::webhooks::Webhooks::open(state_dir),
            }),
        })
    }

    pub fn config(&self) -> &E2bConfig {
        &self.inner.config
    }

    /// Binds the configured listeners and serves until the process ends; returns the bound
    /// API address (and the debug-layout envd one), or `None` when the API is off.
    pub async fn start(&self) -> Result<(Option<SocketAddr>, Option<SocketAddr>), GatewayError> {
        let mut bound = (None, None);
        for (slot, addr) in
            [(0, self.inner.config.listen_addr()?), (1, self.inner.config.envd_listen_addr()?)]
        {
            let Some(addr) = addr else { continue };
            // A listener that cannot bind is reported and left out; the daemon serves on.
            let bound_listener = match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => l.local_addr().map(|local| (l, local)),
                Err(e) => Err(e),
            };
            let (listener, local) = match bound_listener {
                Ok(pair) => pair,
                Err(source) => {
                    let e = GatewayError::Bind { addr, source };
                    tracing::error!(error = %e, "the E2B-compatible API is not served there");
                    continue;
                }
            };
            let router = Gateway { debug_layout: slot == 1, ..self.clone() }.router();
            tokio::spawn(crate::serve::serve(listener, router, local));
            tracing::info!(%local, "E2B-compatible API on http://{local}");
            if slot == 0 {
                bound.0 = Some(local);
            } else {
                bound.1 = Some(local);
            }
        }
        self.spawn_lifetime_keeper();
        if bound.0.is_some() {
            crate::webhooks::spawn_dispatcher(self.clone());
        }
        Ok(bound)
    }

    /// Every route of both halves (control API and envd) on one router.
    pub fn router(&self) -> Router {
        // envd's routes, each request within its sandbox's share (see `crate::budget`).
        let envd = Router::new()
            .route("/process.Process/{method}", post(crate::process::rpc))
            .route("/filesystem.Filesystem/{method}", post(crate::filesystem::rpc))
            .route(
                "/files",
                get(crate::files::download)
                    .post(crate::files::upload)
                    .layer(DefaultBodyLimit::disable()),
            )
            .route_layer(axum::middleware::from_fn_with_state(
                self.clone(),
                crate::budget::per_sandbox,
            ));
        Router::new()
            .route("/health", get(crate::envd::health))
            .merge(crate::api::routes())
            .merge(crate::volumes::routes())
            .merge(envd)
            // A sandbox's own ports first: those requests never reach the routes above.
            .layer(axum::middleware::from_fn_with_state(self.clone(), crate::ports::route))
            .with_state(self.clone())
    }

    /// The Brig client for an API key (checked first; see [`crate::keys`]), or why there is
    /// none. A refused key allocates nothing.
    pub(crate) async fn client_for_key(&self, key: &str) -> Result<Client, KeyError> {
        match self.inner.keys.serve(key, &self.inner.connect).await? {
            Served::Own(client) => Ok(client),
            Served::Admin => self
                .inner
                .admin
                .get_or_try_init(|| Client::connect(self.inner.connect.clone()))
                .await
                .cloned()
                .map_err(|e| KeyError::Unavailable(e.to_string())),
        }
    }

    /// The daemon's own client, for envd requests (authorized by their access token).
    pub(crate) async fn admin(&self) -> Result<Client, ConnectError> {
        self.inner
            .admin
            .get_or_try_init(|| Client::connect(self.inner.connect.clone()))
            .await
            .cloned()
            .map_err(|e| {
                ConnectError::new(crate::connect::Code::Unavailable, format!("brigd: {e}"))
            })
    }

    /// The sandbox E2B's debug layout calls `debug_sandbox_id` (what a local envd would be):
    /// made from the `base` template on first use, and again if it is gone.
    pub(crate) async fn debug_sandbox(&self) -> Result<String, ConnectError> {
        let mut slot = self.inner.debug_sandbox.lock().await;
        let admin = self.admin().await?;
        if let Some(id) = slot.as_ref() {
            if admin.sandbox(id).status().await.is_ok() {
                return Ok(id.clone());
            }
        }
        let id = crate::api::create_debug_sandbox(self, &admin).await?;
        *slot = Some(id.clone());
        Ok(id)
    }

    /// The debug layout's sandbox, if one was made.
    pub(crate) async fn current_debug_sandbox(&self) -> Option<String> {
        self.inner.debug_sandbox.lock().await.clone()
    }

    /// The envd access token of sandbox `id`.
    pub(crate) fn envd_token(&self, id: &str) -> String {
        hex::encode(ring::hmac::sign(&self.inner.key, id.as_bytes()).as_ref())
    }

    /// Sandbox `id`'s traffic access token (its private ports need it).
    pub(crate) fn traffic_token(&self, id: &str) -> String {
        self.envd_token(&format!("traffic/{id}"))
    }

    /// Whether `token` is sandbox `id`'s envd access token (compared in constant time).
    pub(crate) fn envd_token_ok(&self, id: &str, token: &str) -> bool {
        hex::decode(token.trim())
            .map(|tag| ring::hmac::verify(&self.inner.key, id.as_bytes(), &tag).is_ok())
            .unwrap_or(false)
    }
}

/// A header's value as text (`None` when absent or not text).
pub(crate) fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn load_or_create_secret(path: &Path) -> Result<[u8; 32], GatewayError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| GatewayError::Secret { path: path.display().to_string(), source };
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() == 32 => {
            let mut secret = [0u8; 32];
            secret.copy_from_slice(&bytes);
            return Ok(secret);
        }
        Ok(_) => {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not 32 bytes; remove it to make a new one (outstanding envd tokens end)",
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let mut secret = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .map_err(|_| err(std::io::Error::other("no system randomness")))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    file.write_all(&secret).map_err(err)?;
    Ok(secret)
}
