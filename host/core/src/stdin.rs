//! A command's streamed stdin as the node hands it to a tier.

use bytes::Bytes;
use tokio::sync::oneshot;

/// A chunk of a command's streamed stdin. The tier calls [`StdinChunk::written`] once the bytes
/// are where the command reads them (its pipe or terminal, which outlive the node); the node
/// acknowledges the write to the client only then, so a node crash loses no acknowledged input.
/// A chunk dropped without it was not written (the command's input is gone).
#[derive(Debug)]
pub struct StdinChunk {
    pub data: Bytes,
    done: Option<oneshot::Sender<()>>,
}

impl StdinChunk {
    /// A chunk, and what resolves once the tier has written it.
    pub fn new(data: Bytes) -> (StdinChunk, oneshot::Receiver<()>) {
        let (done, written) = oneshot::channel();
        (StdinChunk { data, done: Some(done) }, written)
    }

    /// The bytes are written where the command reads them.
    pub fn written(mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}
