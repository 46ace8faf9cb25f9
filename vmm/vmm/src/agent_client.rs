//! The host's end of the agent protocol (see `brig-agent`): connect through the VM's vsock
//! Unix socket, ask for a command, relay its output.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("vsock socket {0}")]
    Connect(String, #[source] std::io::Error),
    #[error("the VM refused the connection to port {0} (no agent listening yet?)")]
    Refused(u32),
    #[error("agent connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent sent frame kind {0}, which this client does not know")]
    BadFrame(u8),
}

/// Runs `command` in the guest; its stdout and stderr go to ours; returns its exit status.
pub fn exec(uds: &Path, port: u32, command: &str) -> Result<i32, AgentError> {
    let mut stream =
        UnixStream::connect(uds).map_err(|e| AgentError::Connect(uds.display().to_string(), e))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("OK ") {
        return Err(AgentError::Refused(port));
    }
    stream.write_all(format!("EXEC {}\n", command.replace('\n', " ")).as_bytes())?;
    loop {
        let mut head = [0u8; 5];
        if reader.read_exact(&mut head).is_err() {
            return Err(AgentError::Refused(port));
        }
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut data = vec![0u8; len.min(1 << 20)];
        reader.read_exact(&mut data)?;
        match head[0] {
            1 => std::io::stdout().write_all(&data)?,
            2 => std::io::stderr().write_all(&data)?,
            3 => {
                let code =
                    data.get(..4).and_then(|b| b.try_into().ok()).map_or(1, i32::from_le_bytes);
                std::io::stdout().flush()?;
                return Ok(code);
            }
            other => return Err(AgentError::BadFrame(other)),
        }
    }
}
