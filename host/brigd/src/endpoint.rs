//! `endpoint.json`: how local clients find a running daemon (address, certificate fingerprint).
//! Written once the daemon listens, removed on clean shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "endpoint.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub cert_sha256: String,
    pub cert_path: PathBuf,
    pub protocol: u16,
    pub pid: u32,
    /// Where the Prometheus metrics are served (`GET /metrics`), if they are.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// Where the E2B-compatible API is served (`E2B_API_URL`, `E2B_SANDBOX_URL`), if it is.
    #[serde(default)]
    pub e2b: Option<SocketAddr>,
    /// The E2B debug layout's envd listener, if it is served.
    #[serde(default)]
    pub e2b_envd: Option<SocketAddr>,
}

impl Endpoint {
    pub fn write(&self, state_dir: &Path) -> anyhow::Result<()> {
        let tmp = state_dir.join(format!("{FILE_NAME}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, state_dir.join(FILE_NAME))?;
        Ok(())
    }

    pub fn remove(state_dir: &Path) {
        let _ = std::fs::remove_file(state_dir.join(FILE_NAME));
    }
}
