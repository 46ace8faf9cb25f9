//! A VM's own files as the host's file API reaches them (`AgentRequest::Files`, agent protocol
//! 3): the requests and what they answer, in the container service's terms.
//!
//! ```text
//! stat    one STDOUT frame: a FileEntry as JSON
//! list    STDOUT frames of FileEntry JSON, one a line (at most MAX_GUEST_LIST entries)
//! mkdir   nothing
//! remove  nothing
//! then    EXIT 0, or a Failure's status with its STDERR line
//! ```
//!
//! The agent resolves every path inside the sandbox's root without following a link out of it
//! (`..` refused), and refuses kernel file systems, as for a container.

use serde::{Deserialize, Serialize};

pub use crate::container::{Failure, FileEntry};

/// Most entries a listing answers.
pub const MAX_GUEST_LIST: usize = 100_000;
/// The most bytes a listing's answer takes (an entry's line is at most a path of 4 KiB and
/// its fields).
pub const MAX_GUEST_LIST_BYTES: usize = 32 << 20;

/// One file request for the VM's own files.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "file_op", rename_all = "snake_case", deny_unknown_fields)]
pub enum GuestFileRequest {
    Stat { path: String },
    List { path: String },
    Mkdir { path: String, parents: bool },
    Remove { path: String, recursive: bool },
}

/// A listing's answer read back: each line a [`FileEntry`].
pub fn parse_listing(bytes: &[u8]) -> Result<Vec<FileEntry>, serde_json::Error> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .take(MAX_GUEST_LIST)
        .map(serde_json::from_slice)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_listings_round_trip() {
        let req = GuestFileRequest::Remove { path: "/a b".into(), recursive: true };
        let json = serde_json::to_string(&req).expect("json");
        assert_eq!(serde_json::from_str::<GuestFileRequest>(&json).expect("back"), req);
        let entry = |p: &str| FileEntry {
            path: p.into(),
            kind: "file".into(),
            size: 3,
            mode: 0o644,
            modified_unix_ms: 1,
        };
        let mut bytes = Vec::new();
        for e in [entry("/x"), entry("/y\nz")] {
            bytes.extend(serde_json::to_vec(&e).expect("json"));
            bytes.push(b'\n');
        }
        assert_eq!(parse_listing(&bytes).expect("parse"), vec![entry("/x"), entry("/y\nz")]);
        assert!(parse_listing(b"{\"path\":1}\n").is_err());
    }
}
