//! The gateway's HTTP server: hyper's (HTTP/1.1 and h2c on one port, through hyper-util's
//! automatic builder) with limits on what a client may hold, so connections that never finish
//! a request neither stay open nor keep memory:
//! - a request head larger than [`MAX_HEADER_BYTES`] is refused (431 on HTTP/1, a reset on h2);
//! - an HTTP/1 head not read whole within [`HEADER_READ_TIMEOUT`] closes the connection (this
//!   also ends an HTTP/1 connection idle between requests);
//! - any connection with no request open for [`IDLE_TIMEOUT`] is closed, whatever its protocol
//!   (one that never sent a byte, an idle h2 connection);
//! - at most [`MAX_CONNECTIONS`] connections at once; h2 peers that stop answering pings are
//!   dropped, and an h2 connection has at most [`H2_MAX_STREAMS`] streams open.
//!
//! A request is open from its head until its response body is dropped (sent or abandoned), so
//! a long command stream or upload is never cut for idleness.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tower_service::Service as _;

/// Largest request head (HTTP/1 read buffer, h2 header list).
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// How long an HTTP/1 request head may take to arrive, from the connection's first byte or
/// the end of its previous request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
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

async fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    tcp: tokio::net::TcpStream,
    router: Router,
) {
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
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
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
