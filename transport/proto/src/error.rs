//! Error codes that cross the wire. Every platform error maps to one code; `retryable` tells a
//! client whether sending the same request again (possibly elsewhere) can help.

use serde::{Deserialize, Serialize};

/// Closed set of error codes. Append new codes at the end (postcard encodes the index).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Missing or wrong access token.
    Unauthenticated,
    /// Client and server speak different protocol versions.
    VersionMismatch,
    /// The request could not be decoded or names impossible values.
    BadRequest,
    /// The sandbox, tool, file or layer does not exist.
    NotFound,
    /// Something with that name already exists.
    AlreadyExists,
    /// A path tried to leave the sandbox workspace, or the operation is not allowed.
    PermissionDenied,
    /// A component is malformed or does not implement a world Brig runs.
    InvalidComponent,
    /// The node is out of a resource right now (slots, memory); retry later or elsewhere.
    ResourceExhausted,
    /// The server is shutting down or a dependency is temporarily unavailable.
    Unavailable,
    /// The object is in use (e.g. a tool referenced by a running call).
    Conflict,
    /// A payload is larger than the server accepts.
    TooLarge,
    /// A bug or an unexpected host failure.
    Internal,
    /// The sandbox was destroyed by its idle TTL or lifetime limit.
    Expired,
    /// Stored data is missing or corrupt (a layer chunk failed its digest check).
    DataLoss,
    /// The node that held the sandbox stopped answering; the sandbox is failed.
    SandboxLost,
    /// The project is at a limit (live sandboxes or creation rate); the message says which.
    QuotaExceeded,
}

/// How a `BadRequest` refusal of an operation the sandbox's tier does not serve ends, so a
/// client can fall back to another way (the message names the sandbox, its tier and the op).
pub const NEEDS_ANOTHER_TIER: &str = "needs another tier";

impl ErrorCode {
    /// Whether retrying the same request can succeed.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::ResourceExhausted | ErrorCode::Unavailable)
    }

    /// Stable lowercase name, used in CLI output and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::VersionMismatch => "version_mismatch",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::InvalidComponent => "invalid_component",
            ErrorCode::ResourceExhausted => "resource_exhausted",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Conflict => "conflict",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Internal => "internal",
            ErrorCode::Expired => "expired",
            ErrorCode::DataLoss => "data_loss",
            ErrorCode::SandboxLost => "sandbox_lost",
            ErrorCode::QuotaExceeded => "quota_exceeded",
        }
    }
}

/// An error as it travels in a [`crate::Reply::Error`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError { code, message: message.into() }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for WireError {}
