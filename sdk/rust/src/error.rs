//! SDK errors. Every error says whether retrying can help ([`Error::retryable`]).

use brig_proto::ErrorCode;
use brig_transport::TransportError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request; `code` says why.
    #[error("{}: {message}", code.as_str())]
    Server { code: ErrorCode, message: String },
    /// The connection could not be made or authenticated.
    #[error("cannot connect to brigd at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: TransportError,
    },
    /// The connection failed during a request.
    #[error("request failed in transport")]
    Transport(#[from] TransportError),
    /// The server replied with something this request does not expect.
    #[error("unexpected reply to {request}: {reply}")]
    UnexpectedReply { request: &'static str, reply: String },
    /// Local configuration (state directory, token or certificate file) is missing or bad.
    #[error("client configuration: {0}")]
    Config(String),
    /// Local file I/O during an upload or download.
    #[error("local I/O on {path}")]
    LocalIo {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A download ended before the announced size arrived.
    #[error("download ended after {got} of {expected} bytes")]
    ShortDownload { got: u64, expected: u64 },
}

impl Error {
    /// Whether the sandbox's tier does not serve the operation (another way may).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Server { code: ErrorCode::BadRequest, message }
            if message.ends_with(brig_proto::NEEDS_ANOTHER_TIER))
    }

    /// Whether sending the request again (after a pause, or to another node) can succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Server { code, .. } => code.retryable(),
            Error::Connect { source, .. } => !matches!(source, TransportError::HelloRefused { .. }),
            Error::Transport(e) => e.is_connection_lost(),
            Error::ShortDownload { .. } => true,
            Error::UnexpectedReply { .. } | Error::Config(_) | Error::LocalIo { .. } => false,
        }
    }

    /// The server's error code, if the server refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { code, .. } => Some(*code),
            Error::Connect { source: TransportError::HelloRefused { status, .. }, .. } => {
                Some(match status {
                    brig_proto::hello::HelloStatus::VersionMismatch => ErrorCode::VersionMismatch,
                    _ => ErrorCode::Unauthenticated,
                })
            }
            _ => None,
        }
    }
}

impl From<brig_proto::WireError> for Error {
    fn from(e: brig_proto::WireError) -> Self {
        Error::Server { code: e.code, message: e.message }
    }
}
