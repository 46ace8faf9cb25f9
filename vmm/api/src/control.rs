//! The VMM's control socket: how the host (brig-vmtier) steers a running Linux VM. One Unix
//! socket per VMM; on each connection the host sends [`ControlRequest`]s and gets one
//! [`ControlReply`] per request, each one JSON object on a line of at most [`MAX_LINE`] bytes:
//!
//! ```text
//! host → VMM   {"op":"stats"}                    → {"reply":"stats","rss_kib":…,"balloon":{…}|null}
//!              {"op":"balloon","target_mib":N}   → {"reply":"done"}
//!              {"op":"snapshot","dir":"/…"}      → {"reply":"saved","micros":…}   (the VM runs on)
//!              {"op":"pause","dir":"/…"}         → {"reply":"saved","micros":…}   (then the VMM exits)
//! anything the VMM cannot serve                  → {"reply":"error","message":"…"}
//! ```
//!
//! A malformed request gets an error reply and never stops the VMM. The host reads a reply
//! with the same line cap and a deadline: a VMM is as trusted as the guest it runs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Longest request or reply line, newline included.
pub const MAX_LINE: usize = 64 << 10;

/// What the host asks a VMM.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlRequest {
    /// The VMM's memory and its balloon (a struct variant, so stray fields are refused).
    Stats {},
    /// Sets the balloon's target (0 gives everything back).
    Balloon { target_mib: u64 },
    /// Stops the vCPUs at their next exit, saves the VM to `dir`, then lets it run on.
    Snapshot { dir: PathBuf },
    /// As `Snapshot`, then the VMM exits: the sandbox lives on in `dir`.
    Pause { dir: PathBuf },
}

/// The balloon's figures.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BalloonStats {
    pub target_mib: u64,
    pub actual_mib: u64,
    /// Memory the guest reported free and the VMM discarded, in all.
    pub reported_mib: u64,
    pub reports: u64,
    pub inflated_mib: u64,
}

/// A VMM's answer to one request.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlReply {
    Stats {
        /// The VMM process's resident memory (guest memory it touched plus its own).
        rss_kib: u64,
        /// None without a balloon device.
        balloon: Option<BalloonStats>,
    },
    /// The balloon request was taken.
    Done,
    /// The VM is saved; how long the save took.
    Saved {
        micros: u64,
    },
    Error {
        message: String,
    },
}

/// A control line that is not a request or reply of this protocol.
#[derive(Debug, thiserror::Error)]
pub enum ControlCodecError {
    #[error("control line of more than {MAX_LINE} bytes")]
    TooLong,
    #[error("malformed control line")]
    Malformed(#[source] serde_json::Error),
}

/// `message` as one line (newline included).
pub fn encode_line<T: Serialize>(message: &T) -> String {
    // A request or reply is plain data with string keys: serializing it cannot fail.
    let mut line = serde_json::to_string(message).unwrap_or_else(|_| "{}".into());
    line.push('\n');
    line
}

/// Parses one line (with or without its newline).
pub fn decode_line<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, ControlCodecError> {
    if line.len() > MAX_LINE {
        return Err(ControlCodecError::TooLong);
    }
    serde_json::from_str(line.trim_end()).map_err(ControlCodecError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_strangers_are_refused() {
        let requests = [
            ControlRequest::Stats {},
            ControlRequest::Balloon { target_mib: 32 },
            ControlRequest::Snapshot { dir: "/a b\nc".into() },
            ControlRequest::Pause { dir: "/x".into() },
        ];
        for r in requests {
            let line = encode_line(&r);
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1, "{line:?}");
            assert_eq!(decode_line::<ControlRequest>(&line).expect("decode"), r);
        }
        let reply = ControlReply::Stats {
            rss_kib: 9,
            balloon: Some(BalloonStats { target_mib: 1, ..BalloonStats::default() }),
        };
        assert_eq!(decode_line::<ControlReply>(&encode_line(&reply)).expect("reply"), reply);
        for bad in [
            "",
            "stats",
            r#"{"op":"explode"}"#,
            r#"{"op":"balloon"}"#,
            r#"{"op":"balloon","target_mib":-1}"#,
            r#"{"op":"stats","extra":1}"#,
        ] {
            assert!(decode_line::<ControlRequest>(bad).is_err(), "{bad:?}");
        }
        // A renamed field is an error, not a zero.
        assert!(decode_line::<ControlReply>(r#"{"reply":"stats","rss":1,"balloon":null}"#).is_err());
        let long = format!("{{\"op\":\"snapshot\",\"dir\":\"/{}\"}}", "a".repeat(MAX_LINE));
        assert!(matches!(decode_line::<ControlRequest>(&long), Err(ControlCodecError::TooLong)));
    }
}
