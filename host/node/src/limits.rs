//! Per-client bounds: how many sessions and execs a sandbox keeps, how many requests one client
//! connection has open, how many clients follow audit trails, and how much a streamed exec's
//! stdin carries. Reaching one is [`NodeError::Limit`] (`QuotaExceeded` on the wire, not
//! retryable) for that client; everyone else carries on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::NodeError;

/// The `[limits]` section of the node configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Open sessions per sandbox.
    pub sessions_per_sandbox: usize,
    /// Execs a sandbox keeps at once, running or finished and still attachable (each keeps up
    /// to 8 MiB of output). At the limit the oldest finished exec is forgotten to make room; a
    /// sandbox whose kept execs all still run gets the error.
    pub execs_per_sandbox: usize,
    /// Requests open at once on one client connection (below QUIC's stream limit, so a client
    /// over it hears why instead of waiting).
    pub streams_per_connection: usize,
    /// Clients following audit trails at once, on the whole node.
    pub audit_followers: usize,
    /// Clients following the lifecycle journal at once (each E2B gateway's webhook
    /// dispatcher is one), on the whole node.
    pub event_followers: usize,
    /// Directory watches one sandbox has at once (each is a process of the sandbox).
    pub watches_per_sandbox: usize,
    /// Bytes one exec's streamed stdin may carry; past it the command's stdin is closed.
    pub exec_stdin_bytes: u64,
    /// File operations of one sandbox under way at once on the node's blocking pool (see
    /// `file_work`): a sandbox whose files hang holds at most this many threads.
    pub file_ops_per_sandbox: usize,
    /// File operations under way at once on the whole node.
    pub file_ops_per_node: usize,
    /// How long one file operation (an open, a chunk of a transfer, a listing) may take before
    /// its request answers with an error.
    pub file_op_deadline_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            sessions_per_sandbox: 64,
            execs_per_sandbox: 256,
            streams_per_connection: 8192,
            audit_followers: 256,
            event_followers: 64,
            watches_per_sandbox: 16,
            exec_stdin_bytes: 16 << 30,
            file_ops_per_sandbox: 8,
            file_ops_per_node: 128,
            file_op_deadline_ms: 30_000,
        }
    }
}

/// Which of the `[limits]` a client reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    SessionsPerSandbox,
    ExecsPerSandbox,
    AuditFollowers,
    EventFollowers,
    WatchesPerSandbox,
    ExecStdinBytes,
    FileOpsPerSandbox,
    FileOpsPerNode,
}

impl Limit {
    /// What is counted, as a client reads it.
    pub fn what(self) -> &'static str {
        match self {
            Limit::SessionsPerSandbox => "open sessions per sandbox",
            Limit::ExecsPerSandbox => "running or kept execs per sandbox",
            Limit::AuditFollowers => "clients following audit trails on this node",
            Limit::EventFollowers => "clients following lifecycle events on this node",
            Limit::WatchesPerSandbox => "directory watches per sandbox",
            Limit::ExecStdinBytes => "bytes of stdin per exec",
            Limit::FileOpsPerSandbox => "file operations under way per sandbox",
            Limit::FileOpsPerNode => "file operations under way on this node",
        }
    }

    /// Its name in `[limits]`.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::SessionsPerSandbox => "sessions_per_sandbox",
            Limit::ExecsPerSandbox => "execs_per_sandbox",
            Limit::AuditFollowers => "audit_followers",
            Limit::EventFollowers => "event_followers",
            Limit::WatchesPerSandbox => "watches_per_sandbox",
            Limit::ExecStdinBytes => "exec_stdin_bytes",
            Limit::FileOpsPerSandbox => "file_ops_per_sandbox",
            Limit::FileOpsPerNode => "file_ops_per_node",
        }
    }

    pub(crate) fn reached(self, max: impl TryInto<u64>) -> NodeError {
        NodeError::Limit { limit: self, max: max.try_into().unwrap_or(u64::MAX) }
    }
}

/// A count with a ceiling; [`Gauge::enter`] holds one unit until the guard drops.
#[derive(Debug, Default)]
pub(crate) struct Gauge {
    held: Arc<AtomicUsize>,
}

/// One unit of a [`Gauge`], given back on drop.
pub(crate) struct GaugeGuard {
    held: Arc<AtomicUsize>,
}

impl Gauge {
    /// Takes a unit, or `limit`'s error when `max` are held.
    pub fn enter(&self, max: usize, limit: Limit) -> Result<GaugeGuard, NodeError> {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        match taken {
            Ok(_) => Ok(GaugeGuard { held: self.held.clone() }),
            Err(_) => Err(limit.reached(max)),
        }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_refuses_past_its_limit_and_frees_on_drop() {
        let gauge = Gauge::default();
        let a = gauge.enter(2, Limit::AuditFollowers).expect("first");
        let _b = gauge.enter(2, Limit::AuditFollowers).expect("second");
        let err = gauge.enter(2, Limit::AuditFollowers).err().expect("third is over");
        let wire = err.to_wire();
        assert_eq!(wire.code, brig_proto::ErrorCode::QuotaExceeded);
        assert!(wire.message.contains("limits.audit_followers"), "{}", wire.message);
        drop(a);
        assert!(gauge.enter(2, Limit::AuditFollowers).is_ok());
    }
}
