//! Brig's wire protocol: messages, framing, version negotiation and error codes. No I/O here.
//!
//! A connection starts with a [`hello`] exchange on its first bidirectional stream; that layout
//! never changes between protocol versions, so an old client always gets a readable "version
//! mismatch" instead of a decode failure or a hang. After it, every request travels on its own
//! bidirectional stream:
//!
//! ```text
//! client → server:  frame(Request) [raw upload bytes …] FIN
//! server → client:  frame(Reply)   [raw download bytes … | more frames …] FIN
//! ```
//!
//! A frame is a little-endian `u32` length followed by that many bytes of postcard-encoded
//! message (see [`frame`]). Uploads (`FileWrite`, `ToolAdd`) and downloads (`FileRead`) carry
//! their payload as raw stream bytes after the header frame, so large files never sit whole in
//! memory and never pay for framing.
#![forbid(unsafe_code)]

pub mod error;
pub mod frame;
pub mod hello;
pub mod message;
mod types_audit;
mod types_build;
mod types_call;
mod types_cluster;
mod types_exec;
mod types_files;
mod types_images;
mod types_sandbox;
mod types_volumes;

pub use error::{ErrorCode, WireError, NEEDS_ANOTHER_TIER};
pub use frame::{decode, encode, FrameError, MAX_FRAME_BYTES};
pub use message::*;
pub use types_audit::*;
pub use types_build::*;
pub use types_call::*;
pub use types_cluster::*;
pub use types_exec::*;
pub use types_files::*;
pub use types_images::*;
pub use types_sandbox::*;
pub use types_volumes::*;

/// The protocol version this build speaks. Bump on any change to message encodings.
pub const PROTOCOL_VERSION: u16 = 9;

/// TLS application protocol name (ALPN). Versioning happens in the hello, not here.
pub const ALPN: &[u8] = b"brig";
