//! The gateway's HTTP server: hyper's (HTTP/1.1 and h2c on one port, through hyper-util's
//! automatic builder) with limits on what a client may hold, so connections that never finish
//! a request neither stay open nor keep memory:
//! - a connection whose first bytes do not tell its protocol within [`HEADER_READ_TIMEOUT`]
//!   (the whole HTTP/2 preface, or anything that cannot begin it) is closed: hyper-util's
//!   automatic builder waits for them without a deadline;
//! - a request head larger than [`MAX_HEADER_BYTES`] is refused (431 on HTTP/1, a reset on h2);
//! - an HTTP/1 head not read whole within [`HEADER_READ_TIMEOUT`] closes the connection (this
//!   also ends an HTTP/1 connection idle between requests);
//! - any connection with no request open for [`IDLE_TIMEOUT`] is closed, whatever its protocol
//!   (an idle h2 connection);
//! - at most [`MAX_CONNECTIONS`] connections at once; h2 peers that stop answering pings are
//!   dropped, and an h2 connection has at most [`H2_MAX_STREAMS`] streams open.
//!
//! A request is open from its head until its response body is dropped (sent or abandoned), so
//! a long command stream or upload is never cut for idleness.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower_service::Service as _;

/// Largest request head (HTTP/1 read buffer, h2 header list). E2B's SDKs send heads of a few
/// hundred bytes; at this size [`MAX_CONNECTIONS`] unfinished heads hold at most 128 MiB.
pub const MAX_HEADER_BYTES: usize = 16 << 10;
/// How long a connection's first bytes (enough to tell HTTP/1 from HTTP/2) may take to
/// arrive; and how long an HTTP/1 request head may take, from the connection's first byte or
/// the end of its previous request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The bytes every HTTP/2 connection opens with.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// How long a connection may stay with no request open.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most connections served at once; more wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 8192;
/// Streams open at once on one h2 connection.
pub const H2_MAX_STREAMS: u32 = 256;
/// h2 keepalive pings, and how long a ping may go unanswered.
const H2_PING_EVERY: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a connection's idleness is looked at.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long a connection asked to close may take to finish what it has open.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// The server's protocol settings.
fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(H2_PING_EVERY)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    builder
}

/// Requests open on one connection, and since when it has had none.
struct Activity {
    open: AtomicUsize,
    quiet_since: parking_lot::Mutex<Instant>,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            quiet_since: parking_lot::Mutex::new(Instant::now()),
        })
    }

    fn begin(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenRequest(self.clone())
    }

    /// How long the connection has had no request open (`None` while one is).
    fn idle_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(self.quiet_since.lock().elapsed())
    }
}

/// A request in progress: from its head until its response body is dropped.
struct OpenRequest(Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let mut since = self.0.quiet_since.lock();
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            *since = Instant::now();
        }
    }
}

/// Serves `router` on `listener` until the process ends.
pub(crate) async fn serve(listener: tokio::net::TcpListener, router: Router, local: SocketAddr) {
    let builder = builder();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was taken: wait a
                // moment rather than spin.
                tracing::warn!(%local, error = %e, "E2B API accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small writes (Connect envelopes, stream ends) go out at once: without TCP_NODELAY
        // a reply waits on the client's delayed ACK (~40 ms a command).
        let _ = tcp.set_nodelay(true);
        let (builder, router) = (builder.clone(), router.clone());
        tokio::spawn(async move {
            serve_connection(&builder, tcp, router).await;
            tracing::trace!(%peer, "E2B API connection closed");
            drop(slot);
        });
    }
}

/// Reads a connection's first bytes until they tell its protocol: the whole HTTP/2 preface,
/// or bytes that cannot begin it (HTTP/1, whose head timeout then applies). `None` when the
/// connection ends, fails, or tells neither `within` ([`HEADER_READ_TIMEOUT`]).
async fn protocol_head<T: AsyncRead + Unpin>(
    tcp: &mut T,
    within: Duration,
) -> Option<([u8; 24], usize)> {
    let read = async {
        let mut head = [0u8; 24];
        let mut n = 0;
        loop {
            let got = tcp.read(&mut head[n..]).await.ok()?;
            if got == 0 {
                return None;
            }
            n += got;
            if n == head.len() || head[..n] != H2_PREFACE[..n] {
                return Some((head, n));
            }
        }
    };
    tokio::time::timeout(within, read).await.ok().flatten()
}

/// A connection whose first bytes, already read, are read again first (by hyper, which
/// tells the protocol from them once more).
struct Replayed<T> {
    head: [u8; 24],
    unread: std::ops::Range<usize>,
    tcp: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Replayed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.unread.is_empty() {
            let n = self.unread.len().min(buf.remaining());
            let start = self.unread.start;
            buf.put_slice(&self.head[start..start + n]);
            self.unread.start += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Replayed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

async fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    mut tcp: TcpStream,
    router: Router,
) {
    // Before hyper: its automatic builder reads the first bytes with no deadline, so a
    // connection that sends nothing (or `P`) would hold its slot until the idle check.
    let Some((head, n)) = protocol_head(&mut tcp, HEADER_READ_TIMEOUT).await else {
        tracing::trace!("E2B API connection closed before its protocol was told");
        return;
    };
    let io = Replayed { head, unread: 0..n, tcp };
    let activity = Activity::new();
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let open = activity.begin();
            let mut router = router.clone();
            async move {
                let response = router.call(request).await?;
                // The request stays open until hyper drops its response body.
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _ = &open;
                        frame
                    }))
                }))
            }
        })
    };
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "E2B API connection ended");
                }
                return;
            }
            _ = tokio::time::sleep(IDLE_CHECK) => {
                match closing {
                    Some(at) if at.elapsed() >= CLOSE_GRACE => return,
                    Some(_) => {}
                    None => {
                        if activity.idle_for().is_some_and(|idle| idle >= IDLE_TIMEOUT) {
                            conn.as_mut().graceful_shutdown();
                            closing = Some(Instant::now());
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    const WITHIN: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn a_connection_must_tell_its_protocol_within_the_head_timeout() {
        // Nothing, or a beginning of the HTTP/2 preface, and then nothing: closed.
        for sent in [&b""[..], b"P", b"PRI * HTTP/2.0\r\n"] {
            let (mut client, mut server) = tokio::io::duplex(1024);
            client.write_all(sent).await.expect("write");
            let started = tokio::time::Instant::now();
            assert_eq!(protocol_head(&mut server, WITHIN).await, None, "{sent:?}");
            assert!(started.elapsed() >= WITHIN);
            drop(client);
        }
        // The whole preface, even in pieces; or anything that cannot begin it: told at once.
        let (mut client, mut server) = tokio::io::duplex(1024);
        let reader = tokio::spawn(async move { protocol_head(&mut server, WITHIN * 10).await });
        client.write_all(&H2_PREFACE[..5]).await.expect("write");
        tokio::time::sleep(WITHIN / 3).await;
        client.write_all(&H2_PREFACE[5..]).await.expect("write");
        assert_eq!(reader.await.expect("task"), Some((*H2_PREFACE, 24)));
        for (sent, told) in [(&b"GET / HTTP/1.1\r\n"[..], 1), (b"PUT", 2), (b"PRX", 3)] {
            let (mut client, mut server) = tokio::io::duplex(1024);
            client.write_all(sent).await.expect("write");
            let (_, n) = protocol_head(&mut server, WITHIN * 10).await.expect("told");
            assert!(n >= told && n <= sent.len(), "{sent:?}: {n}");
        }
        // A connection that ends first: closed.
        let (client, mut server) = tokio::io::duplex(1024);
        drop(client);
        assert_eq!(protocol_head(&mut server, WITHIN * 10).await, None);
    }

    #[tokio::test]
    async fn both_protocols_are_served_after_the_first_bytes_are_read() {
        let router = Router::new().route("/health", axum::routing::get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let local = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, router, local));
        // HTTP/1, its head in two pieces.
        let mut tcp = TcpStream::connect(local).await.expect("connect");
        tcp.write_all(b"GE").await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        tcp.write_all(b"T /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
        // HTTP/2 with prior knowledge: the server's SETTINGS frame follows the preface.
        let mut tcp = TcpStream::connect(local).await.expect("connect");
        tcp.write_all(&H2_PREFACE[..10]).await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        tcp.write_all(&H2_PREFACE[10..]).await.expect("write");
        tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.expect("settings");
        let mut frame = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut frame))
            .await
            .expect("answered")
            .expect("read");
        assert_eq!(frame[3], 4, "a SETTINGS frame: {frame:?}");
    }
}
