//! Shell sessions in a microVM: the container tier's session engine
//! (`brig_container::session`) driving a shell the guest's agent runs, its descriptors carried
//! over one vsock connection (the agent protocol's SESSION request). Each descriptor becomes an
//! in-memory pipe on this side, so the engine cannot tell the shell is in another kernel.

use brig_container::session::{
    session_env, Session, SessionError, SessionParts, SessionProcess, DRIVER,
};
use brig_vmm_api::agent::{self, AgentRequest, ProcessRun};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::agent_link::request_with_body;
use crate::{MicroVm, VmTier, VmTierError};

/// Buffer of each in-memory pipe.
const PIPE_BYTES: usize = 256 << 10;

/// The session's shell as the engine sees it: interrupt and close travel to the agent.
struct GuestShell {
    frames: mpsc::UnboundedSender<(u8, Vec<u8>)>,
    tasks: Vec<JoinHandle<()>>,
}

impl SessionProcess for GuestShell {
    fn interrupt(&mut self) -> Result<(), SessionError> {
        self.frames.send((agent::IN_INTERRUPT, Vec::new())).map_err(|_| SessionError::Closed)
    }

    /// Hangs up: the agent kills the shell and everything it started.
    fn close(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for GuestShell {
    fn drop(&mut self) {
        self.close();
    }
}

/// Copies what the engine writes into `from` to the agent as frames of `kind`.
fn forward(
    mut from: DuplexStream,
    kind: u8,
    frames: mpsc::UnboundedSender<(u8, Vec<u8>)>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 || frames.send((kind, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    })
}

impl VmTier {
    /// Opens a shell session in `vm`: `shell` (an absolute path in the guest) with `env`, in
    /// `cwd`, kept between commands.
    pub async fn open_session(
        &self,
        vm: &MicroVm,
        shell: &str,
        env: Vec<(String, String)>,
        cwd: &str,
    ) -> Result<Session, VmTierError> {
        if vm.is_paused() {
            return Err(VmTierError::Paused);
        }
        if !shell.starts_with('/') {
            return Err(VmTierError::Agent(format!(
                "the session shell {shell:?} is not an absolute path"
            )));
        }
        // The shell runs the driver with the session's environment and directory as data.
        let process = ProcessRun {
            argv: vec![shell.to_string(), "-c".to_string(), DRIVER.to_string()],
            env: session_env(env),
            cwd: Some(cwd.to_string()).filter(|c| !c.is_empty()),
        };
        let request = AgentRequest::Session { process };
        over_agent(request_with_body(&vm.uds, &request, &[]).await?)
    }
}

/// A session over an agent connection that has just started a session shell (the SESSION
/// request, or a container's): its frames become the engine's in-memory pipes.
pub(crate) fn over_agent(stream: crate::ExecStream) -> Result<Session, VmTierError> {
    let (mut reader, writer) = stream.into_parts();
    let mut writer =
        writer.ok_or_else(|| VmTierError::Agent("no connection to write to".into()))?;
    let (frames_tx, mut frames_rx) = mpsc::unbounded_channel::<(u8, Vec<u8>)>();
    let (mut out_w, out_r) = tokio::io::duplex(PIPE_BYTES);
    let (mut err_w, err_r) = tokio::io::duplex(PIPE_BYTES);
    let (mut done_w, done_r) = tokio::io::duplex(PIPE_BYTES);
    // Agent frames to the engine's pipes; the pipes close when the shell ends.
    let from_agent = tokio::spawn(async move {
        loop {
            let mut head = [0u8; 5];
            if reader.read_exact(&mut head).await.is_err() {
                return;
            }
            let Ok((kind, len)) = agent::parse_header(head) else { return };
            let mut data = vec![0u8; len];
            if reader.read_exact(&mut data).await.is_err() {
                return;
            }
            let written = match kind {
                agent::STDOUT => out_w.write_all(&data).await,
                agent::STDERR => err_w.write_all(&data).await,
                agent::SESSION_DONE => done_w.write_all(&data).await,
                _ => return,
            };
            if written.is_err() {
                return;
            }
        }
    });
    // Frames to the agent, from every writer.
    let to_agent = tokio::spawn(async move {
        while let Some((kind, data)) = frames_rx.recv().await {
            if writer.write_all(&agent::encode_frame(kind, &data)).await.is_err() {
                return;
            }
        }
    });
    let (stdin_w, stdin_r) = tokio::io::duplex(PIPE_BYTES);
    let (commands_w, commands_r) = tokio::io::duplex(PIPE_BYTES);
    let tasks = vec![
        from_agent,
        to_agent,
        forward(stdin_r, agent::IN_STDIN, frames_tx.clone()),
        forward(commands_r, agent::IN_COMMAND, frames_tx.clone()),
    ];
    let boxed = |r: DuplexStream| -> Box<dyn AsyncRead + Send + Unpin> { Box::new(r) };
    Ok(Session::from_parts(SessionParts {
        commands: Box::new(commands_w),
        stdin: Box::new(stdin_w),
        stdout: boxed(out_r),
        stderr: boxed(err_r),
        done: boxed(done_r),
        process: Box::new(GuestShell { frames: frames_tx, tasks }),
    }))
}
