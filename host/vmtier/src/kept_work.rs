//! Taking back what a guest's agent kept while the node was down, or while its VM was saved
//! by a pause: commands started with `keep` and kept sessions, of a microVM or full VM (its own) or of one container of a
//! container-host VM (kept under the container's name). Each command is read again from its
//! first byte, with its deadline counted from its start, and its stdin, if a client streamed
//! it and has not ended it, is written on by id; each session is attached again by the node's
//! session id, with its record (see `session`).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use brig_core::sandbox::{KeptWork, RecoveredExec, Session, Stdin, StdinChunk};
use tokio::sync::mpsc;

use crate::agent_link::{attach_kept, attach_kept_input, kept_commands};
use crate::guest_exec::{serve_kept, KeptCommand};
use crate::session::resume_kept_sessions;

/// Stdin chunks queued for a kept command taken back (each is acknowledged once sent).
const STDIN_CHUNKS: usize = 16;

/// What the agent behind `uds` kept for `container` (none: the VM's own), with the session
/// records in `sessions_dir`; `owner` names the VM or container in logs; `saving` is the VM's
/// pause flag (see [`KeptCommand::saving`]).
pub(crate) async fn recover(
    uds: &Path,
    container: Option<&str>,
    sessions_dir: &Path,
    owner: &str,
    saving: Option<Arc<AtomicBool>>,
) -> KeptWork {
    let mut work = KeptWork::default();
    // Once more after a moment: a guest just restored from a pause may refuse a connection
    // while its vsock transport settles.
    let listed = match kept_commands(uds, container).await {
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            kept_commands(uds, container).await
        }
        listed => listed,
    };
    for (id, session) in resume_kept_sessions(uds, sessions_dir, container, owner).await {
        work.sessions.push((id, Box::new(session) as Box<dyn Session>));
    }
    let listed = match listed {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(owner, error = %e, "cannot list the guest's kept commands");
            return work;
        }
    };
    for info in listed {
        let id = info.keep.id;
        // A stdin kept open is written through this connection from here, by id.
        let attached = if info.input_open {
            attach_kept_input(uds, id, container).await.map(|(stream, input)| {
                let (tx, rx) = mpsc::channel::<StdinChunk>(STDIN_CHUNKS);
                (stream, Some((input, rx, tx)))
            })
        } else {
            attach_kept(uds, id, container).await.map(|stream| (stream, None))
        };
        let (stream, input) = match attached {
            Ok(attached) => attached,
            Err(e) => {
                tracing::warn!(owner, exec = id, error = %e, "cannot attach a kept command");
                continue;
            }
        };
        let (input, stdin, stdin_tx) = match input {
            Some((input, rx, tx)) => (Some(input), Stdin::Stream(rx), Some(tx)),
            None => (None, Stdin::Empty, None),
        };
        let kept = KeptCommand {
            uds: uds.to_owned(),
            id,
            container: container.map(str::to_string),
            ran_for: Duration::from_millis(info.elapsed_ms),
            saving: saving.clone(),
        };
        let timeout = Duration::from_millis(info.keep.timeout_ms);
        let running = serve_kept(stream, input, stdin, timeout, info.keep.output_limit, Some(kept));
        work.execs.push(RecoveredExec {
            exec_id: id,
            argv: info.argv,
            output: Vec::new(),
            gap: info.gap,
            running: Some(running),
            exit: None,
            stdin: stdin_tx,
            archive: None,
        });
    }
    work
}
