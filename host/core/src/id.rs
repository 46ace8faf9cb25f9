//! Identifiers. A sandbox id names the node that owns it, so any control-plane replica can route
//! a request without keeping per-sandbox state (as DSec and E2B do).
//!
//! ```text
//! sb-0000002a-9f3c1e0b7a6d5c4e
//!    └ node ┘ └─── random ───┘   (lowercase hex, 8 + 16 digits)
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A node in a cluster; the all-in-one daemon is node 0 unless configured otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId {
    node: NodeId,
    local: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a sandbox id (expected sb-<8 hex>-<16 hex>)")]
pub struct IdError(pub String);

impl SandboxId {
    /// A fresh random id on `node`.
    pub fn generate(node: NodeId) -> SandboxId {
        SandboxId { node, local: rand::random::<u64>() }
    }

    pub fn node(&self) -> NodeId {
        self.node
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sb-{}-{:016x}", self.node, self.local)
    }
}

impl FromStr for SandboxId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        let err = || IdError(s.chars().take(64).collect());
        let rest = s.strip_prefix("sb-").ok_or_else(err)?;
        let (node, local) = rest.split_once('-').ok_or_else(err)?;
        let hex = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !hex(node, 8) || !hex(local, 16) {
            return Err(err());
        }
        Ok(SandboxId {
            node: NodeId(u32::from_str_radix(node, 16).map_err(|_| err())?),
            local: u64::from_str_radix(local, 16).map_err(|_| err())?,
        })
    }
}

impl TryFrom<String> for SandboxId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_carries_node() {
        let id = SandboxId::generate(NodeId(42));
        let parsed: SandboxId = id.to_string().parse().expect("parse");
        assert_eq!(parsed, id);
        assert_eq!(parsed.node(), NodeId(42));
        assert!(id.to_string().starts_with("sb-0000002a-"));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "sb-",
            "sb-1-2",
            "sb-0000002a-XYZ",
            "../etc/passwd",
            "sb-0000002A-0000000000000000",
        ] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad}");
        }
    }
}
