//! Commands in a microVM: the request goes to the guest's agent as data (argv, environment,
//! working directory; no shell in between), its stdin as frames (the request's bytes, or
//! streamed as the client sends them). The output goes into the command's hub (`crate::exec_hub`) as the agent
//! sends it, up to the request's output cap and timeout, so a client that goes away can
//! attach again by exec id, and the command can be listed and killed, as in a container.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_proto::{AuditKind, ExecResult, OutputStream, Reply, StdinMode};
use brig_transport::Exchange;
use brig_vmtier::{ExecEvent, ProcessRun};
use tokio::sync::Notify;

use crate::exec_hub::ExecHub;
use crate::microvm::vm_error;
use crate::sandboxes::{SandboxEntry, TierHandle};
use crate::{Node, NodeError};

impl Node {
    /// Runs an exec request in a microVM: `ExecStarted`, the output, `Exited`.
    pub(crate) async fn exec_microvm(
        &self,
        entry: &SandboxEntry,
        req: brig_proto::ExecRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let TierHandle::Microvm(vm) = &entry.handle else { return Ok(None) };
        let refuse = |op| NodeError::WrongTier { id: entry.id.to_string(), tier: entry.tier, op };
        if req.user.is_some() {
            return Err(refuse("a command as another user (microVM commands run as root)"));
        }
        // Argv, environment and directory go to the agent as data and reach execve unchanged.
        let process = ProcessRun {
            argv: req.argv.clone(),
            env: req.env.clone(),
            cwd: Some(req.cwd.clone()).filter(|c| !c.is_empty()),
        };
        let (stream, feeder) = match req.stdin {
            StdinMode::Empty => {
                (brig_vmtier::exec_stream(&vm.uds, process).await.map_err(vm_error)?, None)
            }
            _ => {
                let (stream, stdin) =
                    brig_vmtier::exec_stream_input(&vm.uds, process).await.map_err(vm_error)?;
                (stream, Some(feed_stdin(&req.stdin, stdin, exchange)))
            }
        };
        self.guest_command(entry, &vm.execs, &req, stream, feeder, exchange).await
    }

    /// Serves a command a guest's agent has started (in a microVM, or in a container of a
    /// container-host VM): `ExecStarted`, the output, `Exited`. The command runs on, and its
    /// output is kept in its hub, whatever the client does; the client (or a later one, by
    /// id) reads from the hub. `feeder` writes its stdin and ends with it.
    pub(crate) async fn guest_command(
        &self,
        entry: &SandboxEntry,
        execs: &crate::exec_hub::ExecTable,
        req: &brig_proto::ExecRequest,
        stream: brig_vmtier::ExecStream,
        feeder: Option<tokio::task::JoinHandle<()>>,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let cfg = &self.inner.config.container;
        let timeout = Duration::from_millis(
            req.timeout_ms.unwrap_or(cfg.default_exec_timeout_ms).min(cfg.max_exec_timeout_ms),
        );
        let limit = req
            .output_limit_bytes
            .unwrap_or(cfg.default_output_limit_bytes)
            .min(cfg.max_output_limit_bytes);
        let started = Instant::now();
        let exec_id = execs.next_id();
        let recorder = self.recorder(entry);
        let (user, cwd) = (req.user.clone(), Some(req.cwd.clone()).filter(|c| !c.is_empty()));
        recorder.record(AuditKind::ExecStart { exec_id, argv: req.argv.clone(), user, cwd });
        let kill = Arc::new(Notify::new());
        let killer = kill.clone();
        let hub = execs.insert(exec_id, req.argv.clone(), Box::new(move || killer.notify_one()));
        let run = Run { stream, hub: hub.clone(), kill, deadline: started + timeout, limit };
        tokio::spawn(async move {
            let mut result = run.pump().await;
            if let Some(feeder) = feeder {
                feeder.abort();
            }
            result.duration_us = started.elapsed().as_micros() as u64;
            recorder.exec_end(exec_id, &result);
            hub.finish(result);
        });
        exchange.reply(&Reply::ExecStarted { exec_id }).await?;
        let reply = execs.attach_streaming(exec_id, exchange).await;
        entry.touch();
        reply
    }
}

/// Feeds a guest command's stdin as the request says: its bytes, or the client's upload as
/// it streams (no upload: end of file at once).
pub(crate) fn feed_stdin(
    mode: &StdinMode,
    stdin: brig_vmtier::GuestStdin,
    exchange: &mut Exchange,
) -> tokio::task::JoinHandle<()> {
    match (mode, exchange.take_upload()) {
        (StdinMode::Stream, Some(upload)) => feed_upload(upload, stdin),
        (StdinMode::Bytes(data), _) => feed_bytes(data.clone(), stdin),
        _ => feed_bytes(Vec::new(), stdin),
    }
}

/// Writes the client's upload to a guest command's stdin, then ends it; the task keeps the
/// agent connection's write half (whose hang-up kills the command) until it is aborted.
fn feed_upload(
    mut upload: brig_transport::Upload,
    mut stdin: brig_vmtier::GuestStdin,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(Some(chunk)) = upload.read().await {
            if stdin.write(&chunk).await.is_err() {
                break;
            }
        }
        let _ = stdin.finish().await;
        std::future::pending::<()>().await;
    })
}

/// Writes `data` to a guest command's stdin and ends it, as [`feed_upload`].
fn feed_bytes(data: Vec<u8>, mut stdin: brig_vmtier::GuestStdin) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if stdin.write(&data).await.is_ok() {
            let _ = stdin.finish().await;
        }
        std::future::pending::<()>().await;
    })
}

/// One command in a guest, pumped from the agent into its hub.
struct Run {
    stream: brig_vmtier::ExecStream,
    hub: Arc<ExecHub>,
    kill: Arc<Notify>,
    deadline: Instant,
    limit: u64,
}

impl Run {
    /// Moves the agent's output into the hub until the command exits, runs past its deadline
    /// or its cap, or is killed. Then the stream is dropped: the agent sees the hang-up and
    /// kills the command's process group.
    async fn pump(mut self) -> ExecResult {
        let mut result = ExecResult::default();
        loop {
            let next = tokio::time::timeout_at(
                tokio::time::Instant::from_std(self.deadline),
                self.stream.next(),
            );
            let event = tokio::select! {
                event = next => event,
                () = self.kill.notified() => {
                    result.killed = true;
                    result.signal = Some(9);
                    return result;
                }
            };
            let event = match event {
                Err(_) => {
                    result.timed_out = true;
                    return result;
                }
                Ok(Err(e)) => {
                    let note = format!("[brig: the guest's agent went away: {e}]\n");
                    self.hub.push(Reply::Output {
                        stream: OutputStream::Stderr,
                        data: note.into_bytes(),
                    });
                    return result;
                }
                Ok(Ok(event)) => event,
            };
            let (kind, mut data) = match event {
                ExecEvent::Stdout(d) => (OutputStream::Stdout, d),
                ExecEvent::Stderr(d) => (OutputStream::Stderr, d),
                ExecEvent::Signaled(signal) => {
                    result.signal = Some(signal);
                    return result;
                }
                ExecEvent::Exit(code) => {
                    result.exit_code = Some(code);
                    return result;
                }
            };
            let room = self.limit.saturating_sub(result.stdout_bytes + result.stderr_bytes);
            if data.len() as u64 > room {
                data.truncate(room as usize);
                result.truncated = true;
            }
            match kind {
                OutputStream::Stdout => result.stdout_bytes += data.len() as u64,
                OutputStream::Stderr => result.stderr_bytes += data.len() as u64,
            }
            if !data.is_empty() {
                self.hub.push(Reply::Output { stream: kind, data });
            }
            if result.truncated {
                result.signal = Some(9);
                return result;
            }
        }
    }
}
