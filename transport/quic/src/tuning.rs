//! Transport settings for a sandbox platform, and the UDP socket they run on.
//!
//! quinn's defaults throttle this workload (docs/GUEST.md §6): 100 concurrent streams per
//! connection (excess requests wait silently), a 30 s idle timeout with no keep-alive (an agent thinking for
//! a minute loses its connection), and the kernel's 208 KiB UDP receive buffer, which drops
//! packets in bursts. We raise all of them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::TransportError;

/// Concurrent bidirectional streams (= in-flight requests) a client may open per connection,
/// at most.
pub const MAX_CONCURRENT_STREAMS: u32 = 16_384;
/// What a connection may open at first. quinn keeps per-stream state (and, as streams are
/// recycled, their buffers) for every stream the peer may open, so a fixed credit of
/// [`MAX_CONCURRENT_STREAMS`] grew each busy connection by ~6 MiB over its first ~16k
/// requests. The server raises a connection's credit, doubling, as its open requests reach
/// three quarters of it (`crate::server`), so memory follows the peak a connection uses.
pub const INITIAL_STREAM_CREDIT: u32 = 256;
/// Keep-alive interval; well under [`IDLE_TIMEOUT`]. It also bounds how long a client waits on
/// a connection to a server that restarted: its next keep-alive draws a stateless reset.
pub const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// A connection with no traffic (keep-alives count) for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// UDP socket buffers requested; the kernel caps them at `net.core.{r,w}mem_max`, which the setup
/// script raises.
pub const UDP_BUFFER_BYTES: usize = 4 << 20;

/// Which end a configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Client,
    Server,
}

/// The transport configuration of each end. Only clients open streams.
pub fn transport_config(end: End) -> Arc<quinn::TransportConfig> {
    let credit = match end {
        End::Server => INITIAL_STREAM_CREDIT,
        End::Client => 0,
    };
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(credit.into())
        .max_concurrent_uni_streams(0u32.into())
        .keep_alive_interval(Some(KEEP_ALIVE))
        .stream_receive_window((8u32 << 20).into())
        .receive_window((64u32 << 20).into())
        .send_window(64 << 20);
    // IDLE_TIMEOUT is far below the 2^62 ms limit, so the conversion cannot fail.
    if let Ok(idle) = quinn::IdleTimeout::try_from(IDLE_TIMEOUT) {
        t.max_idle_timeout(Some(idle));
    }
    Arc::new(t)
}

/// Binds a UDP socket with enlarged buffers, for use by a quinn endpoint.
pub fn bind_udp(addr: SocketAddr) -> Result<std::net::UdpSocket, TransportError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let bind_err = |source| TransportError::Bind { addr, source };
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(bind_err)?;
    for (what, result) in [
        ("receive", socket.set_recv_buffer_size(UDP_BUFFER_BYTES)),
        ("send", socket.set_send_buffer_size(UDP_BUFFER_BYTES)),
    ] {
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot enlarge UDP {what} buffer");
        }
    }
    if let Ok(got) = socket.recv_buffer_size() {
        // Linux reports double the usable size.
        if got < UDP_BUFFER_BYTES {
            tracing::warn!(
                got_bytes = got,
                want_bytes = UDP_BUFFER_BYTES,
                "UDP receive buffer capped by net.core.rmem_max; bursts may drop packets"
            );
        }
    }
    socket.bind(&addr.into()).map_err(bind_err)?;
    Ok(socket.into())
}
