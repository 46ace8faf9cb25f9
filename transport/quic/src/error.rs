//! Transport errors.

use brig_proto::hello::{HelloError, HelloStatus};
use brig_proto::FrameError;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot read or write TLS identity at {path}")]
    IdentityIo {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate a TLS certificate")]
    CertGen(#[source] rcgen::Error),
    #[error("TLS configuration rejected")]
    Tls(#[source] rustls::Error),
    #[error("certificate pin {0:?} is not a sha256 hex fingerprint")]
    BadPin(String),
    #[error("cannot bind UDP socket on {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start connecting")]
    Connect(#[source] quinn::ConnectError),
    #[error("connection failed")]
    Connection(#[source] quinn::ConnectionError),
    #[error("server refused the hello ({status:?}): {message}")]
    HelloRefused { status: HelloStatus, message: String },
    #[error("malformed hello")]
    Hello(#[source] HelloError),
    #[error("no hello within {0:?}")]
    HelloTimeout(std::time::Duration),
    #[error("no QUIC handshake with {addr} within {after:?} (is it running?)")]
    HandshakeTimeout { addr: std::net::SocketAddr, after: std::time::Duration },
    #[error("stream write failed")]
    Write(#[source] quinn::WriteError),
    #[error("stream read failed")]
    Read(#[source] quinn::ReadError),
    #[error("stream closed")]
    Closed(#[source] quinn::ClosedStream),
    #[error("bad frame")]
    Frame(#[source] FrameError),
    #[error("stream ended in the middle of a frame")]
    Truncated,
    /// The client stopped reading this request's replies (it dropped the stream or left).
    #[error("the client stopped reading the replies")]
    PeerGone,
    /// The exchange's sending half was taken off (`ClientExchange::take_upload`).
    #[error("this exchange's upload half was taken off")]
    UploadTaken,
    #[error("peer ended the stream without a reply")]
    NoReply,
}

impl TransportError {
    /// Whether the failure is in the connection (reconnecting may help) rather than the request.
    pub fn is_connection_lost(&self) -> bool {
        matches!(
            self,
            TransportError::Connection(_)
                | TransportError::HandshakeTimeout { .. }
                | TransportError::Write(quinn::WriteError::ConnectionLost(_))
                | TransportError::Read(quinn::ReadError::ConnectionLost(_))
        )
    }
}
