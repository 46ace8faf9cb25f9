//! Node errors and their wire codes.

use brig_core::{IdError, Tier};
use brig_fncall::FncallError;
use brig_proto::{ErrorCode, WireError};
use brig_transport::TransportError;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("bad sandbox id")]
    BadId(#[from] IdError),
    #[error("no sandbox {0}")]
    SandboxNotFound(String),
    #[error("sandbox {0} was destroyed")]
    SandboxDestroyed(String),
    #[error("sandbox {id} expired: {reason}")]
    SandboxExpired { id: String, reason: String },
    #[error("tier {0} is not offered by this node (it offers: fncall)")]
    TierUnavailable(Tier),
    #[error("this node holds its maximum of {0} sandboxes")]
    Full(usize),
    #[error("upload exceeds the {0}-byte limit")]
    UploadTooLarge(u64),
    #[error(transparent)]
    Fncall(#[from] FncallError),
    #[error("I/O error on {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("transport failed")]
    Transport(#[from] TransportError),
}

impl NodeError {
    /// The wire error a client sees. The message includes the source chain.
    pub fn to_wire(&self) -> WireError {
        let code = match self {
            NodeError::BadId(_) => ErrorCode::BadRequest,
            NodeError::SandboxNotFound(_) => ErrorCode::NotFound,
            NodeError::SandboxDestroyed(_) => ErrorCode::NotFound,
            NodeError::SandboxExpired { .. } => ErrorCode::Expired,
            NodeError::TierUnavailable(_) => ErrorCode::BadRequest,
            NodeError::Full(_) => ErrorCode::ResourceExhausted,
            NodeError::UploadTooLarge(_) => ErrorCode::TooLarge,
            NodeError::Fncall(e) => match e {
                FncallError::ToolNotFound(_) => ErrorCode::NotFound,
                FncallError::BadToolName(_) => ErrorCode::BadRequest,
                FncallError::InvalidComponent(_) => ErrorCode::InvalidComponent,
                FncallError::Busy(_) => ErrorCode::ResourceExhausted,
                FncallError::PathEscape(_) => ErrorCode::PermissionDenied,
                FncallError::File { source, .. } => io_code(source),
                FncallError::Engine(_) | FncallError::Io { .. } | FncallError::Internal(_) => {
                    ErrorCode::Internal
                }
            },
            NodeError::Io { .. } | NodeError::Transport(_) => ErrorCode::Internal,
        };
        WireError::new(code, chain(self))
    }
}

fn io_code(e: &std::io::Error) -> ErrorCode {
    use std::io::ErrorKind::*;
    match e.kind() {
        NotFound => ErrorCode::NotFound,
        AlreadyExists => ErrorCode::AlreadyExists,
        PermissionDenied => ErrorCode::PermissionDenied,
        InvalidInput | NotADirectory | IsADirectory | DirectoryNotEmpty => ErrorCode::BadRequest,
        StorageFull | QuotaExceeded | FileTooLarge => ErrorCode::ResourceExhausted,
        _ => ErrorCode::Internal,
    }
}

/// `error: source: source …`, the way a client wants to read it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(source) = next {
        let text = source.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = source.source();
    }
    out
}
