//! Reading frames and raw bytes from a quinn stream, and writing them.
//!
//! [`FrameReader`] buffers what it reads, so a frame and the raw bytes after it (an upload, a
//! download) can arrive in the same QUIC chunk without being lost: after the header frame,
//! [`FrameReader::read_raw`] first drains the buffer, then reads the stream.

use brig_proto::frame::{body_len, HEADER_BYTES};
use bytes::{Buf, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::TransportError;

/// Buffered reader of frames and raw bytes from one receive stream.
pub struct FrameReader {
    recv: quinn::RecvStream,
    buf: BytesMut,
}

impl FrameReader {
    pub fn new(recv: quinn::RecvStream) -> Self {
        FrameReader { recv, buf: BytesMut::new() }
    }

    /// Reads until at least `need` bytes are buffered; `false` if the stream ended first.
    async fn fill(&mut self, need: usize) -> Result<bool, TransportError> {
        while self.buf.len() < need {
            match self.recv.read_chunk(usize::MAX, true).await.map_err(TransportError::Read)? {
                Some(chunk) => {
                    if self.buf.is_empty() && chunk.bytes.len() >= need {
                        // Common case: the whole frame arrived in one chunk.
                        self.buf = BytesMut::from(chunk.bytes);
                    } else {
                        self.buf.extend_from_slice(&chunk.bytes);
                    }
                }
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Reads the next frame; `None` when the stream ended cleanly between frames.
    pub async fn read_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, TransportError> {
        if !self.fill(HEADER_BYTES).await? {
            return if self.buf.is_empty() { Ok(None) } else { Err(TransportError::Truncated) };
        }
        let mut header = [0u8; HEADER_BYTES];
        header.copy_from_slice(&self.buf[..HEADER_BYTES]);
        let len = body_len(header).map_err(TransportError::Frame)?;
        if !self.fill(HEADER_BYTES + len).await? {
            return Err(TransportError::Truncated);
        }
        let msg = brig_proto::decode(&self.buf[HEADER_BYTES..HEADER_BYTES + len])
            .map_err(TransportError::Frame)?;
        self.buf.advance(HEADER_BYTES + len);
        Ok(Some(msg))
    }

    /// Reads the next piece of raw bytes; `None` at the end of the stream.
    pub async fn read_raw(&mut self) -> Result<Option<Bytes>, TransportError> {
        if !self.buf.is_empty() {
            return Ok(Some(self.buf.split().freeze()));
        }
        match self.recv.read_chunk(usize::MAX, true).await.map_err(TransportError::Read)? {
            Some(chunk) => Ok(Some(chunk.bytes)),
            None => Ok(None),
        }
    }

    /// Reads raw bytes to the end of the stream, refusing more than `limit`.
    pub async fn read_raw_to_end(&mut self, limit: usize) -> Result<Vec<u8>, TransportError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.read_raw().await? {
            if out.len() + chunk.len() > limit {
                return Err(TransportError::Frame(brig_proto::FrameError::TooLarge(
                    out.len() + chunk.len(),
                )));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// Tells the peer we will read no more (e.g. after refusing an upload).
    pub fn stop(&mut self, code: u32) {
        let _ = self.recv.stop(code.into());
    }
}

/// Writes one frame.
pub async fn write_frame<T: Serialize>(
    send: &mut quinn::SendStream,
    msg: &T,
) -> Result<(), TransportError> {
    let bytes = brig_proto::encode(msg).map_err(TransportError::Frame)?;
    send.write_chunk(Bytes::from(bytes)).await.map_err(TransportError::Write)
}

/// Writes raw bytes.
pub async fn write_raw(send: &mut quinn::SendStream, bytes: Bytes) -> Result<(), TransportError> {
    send.write_chunk(bytes).await.map_err(TransportError::Write)
}
