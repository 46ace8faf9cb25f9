//! The client side: connect with a pinned certificate, say hello with the token, then open one
//! stream per request.

use std::net::SocketAddr;
use std::sync::Arc;

use brig_proto::hello::{ClientHello, HelloStatus, ServerHello};
use brig_proto::{Reply, Request, PROTOCOL_VERSION};
use bytes::Bytes;

use crate::server::HELLO_TIMEOUT;
use crate::stream::{write_frame, write_raw, FrameReader};
use crate::{CertPin, TransportError};

/// An authenticated connection to a Brig server. Cheap to clone; requests run concurrently.
#[derive(Clone)]
pub struct ClientConnection {
    conn: quinn::Connection,
    // Kept so the endpoint's socket lives as long as any clone of the connection.
    _endpoint: quinn::Endpoint,
    server_message: Arc<str>,
}

/// How long a QUIC handshake may take before the server counts as unreachable.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl ClientConnection {
    /// Connects to `addr`, trusting only the pinned certificate, and authenticates with `token`.
    pub async fn connect(
        addr: SocketAddr,
        pin: &CertPin,
        token: &str,
        version: u16,
    ) -> Result<ClientConnection, TransportError> {
        let local: SocketAddr = if addr.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let socket = crate::tuning::bind_udp(local)?;
        let mut endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|source| TransportError::Bind { addr: local, source })?;
        endpoint.set_default_client_config(pin.client_config()?);
        let connecting = endpoint.connect(addr, "brigd").map_err(TransportError::Connect)?;
        // A server that is gone never answers the handshake; without a bound the attempt would
        // last the whole idle timeout.
        let conn = tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting)
            .await
            .map_err(|_| TransportError::HandshakeTimeout { addr, after: HANDSHAKE_TIMEOUT })?
            .map_err(TransportError::Connection)?;
        let hello = ClientHello { version, token: token.to_string() };
        let reply = tokio::time::timeout(HELLO_TIMEOUT, say_hello(&conn, &hello))
            .await
            .map_err(|_| TransportError::HelloTimeout(HELLO_TIMEOUT))??;
        if reply.status != HelloStatus::Ok {
            conn.close(0u32.into(), b"hello refused");
            return Err(TransportError::HelloRefused {
                status: reply.status,
                message: reply.message,
            });
        }
        Ok(ClientConnection { conn, _endpoint: endpoint, server_message: reply.message.into() })
    }

    /// Connects speaking this build's protocol version.
    pub async fn connect_current(
        addr: SocketAddr,
        pin: &CertPin,
        token: &str,
    ) -> Result<ClientConnection, TransportError> {
        Self::connect(addr, pin, token, PROTOCOL_VERSION).await
    }

    /// What the server said in its hello (name and version).
    pub fn server_message(&self) -> &str {
        &self.server_message
    }

    pub fn remote_address(&self) -> SocketAddr {
        self.conn.remote_address()
    }

    /// Whether the connection has been closed (by either side or by the idle timeout).
    pub fn is_closed(&self) -> bool {
        self.conn.close_reason().is_some()
    }

    /// Opens a stream and sends `request`; the caller may then upload and must read the reply.
    pub async fn open(&self, request: &Request) -> Result<ClientExchange, TransportError> {
        let (mut send, recv) = self.conn.open_bi().await.map_err(TransportError::Connection)?;
        write_frame(&mut send, request).await?;
        Ok(ClientExchange { send: Some(send), reader: FrameReader::new(recv) })
    }

    /// Opens a stream and writes `bytes` as they are, unframed: for probing servers with
    /// malformed requests in tests and fuzzers.
    pub async fn open_raw(&self, bytes: Bytes) -> Result<ClientExchange, TransportError> {
        let (mut send, recv) = self.conn.open_bi().await.map_err(TransportError::Connection)?;
        write_raw(&mut send, bytes).await?;
        Ok(ClientExchange { send: Some(send), reader: FrameReader::new(recv) })
    }

    /// Sends a request that has no upload and reads its single reply.
    pub async fn request(&self, request: &Request) -> Result<Reply, TransportError> {
        let mut exchange = self.open(request).await?;
        exchange.finish_upload()?;
        exchange.reply().await
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.conn.close(0u32.into(), b"client closed");
    }
}

async fn say_hello(
    conn: &quinn::Connection,
    hello: &ClientHello,
) -> Result<ServerHello, TransportError> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(TransportError::Connection)?;
    let bytes = hello.encode().map_err(TransportError::Hello)?;
    write_raw(&mut send, Bytes::from(bytes)).await?;
    send.finish().map_err(TransportError::Closed)?;
    let reply = recv
        .read_to_end(brig_proto::hello::SERVER_FIXED_BYTES + brig_proto::hello::MAX_MESSAGE_BYTES)
        .await
        .map_err(|e| match e {
            quinn::ReadToEndError::Read(e) => TransportError::Read(e),
            quinn::ReadToEndError::TooLong => TransportError::Hello(
                brig_proto::hello::HelloError::TooLong(brig_proto::hello::MAX_MESSAGE_BYTES),
            ),
        })?;
    ServerHello::decode(&reply).map_err(TransportError::Hello)
}

/// One request in flight, from the client's side.
pub struct ClientExchange {
    /// `None` once [`ClientExchange::take_upload`] took it.
    send: Option<quinn::SendStream>,
    reader: FrameReader,
}

/// The sending half of an exchange, taken off so an upload (a command's stdin) can be fed from
/// one task while another reads the replies.
pub struct ClientUpload {
    send: quinn::SendStream,
}

impl ClientUpload {
    /// Sends a piece of the upload.
    pub async fn send_raw(&mut self, bytes: Bytes) -> Result<(), TransportError> {
        write_raw(&mut self.send, bytes).await
    }

    /// Marks the end of the upload.
    pub fn finish(&mut self) -> Result<(), TransportError> {
        self.send.finish().map_err(TransportError::Closed)
    }
}

impl ClientExchange {
    fn upload(&mut self) -> Result<&mut quinn::SendStream, TransportError> {
        self.send.as_mut().ok_or(TransportError::UploadTaken)
    }

    /// Sends a piece of the upload that follows the request.
    pub async fn send_raw(&mut self, bytes: Bytes) -> Result<(), TransportError> {
        write_raw(self.upload()?, bytes).await
    }

    /// Marks the end of the upload (or of a request without one).
    pub fn finish_upload(&mut self) -> Result<(), TransportError> {
        self.upload()?.finish().map_err(TransportError::Closed)
    }

    /// Takes the sending half off this exchange (once); the exchange goes on reading replies.
    pub fn take_upload(&mut self) -> Option<ClientUpload> {
        self.send.take().map(|send| ClientUpload { send })
    }

    /// Reads the next reply frame.
    pub async fn reply(&mut self) -> Result<Reply, TransportError> {
        self.reader.read_frame().await?.ok_or(TransportError::NoReply)
    }

    /// Reads the next reply frame, or `None` at the end of the stream.
    pub async fn next_reply(&mut self) -> Result<Option<Reply>, TransportError> {
        self.reader.read_frame().await
    }

    /// Reads the next piece of a download; `None` at its end.
    pub async fn read_raw(&mut self) -> Result<Option<Bytes>, TransportError> {
        self.reader.read_raw().await
    }
}
