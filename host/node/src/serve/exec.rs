//! Execs, the same for every tier: the request is checked and given the node's timeout and
//! output policy, the tier starts the command ([`brig_core::Sandbox::exec`]), and its events are
//! pumped into the command's hub (`crate::execs::hub`), which clients read from: the one that
//! started it, and any that attach later by exec id.
//!
//! ```text
//! ExecRequest ─▶ check_command, capabilities ─▶ ExecSpec ─▶ sandbox.exec ─▶ RunningExec
//!   upload ─▶ stdin channel ──────────────────────────────────────────────┘   │ events
//!                                       client(s) ◀─ ExecHub ◀─ pump ◀────────┘
//! ```

use std::sync::Arc;
use std::time::Duration;

use brig_core::sandbox::{
    ExecControl, ExecEvent, ExecExit, ExecSpec, Op, Stdin, StdinChunk, TerminalSize,
};
use brig_proto::{AuditKind, ExecResult, OutputStream, Reply, StdinMode};
use brig_transport::{Exchange, Upload};
use tokio::sync::{mpsc, oneshot};

use crate::execs::hub::{ExecHub, Killer, Resizer, Seen};
use crate::execs::input::StdinRefused;
use crate::limits::Limit;
use crate::policy::audit::Recorder;
use crate::table::sandboxes::SandboxEntry;
use crate::{Node, NodeError};

/// Stdin chunks buffered between the client's upload and the tier.
const STDIN_CHUNKS: usize = 16;
/// How long a resumed sandbox's commands may take, in all, to be seen detached by their old
/// pumps (the hang-up reaches them a moment after the VM stopped).
const DETACH_SEEN_WITHIN: Duration = Duration::from_secs(5);
/// The same after a save that failed, where most connections outlived it.
const FAILED_SAVE_DETACH_WITHIN: Duration = Duration::from_secs(1);

impl Node {
    /// Runs a command: `ExecStarted`, its output, `Exited`. The command runs on, and its output
    /// is kept, whatever the client does.
    pub(crate) async fn exec(
        &self,
        req: brig_proto::ExecRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let mut req = req;
        let entry = self.live(&req.sandbox).await?;
        if req.argv.is_empty() {
            // No arguments: the image's own command, as `docker run IMAGE`.
            req.argv = entry.sandbox.image_command();
        }
        // What execve cannot carry is refused here, the same for every tier.
        brig_core::check_command(&req.argv, &req.env, &req.cwd)?;
        entry.require(Op::Exec)?;
        if req.terminal.is_some() {
            entry.require(Op::Terminal)?;
        }
        let cfg = &self.inner.config.container;
        let timeout = Duration::from_millis(
            req.timeout_ms.unwrap_or(cfg.default_exec_timeout_ms).min(cfg.max_exec_timeout_ms),
        );
        let output_limit = req
            .output_limit_bytes
            .unwrap_or(cfg.default_output_limit_bytes)
            .min(cfg.max_output_limit_bytes);
        let limits = &self.inner.config.limits;
        entry.execs.make_room(limits.execs_per_sandbox)?;
        let (stdin, streamed) = match req.stdin {
            StdinMode::Empty => (Stdin::Empty, None),
            StdinMode::Bytes(bytes) => (Stdin::Bytes(bytes), None),
            StdinMode::Stream => {
                // No upload at all is end of input at once (the sender drops).
                let (tx, rx) = mpsc::channel::<StdinChunk>(STDIN_CHUNKS);
                let upload = exchange.take_upload();
                (Stdin::Stream(rx), upload.map(|upload| (tx, upload)))
            }
        };
        let cwd = Some(req.cwd.clone()).filter(|c| !c.is_empty());
        let exec_id = entry.execs.next_id();
        let spec = ExecSpec {
            exec_id,
            argv: req.argv.clone(),
            env: req.env,
            cwd: cwd.clone(),
            user: req.user.clone(),
            stdin,
            timeout,
            output_limit,
            terminal: req.terminal.map(|s| TerminalSize { rows: s.rows, cols: s.cols }),
        };
        let running = entry.sandbox.exec(spec).await.map_err(|e| entry.fail(e))?;
        let recorder = self.recorder(&entry);
        let argv = req.argv;
        recorder.record(AuditKind::ExecStart { exec_id, argv: argv.clone(), user: req.user, cwd });
        let pid = running.pid;
        let (kill, resizer) = controls(running.control, req.terminal.is_some());
        let hub = entry.execs.insert_with(exec_id, argv, pid, kill, resizer, running.archive);
        // Its stdin is the hub's: this client's upload feeds it, and any client by id.
        let stdin_over = streamed.map(|(tx, upload)| {
            hub.stdin.open(tx, limits.exec_stdin_bytes);
            forward_upload(upload, hub.clone())
        });
        // This client's place is taken before the pump starts: nothing it has not read is
        // dropped while its first reply goes out.
        let reader = hub.reader();
        tokio::spawn(pump(running.events, hub.clone(), exec_id, recorder, Seen::default()));
        exchange.reply(&Reply::ExecStarted { exec_id, pid }).await?;
        let streamed = match stdin_over {
            None => hub.stream_as(reader, exchange).await,
            // Stdin over its limit ends this client's stream with the error; the command runs
            // on (its stdin closed) and can be attached to by id. Checked first: the closed
            // stdin may end the command, and with it the stream, at once.
            Some(over) => tokio::select! {
                biased;
                Ok(max) = over => Err(Limit::ExecStdinBytes.reached(max)),
                streamed = hub.stream_as(reader, exchange) => streamed,
            },
        };
        entry.touch();
        streamed
    }
}

impl Node {
    /// Serves again the commands and sessions a sandbox's tier kept across a restart of the
    /// node, each under its old id: a command with its output so far, then (if it still runs)
    /// the rest as it comes. New execs and sessions get ids after theirs.
    pub(crate) async fn recover_kept(&self, entry: &SandboxEntry) {
        let (sessions, resumed) = self.take_back_kept(entry, Duration::ZERO).await;
        if resumed > 0 || sessions > 0 {
            tracing::info!(sandbox = %entry.id, sessions, resumed, "commands kept across the restart are served again");
        }
    }

    /// After a VM saved by a pause runs again: its commands and sessions, detached at the save,
    /// are taken back under their ids, each command going on from the output its clients had
    /// (read again from the guest's first byte, what they had is skipped). A command the guest
    /// no longer has is finished as lost. After a pause that failed, `resumed` is false: the
    /// commands whose connections outlived it are left to their pumps.
    pub(crate) async fn take_back_after_pause(&self, entry: &SandboxEntry, resumed: bool) {
        let wait = if resumed { DETACH_SEEN_WITHIN } else { FAILED_SAVE_DETACH_WITHIN };
        let (sessions, resumed) = self.take_back_kept(entry, wait).await;
        let lost = entry.execs.finish_detached(
            "[brig: the command was not in the VM when it resumed; its status is unknown]\n",
        );
        if resumed > 0 || sessions > 0 || lost > 0 {
            tracing::debug!(sandbox = %entry.id, sessions, resumed, lost, "commands and sessions taken back after a pause");
        }
    }

    /// Takes back what `entry`'s tier kept: sessions, and commands (into the hub a detached one
    /// has, or a new one), waiting up to `wait` in all for the old pumps of commands the node
    /// follows to see them detached. Returns the sessions and the running commands taken back.
    async fn take_back_kept(&self, entry: &SandboxEntry, wait: Duration) -> (usize, usize) {
        let detach_deadline = tokio::time::Instant::now() + wait;
        let kept = entry.sandbox.recover_kept().await;
        let sessions = kept.sessions.len();
        for (id, session) in kept.sessions {
            entry.sessions.restore(id, session);
        }
        let recorder = self.recorder(entry);
        let mut resumed = 0;
        for exec in kept.execs {
            entry.execs.continue_after(exec.exec_id);
            // Whether a kept command is on a terminal is not recorded here: its control says.
            let (kill, resizer) = match &exec.running {
                Some(running) => controls(running.control.clone(), true),
                None => (Box::new(|| {}) as Killer, None),
            };
            let pid = exec.running.as_ref().and_then(|r| r.pid);
            let (hub, mut skip, gap_note) = match entry.execs.find(exec.exec_id) {
                Some(hub) => {
                    // Detached by a pause: it goes on in the hub its clients read.
                    if !hub.detached_by(detach_deadline).await {
                        // Its pump still relays it (a save that failed left its connection).
                        tracing::debug!(sandbox = %entry.id, exec = exec.exec_id, "a kept command the node still follows is left to its pump");
                        continue;
                    }
                    let Some(seen) = hub.reattach(kill) else { continue };
                    (hub, seen, "output past what the guest keeps was lost while its VM was paused")
                }
                None => {
                    let hub = entry.execs.insert_with(
                        exec.exec_id,
                        exec.argv,
                        pid,
                        kill,
                        resizer,
                        exec.archive,
                    );
                    (
                        hub,
                        Seen::default(),
                        "output past what is kept on disk was lost when the node restarted",
                    )
                }
            };
            // Its stdin, kept open across the restart, is written by id from here.
            if let Some(tx) = exec.stdin {
                hub.stdin.open(tx, self.inner.config.limits.exec_stdin_bytes);
            }
            // Read again from its first byte: what the hub has already is skipped.
            for reply in exec.output.into_iter().filter_map(output_reply) {
                if let Some(reply) = skip.skip(reply) {
                    hub.push(reply);
                }
            }
            if exec.gap {
                let note = format!("[brig: {gap_note}]\n");
                hub.push(Reply::Output { stream: OutputStream::Stderr, data: note.into_bytes() });
            }
            match (exec.running, exec.exit) {
                (Some(running), _) => {
                    resumed += 1;
                    tokio::spawn(pump(running.events, hub, exec.exec_id, recorder.clone(), skip));
                }
                (None, exit) => hub.finish(result_of(exit.unwrap_or_default())),
            }
        }
        (sessions, resumed)
    }
}

/// A running command's kill switch and, on a terminal, its resizer, from its control.
fn controls(control: Arc<dyn ExecControl>, on_terminal: bool) -> (Killer, Option<Resizer>) {
    let resizer = on_terminal.then(|| -> Resizer {
        let control = control.clone();
        Box::new(move |s: brig_proto::TerminalSize| {
            let size = TerminalSize { rows: s.rows, cols: s.cols };
            control
                .resize(size)
                .unwrap_or_else(|| Err(std::io::Error::other("the command is not on a terminal")))
        })
    });
    (Box::new(move || control.kill()), resizer)
}

/// The reply a command's output event becomes (`None` for its exit).
fn output_reply(event: ExecEvent) -> Option<Reply> {
    match event {
        ExecEvent::Stdout(b) => {
            Some(Reply::Output { stream: OutputStream::Stdout, data: b.to_vec() })
        }
        ExecEvent::Stderr(b) => {
            Some(Reply::Output { stream: OutputStream::Stderr, data: b.to_vec() })
        }
        ExecEvent::Exited(_) | ExecEvent::Detached(_) => None,
    }
}

/// Moves a command's events into its hub until it ends, or until the tier detaches it (then
/// the hub waits to be taken back). The first `skip` bytes of each stream are the hub's already
/// (a command read again from its first byte after a pause).
pub(crate) async fn pump(
    mut events: mpsc::Receiver<ExecEvent>,
    hub: Arc<ExecHub>,
    exec_id: u64,
    recorder: Recorder,
    mut skip: Seen,
) {
    let mut result = ExecResult::default();
    while let Some(event) = events.recv().await {
        match event {
            ExecEvent::Exited(exit) => {
                result = result_of(exit);
                break;
            }
            ExecEvent::Detached(why) => {
                tracing::debug!(exec = exec_id, why, "a command goes on out of the node's sight");
                hub.detach();
                return;
            }
            output => {
                if let Some(reply) = output_reply(output).and_then(|r| skip.skip(r)) {
                    hub.push_for_readers(reply).await;
                }
            }
        }
    }
    recorder.exec_end(exec_id, &result);
    hub.finish(result);
}

fn result_of(exit: ExecExit) -> ExecResult {
    ExecResult {
        exit_code: exit.exit_code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        killed: exit.killed,
        truncated: exit.truncated,
        oom_killed: exit.oom_killed,
        duration_us: u64::try_from(exit.duration.as_micros()).unwrap_or(u64::MAX),
        stdout_bytes: exit.stdout_bytes,
        stderr_bytes: exit.stderr_bytes,
    }
}

/// Feeds the starting client's upload into `hub`'s stdin until the client ends it (then the
/// stdin is closed, as the client's end of input), the stdin is closed by id, or the limit is
/// passed: then the upload is refused and the limit sent on the returned channel. A client
/// that goes away without ending it (its connection lost, its process killed) leaves the
/// stdin open, as E2B's processes do: a client that reconnects writes on, or closes it, by id.
pub(crate) fn forward_upload(mut upload: Upload, hub: Arc<ExecHub>) -> oneshot::Receiver<u64> {
    let (over_tx, over_rx) = oneshot::channel();
    tokio::spawn(async move {
        // The upload waits on the command as long as it reads (the client is slowed).
        loop {
            let chunk = match upload.read().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "a client went away with a command's stdin open");
                    return;
                }
            };
            match hub.stdin.write(chunk, false).await {
                Ok(()) => {}
                Err(StdinRefused::Over(max)) => {
                    upload.refuse();
                    let _ = over_tx.send(max);
                    return;
                }
                // Closed by id, or the command ended: the rest of the upload has nowhere to go.
                Err(StdinRefused::Closed | StdinRefused::Stalled) => {
                    upload.refuse();
                    return;
                }
            }
        }
        hub.stdin.close();
    });
    over_rx
}
