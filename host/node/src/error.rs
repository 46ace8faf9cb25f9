//! Node errors and their wire codes.

pub(crate) use brig_core::sandbox::chain;
use brig_core::{IdError, SandboxError, Tier};
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
    #[error(
        "exec {0}'s stdin is not open (it was not streamed, was closed, or the command ended)"
    )]
    StdinClosed(u64),
    #[error("exec {0} took no input for {1:?} (it does not read its stdin)")]
    StdinStalled(u64, std::time::Duration),
    #[error("no session {0:?} in this sandbox")]
    NoSuchSession(String),
    #[error(transparent)]
    Container(#[from] brig_container::runtime::RuntimeError),
    #[error(transparent)]
    Store(#[from] brig_images::StoreError),
    #[error("image pull: {0}")]
    Pull(#[from] brig_registry::PullError),
    #[error("nothing answers on port {port} in the sandbox ({why})")]
    PortClosed { port: u16, why: String },
    #[error("image build: {0}")]
    ImageBuild(#[from] crate::environments::build_step::ImageBuildError),
    #[error(transparent)]
    Build(#[from] brig_images::build::BuildError),
    #[error("the layer store is not available on this node ({0})")]
    NoStore(String),
    #[error("this node holds its maximum of {0} sandboxes")]
    Full(usize),
    /// A client reached one of the node's `[limits]`.
    #[error("limit reached: at most {max} {} (the node's limits.{})", .limit.what(), .limit.setting())]
    Limit { limit: crate::limits::Limit, max: u64 },
    #[error("upload exceeds the {0}-byte limit")]
    UploadTooLarge(u64),
    /// A file operation on a sandbox's files did not finish within the node's deadline.
    #[error("{what}: the file operation did not finish within {after:?}")]
    FileDeadline { what: String, after: std::time::Duration },
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
    #[error("the node's swap")]
    Swap(#[from] crate::host::swap::SwapError),
    #[error("bad egress rules: {0}")]
    BadEgress(String),
    #[error("sandbox network")]
    Net(#[from] brig_hostkit::network::NetError),
    #[error("bad protected path: {0}")]
    BadProtected(String),
    #[error("node full: {0}")]
    Overcommitted(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} requests go to the control plane, not to a node")]
    ControlOnly(&'static str),
    /// A streaming request made without an exchange to stream on ([`crate::Node::handle`]).
    #[error("{0} streams its reply: send it on an exchange of its own")]
    NeedsStream(&'static str),
    #[error("bad command")]
    BadCommand(#[from] brig_core::CommandError),
    #[error("bad labels")]
    BadLabels(#[from] brig_core::LabelError),
    /// A sandbox's tier refused or failed an operation.
    #[error(transparent)]
    Volume(#[from] crate::environments::volumes::VolumeError),
    #[error("{}", sandbox_text(.id, *.tier, .source))]
    Sandbox { id: String, tier: Tier, source: SandboxError },
}

/// How a tier's failure reads to a client: a refusal names the sandbox and its tier, what it
/// ran in being gone names the sandbox, the rest is the tier's own text.
fn sandbox_text(id: &str, tier: Tier, e: &SandboxError) -> String {
    match e {
        SandboxError::Unsupported { .. } => {
            format!("sandbox {id} is a {tier} sandbox; {e} {}", brig_proto::NEEDS_ANOTHER_TIER)
        }
        SandboxError::Lost(why) => format!("sandbox {id} is gone: {why}"),
        other => other.to_string(),
    }
}

impl NodeError {
    /// A failure of sandbox `id`'s tier.
    pub(crate) fn sandbox(id: &str, tier: Tier, source: SandboxError) -> NodeError {
        NodeError::Sandbox { id: id.to_string(), tier, source }
    }

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
            NodeError::StdinClosed(_) => ErrorCode::Conflict,
            NodeError::StdinStalled(..) => ErrorCode::ResourceExhausted,
            // The shim refuses a spawn only when it cannot fork: the sandbox's pids are used up.
            NodeError::Container(brig_container::runtime::RuntimeError::Shim(
                brig_container::shim_conn::ShimConnError::SpawnFailed(_),
            )) => ErrorCode::ResourceExhausted,
            NodeError::Container(_) | NodeError::Swap(_) => ErrorCode::Internal,
            NodeError::NoStore(_) => ErrorCode::Unavailable,
            NodeError::Build(_) => ErrorCode::BadRequest,
            NodeError::ImageBuild(e) => e.code(),
            NodeError::PortClosed { .. } => ErrorCode::Unavailable,
            NodeError::Pull(e) => {
                use brig_registry::pull::PullFailure as F;
                match e.failure() {
                    F::BadReference | F::BadImage => ErrorCode::BadRequest,
                    F::Denied => ErrorCode::PermissionDenied,
                    F::NotFound => ErrorCode::NotFound,
                    F::Unreachable | F::Store => ErrorCode::Unavailable,
                    F::TooLarge => ErrorCode::TooLarge,
                    F::Corrupt => ErrorCode::DataLoss,
                    F::Internal => ErrorCode::Internal,
                }
            }
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
                    S::Backend(_) | S::Mount(_) | S::LazyServer(_) | S::Io { .. } => {
                        ErrorCode::Unavailable
                    }
                }
            }
            NodeError::Full(_) => ErrorCode::ResourceExhausted,
            NodeError::Limit { .. } => ErrorCode::QuotaExceeded,
            NodeError::UploadTooLarge(_) => ErrorCode::TooLarge,
            NodeError::FileDeadline { .. } => ErrorCode::Unavailable,
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
            // A full state disk is the node's resources running out, not a bug: retryable
            // elsewhere, and the message names the file.
            NodeError::Io { source, .. } if io_code(source) == ErrorCode::ResourceExhausted => {
                ErrorCode::ResourceExhausted
            }
            NodeError::Io { .. } | NodeError::Transport(_) => ErrorCode::Internal,
            NodeError::BadEgress(_) | NodeError::BadProtected(_) => ErrorCode::BadRequest,
            NodeError::Overcommitted(_) => ErrorCode::ResourceExhausted,
            NodeError::Forbidden(_) => ErrorCode::PermissionDenied,
            NodeError::ControlOnly(_) | NodeError::NeedsStream(_) => ErrorCode::BadRequest,
            NodeError::Net(brig_hostkit::network::NetError::NoSlot) => ErrorCode::ResourceExhausted,
            NodeError::Net(_) => ErrorCode::Unavailable,
            NodeError::BadCommand(_) | NodeError::BadLabels(_) => ErrorCode::BadRequest,
            NodeError::Volume(e) => e.code(),
            NodeError::Sandbox { source, .. } => match source {
                SandboxError::Unsupported { .. } | SandboxError::BadRequest(_) => {
                    ErrorCode::BadRequest
                }
                SandboxError::Io { kind, .. } => io_code(&std::io::Error::from(*kind)),
                SandboxError::PermissionDenied(_) => ErrorCode::PermissionDenied,
                SandboxError::NotFound(_) => ErrorCode::NotFound,
                SandboxError::Conflict(_) => ErrorCode::Conflict,
                SandboxError::Exhausted(_) => ErrorCode::ResourceExhausted,
                SandboxError::Unavailable(_) => ErrorCode::Unavailable,
                SandboxError::TooLarge(_) => ErrorCode::TooLarge,
                SandboxError::Lost(_) => ErrorCode::SandboxLost,
                SandboxError::Internal(_) => ErrorCode::Internal,
            },
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
        StorageFull | QuotaExceeded | FileTooLarge | OutOfMemory => ErrorCode::ResourceExhausted,
        _ => ErrorCode::Internal,
    }
}
