//! Length-prefixed frames: `u32` little-endian length, then a postcard-encoded message.
//!
//! ```text
//! 0        4                 4+len
//! +--------+-----------------+
//! | len LE | postcard(T)     |
//! +--------+-----------------+
//! ```
//! `len` is capped at [`MAX_FRAME_BYTES`]; a larger prefix is rejected before any allocation.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest frame body either side accepts. Bulk data travels as raw bytes, not in frames.
pub const MAX_FRAME_BYTES: usize = 8 << 20;

/// Size of the length prefix.
pub const HEADER_BYTES: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("cannot encode message")]
    Encode(#[source] postcard::Error),
    #[error("cannot decode message")]
    Decode(#[source] postcard::Error),
}

/// Encodes `msg` as one frame (header included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&[0; HEADER_BYTES]);
    let mut out = postcard::to_extend(msg, out).map_err(FrameError::Encode)?;
    let len = out.len() - HEADER_BYTES;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let len32 = u32::try_from(len).map_err(|_| FrameError::TooLarge(len))?;
    out[..HEADER_BYTES].copy_from_slice(&len32.to_le_bytes());
    Ok(out)
}

/// Reads the body length from a frame header, rejecting oversized frames.
pub fn body_len(header: [u8; HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// Decodes a frame body (without its header).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(body).map_err(FrameError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallRequest, Request, ToolOp};

    #[test]
    fn round_trip() {
        let req = Request::Tool(ToolOp::Call(CallRequest::new("jq", "{}")));
        let frame = encode(&req).expect("encode");
        let len = body_len(frame[..4].try_into().expect("header")).expect("len");
        assert_eq!(len, frame.len() - 4);
        let back: Request = decode(&frame[4..]).expect("decode");
        assert_eq!(back, req);
    }

    #[test]
    fn oversized_header_is_rejected() {
        let header = (MAX_FRAME_BYTES as u32 + 1).to_le_bytes();
        assert!(matches!(body_len(header), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        for seed in 0u8..=255 {
            let body: Vec<u8> =
                (0..64u8).map(|i| i.wrapping_mul(seed).wrapping_add(seed)).collect();
            let _ = decode::<Request>(&body);
        }
    }
}
