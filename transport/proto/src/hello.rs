//! The connection hello: authentication and version negotiation, in a layout that every protocol
//! version keeps, so that mismatched peers always understand each other's refusal.
//!
//! ```text
//! client hello                      server reply
//! 0..4  magic "BRIG"                0..4  magic "BRIG"
//! 4..6  protocol version (u16 LE)   4..6  server protocol version (u16 LE)
//! 6..8  token length n (u16 LE)     6     status (0 ok, 1 version, 2 auth, 3 malformed)
//! 8..   token (n bytes, UTF-8)      7..9  message length m (u16 LE)
//!                                   9..   message (m bytes, UTF-8)
//! ```

pub const MAGIC: [u8; 4] = *b"BRIG";
/// Longest token a hello may carry.
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Longest message a hello reply may carry.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Bytes of a client hello before the token.
pub const CLIENT_FIXED_BYTES: usize = 8;
/// Bytes of a server reply before the message.
pub const SERVER_FIXED_BYTES: usize = 9;

/// How Brig writes a token that E2B's SDKs take as an API key: `e2b_` and the hex secret.
pub const E2B_KEY_PREFIX: &str = "e2b_";

/// The secret a token carries: the token with surrounding space and an `e2b_` prefix taken
/// off, so `e2b_<hex>` and `<hex>` are one token.
pub fn token_secret(token: &str) -> &str {
    let token = token.trim();
    token.strip_prefix(E2B_KEY_PREFIX).unwrap_or(token)
}

/// A new token: 256 random bits, hex, written as an E2B API key (`e2b_<64 hex>`).
pub fn e2b_key(secret_hex: &str) -> String {
    format!("{E2B_KEY_PREFIX}{}", token_secret(secret_hex))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    pub version: u16,
    pub token: String,
}

/// Outcome of a hello, as the server reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloStatus {
    Ok = 0,
    VersionMismatch = 1,
    Unauthenticated = 2,
    Malformed = 3,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    pub version: u16,
    pub status: HelloStatus,
    pub message: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HelloError {
    #[error("not a Brig hello (bad magic)")]
    BadMagic,
    #[error("hello is truncated")]
    Truncated,
    #[error("hello field of {0} bytes is too long")]
    TooLong(usize),
    #[error("hello text is not UTF-8")]
    NotUtf8,
    #[error("unknown hello status {0}")]
    UnknownStatus(u8),
}

impl ClientHello {
    pub fn encode(&self) -> Result<Vec<u8>, HelloError> {
        let token = self.token.as_bytes();
        if token.len() > MAX_TOKEN_BYTES {
            return Err(HelloError::TooLong(token.len()));
        }
        let mut out = Vec::with_capacity(CLIENT_FIXED_BYTES + token.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(token.len() as u16).to_le_bytes());
        out.extend_from_slice(token);
        Ok(out)
    }

    /// Parses the fixed part; returns the version and how many token bytes follow.
    pub fn parse_fixed(fixed: &[u8; CLIENT_FIXED_BYTES]) -> Result<(u16, usize), HelloError> {
        if fixed[..4] != MAGIC {
            return Err(HelloError::BadMagic);
        }
        let version = u16::from_le_bytes([fixed[4], fixed[5]]);
        let len = u16::from_le_bytes([fixed[6], fixed[7]]) as usize;
        if len > MAX_TOKEN_BYTES {
            return Err(HelloError::TooLong(len));
        }
        Ok((version, len))
    }

    /// Parses a whole client hello.
    pub fn decode(bytes: &[u8]) -> Result<Self, HelloError> {
        let fixed: &[u8; CLIENT_FIXED_BYTES] = bytes
            .get(..CLIENT_FIXED_BYTES)
            .and_then(|b| b.try_into().ok())
            .ok_or(HelloError::Truncated)?;
        let (version, len) = Self::parse_fixed(fixed)?;
        let token =
            bytes.get(CLIENT_FIXED_BYTES..CLIENT_FIXED_BYTES + len).ok_or(HelloError::Truncated)?;
        let token = std::str::from_utf8(token).map_err(|_| HelloError::NotUtf8)?.to_owned();
        Ok(ClientHello { version, token })
    }
}

impl ServerHello {
    pub fn encode(&self) -> Vec<u8> {
        let mut msg = self.message.as_bytes();
        if msg.len() > MAX_MESSAGE_BYTES {
            msg = &msg[..MAX_MESSAGE_BYTES];
        }
        let mut out = Vec::with_capacity(SERVER_FIXED_BYTES + msg.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.push(self.status as u8);
        out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        out.extend_from_slice(msg);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, HelloError> {
        if bytes.len() < SERVER_FIXED_BYTES {
            return Err(HelloError::Truncated);
        }
        if bytes[..4] != MAGIC {
            return Err(HelloError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let status = match bytes[6] {
            0 => HelloStatus::Ok,
            1 => HelloStatus::VersionMismatch,
            2 => HelloStatus::Unauthenticated,
            3 => HelloStatus::Malformed,
            other => return Err(HelloError::UnknownStatus(other)),
        };
        let len = u16::from_le_bytes([bytes[7], bytes[8]]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(HelloError::TooLong(len));
        }
        let msg =
            bytes.get(SERVER_FIXED_BYTES..SERVER_FIXED_BYTES + len).ok_or(HelloError::Truncated)?;
        let message = String::from_utf8_lossy(msg).into_owned();
        Ok(ServerHello { version, status, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_round_trip() {
        let h = ClientHello { version: 7, token: "abc".into() };
        assert_eq!(ClientHello::decode(&h.encode().expect("encode")), Ok(h));
    }

    #[test]
    fn server_round_trip() {
        let h =
            ServerHello { version: 1, status: HelloStatus::VersionMismatch, message: "x".into() };
        assert_eq!(ServerHello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(ClientHello::decode(b"HTTP/1.1 200"), Err(HelloError::BadMagic));
        assert_eq!(ClientHello::decode(b"BRIG"), Err(HelloError::Truncated));
        let mut long = b"BRIG\x01\x00".to_vec();
        long.extend_from_slice(&(5000u16).to_le_bytes());
        assert_eq!(ClientHello::decode(&long), Err(HelloError::TooLong(5000)));
    }
}
