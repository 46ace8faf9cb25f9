//! The audit trail: what happened in a sandbox, in order.

use serde::{Deserialize, Serialize};

/// One recorded event. `seq` counts from 1 per sandbox and never repeats.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub seq: u64,
    pub unix_ms: u64,
    pub kind: AuditKind,
}

/// What was recorded.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    ExecStart {
        exec_id: u64,
        argv: Vec<String>,
        user: Option<String>,
        cwd: Option<String>,
    },
    ExecEnd {
        exec_id: u64,
        exit_code: Option<i32>,
        signal: Option<i32>,
        /// `exited`, `timed_out`, `killed`, `oom_killed` or `signaled`.
        outcome: String,
        duration_ms: u64,
        stdout_bytes: u64,
        stderr_bytes: u64,
        truncated: bool,
    },
    /// A command sent to a shell session.
    SessionCommand {
        session: String,
        command: String,
    },
    /// A tool call in a fncall sandbox.
    Call {
        tool: String,
        outcome: String,
    },
    /// A file operation through the API: `read`, `write`, `list`, `stat`, `mkdir`, `remove`.
    File {
        op: String,
        path: String,
        bytes: u64,
        ok: bool,
    },
    /// A new connection the sandbox opened or tried to open.
    Egress {
        allowed: bool,
        proto: String,
        dst: String,
        port: Option<u16>,
    },
    /// The egress rules changed (the new rule list).
    Policy {
        rules: Vec<String>,
    },
    /// `created`, `paused`, `resumed`, `forked`, `destroyed`, `expired`, …
    Lifecycle {
        event: String,
        detail: String,
    },
}

/// Reads a sandbox's audit trail.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditRequest {
    pub sandbox: String,
    /// Only events with a larger `seq`.
    pub after_seq: u64,
    /// Keep the stream open and send events as they happen, until the sandbox is gone.
    pub follow: bool,
}

/// One lifecycle event of a sandbox in the node's journal (`SandboxOp::Events`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LifecycleEvent {
    /// Its place in the node's journal (1, 2, …).
    pub seq: u64,
    pub unix_ms: u64,
    pub sandbox: String,
    /// `created`, `paused`, `resumed`, `forked`, `checkpointed`, `destroyed`, `expired`, …
    pub event: String,
    pub detail: String,
    /// The sandbox's project, if it has one.
    pub project: Option<String>,
    /// The sandbox's labels when it happened.
    pub labels: Vec<(String, String)>,
    /// When the sandbox was created.
    pub started_unix_ms: u64,
}

/// Reads the node's lifecycle journal: one sandbox's events or every visible one's.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct EventsRequest {
    /// Only this sandbox's events.
    pub sandbox: Option<String>,
    /// Only this project's (and its sub-projects') events; set for a project-scoped client.
    pub project: Option<String>,
    /// Only events with a larger `seq`.
    pub after_seq: u64,
    /// At most this many per reply.
    pub limit: u32,
    /// Only these events (`created`, `destroyed`, …); empty: all.
    pub events: Vec<String>,
    /// The newest `limit` (still oldest first in the reply) rather than the oldest.
    pub newest_first: bool,
    /// Keep the stream open and send events as they happen.
    pub follow: bool,
}
