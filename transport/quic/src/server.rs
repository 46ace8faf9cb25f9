//! The server side: accept connections, run the hello, and hand each request stream to a
//! [`Service`] on its own task.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use brig_proto::hello::{ClientHello, HelloStatus, ServerHello, CLIENT_FIXED_BYTES};
use brig_proto::{ErrorCode, Reply, Request, WireError, PROTOCOL_VERSION};
use bytes::Bytes;

use crate::stream::{write_frame, write_raw, FrameReader};
use crate::{Identity, TransportError};

/// How long a new connection may take to send its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Application close codes.
pub mod close_code {
    pub const SHUTDOWN: u32 = 0;
    pub const HELLO_REFUSED: u32 = 1;
}

/// What the transport calls into. Implemented by the node (and later the control plane).
pub trait Service: Send + Sync + 'static {
    /// Who a connection acts for, decided once at its hello and handed to every request.
    type Principal: Send + Sync + 'static;

    /// The principal a hello token admits, or `None` to refuse the connection.
    fn authenticate(&self, token: &str) -> impl Future<Output = Option<Self::Principal>> + Send;

    /// Serves one request. The service writes its reply (and any raw bytes) to `exchange`.
    fn serve(
        &self,
        principal: &Self::Principal,
        request: Request,
        exchange: Exchange,
    ) -> impl Future<Output = ()> + Send;

    /// Text sent in a successful hello reply (server name and version).
    fn hello_message(&self) -> String {
        format!("brigd {}", env!("CARGO_PKG_VERSION"))
    }
}

/// One request's stream pair, as the service sees it.
pub struct Exchange {
    send: quinn::SendStream,
    reader: Option<FrameReader>,
}

/// The upload half of an exchange, taken out to be read concurrently with replies.
pub struct Upload {
    reader: FrameReader,
}

impl Upload {
    /// The next piece of the upload; `None` once the client finished it.
    pub async fn read(&mut self) -> Result<Option<Bytes>, TransportError> {
        self.reader.read_raw().await
    }

    /// Stops the upload: the client's further writes fail instead of blocking.
    pub fn refuse(&mut self) {
        self.reader.stop(0);
    }
}

impl Exchange {
    /// Sends a reply frame.
    pub async fn reply(&mut self, reply: &Reply) -> Result<(), TransportError> {
        write_frame(&mut self.send, reply).await
    }

    /// Sends an error reply.
    pub async fn error(&mut self, error: WireError) -> Result<(), TransportError> {
        self.reply(&Reply::Error(error)).await
    }

    /// Completes when the client stops reading the replies: it dropped the stream, or its
    /// connection is gone. A request that waits on events selects on this, so a client that
    /// left does not hold its place (and its connection's request limit) until the next event.
    pub fn peer_gone(&self) -> impl Future<Output = ()> + Send + 'static {
        let stopped = self.send.stopped();
        async move {
            match stopped.await {
                Ok(Some(_)) | Err(_) => {}
                // Finished by us and acknowledged: nothing more will happen on this stream.
                Ok(None) => std::future::pending().await,
            }
        }
    }

    /// Sends raw bytes after a reply frame (downloads).
    pub async fn send_raw(&mut self, bytes: Bytes) -> Result<(), TransportError> {
        write_raw(&mut self.send, bytes).await
    }

    /// Reads the next piece of an upload; `None` once the client finished it (or the upload
    /// was taken with [`Exchange::take_upload`]).
    pub async fn read_upload(&mut self) -> Result<Option<Bytes>, TransportError> {
        match &mut self.reader {
            Some(reader) => reader.read_raw().await,
            None => Ok(None),
        }
    }

    /// Reads a whole upload, refusing more than `limit` bytes.
    pub async fn read_upload_to_end(&mut self, limit: usize) -> Result<Vec<u8>, TransportError> {
        match &mut self.reader {
            Some(reader) => reader.read_raw_to_end(limit).await,
            None => Ok(Vec::new()),
        }
    }

    /// Takes the upload half, to read it while replies are being sent.
    pub fn take_upload(&mut self) -> Option<Upload> {
        self.reader.take().map(|reader| Upload { reader })
    }

    /// Stops reading an upload we refused, so the client is not left blocked on flow control.
    pub fn refuse_upload(&mut self) {
        if let Some(reader) = &mut self.reader {
            reader.stop(0);
        }
    }

    /// Ends the reply stream. Dropping the exchange does the same.
    pub fn finish(mut self) {
        let _ = self.send.finish();
    }
}

/// A bound QUIC server endpoint.
pub struct Server {
    endpoint: quinn::Endpoint,
    /// Requests one connection may have open at once; the next is refused with
    /// `QuotaExceeded` until one ends.
    open_requests: usize,
}

impl Server {
    /// Binds `addr` with `identity`'s certificate.
    pub fn bind(addr: SocketAddr, identity: &Identity) -> Result<Server, TransportError> {
        let socket = crate::tuning::bind_udp(addr)?;
        let mut config = quinn::EndpointConfig::new(identity.reset_key());
        let cid_key = identity.connection_id_key();
        config.cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
        });
        let endpoint = quinn::Endpoint::new(
            config,
            Some(identity.server_config()?),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|source| TransportError::Bind { addr, source })?;
        let open_requests = crate::tuning::MAX_CONCURRENT_STREAMS as usize;
        Ok(Server { endpoint, open_requests })
    }

    /// Bounds the requests one connection has open at once (at most QUIC's stream limit):
    /// the one over it gets a `QuotaExceeded` error, and the connection's others carry on.
    pub fn limit_open_requests(mut self, max: usize) -> Server {
        self.open_requests = max.clamp(1, crate::tuning::MAX_CONCURRENT_STREAMS as usize);
        self
    }

    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        let addr = self.endpoint.local_addr();
        addr.map_err(|source| TransportError::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })
    }

    /// Serves until `shutdown` completes, then closes every connection and waits briefly for
    /// peers to be told.
    pub async fn run<S: Service>(self, service: Arc<S>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                incoming = self.endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    let service = service.clone();
                    let open_requests = self.open_requests;
                    tokio::spawn(async move {
                        if let Err(e) = serve_connection(incoming, service, open_requests).await {
                            tracing::debug!(error = %e, "connection ended with error");
                        }
                    });
                }
                () = &mut shutdown => break,
            }
        }
        self.endpoint.close(close_code::SHUTDOWN.into(), b"server shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
    }
}

async fn serve_connection<S: Service>(
    incoming: quinn::Incoming,
    service: Arc<S>,
    open_requests: usize,
) -> Result<(), TransportError> {
    let conn = incoming.await.map_err(TransportError::Connection)?;
    let (status, principal) = tokio::time::timeout(HELLO_TIMEOUT, hello(&conn, service.as_ref()))
        .await
        .map_err(|_| TransportError::HelloTimeout(HELLO_TIMEOUT))??;
    let Some(principal) = principal.filter(|_| status == HelloStatus::Ok) else {
        tracing::info!(remote = %conn.remote_address(), ?status, "hello refused");
        // Give the client a moment to read the refusal, then close.
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.closed()).await;
        conn.close(close_code::HELLO_REFUSED.into(), b"hello refused");
        return Ok(());
    };
    let principal = Arc::new(principal);
    let open = Arc::new(tokio::sync::Semaphore::new(open_requests));
    let mut credit = crate::tuning::INITIAL_STREAM_CREDIT;
    loop {
        // More credit before the client runs out (see `tuning::INITIAL_STREAM_CREDIT`).
        let open_now = open_requests - open.available_permits();
        if credit < crate::tuning::MAX_CONCURRENT_STREAMS && open_now * 4 >= credit as usize * 3 {
            credit = (credit * 2).min(crate::tuning::MAX_CONCURRENT_STREAMS);
            conn.set_max_concurrent_bi_streams(credit.into());
        }
        let (send, recv) = match conn.accept_bi().await {
            Ok(pair) => pair,
            Err(quinn::ConnectionError::ApplicationClosed(_))
            | Err(quinn::ConnectionError::LocallyClosed) => return Ok(()),
            Err(e) => return Err(TransportError::Connection(e)),
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tokio::spawn(refuse_stream(send, recv, open_requests));
            continue;
        };
        let service = service.clone();
        let principal = principal.clone();
        tokio::spawn(async move {
            serve_stream(send, recv, service, &principal).await;
            drop(permit);
        });
    }
}

/// Answers a request over the connection's limit without reading it.
async fn refuse_stream(send: quinn::SendStream, recv: quinn::RecvStream, limit: usize) {
    tracing::debug!(limit, "request refused: its connection has as many requests open as allowed");
    let mut exchange = Exchange { send, reader: Some(FrameReader::new(recv)) };
    exchange.refuse_upload();
    let message = format!(
        "limit reached: at most {limit} requests open at once on one connection (the node's \
         limits.streams_per_connection); wait for some to finish"
    );
    let _ = exchange.error(WireError::new(ErrorCode::QuotaExceeded, message)).await;
    exchange.finish();
}

/// Runs the hello on the connection's first stream and returns what was decided.
async fn hello<S: Service>(
    conn: &quinn::Connection,
    service: &S,
) -> Result<(HelloStatus, Option<S::Principal>), TransportError> {
    let (mut send, mut recv) = conn.accept_bi().await.map_err(TransportError::Connection)?;
    let mut fixed = [0u8; CLIENT_FIXED_BYTES];
    let parsed = match recv.read_exact(&mut fixed).await {
        Ok(()) => ClientHello::parse_fixed(&fixed).ok(),
        Err(_) => None,
    };
    let mut principal = None;
    let (status, message) = match parsed {
        None => (HelloStatus::Malformed, "not a Brig hello".to_string()),
        Some((version, token_len)) => {
            let mut token = vec![0u8; token_len];
            let token_ok = recv.read_exact(&mut token).await.is_ok();
            match std::str::from_utf8(&token) {
                _ if !token_ok => (HelloStatus::Malformed, "hello truncated".to_string()),
                _ if version != PROTOCOL_VERSION => (
                    HelloStatus::VersionMismatch,
                    format!(
                        "this server speaks Brig protocol {PROTOCOL_VERSION} and the client speaks \
                         {version}; use a client of the same release as the server"
                    ),
                ),
                Ok(token) => {
                    principal = service.authenticate(token).await;
                    if principal.is_some() {
                        (HelloStatus::Ok, service.hello_message())
                    } else {
                        (HelloStatus::Unauthenticated, "access token refused".to_string())
                    }
                }
                Err(_) => (HelloStatus::Unauthenticated, "access token refused".to_string()),
            }
        }
    };
    let reply = ServerHello { version: PROTOCOL_VERSION, status, message };
    write_raw(&mut send, Bytes::from(reply.encode())).await?;
    let _ = send.finish();
    Ok((status, principal))
}

async fn serve_stream<S: Service>(
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    service: Arc<S>,
    principal: &S::Principal,
) {
    let mut reader = FrameReader::new(recv);
    match reader.read_frame::<Request>().await {
        Ok(Some(request)) => {
            service.serve(principal, request, Exchange { send, reader: Some(reader) }).await
        }
        Ok(None) => {}
        Err(e) => {
            let mut exchange = Exchange { send, reader: Some(reader) };
            exchange.refuse_upload();
            let message = format!("cannot decode request as Brig protocol {PROTOCOL_VERSION}: {e}");
            let _ = exchange.error(WireError::new(ErrorCode::BadRequest, message)).await;
            exchange.finish();
        }
    }
}
