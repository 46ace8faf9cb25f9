//! Brig's QUIC transport on quinn: endpoints, TLS with a pinned self-signed certificate, the
//! token hello, and one framed bidirectional stream per request.
//!
//! ```text
//! client                                         server
//! connect (TLS 1.3, ALPN "brig", cert pinned) ─▶ accept
//! stream 0: ClientHello{version, token}       ─▶ Service::authenticate → principal, ServerHello
//! stream n: frame(Request) [upload] FIN       ─▶ Service::serve(principal, request, Exchange)
//!           ◀─ frame(Reply) [download | frames] FIN
//! ```
//! Requests on a connection run concurrently; the stream limit is raised far above quinn's
//! default of 100 (see [`tuning`]). The transport knows nothing about sandboxes: it hands decoded
//! requests to a [`server::Service`].
#![forbid(unsafe_code)]

pub mod client;
pub mod error;
pub mod server;
pub mod stream;
pub mod tls;
pub mod tuning;

pub use client::{ClientConnection, ClientExchange, ClientUpload};
pub use error::TransportError;
pub use server::{Exchange, Server, Service, Upload};
pub use tls::{CertPin, Identity};
