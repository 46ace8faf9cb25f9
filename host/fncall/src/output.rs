//! Capped capture of a guest's stdout or stderr.
//!
//! Keeps at most `cap` bytes. The write that would pass the cap stores what fits, marks the
//! stream overflowed and traps the guest: an output flood (`yes`) ends at once instead of
//! burning CPU until its deadline, and the call reports `OutputOverflow`.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Advertised write budget per `check-write`; the cap is enforced in `write`.
const WRITE_BUDGET: usize = 64 << 10;

#[derive(Clone)]
pub(crate) struct CappedOutput {
    inner: Arc<Mutex<Captured>>,
}

struct Captured {
    data: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl CappedOutput {
    pub fn new(cap: usize) -> Self {
        CappedOutput {
            inner: Arc::new(Mutex::new(Captured { data: Vec::new(), cap, overflowed: false })),
        }
    }

    /// The captured bytes and whether the cap was hit.
    pub fn take(&self) -> (Vec<u8>, bool) {
        let mut inner = self.inner.lock();
        (std::mem::take(&mut inner.data), inner.overflowed)
    }

    fn append(&self, bytes: &[u8]) -> Result<(), usize> {
        let mut inner = self.inner.lock();
        let room = inner.cap - inner.data.len();
        if bytes.len() > room {
            inner.data.extend_from_slice(&bytes[..room]);
            inner.overflowed = true;
            return Err(inner.cap);
        }
        inner.data.extend_from_slice(bytes);
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CappedOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.append(&bytes).map_err(|cap| {
            StreamError::Trap(wasmtime::format_err!("output exceeded its cap of {cap} bytes"))
        })
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_BUDGET)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CappedOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(match self.append(buf) {
            Ok(()) => Ok(buf.len()),
            Err(cap) => {
                Err(std::io::Error::other(format!("output exceeded its cap of {cap} bytes")))
            }
        })
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_up_to_cap_then_overflows() {
        let out = CappedOutput::new(5);
        assert!(out.append(b"abc").is_ok());
        assert_eq!(out.append(b"defg"), Err(5));
        assert_eq!(out.take(), (b"abcde".to_vec(), true));
    }
}
