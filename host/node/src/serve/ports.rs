//! Connections to ports inside sandboxes (`SandboxOp::ConnectPort`): the node connects to the
//! sandbox's own loopback from within its network namespace (`brig_container::port_connect`)
//! and the request's stream carries the bytes both ways until either side ends. What E2B's
//! port routes (`E2b-Sandbox-Port`, `<port>-<id>.<domain>`) and `brig port` ride on.

use std::time::Duration;

use brig_proto::Reply;
use brig_transport::Exchange;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{Node, NodeError};

/// How long reaching a port may take (a listening port answers at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read from the sandbox per piece sent on.
const PIECE: usize = 64 << 10;

impl Node {
    /// Connects to `port` in `sandbox` and carries the connection on `exchange`.
    pub(crate) async fn connect_port(
        &self,
        sandbox: &str,
        port: u16,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let entry = self.live(sandbox).await?;
        let Some(pid) = entry.sandbox.net_pid() else {
            exchange.refuse_upload();
            return Err(NodeError::WrongTier {
                id: sandbox.to_string(),
                tier: entry.tier,
                op: "connections to its ports (a container's)",
            });
        };
        if port == 0 {
            exchange.refuse_upload();
            return Err(NodeError::PortClosed { port, why: "port 0 is no port".into() });
        }
        let stream =
            match brig_container::port_connect::connect_port(pid, port, CONNECT_TIMEOUT).await {
                Ok(stream) => stream,
                Err(e) => {
                    exchange.refuse_upload();
                    return Err(NodeError::PortClosed { port, why: e.to_string() });
                }
            };
        let io = |source| NodeError::Io { what: format!("port {port} connection"), source };
        stream.set_nonblocking(true).map_err(io)?;
        // Bytes go on as they come (a proxied stream is often small pieces).
        stream.set_nodelay(true).map_err(io)?;
        let stream = tokio::net::TcpStream::from_std(stream).map_err(io)?;
        exchange.reply(&Reply::PortOpen).await?;
        let (mut from_sandbox, mut to_sandbox) = stream.into_split();
        let Some(mut upload) = exchange.take_upload() else { return Ok(None) };
        let inbound = async {
            while let Ok(Some(piece)) = upload.read().await {
                if to_sandbox.write_all(&piece).await.is_err() {
                    upload.refuse();
                    break;
                }
            }
            let _ = to_sandbox.shutdown().await;
        };
        let outbound = async {
            let mut buf = BytesMut::with_capacity(PIECE);
            loop {
                buf.reserve(PIECE);
                match from_sandbox.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if exchange.send_raw(buf.split().freeze()).await.is_err() {
                            break;
                        }
                    }
                }
            }
        };
        tokio::join!(inbound, outbound);
        Ok(None)
    }
}
