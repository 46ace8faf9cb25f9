//! Execs in container sandboxes, decoupled from the client's stream: output goes to a bounded
//! per-exec buffer (the hub) that any number of client streams read from, so a rollout worker
//! that crashes mid-command reconnects (`ExecAttach`) and gets everything kept, then the rest.
//!
//! ```text
//! engine events ─▶ pump task ─▶ ExecHub { events (≤ HUB_BYTES, oldest dropped), result }
//!                                   ▲ notify
//! client stream(s) ─ cursor ────────┘  replay from the start, then follow, then Exited
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_container::exec::{ExecEvent, Killer, Stdin};
use brig_proto::{AuditKind, ExecInfo, ExecRequest, ExecResult, OutputStream, Reply, StdinMode};
use brig_transport::Exchange;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify};

use super::{merged_env, result_of, ContainerSandbox, ContainerTier};
use crate::audit::Recorder;
use crate::NodeError;

/// Output kept per exec for reattaching clients.
const HUB_BYTES: usize = 8 << 20;
/// How long a finished exec stays attachable.
const FINISHED_KEEP: Duration = Duration::from_secs(600);

/// One exec's output and outcome, shared by its pump and its readers.
pub(crate) struct ExecHub {
    argv: Vec<String>,
    killer: Killer,
    state: Mutex<HubState>,
    changed: Notify,
}

#[derive(Default)]
struct HubState {
    /// Output replies; `first` is the absolute index of `events[0]`.
    events: VecDeque<Reply>,
    first: u64,
    bytes: usize,
    dropped_bytes: u64,
    result: Option<ExecResult>,
    finished: Option<Instant>,
}

fn output_len(reply: &Reply) -> usize {
    match reply {
        Reply::Output { data, .. } => data.len(),
        _ => 0,
    }
}

impl ExecHub {
    fn push(&self, reply: Reply) {
        let mut st = self.state.lock();
        st.bytes += output_len(&reply);
        st.events.push_back(reply);
        while st.bytes > HUB_BYTES {
            let Some(old) = st.events.pop_front() else { break };
            let n = output_len(&old);
            st.bytes -= n;
            st.dropped_bytes += n as u64;
            st.first += 1;
        }
        drop(st);
        self.changed.notify_waiters();
    }

    fn finish(&self, result: ExecResult) {
        let mut st = self.state.lock();
        st.result = Some(result);
        st.finished = Some(Instant::now());
        drop(st);
        self.changed.notify_waiters();
    }

    fn info(&self, exec_id: u64) -> ExecInfo {
        let st = self.state.lock();
        ExecInfo {
            exec_id,
            argv: self.argv.clone(),
            result: st.result.clone(),
            buffered_bytes: st.bytes as u64,
        }
    }

    /// Streams everything kept and then what follows, until the exec ends.
    async fn stream(&self, exchange: &mut Exchange) -> Result<Option<Reply>, NodeError> {
        let mut next = 0u64;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (batch, result) = {
                let st = self.state.lock();
                let mut batch = Vec::new();
                if next < st.first {
                    let note = format!(
                        "[brig: {} bytes of earlier output were not kept]\n",
                        st.dropped_bytes
                    );
                    batch.push(Reply::Output {
                        stream: OutputStream::Stderr,
                        data: note.into_bytes(),
                    });
                    next = st.first;
                }
                let skip = (next - st.first) as usize;
                batch.extend(st.events.iter().skip(skip).cloned());
                next = st.first + st.events.len() as u64;
                (batch, st.result.clone())
            };
            for reply in &batch {
                exchange.reply(reply).await?;
            }
            if let Some(result) = result {
                return Ok(Some(Reply::Exited(result)));
            }
            notified.await;
        }
    }
}

/// Moves engine events into the hub until the exec ends.
async fn pump(
    mut events: mpsc::Receiver<ExecEvent>,
    hub: Arc<ExecHub>,
    exec_id: u64,
    recorder: Recorder,
) {
    while let Some(event) = events.recv().await {
        match event {
            ExecEvent::Stdout(b) => {
                hub.push(Reply::Output { stream: OutputStream::Stdout, data: b.to_vec() })
            }
            ExecEvent::Stderr(b) => {
                hub.push(Reply::Output { stream: OutputStream::Stderr, data: b.to_vec() })
            }
            ExecEvent::Exit(exit) => {
                let result = result_of(exit);
                recorder.exec_end(exec_id, &result);
                hub.finish(result);
                return;
            }
        }
    }
    recorder.exec_end(exec_id, &ExecResult::default());
    hub.finish(ExecResult::default());
}

impl ContainerSandbox {
    /// Runs a command, streaming `ExecStarted`, `Output`… and `Exited` to the client. The
    /// command runs to its end even if the client goes away; its output is kept for
    /// [`ContainerSandbox::attach`].
    pub async fn exec(
        &self,
        tier: &ContainerTier,
        req: ExecRequest,
        exchange: &mut Exchange,
        recorder: Recorder,
    ) -> Result<Option<Reply>, NodeError> {
        let stream_stdin = req.stdin == StdinMode::Stream;
        if req.argv.is_empty() {
            return Err(NodeError::BadImage(String::new(), "exec needs a command".into()));
        }
        let argv = req.argv.clone();
        let (user, cwd) = (req.user.clone(), Some(req.cwd.clone()).filter(|c| !c.is_empty()));
        let request = brig_container::exec::ExecRequest {
            argv: req.argv,
            env: merged_env(&self.env, req.env),
            cwd: req.cwd,
            user: req.user,
            stdin: match req.stdin {
                StdinMode::Empty => Stdin::Null,
                StdinMode::Bytes(b) => Stdin::Bytes(b),
                StdinMode::Stream => Stdin::Stream,
            },
            timeout: Some(tier.timeout(req.timeout_ms)),
            output_limit: tier.output_limit(req.output_limit_bytes),
        };
        let mut exec = brig_container::exec::exec(&self.container, request).await?;
        let exec_id = self.next_exec.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        recorder.record(AuditKind::ExecStart { exec_id, argv: argv.clone(), user, cwd });
        let hub = Arc::new(ExecHub {
            argv,
            killer: exec.killer(),
            state: Mutex::default(),
            changed: Notify::new(),
        });
        self.prune_execs();
        self.execs.lock().insert(exec_id, hub.clone());
        let feeder = match (stream_stdin, exec.stdin.take(), exchange.take_upload()) {
            (true, Some(mut stdin), Some(mut upload)) => Some(tokio::spawn(async move {
                while let Ok(Some(chunk)) = upload.read().await {
                    if stdin.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            })),
            _ => None,
        };
        let events = std::mem::replace(&mut exec.events, mpsc::channel(1).1);
        tokio::spawn(pump(events, hub.clone(), exec_id, recorder));
        exchange.reply(&Reply::ExecStarted { exec_id }).await?;
        let streamed = hub.stream(exchange).await;
        if let Some(feeder) = feeder {
            feeder.abort();
        }
        streamed
    }

    /// Streams an exec again: everything kept from its start, then the rest.
    pub async fn attach(
        &self,
        exec_id: u64,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let hub = self.execs.lock().get(&exec_id).cloned().ok_or(NodeError::NoSuchExec(exec_id))?;
        exchange.reply(&Reply::ExecStarted { exec_id }).await?;
        hub.stream(exchange).await
    }

    pub fn kill(&self, exec_id: u64) -> Result<(), NodeError> {
        let hub = self.execs.lock().get(&exec_id).cloned().ok_or(NodeError::NoSuchExec(exec_id))?;
        hub.killer.kill();
        Ok(())
    }

    /// Running and recently finished execs.
    pub fn execs(&self) -> Vec<ExecInfo> {
        self.prune_execs();
        let mut out: Vec<ExecInfo> =
            self.execs.lock().iter().map(|(id, hub)| hub.info(*id)).collect();
        out.sort_by_key(|e| e.exec_id);
        out
    }

    /// Forgets execs that finished long ago.
    fn prune_execs(&self) {
        self.execs
            .lock()
            .retain(|_, hub| hub.state.lock().finished.is_none_or(|t| t.elapsed() < FINISHED_KEEP));
    }
}
