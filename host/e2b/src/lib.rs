//! E2B-compatible API for Brig. Code written for E2B's SDKs (`e2b` on PyPI and npm) runs on
//! Brig unchanged: point `E2B_API_URL` and `E2B_SANDBOX_URL` at this server and put a Brig
//! access token in `E2B_API_KEY`.
//!
//! One HTTP server (axum; HTTP/1.1 and h2c) serves both halves of E2B's contract:
//! - the control API (`spec/openapi.yml` of e2b-dev/E2B: create, list, get, kill, pause,
//!   connect/resume, timeout, fork, snapshots, network, metrics) in [`api`];
//! - envd, what runs "inside" an E2B sandbox, routed by the `E2b-Sandbox-Id` header: the Connect
//!   RPC services `process.Process` ([`process`]) and `filesystem.Filesystem` ([`filesystem`]),
//!   and the HTTP `/files` and `/health` ([`files`]).
//!
//! The gateway is a client of brigd like any other: every operation is a Brig SDK call over
//! QUIC, made with the caller's own access token (so project-scoped tokens keep their scope).
//! envd requests carry no API key; they carry the per-sandbox `envdAccessToken` the create or
//! connect answer handed out (an HMAC of the sandbox id under the gateway's secret), and are then
//! served with the daemon's own token.
#![forbid(unsafe_code)]

pub mod api;
mod api_more;
mod auto_resume;
mod budget;
mod code_interpreter;
pub mod connect;
pub mod envd;
mod events;
mod facts;
pub mod files;
mod files_only_pause;
pub mod filesystem;
mod gateway;
pub mod keys;
pub mod limits;
mod listing;
mod owners;
mod ports;
pub mod process;
mod serve;
mod template_builds;
mod templates;
mod volumes;
pub mod watch;
mod watch_live;
pub mod webhook_targets;
pub mod webhooks;

use std::collections::BTreeMap;
use std::net::SocketAddr;

pub use gateway::{Gateway, GatewayError};
pub use keys::KeyCheck;

/// The `[e2b]` section of brigd's configuration.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct E2bConfig {
    /// Where the API (control and envd) is served; `off` serves none.
    pub listen: String,
    /// A second listener for E2B's debug layout (`E2B_DEBUG=true`: envd on port 49983 of the
    /// API's host), serving the same routes; `off` serves none.
    pub envd_listen: String,
    /// Template id → Brig image (a layer stack or `env:NAME`).
    pub templates: BTreeMap<String, String>,
    /// A metadata key whose value names the image directly (self-hosted E2B gateways let
    /// `metadata={KEY: IMAGE}` choose it; slime's E2B backend does so).
    pub image_metadata_key: Option<String>,
    /// Sandbox lifetime when a create names none (seconds; E2B's default is 300).
    pub default_timeout_s: u64,
    /// Longest lifetime a create or `set_timeout` may ask for (seconds).
    pub max_timeout_s: u64,
    /// Memory limit of each sandbox (MiB), reported as `memoryMB`.
    pub memory_mib: u64,
    /// CPU of each sandbox (thousandths of a core), reported as `cpuCount`.
    pub cpu_millis: u64,
    /// Writable-layer size of each sandbox (MiB), reported as `diskSizeMB`.
    pub disk_mib: u64,
    /// Where webhooks may be delivered: `public` addresses only (the default), `private`
    /// networks too, or `any` (see [`webhook_targets`]).
    pub webhook_targets: webhook_targets::WebhookTargets,
}

impl Default for E2bConfig {
    fn default() -> Self {
        E2bConfig {
            listen: "127.0.0.1:3000".into(),
            envd_listen: "off".into(),
            templates: BTreeMap::from([("base".to_string(), "debian-12".to_string())]),
            image_metadata_key: None,
            default_timeout_s: 300,
            max_timeout_s: 24 * 3600,
            memory_mib: 1024,
            cpu_millis: 2000,
            disk_mib: 1024,
            webhook_targets: Default::default(),
        }
    }
}

impl E2bConfig {
    /// The API listener's address, `None` when it is off.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, GatewayError> {
        parse_listen(&self.listen)
    }

    /// The debug-layout envd listener's address, `None` when it is off.
    pub fn envd_listen_addr(&self) -> Result<Option<SocketAddr>, GatewayError> {
        parse_listen(&self.envd_listen)
    }
}

fn parse_listen(text: &str) -> Result<Option<SocketAddr>, GatewayError> {
    match text.trim() {
        "" | "off" => Ok(None),
        addr => addr
            .parse()
            .map(Some)
            .map_err(|e| GatewayError::Config(format!("listen address {addr:?}: {e}"))),
    }
}

/// The version of envd this gateway behaves as: every feature the SDK gates on a version
/// (default user, octet-stream uploads, stdin closing, watch options) is on.
pub const ENVD_VERSION: &str = "0.6.4";
/// envd's port in E2B's URLs and headers.
pub const ENVD_PORT: u16 = 49983;

/// The generated envd messages (prost types with ProtoJSON serde).
pub mod pb {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod process {
        include!(concat!(env!("OUT_DIR"), "/process.rs"));
        include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
    }
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod filesystem {
        include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
        include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
    }
}
