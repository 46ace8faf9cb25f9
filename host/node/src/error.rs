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
    #[error("tier {tier} is not offered by this node ({why})")]
    TierUnavailable { tier: Tier, why: String },
    #[error("sandbox {id} is a {tier} sandbox; {op} needs another tier")]
    WrongTier { id: String, tier: Tier, op: &'static str },
    #[error("image {0:?} is not valid: {1}")]
    BadImage(String, String),
    #[error("no running exec {0} in this sandbox")]
    NoSuchExec(u64),
    #[error("exec {0} does not run on a terminal")]
    NotATerminal(u64),
    #[error("no session {0:?} in this sandbox")]
    NoSuchSession(String),
    #[error(transparent)]
    Container(#[from] brig_container::runtime::RuntimeError),
    #[error(transparent)]
    File(#[from] brig_container::files::FileError),
    #[error(transparent)]
    Session(#[from] brig_container::session::SessionError),
    #[error(transparent)]
    Store(#[from] brig_images::StoreError),
    #[error(transparent)]
    Build(#[from] brig_images::build::BuildError),
    #[error("the layer store is not available on this node ({0})")]
    NoStore(String),
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
    #[error("bad egress rules: {0}")]
    BadEgress(String),
    #[error("sandbox network")]
    Net(#[from] brig_container::network::NetError),
    #[error("bad protected path: {0}")]
    BadProtected(String),
    #[error("node full: {0}")]
    Overcommitted(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} requests go to the control plane, not to a node")]
    ControlOnly(&'static str),
    /// The container-host VM a container ran in is gone.
    #[error("sandbox {id} is gone: {why}")]
    HostVmLost { id: String, why: String },
    /// A file request a container-host VM's agent refused (its message names the path).
    #[error("{message}")]
    HostedFile { kind: std::io::ErrorKind, message: String },
    #[error("in the container-host VM: {0}")]
    HostedContainer(String),
    /// A guest's answer ran past what the node takes in for it (a file read of `/dev/zero`).
    #[error("{0}")]
    GuestReplyTooLarge(String),
    /// A guest's answer did not end in time.
    #[error("{0}")]
    GuestReplyTimeout(String),
    #[error("bad command")]
    BadCommand(#[from] brig_core::CommandError),
}

impl NodeError {
    /// The wire error a client sees. The message includes the source chain.
    pub fn to_wire(&self) -> WireError {
        let code = match self {
            NodeError::BadId(_) => ErrorCode::BadRequest,
            NodeError::SandboxNotFound(_) => ErrorCode::NotFound,
            NodeError::SandboxDestroyed(_) => ErrorCode::NotFound,
            NodeError::SandboxExpired { .. } => ErrorCode::Expired,
            NodeError::TierUnavailable { .. } => ErrorCode::Unavailable,
            NodeError::WrongTier { .. } | NodeError::BadImage(..) => ErrorCode::BadRequest,
            NodeError::NoSuchExec(_) | NodeError::NoSuchSession(_) => ErrorCode::NotFound,
            NodeError::NotATerminal(_) => ErrorCode::BadRequest,
            // The shim refuses a spawn only when it cannot fork: the sandbox's pids are used up.
            NodeError::Container(brig_container::runtime::RuntimeError::Shim(
                brig_container::shim_conn::ShimConnError::SpawnFailed(_),
            )) => ErrorCode::ResourceExhausted,
            NodeError::Container(_) => ErrorCode::Internal,
            NodeError::File(e) => match e {
                brig_container::files::FileError::Io { source, .. } => io_code(source),
                _ => ErrorCode::BadRequest,
            },
            NodeError::NoStore(_) => ErrorCode::Unavailable,
            NodeError::Build(_) => ErrorCode::BadRequest,
            NodeError::Store(e) => {
                use brig_images::StoreError as S;
                match e {
                    S::BadName(_) | S::BadReference(_) | S::Format(_) => ErrorCode::BadRequest,
                    S::NoLayer(_) | S::NoEnv(_) => ErrorCode::NotFound,
                    S::VersionTaken(_) => ErrorCode::AlreadyExists,
                    S::InUse(_) => ErrorCode::Conflict,
                    S::Damaged { .. } => ErrorCode::DataLoss,
                    S::Build(_) => ErrorCode::BadRequest,
                    S::Backend(brig_images::backend::BackendError::Missing(_)) => {
                        ErrorCode::DataLoss
                    }
                    S::Cache(_) => ErrorCode::DataLoss,
                    S::Backend(_) | S::Mount(_) | S::Io { .. } => ErrorCode::Unavailable,
                }
            }
            NodeError::Session(e) => match e {
                brig_container::session::SessionError::Busy => ErrorCode::Conflict,
                brig_container::session::SessionError::Idle => ErrorCode::BadRequest,
                brig_container::session::SessionError::Closed => ErrorCode::NotFound,
                _ => ErrorCode::Internal,
            },
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
            NodeError::BadEgress(_) | NodeError::BadProtected(_) => ErrorCode::BadRequest,
            NodeError::Overcommitted(_) => ErrorCode::ResourceExhausted,
            NodeError::Forbidden(_) => ErrorCode::PermissionDenied,
            NodeError::ControlOnly(_) => ErrorCode::BadRequest,
            NodeError::Net(brig_container::network::NetError::NoSlot) => {
                ErrorCode::ResourceExhausted
            }
            NodeError::Net(_) => ErrorCode::Unavailable,
            NodeError::HostVmLost { .. } => ErrorCode::SandboxLost,
            NodeError::HostedFile { kind, .. } => io_code(&std::io::Error::from(*kind)),
            NodeError::HostedContainer(_) => ErrorCode::Internal,
            NodeError::GuestReplyTooLarge(_) => ErrorCode::TooLarge,
            NodeError::GuestReplyTimeout(_) => ErrorCode::Unavailable,
            NodeError::BadCommand(_) => ErrorCode::BadRequest,
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
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
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
