//! A command a guest's agent runs (in a microVM, or in a container of a container-host VM), as
//! the sandbox interface's [`RunningExec`]: the agent's output relayed as events up to the
//! command's output cap and deadline, its stdin fed as frames, and a kill that hangs up. The
//! agent kills the command's process group when the connection goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_core::sandbox::{ExecControl, ExecEvent, ExecExit, ExecSpec, RunningExec, Stdin};
use brig_vmm_api::agent::{KeepExec, KeptStdin};
use bytes::Bytes;
use tokio::sync::{mpsc, Notify};

use crate::agent_link::{ExecEvent as AgentEvent, ExecStream, GuestStdin};
use crate::VmTierError;

/// Events buffered between the pump and the node per command.
const EVENTS: usize = 64;
/// How long the agent has to take a command's whole stdin and start it.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// Kills a guest command: its pump drops the agent connection.
struct Hangup(Arc<Notify>);

impl ExecControl for Hangup {
    fn kill(&self) {
        self.0.notify_one();
    }
}

/// A command the guest's agent keeps across the node's restarts (`keep`): ending it early
/// takes a kill request, since a hang-up leaves it running.
#[derive(Debug, Clone)]
pub struct KeptCommand {
    /// The agent's socket (the VM's vsock Unix socket).
    pub uds: std::path::PathBuf,
    pub id: u64,
    /// The container of a container-host VM it runs in (none: the VM's own command).
    pub container: Option<String>,
    /// How long it ran before this node serves it (a command taken back after a restart).
    pub ran_for: Duration,
    /// Set while its VM is being saved by a pause (none: a container-host VM's container,
    /// paused in place): a connection that ends then is the VMM stopping with the command
    /// kept in the saved guest, so the command is detached ([`ExecEvent::Detached`]) rather
    /// than killed and ended.
    pub saving: Option<Arc<AtomicBool>>,
}

/// What the agent is asked to keep of the command `spec` starts: it runs under the node's id
/// with its deadline and output cap, and its stdin is kept too: given whole, the agent has
/// all of it before the command starts; streamed, it stays open for a restarted node. An
/// agent of `agent_protocol` 2 or later says when the command started, whatever its stdin.
pub(crate) fn keep_for(spec: &ExecSpec, agent_protocol: u32) -> KeepExec {
    KeepExec {
        started: agent_protocol >= 2,
        id: spec.exec_id,
        timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
        output_limit: spec.output_limit,
        stdin: match spec.stdin {
            Stdin::Empty => KeptStdin::EndsWithConnection,
            Stdin::Bytes(_) => KeptStdin::Whole,
            Stdin::Stream(_) => KeptStdin::Kept,
        },
    }
}

/// Waits until the agent says the command `keep` asked for started (stdin given whole,
/// [`Stdin::Bytes`], is written all first), so that what the node acknowledges is a command
/// the guest keeps: a pause or a crash a moment later finds it. An agent not asked to say so
/// (older than protocol 2, and not given its stdin whole) is not waited for. Streamed stdin
/// is fed while the command runs ([`serve_kept`]). Returns what to serve.
pub(crate) async fn until_started(
    mut stream: ExecStream,
    mut input: Option<GuestStdin>,
    stdin: Stdin,
    keep: &KeepExec,
) -> Result<(ExecStream, Option<GuestStdin>, Stdin), VmTierError> {
    if !keep.started && keep.stdin != KeptStdin::Whole {
        return Ok((stream, input, stdin));
    }
    let start = async {
        let stdin = match (stdin, input.as_mut()) {
            (Stdin::Bytes(data), Some(input)) => {
                input.write(&data).await?;
                input.finish().await?;
                Stdin::Empty
            }
            (stdin, _) => stdin,
        };
        // A command that could not start has its error read next, as events.
        stream.started().await?;
        Ok::<_, VmTierError>(stdin)
    };
    let stdin = tokio::time::timeout(START_DEADLINE, start)
        .await
        .map_err(|_| VmTierError::ReplyTimeout(START_DEADLINE))??;
    Ok((stream, input, stdin))
}

/// Serves a started guest command: `stdin` goes to `input` (needed unless `stdin` is
/// [`Stdin::Empty`]), the output comes as events, within `timeout` and `output_limit`.
pub fn serve(
    stream: ExecStream,
    input: Option<GuestStdin>,
    stdin: Stdin,
    timeout: Duration,
    output_limit: u64,
) -> RunningExec {
    serve_kept(stream, input, stdin, timeout, output_limit, None)
}

/// As [`serve`], for a command the agent keeps: `timeout` counts from its start, and a
/// timeout, cap or kill asks the agent to kill it.
pub fn serve_kept(
    stream: ExecStream,
    input: Option<GuestStdin>,
    stdin: Stdin,
    timeout: Duration,
    output_limit: u64,
    kept: Option<KeptCommand>,
) -> RunningExec {
    let ran_for = kept.as_ref().map_or(Duration::ZERO, |k| k.ran_for);
    let started = Instant::now().checked_sub(ran_for).unwrap_or_else(Instant::now);
    let feeder = input.map(|input| feed(stdin, input));
    let kill = Arc::new(Notify::new());
    let (tx, rx) = mpsc::channel(EVENTS);
    let pump = Pump {
        stream,
        out: tx.clone(),
        kill: kill.clone(),
        deadline: started + timeout,
        limit: output_limit,
    };
    tokio::spawn(async move {
        let mut exit = match pump.run().await {
            Ended::Exit(exit) => exit,
            Ended::AgentGone { exit, why } => {
                let saved = kept.as_ref().and_then(|k| k.saving.as_ref());
                if saved.is_some_and(|s| s.load(Ordering::SeqCst)) {
                    // The VM is being saved with the command in it: it goes on at resume.
                    if let Some(feeder) = feeder {
                        feeder.abort();
                    }
                    let _ = tx.send(ExecEvent::Detached(why)).await;
                    return;
                }
                let note = format!("[brig: the guest's agent went away: {why}]\n");
                let _ = tx.send(ExecEvent::Stderr(Bytes::from(note))).await;
                exit
            }
        };
        let ended =
            exit.exit_code.is_some() || (exit.signal.is_some() && !exit.killed && !exit.truncated);
        if let (Some(kept), false) = (&kept, ended) {
            // Killed, timed out or capped: a kept command does not end with the hang-up.
            let container = kept.container.as_deref();
            if let Err(e) = crate::agent_link::kill_kept(&kept.uds, kept.id, container).await {
                tracing::warn!(exec = kept.id, error = %e, "cannot kill a kept guest command");
            }
        }
        // The feeder holds the write half: the agent sees the hang-up once it goes.
        if let Some(feeder) = feeder {
            feeder.abort();
        }
        exit.duration = started.elapsed();
        let _ = tx.send(ExecEvent::Exited(exit)).await;
    });
    RunningExec { events: rx, control: Arc::new(Hangup(kill)), pid: None, archive: None }
}

/// Writes the command's stdin, then ends it; keeps the write half (whose hang-up kills the
/// command) until aborted.
fn feed(stdin: Stdin, mut input: GuestStdin) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        match stdin {
            Stdin::Empty => {}
            Stdin::Bytes(data) => {
                if input.write(&data).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            Stdin::Stream(mut rx) => {
                while let Some(chunk) = rx.recv().await {
                    if input.write(&chunk.data).await.is_err() {
                        break;
                    }
                    // Sent to the guest's agent, which keeps a kept command's stdin open through
                    // a node restart or a pause (not through the VM's end).
                    chunk.written();
                }
            }
        }
        let _ = input.finish().await;
        std::future::pending::<()>().await;
    })
}

/// How a command's relay ended.
enum Ended {
    /// It exited, was signalled, killed, timed out or capped.
    Exit(ExecExit),
    /// The agent's connection ended first (what was relayed so far is in `exit`).
    AgentGone { exit: ExecExit, why: String },
}

/// One command's output, moved from the agent to the node.
struct Pump {
    stream: ExecStream,
    out: mpsc::Sender<ExecEvent>,
    kill: Arc<Notify>,
    deadline: Instant,
    limit: u64,
}

impl Pump {
    /// Relays output until the command exits, runs past its deadline or its cap, or is
    /// killed, or the agent's connection ends. Then the stream is dropped: the agent sees the
    /// hang-up and kills the command (unless it keeps it).
    async fn run(mut self) -> Ended {
        let mut exit = ExecExit::default();
        loop {
            let next = tokio::time::timeout_at(
                tokio::time::Instant::from_std(self.deadline),
                self.stream.next(),
            );
            let event = tokio::select! {
                event = next => event,
                () = self.kill.notified() => {
                    exit.killed = true;
                    exit.signal = Some(9);
                    return Ended::Exit(exit);
                }
            };
            let event = match event {
                Err(_) => {
                    exit.timed_out = true;
                    return Ended::Exit(exit);
                }
                Ok(Err(e)) => return Ended::AgentGone { exit, why: e.to_string() },
                Ok(Ok(event)) => event,
            };
            let (stdout, mut data) = match event {
                AgentEvent::Stdout(d) => (true, d),
                AgentEvent::Stderr(d) => (false, d),
                AgentEvent::Signaled(signal) => {
                    exit.signal = Some(signal);
                    return Ended::Exit(exit);
                }
                AgentEvent::Exit(code) => {
                    exit.exit_code = Some(code);
                    return Ended::Exit(exit);
                }
            };
            let room = self.limit.saturating_sub(exit.stdout_bytes + exit.stderr_bytes);
            if data.len() as u64 > room {
                data.truncate(room as usize);
                exit.truncated = true;
            }
            let n = data.len() as u64;
            if !data.is_empty() {
                let data = Bytes::from(data);
                let event = if stdout { ExecEvent::Stdout(data) } else { ExecEvent::Stderr(data) };
                // A receiver that went away changes nothing: the command runs to its end.
                let _ = self.out.send(event).await;
            }
            if stdout {
                exit.stdout_bytes += n;
            } else {
                exit.stderr_bytes += n;
            }
            if exit.truncated {
                exit.signal = Some(9);
                return Ended::Exit(exit);
            }
        }
    }
}
