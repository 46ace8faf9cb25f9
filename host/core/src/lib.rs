//! Brig's domain types, shared by the node, the control plane and the tier backends.
//!
//! These are not wire types: the node converts between them and `brig-proto` at its boundary,
//! so a backend never depends on the encoding and the wire can evolve without touching tiers.
#![forbid(unsafe_code)]

pub mod call;
pub mod command;
pub mod egress;
pub mod exec;
pub mod files;
pub mod id;
pub mod records;
pub mod sandbox;
pub mod spec;
pub mod stdin;

pub use call::{CallLimits, CallOutcome, CallReport, ToolCall};
pub use command::{check_command, check_sandbox_env, CommandError};
pub use egress::{Destination, EgressPolicy, EgressRule};
pub use id::{IdError, NodeId, SandboxId};
pub use sandbox::{Capabilities, Op, Sandbox, SandboxError};
pub use spec::{
    check_labels, IdleAction, LabelError, Labels, QosClass, SandboxSpec, Tier, VolumeBinding,
};
