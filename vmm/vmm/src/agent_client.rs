//! The host's end of the agent protocol (see `brig-agent`): connect through the VM's vsock
//! Unix socket, ask for a command, relay its output.

use std::io::{BufRead, BufReader, Write};

use brig_vmm_api::agent;
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
    let process = agent::ProcessRun::shell(command);
    stream.write_all(
        &agent::AgentRequest::Exec { process, stdin_frames: false, keep: None }.to_frame(),
    )?;
    loop {
        let Ok((kind, data)) = agent::read_frame(&mut reader) else {
            return Err(AgentError::Refused(port));
        };
        match kind {
            agent::STDOUT => std::io::stdout().write_all(&data)?,
            agent::STDERR => std::io::stderr().write_all(&data)?,
            agent::EXIT => {
                let code = agent::status_of(&data);
                std::io::stdout().flush()?;
                return Ok(code);
            }
            other => return Err(AgentError::BadFrame(other)),
        }
    }
}
