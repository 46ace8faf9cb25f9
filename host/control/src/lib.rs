//! The control plane. In the all-in-one daemon it holds access control: the access tokens that
//! admit a client, kept in a local file. In a cluster (`brigd control`) it is a replica that
//! registers nodes from their heartbeats, places creates and one-shot calls with brig-sched,
//! hands clients signed routes to nodes, and enforces project quotas; durable state lives in
//! etcd, nothing per sandbox.
#![forbid(unsafe_code)]

pub mod events;
pub mod links;
pub mod plane;
pub mod quota;
pub mod registry;
pub mod signing;
pub mod store;
pub mod tokens;
pub mod volumes;

pub use plane::{Caller, ControlConfig, ControlPlane};
pub use signing::{Claims, Signer, SigningError};
pub use store::{StateStore, StoreError};
pub use tokens::{AccessTokens, TokenError};
