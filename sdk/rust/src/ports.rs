//! Connections to ports inside a sandbox (`Sandbox::connect_port`): a byte stream to what
//! listens on the sandbox's own loopback, carried by one request stream to its node.

use brig_proto::{Reply, Request, SandboxOp};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use crate::client::unexpected;
use crate::{Error, Sandbox};

/// Bytes buffered each way between the caller and the stream.
const BUFFER: usize = 256 << 10;

impl Sandbox {
    /// A connection to `port` on the sandbox's loopback (never a port of the host), as an
    /// `AsyncRead + AsyncWrite` stream; `unavailable` when nothing listens there.
    pub async fn connect_port(&self, port: u16) -> Result<DuplexStream, Error> {
        let request =
            Request::Sandbox(SandboxOp::ConnectPort { sandbox: self.id().to_string(), port });
        let mut exchange = self.client().open(&request).await?;
        let mut upload = exchange.take_upload();
        match exchange.reply().await? {
            Reply::PortOpen => {}
            Reply::Error(e) => return Err(e.into()),
            other => return Err(unexpected("connect_port", &other)),
        }
        let Some(mut upload) = upload.take() else {
            return Err(Error::Config("the request stream has no upload half".into()));
        };
        let (ours, theirs) = tokio::io::duplex(BUFFER);
        let (mut from_caller, mut to_caller) = tokio::io::split(ours);
        tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(64 << 10);
            loop {
                buf.reserve(64 << 10);
                match from_caller.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if upload.send_raw(buf.split().freeze()).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = upload.finish();
        });
        tokio::spawn(async move {
            while let Ok(Some(piece)) = exchange.read_raw().await {
                if to_caller.write_all(&piece).await.is_err() {
                    break;
                }
            }
            let _ = to_caller.shutdown().await;
        });
        Ok(theirs)
    }
}
