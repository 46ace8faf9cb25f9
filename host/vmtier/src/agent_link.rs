//! The link to a guest's brig-agent: one vsock connection (through the VMM's Unix socket) per
//! request; replies come back as frames (stdout, stderr, exit status).

use std::path::Path;
use std::time::Duration;

use brig_vmm_api::agent::{self, AgentRequest, KeepExec, KeptInfo, ProcessRun};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::{io, ExecOutput, VmTierError};

/// A piece of a running command's result, as the agent sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
    /// The process died of this signal (container requests report signals apart).
    Signaled(i32),
}

/// An exec in progress: its output as it is produced, then its status.
pub struct ExecStream {
    pub(crate) reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    /// Kept open while the command runs: closing it hangs up, which kills the command.
    pub(crate) write: Option<tokio::net::unix::OwnedWriteHalf>,
    /// An event read ahead (by [`ExecStream::started`]), given out first.
    pub(crate) pending: Option<ExecEvent>,
}

/// A command's stdin, sent to the agent as frames (see `exec_stream_input`). Keep it until
/// the command is done: dropping it hangs up, which kills the command.
pub struct GuestStdin {
    pub(crate) write: tokio::net::unix::OwnedWriteHalf,
}

impl GuestStdin {
    /// Sends `data` to the command's stdin.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), VmTierError> {
        for chunk in data.chunks(64 << 10) {
            let frame = agent::encode_frame(agent::IN_STDIN, chunk);
            self.write.write_all(&frame).await.map_err(io("command stdin"))?;
        }
        Ok(())
    }

    /// Ends the command's input (it reads end of file).
    pub async fn finish(&mut self) -> Result<(), VmTierError> {
        let frame = agent::frame_header(agent::IN_STDIN, 0);
        self.write.write_all(&frame).await.map_err(io("command stdin"))
    }
}

impl ExecStream {
    /// The connection's two halves, for a request that keeps talking (a session).
    pub(crate) fn into_parts(
        self,
    ) -> (BufReader<tokio::net::unix::OwnedReadHalf>, Option<tokio::net::unix::OwnedWriteHalf>)
    {
        (self.reader, self.write)
    }

    /// The next event; `Exit` is the last.
    pub async fn next(&mut self) -> Result<ExecEvent, VmTierError> {
        if let Some(event) = self.pending.take() {
            return Ok(event);
        }
        loop {
            if let Some(event) = self.next_frame().await? {
                return Ok(event);
            }
        }
    }

    /// Waits for a command given its stdin whole to start ([`agent::STARTED`]): `true` once it
    /// has; `false` if the agent answered otherwise (the command could not start: its error
    /// comes next from [`ExecStream::next`]).
    pub async fn started(&mut self) -> Result<bool, VmTierError> {
        match self.next_frame().await? {
            None => Ok(true),
            Some(event) => {
                self.pending = Some(event);
                Ok(false)
            }
        }
    }

    /// One frame: an event, or `None` for STARTED.
    async fn next_frame(&mut self) -> Result<Option<ExecEvent>, VmTierError> {
        let mut head = [0u8; 5];
        self.reader.read_exact(&mut head).await.map_err(io("agent reply"))?;
        let (kind, len) =
            agent::parse_header(head).map_err(|e| VmTierError::Agent(e.to_string()))?;
        let mut data = vec![0u8; len];
        self.reader.read_exact(&mut data).await.map_err(io("agent reply"))?;
        if kind == agent::STARTED {
            return Ok(None);
        }
        let event = match kind {
            agent::STDOUT => ExecEvent::Stdout(data),
            agent::STDERR => ExecEvent::Stderr(data),
            agent::EXIT | agent::SIGNALED => {
                let value = agent::status_of(&data);
                if kind == agent::EXIT {
                    ExecEvent::Exit(value)
                } else {
                    ExecEvent::Signaled(value)
                }
            }
            other => return Err(VmTierError::Agent(format!("unknown frame kind {other}"))),
        };
        Ok(Some(event))
    }
}

/// Starts `process` in the guest behind `uds` with its stdin streamed through the returned
/// [`GuestStdin`]; with `keep`, the agent keeps it across the node's restarts.
pub async fn exec_stream_input(
    uds: &Path,
    process: ProcessRun,
    keep: Option<KeepExec>,
) -> Result<(ExecStream, GuestStdin), VmTierError> {
    let request = AgentRequest::Exec { process, stdin_frames: true, keep };
    let (reader, write) = request_stream(uds, &request).await?.into_parts();
    let write = write.ok_or_else(|| VmTierError::Agent("no connection to write to".into()))?;
    Ok((ExecStream { reader, write: None, pending: None }, GuestStdin { write }))
}

/// Starts `process` in the guest behind `uds`, its stdin empty; with `keep`, the agent keeps
/// it across the node's restarts.
pub async fn exec_stream(
    uds: &Path,
    process: ProcessRun,
    keep: Option<KeepExec>,
) -> Result<ExecStream, VmTierError> {
    request_stream(uds, &AgentRequest::Exec { process, stdin_frames: false, keep }).await
}

/// The commands the agent behind `uds` keeps (at most [`agent::MAX_KEPT`], each in a frame):
/// the VM's own, or with `container`, that container's (each of these functions takes it).
pub async fn kept_commands(
    uds: &Path,
    container: Option<&str>,
) -> Result<Vec<KeptInfo>, VmTierError> {
    let limit = Duration::from_secs(10);
    let listing = async {
        let mut stream =
            request_stream(uds, &AgentRequest::Kept { container: container.map(str::to_string) })
                .await?;
        let mut out = Vec::new();
        loop {
            match stream.next().await? {
                ExecEvent::Stdout(data) if out.len() < agent::MAX_KEPT => {
                    let info = serde_json::from_slice(&data).map_err(|e| {
                        VmTierError::Agent(format!("an unreadable kept command: {e}"))
                    })?;
                    out.push(info);
                }
                ExecEvent::Exit(0) => return Ok(out),
                other => {
                    return Err(VmTierError::Agent(format!("listing kept commands: {other:?}")))
                }
            }
        }
    };
    tokio::time::timeout(limit, listing).await.map_err(|_| VmTierError::ReplyTimeout(limit))?
}

/// Kept command `id`'s output from its first byte, then the rest as it comes, then its end.
pub async fn attach_kept(
    uds: &Path,
    id: u64,
    container: Option<&str>,
) -> Result<ExecStream, VmTierError> {
    let container = container.map(str::to_string);
    request_stream(uds, &AgentRequest::Attach { id, container, input: false }).await
}

/// As [`attach_kept`], with the command's kept stdin written through the returned
/// [`GuestStdin`] (its `finish` ends the input; dropping it leaves the input open).
pub async fn attach_kept_input(
    uds: &Path,
    id: u64,
    container: Option<&str>,
) -> Result<(ExecStream, GuestStdin), VmTierError> {
    let request =
        AgentRequest::Attach { id, container: container.map(str::to_string), input: true };
    let (reader, write) = request_stream(uds, &request).await?.into_parts();
    let write = write.ok_or_else(|| VmTierError::Agent("no connection to write to".into()))?;
    Ok((ExecStream { reader, write: None, pending: None }, GuestStdin { write }))
}

/// Kills every command and ends every session the agent behind `uds` keeps (best effort: a
/// VM resumed from a saved state, whose connections ended at the save).
pub(crate) async fn kill_all_kept(uds: &Path) {
    // Once more after a moment: a guest just restored may refuse a connection while its
    // vsock transport settles.
    let listed = match kept_commands(uds, None).await {
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            kept_commands(uds, None).await
        }
        listed => listed,
    };
    match listed {
        Ok(listed) => {
            for info in listed.iter().filter(|i| !i.ended) {
                if let Err(e) = kill_kept(uds, info.keep.id, None).await {
                    tracing::debug!(exec = info.keep.id, error = %e, "a kept command not killed");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list a guest's kept commands"),
    }
    // Its kept sessions too: their connections ended at the save as well.
    match kept_sessions(uds, None).await {
        Ok(ids) => {
            for id in ids {
                if let Err(e) = close_kept_session(uds, &id, None).await {
                    tracing::debug!(session = %id, error = %e, "a kept session not ended");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list a guest's kept sessions"),
    }
}

/// The protocol the agent behind `uds` speaks ([`agent::PROTOCOL`]). An agent older than
/// `hello` (a VM started or saved by an older build) cannot read it and answers
/// [`agent::EXIT_BAD_REQUEST`]: protocol 1.
pub(crate) async fn agent_protocol(uds: &Path) -> Result<u32, VmTierError> {
    let out = request_within(uds, &AgentRequest::Hello, KEPT_REQUEST).await?;
    match out.exit_code {
        0 => serde_json::from_slice::<agent::AgentHello>(&out.stdout)
            .map(|hello| hello.protocol)
            .map_err(|e| VmTierError::Agent(format!("the agent's hello: {e}"))),
        agent::EXIT_BAD_REQUEST => Ok(1),
        code => Err(VmTierError::Agent(format!(
            "hello answered {code}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// Deadline of a short request about kept commands and sessions (kill, list, probe, close).
pub(crate) const KEPT_REQUEST: Duration = Duration::from_secs(10);

/// Sends a short request and collects its reply within [`KEPT_REQUEST`]; a refusal (a
/// nonzero status) is an error with the agent's message.
async fn request_ok(uds: &Path, request: &AgentRequest) -> Result<ExecOutput, VmTierError> {
    let out = request_within(uds, request, KEPT_REQUEST).await?;
    if out.exit_code != 0 {
        return Err(VmTierError::Agent(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(out)
}

/// Kills kept command `id` in the guest behind `uds`.
pub async fn kill_kept(uds: &Path, id: u64, container: Option<&str>) -> Result<(), VmTierError> {
    let container = container.map(str::to_string);
    request_ok(uds, &AgentRequest::Kill { id, container }).await.map(drop)
}

/// The ids of the sessions the agent behind `uds` keeps.
pub(crate) async fn kept_sessions(
    uds: &Path,
    container: Option<&str>,
) -> Result<Vec<String>, VmTierError> {
    let container = container.map(str::to_string);
    let out = request_ok(uds, &AgentRequest::Sessions { container }).await?;
    serde_json::from_slice(&out.stdout)
        .map_err(|e| VmTierError::Agent(format!("the agent's session list: {e}")))
}

/// Ends kept session `id` in the guest behind `uds`.
pub(crate) async fn close_kept_session(
    uds: &Path,
    id: &str,
    container: Option<&str>,
) -> Result<(), VmTierError> {
    let request =
        AgentRequest::SessionClose { id: id.to_string(), container: container.map(str::to_string) };
    request_ok(uds, &request).await.map(drop)
}

/// Sends one agent request and returns the reply stream.
pub(crate) async fn request_stream(
    uds: &Path,
    request: &AgentRequest,
) -> Result<ExecStream, VmTierError> {
    request_with_body(uds, request, &[]).await
}

/// Sends a request and `body` right after it (a file's bytes, for `Put`).
pub(crate) async fn request_with_body(
    uds: &Path,
    request: &AgentRequest,
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
    write.write_all(&request.to_frame()).await.map_err(io("agent request"))?;
    write.write_all(body).await.map_err(io("agent request"))?;
    Ok(ExecStream { reader, write: Some(write), pending: None })
}

/// How much of a reply the host takes in from a guest, and for how long: a guest decides what
/// it sends (a file read of `/dev/zero` never ends), so every collected reply is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyLimits {
    /// Output bytes (stdout and stderr together) past which the reply is refused.
    pub max_bytes: usize,
    /// Time from the request to the reply's last frame.
    pub deadline: Duration,
}

/// Largest file moved out of a guest (a microVM's, or a container-host VM's container) in one
/// request: it is held in memory on its way through the agent.
pub const MAX_GUEST_FILE: usize = 256 << 20;

impl ReplyLimits {
    /// Control requests and the tier's own short commands: answers of a few kilobytes.
    pub const CONTROL: ReplyLimits =
        ReplyLimits { max_bytes: 1 << 20, deadline: Duration::from_secs(120) };
    /// A whole file read from a guest, at most `max_bytes` (and never past [`MAX_GUEST_FILE`]).
    pub fn file(max_bytes: usize) -> ReplyLimits {
        ReplyLimits { max_bytes: max_bytes.min(MAX_GUEST_FILE), deadline: Duration::from_secs(300) }
    }
}

/// Runs `process` (a command of the tier's own) and collects its output within `deadline`.
pub(crate) async fn exec_inner(
    uds: &Path,
    process: ProcessRun,
    deadline: Duration,
) -> Result<ExecOutput, VmTierError> {
    let request = AgentRequest::Exec { process, stdin_frames: false, keep: None };
    request_within(uds, &request, deadline).await
}

/// Sends `request` and collects its reply, all within `deadline` (a reply that runs past it
/// is an [`VmTierError::ExecTimeout`]).
pub(crate) async fn request_within(
    uds: &Path,
    request: &AgentRequest,
    deadline: Duration,
) -> Result<ExecOutput, VmTierError> {
    let limits = ReplyLimits { deadline, ..ReplyLimits::CONTROL };
    let mut stream = tokio::time::timeout(deadline, request_stream(uds, request))
        .await
        .map_err(|_| VmTierError::ExecTimeout(deadline))??;
    collect(&mut stream, limits).await.map_err(|e| match e {
        VmTierError::ReplyTimeout(d) => VmTierError::ExecTimeout(d),
        other => other,
    })
}

/// Reads a reply stream to its end, within `limits`. Past either limit the connection is
/// dropped (which ends the guest side) and the caller gets a typed error.
pub(crate) async fn collect(
    stream: &mut ExecStream,
    limits: ReplyLimits,
) -> Result<ExecOutput, VmTierError> {
    let mut out = ExecOutput::default();
    let mut taken = 0usize;
    let read = async {
        loop {
            let event = stream.next().await?;
            let (target, data) = match event {
                ExecEvent::Stdout(d) => (&mut out.stdout, d),
                ExecEvent::Stderr(d) => (&mut out.stderr, d),
                ExecEvent::Signaled(signal) => return Ok(128 + signal),
                ExecEvent::Exit(code) => return Ok(code),
            };
            taken = taken.saturating_add(data.len());
            if taken > limits.max_bytes {
                return Err(VmTierError::ReplyTooLarge { limit: limits.max_bytes });
            }
            target.extend_from_slice(&data);
        }
    };
    let code = tokio::time::timeout(limits.deadline, read)
        .await
        .map_err(|_| VmTierError::ReplyTimeout(limits.deadline))??;
    out.exit_code = code;
    Ok(out)
}
