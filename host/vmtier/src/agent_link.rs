//! The link to a guest's brig-agent: one vsock connection (through the VMM's Unix socket) per
//! request; replies come back as frames (stdout, stderr, exit status).

use std::path::Path;

use brig_vmm_api::agent;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::{io, ExecOutput, VmTierError};

/// A piece of a running command's result, as the agent sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
}

/// An exec in progress: its output as it is produced, then its status.
pub struct ExecStream {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    _write: tokio::net::unix::OwnedWriteHalf,
}

impl ExecStream {
    /// The connection's two halves, for a request that keeps talking (a session).
    pub(crate) fn into_parts(
        self,
    ) -> (BufReader<tokio::net::unix::OwnedReadHalf>, tokio::net::unix::OwnedWriteHalf) {
        (self.reader, self._write)
    }

    /// The next event; `Exit` is the last.
    pub async fn next(&mut self) -> Result<ExecEvent, VmTierError> {
        let mut head = [0u8; 5];
        self.reader.read_exact(&mut head).await.map_err(io("agent reply"))?;
        let (kind, len) = agent::parse_header(head).map_err(VmTierError::Agent)?;
        let mut data = vec![0u8; len];
        self.reader.read_exact(&mut data).await.map_err(io("agent reply"))?;
        match kind {
            agent::STDOUT => Ok(ExecEvent::Stdout(data)),
            agent::STDERR => Ok(ExecEvent::Stderr(data)),
            agent::EXIT => Ok(ExecEvent::Exit(
                data.get(..4).and_then(|b| b.try_into().ok()).map_or(-1, i32::from_le_bytes),
            )),
            other => Err(VmTierError::Agent(format!("unknown frame kind {other}"))),
        }
    }
}

/// Starts `command` in the guest behind `uds`.
pub async fn exec_stream(uds: &Path, command: &str) -> Result<ExecStream, VmTierError> {
    request_stream(uds, &agent::exec_line(command)).await
}

/// Sends one agent request line and returns the reply stream.
pub(crate) async fn request_stream(uds: &Path, request: &str) -> Result<ExecStream, VmTierError> {
    request_with_body(uds, request, &[]).await
}

/// Sends a request line and `body` right after it.
pub(crate) async fn request_with_body(
    uds: &Path,
    request: &str,
    body: &[u8],
) -> Result<ExecStream, VmTierError> {
    let stream =
        UnixStream::connect(uds).await.map_err(io(format!("connecting to {}", uds.display())))?;
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    write
        .write_all(format!("CONNECT {}\n", agent::PORT).as_bytes())
        .await
        .map_err(io("vsock connect"))?;
    let mut line = String::new();
    reader.read_line(&mut line).await.map_err(io("vsock connect"))?;
    if !line.starts_with("OK ") {
        return Err(VmTierError::Agent("the guest's agent is not listening".into()));
    }
    write.write_all(request.as_bytes()).await.map_err(io("agent request"))?;
    write.write_all(body).await.map_err(io("agent request"))?;
    Ok(ExecStream { reader, _write: write })
}

pub(crate) async fn exec_inner(uds: &Path, command: &str) -> Result<ExecOutput, VmTierError> {
    collect(&mut exec_stream(uds, command).await?).await
}

/// Reads a reply stream to its end.
pub(crate) async fn collect(stream: &mut ExecStream) -> Result<ExecOutput, VmTierError> {
    let mut out = ExecOutput::default();
    loop {
        match stream.next().await? {
            ExecEvent::Stdout(d) => out.stdout.extend_from_slice(&d),
            ExecEvent::Stderr(d) => out.stderr.extend_from_slice(&d),
            ExecEvent::Exit(code) => {
                out.exit_code = code;
                return Ok(out);
            }
        }
    }
}
