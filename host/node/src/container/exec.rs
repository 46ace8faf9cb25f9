//! Execs in container sandboxes, decoupled from the client's stream through the exec hub
//! (`crate::exec_hub`): the engine's events are pumped into it, clients read from it.

use std::sync::Arc;

use brig_container::exec::{ExecEvent, Stdin};
use brig_proto::{AuditKind, ExecRequest, ExecResult, OutputStream, Reply, StdinMode};
use brig_transport::Exchange;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::{merged_env, result_of, ContainerSandbox, ContainerTier};
use crate::audit::Recorder;
use crate::exec_hub::ExecHub;
use crate::NodeError;

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
            terminal: req
                .terminal
                .map(|s| brig_container::terminal::TerminalSize { rows: s.rows, cols: s.cols }),
        };
        let mut exec = brig_container::exec::exec(&self.container, request).await?;
        let exec_id = self.execs.next_id();
        recorder.record(AuditKind::ExecStart { exec_id, argv: argv.clone(), user, cwd });
        let killer = exec.killer();
        let resizer = exec.terminal.clone().map(|t| -> crate::exec_hub::Resizer {
            Box::new(move |s: brig_proto::TerminalSize| {
                t.resize(brig_container::terminal::TerminalSize { rows: s.rows, cols: s.cols })
            })
        });
        let hub = self.execs.insert_with(exec_id, argv, Box::new(move || killer.kill()), resizer);
        let feeder = match (stream_stdin, exec.stdin.take(), exec.terminal.clone()) {
            (false, _, _) => None,
            // Typed into the terminal (the terminal has no end of input: the shell's own exit
            // or a kill ends it).
            (true, _, Some(terminal)) => exchange.take_upload().map(|mut upload| {
                tokio::spawn(async move {
                    while let Ok(Some(chunk)) = upload.read().await {
                        if terminal.write_all(&chunk).await.is_err() {
                            break;
                        }
                    }
                })
            }),
            (true, Some(mut stdin), None) => exchange.take_upload().map(|mut upload| {
                tokio::spawn(async move {
                    while let Ok(Some(chunk)) = upload.read().await {
                        if stdin.write_all(&chunk).await.is_err() {
                            break;
                        }
                    }
                })
            }),
            (true, None, None) => None,
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
}
