//! A command's streamed stdin, held by its hub (`crate::execs::hub`) so that it does not belong
//! to one client stream: the client that started the command writes through its upload, and
//! any client writes or closes it by exec id (`ExecOp::Input`), which is also how a command
//! kept across a node restart (its shim kept the pipe's write end) is fed further.
//!
//! ```text
//! upload of the starting client ─┐
//! ExecOp::Input { data, close } ─┴▶ StdinSlot (≤ exec_stdin_bytes) ─▶ tier's channel ─▶ pipe
//! ```
//! A write is done (and a client's write acknowledged) once the tier has put the bytes in the
//! command's pipe or terminal ([`StdinChunk::written`]), which the shim keeps through a node
//! crash; bytes only queued for the tier would die with the node.

use brig_core::sandbox::StdinChunk;
use bytes::Bytes;
use parking_lot::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;

use crate::limits::Limit;
use crate::NodeError;

/// How long a write waits for the command to take input (its pipe and channel full) before
/// the writer hears why.
const STDIN_WRITE_WAIT: Duration = Duration::from_secs(30);

/// An exec's stdin while it is open.
#[derive(Default)]
pub(crate) struct StdinSlot {
    open: Mutex<Option<OpenStdin>>,
}

struct OpenStdin {
    tx: mpsc::Sender<StdinChunk>,
    /// Bytes written so far, and the most allowed.
    written: u64,
    max: u64,
}

/// Why a write to an exec's stdin was refused.
#[derive(Debug)]
pub(crate) enum StdinRefused {
    /// Not open: never streamed, closed, or the command ended.
    Closed,
    /// Past the byte limit (the stdin is closed now).
    Over(u64),
    /// The command took no input for [`STDIN_WRITE_WAIT`].
    Stalled,
}

impl StdinRefused {
    pub(crate) fn into_node_error(self, exec_id: u64) -> NodeError {
        match self {
            StdinRefused::Closed => NodeError::StdinClosed(exec_id),
            StdinRefused::Over(max) => Limit::ExecStdinBytes.reached(max),
            StdinRefused::Stalled => NodeError::StdinStalled(exec_id, STDIN_WRITE_WAIT),
        }
    }
}

impl StdinSlot {
    /// Opens it on `tx` (the tier's end), allowing `max` bytes in all.
    pub(crate) fn open(&self, tx: mpsc::Sender<StdinChunk>, max: u64) {
        *self.open.lock() = Some(OpenStdin { tx, written: 0, max });
    }

    /// Writes `data` into the command's input, waiting as long as the command reads
    /// (`bounded`: up to [`STDIN_WRITE_WAIT`]) for the tier to have written it. Past the byte
    /// limit the stdin is closed and the write refused.
    pub(crate) async fn write(&self, data: Bytes, bounded: bool) -> Result<(), StdinRefused> {
        let tx = {
            let mut open = self.open.lock();
            let Some(o) = open.as_mut() else { return Err(StdinRefused::Closed) };
            let written = o.written.saturating_add(data.len() as u64);
            if written > o.max {
                let max = o.max;
                *open = None;
                return Err(StdinRefused::Over(max));
            }
            o.written = written;
            o.tx.clone()
        };
        if data.is_empty() {
            return if tx.is_closed() { Err(StdinRefused::Closed) } else { Ok(()) };
        }
        let (chunk, written) = StdinChunk::new(data);
        let delivered = async move {
            tx.send(chunk).await.map_err(|_| StdinRefused::Closed)?;
            // Dropped unwritten: the command's input is gone.
            written.await.map_err(|_| StdinRefused::Closed)
        };
        if !bounded {
            return delivered.await;
        }
        match tokio::time::timeout(STDIN_WRITE_WAIT, delivered).await {
            Ok(done) => done,
            Err(_) => Err(StdinRefused::Stalled),
        }
    }

    /// Closes it: the command reads end of file once what was written is read. `false` if it
    /// was not open.
    pub(crate) fn close(&self) -> bool {
        self.open.lock().take().is_some_and(|o| !o.tx.is_closed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A write is done when the tier has written the bytes, not when they are queued for it:
    /// bytes queued and lost with the node must not have been acknowledged.
    #[tokio::test]
    async fn a_write_is_done_once_the_tier_wrote_it_and_refused_if_it_never_will() {
        let slot = Arc::new(StdinSlot::default());
        let (tx, mut rx) = mpsc::channel(16);
        slot.open(tx, 1 << 20);
        let writer = {
            let slot = slot.clone();
            tokio::spawn(async move { slot.write(Bytes::from_static(b"one\n"), true).await })
        };
        let chunk = rx.recv().await.expect("queued for the tier");
        assert_eq!(&chunk.data[..], b"one\n");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "done while only queued");
        chunk.written();
        assert!(matches!(writer.await.expect("join"), Ok(())));

        // The tier drops a chunk it could not write (the command's input is gone).
        let writer = {
            let slot = slot.clone();
            tokio::spawn(async move { slot.write(Bytes::from_static(b"two\n"), true).await })
        };
        drop(rx.recv().await.expect("queued"));
        assert!(matches!(writer.await.expect("join"), Err(StdinRefused::Closed)));
    }
}
