//! Async Rust client for Brig, for rollout workers.
//!
//! One [`Client`] holds one QUIC connection; clone it freely and issue requests from many tasks
//! at once (each request is its own stream). If the connection drops, the next request
//! reconnects.
//!
//! ```no_run
//! # async fn demo() -> Result<(), brig_sdk::Error> {
//! use brig_sdk::{Client, SandboxOptions};
//!
//! // Reads endpoint.json and access-token from brigd's state directory.
//! let client = Client::connect_local().await?;
//!
//! // One-shot: a fresh instance runs the tool and is gone.
//! let r = client.call("jq", r#"{"query":"$.a","json":{"a":1}}"#).await?;
//! assert!(r.is_success());
//!
//! // Stateful: a workspace that persists across calls until destroyed or idle.
//! let sandbox = client.create(SandboxOptions::fncall().label("job", "demo")).await?;
//! sandbox.write_file("src/app.py", b"print('hi')\n").await?;
//! let hits = sandbox.call("grep", r#"{"pattern":"print"}"#).await?;
//! println!("{}", hits.output);
//! sandbox.destroy().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod build;
mod client;
mod cluster;
mod error;
mod events;
mod exec;
mod file_watch;
mod images;
mod lifecycle;
mod ports;
mod sandbox;
mod security;
mod volumes;

pub use build::BuildOptions;
pub use client::{read_token, Client, ConnectOptions, Pin, FAILOVER_AFTER};
pub use cluster::CallHops;
pub use error::Error;
pub use events::EventStream;
pub use exec::{Cmd, ExecEvent, ExecOutput, ExecStdin, ExecStream, SessionOutput, ShellSession};
pub use file_watch::FileWatch;
pub use images::{GcSummary, ImageSource};
pub use lifecycle::Lifetimes;
pub use sandbox::{Sandbox, SandboxOptions};
pub use security::AuditStream;
pub use volumes::Volume;

/// How tokens are written: `e2b_<hex>` (an E2B API key) and `<hex>` are one token.
pub use brig_proto::hello::{e2b_key, token_secret};
/// Wire types the SDK hands back.
pub use brig_proto::{
    AuditEvent, AuditKind, BuildCommand, BuildEvent, BuildEventKind, BuildStep, BuiltImage,
    CallLimits, CallOutcome, CallRequest, CallResult, CallerInfo, ErrorCode, EventsRequest,
    ExecInfo, ExecResult, FileChange, FileEvent, FileEvents, FileKind, FileStat, IdleAction,
    ImageFormat, ImageStats, LayerInfo, LifecycleEvent, NodeCapacity, NodeRoute, NodeStatus,
    NodeSummary, Placement, ProjectInfo, ProjectLimits, PullLayerProgress, PullLayerState,
    PullProgress, PulledImage, PulledLayer, QosClass, SandboxInfo, SandboxLimits, SandboxState,
    SandboxUsage, SessionOpenRequest, StrayObject, Tier, ToolInfo, ToolWorld, UsageSample,
    VolumeAttrs, VolumeEntry, VolumeInfo, VolumeMount,
};
