//! The control plane. In the all-in-one daemon it holds access control: the access tokens that
//! admit a client, kept in a local file. Placement and the node registry join it with the
//! cluster roles.
#![forbid(unsafe_code)]

pub mod tokens;

pub use tokens::{AccessTokens, TokenError};
