//! A TCP connection to a port inside a sandbox's network namespace: made by a thread of its
//! own that joins the namespace and connects to the sandbox's loopback (the thread exits
//! after, so no pooled thread stays in a sandbox's namespace). The socket keeps the namespace
//! it was made in, so the node reaches a sandbox's own `127.0.0.1:PORT`, never a port of the
//! host.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Connects to `port` on the loopback of the network namespace of process `net_pid` (IPv4,
/// then IPv6), within `timeout`.
pub async fn connect_port(net_pid: i32, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let ns = std::fs::File::open(format!("/proc/{net_pid}/ns/net"))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<io::Result<TcpStream>>();
    std::thread::Builder::new().name("brig-port".into()).spawn(move || {
        let connected = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(io::Error::from)
            .and_then(|()| {
                let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                TcpStream::connect_timeout(&v4, timeout).or_else(|e| {
                    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
                    TcpStream::connect_timeout(&v6, timeout).map_err(|_| e)
                })
            });
        let _ = tx.send(connected);
    })?;
    rx.await.map_err(|_| io::Error::other("the connecting thread died"))?
}
