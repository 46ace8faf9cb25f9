//! What a recorded session's command produced while nobody waited on it, kept on disk beside
//! the session's record (`<sessions>/<id>.backlog`), so that a restarted node hands it to the
//! next waiter instead of losing it with its memory.
//!
//! The file is a sequence of frames, appended as the session's reader takes output from the
//! shell and finds no waiter: a tag byte, the payload's length (u32, little-endian), the
//! payload. It is emptied once a waiter has been handed everything. A frame cut short by a
//! crash in the middle of its write is ignored when the file is read back.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::session::SessionEvent;

const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const DONE: u8 = 3;
const DROPPED: u8 = 4;
/// Tag and length.
const FRAME_HEADER: usize = 5;

/// A session's backlog file. Writes are best effort: a node that cannot write it (a full
/// disk) still delivers from memory, and says so in its log once.
pub struct Backlog {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Bytes in the file.
    len: u64,
    /// The file's bound.
    max_bytes: u64,
    warned: bool,
}

impl Backlog {
    /// The backlog at `path`, at most `max_bytes` long (the file is made on the first append).
    pub fn new(path: PathBuf, max_bytes: u64) -> Backlog {
        Backlog { path, file: None, len: 0, max_bytes, warned: false }
    }

    /// Appends an event nobody was waiting for (a `Pending`, which is never kept, is skipped).
    /// False if the file has no room for it (the caller counts it as dropped).
    pub fn append(&mut self, event: &SessionEvent) -> bool {
        let Some(frame) = encode(event) else { return true };
        if self.len + frame.len() as u64 > self.max_bytes {
            return false;
        }
        if let Err(e) = self.write(&frame) {
            if !self.warned {
                self.warned = true;
                tracing::warn!(path = %self.path.display(), error = %e,
                    "cannot keep a session's output on disk; it is kept in memory only");
            }
        }
        true
    }

    fn write(&mut self, frame: &[u8]) -> std::io::Result<()> {
        if self.file.is_none() {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
            self.len = file.metadata()?.len();
            self.file = Some(file);
        }
        if let Some(file) = &mut self.file {
            file.write_all(frame)?;
            self.len += frame.len() as u64;
        }
        Ok(())
    }

    /// Empties the file: a waiter has been handed everything in it.
    pub fn clear(&mut self) {
        if self.len == 0 {
            return;
        }
        let cleared = match &self.file {
            Some(file) => file.set_len(0),
            None => {
                std::fs::OpenOptions::new().write(true).open(&self.path).and_then(|f| f.set_len(0))
            }
        };
        match cleared {
            Ok(()) => self.len = 0,
            Err(e) => tracing::warn!(path = %self.path.display(), error = %e,
                "cannot empty a session's backlog"),
        }
    }

    /// The events kept by an earlier run of the node, up to the bound (anything past it, and a
    /// frame cut short, is left out).
    pub fn load(&mut self) -> Vec<SessionEvent> {
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&self.path)
            .and_then(|f| f.take(self.max_bytes).read_to_end(&mut bytes));
        if let Err(e) = read {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e,
                    "cannot read a session's backlog");
            }
            return Vec::new();
        }
        self.len = bytes.len() as u64;
        decode(&bytes)
    }
}

/// What of a backlog kept by an earlier run is still undelivered. The session is recorded idle
/// only just before a waiter is handed a command's end, so with the record idle (`!running`),
/// everything up to the last end was handed over (the node died before emptying the file).
pub fn kept_undelivered(mut kept: Vec<SessionEvent>, running: bool) -> Vec<SessionEvent> {
    if !running {
        if let Some(last) = kept.iter().rposition(|e| matches!(e, SessionEvent::Done { .. })) {
            kept.drain(..=last);
        }
    }
    kept
}

/// Where session `session_id`'s backlog lives in `dir`.
pub fn path_in(dir: &Path, session_id: &str) -> PathBuf {
    dir.join(format!("{session_id}.backlog"))
}

fn encode(event: &SessionEvent) -> Option<Vec<u8>> {
    let (code, dropped);
    let (tag, head, rest): (u8, &[u8], &[u8]) = match event {
        SessionEvent::Stdout(b) => (STDOUT, &[], b),
        SessionEvent::Stderr(b) => (STDERR, &[], b),
        SessionEvent::Done { exit_code, cwd } => {
            code = exit_code.to_le_bytes();
            (DONE, &code, cwd.as_bytes())
        }
        SessionEvent::Dropped { bytes } => {
            dropped = bytes.to_le_bytes();
            (DROPPED, &dropped, &[])
        }
        SessionEvent::Pending => return None,
    };
    let len = u32::try_from(head.len() + rest.len()).ok()?;
    let mut frame = Vec::with_capacity(FRAME_HEADER + head.len() + rest.len());
    frame.push(tag);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(head);
    frame.extend_from_slice(rest);
    Some(frame)
}

fn decode(mut bytes: &[u8]) -> Vec<SessionEvent> {
    let mut events = Vec::new();
    while bytes.len() >= FRAME_HEADER {
        let tag = bytes[0];
        let len = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        let Some(payload) = bytes.get(FRAME_HEADER..FRAME_HEADER + len) else { break };
        let event = match tag {
            STDOUT => Some(SessionEvent::Stdout(Bytes::copy_from_slice(payload))),
            STDERR => Some(SessionEvent::Stderr(Bytes::copy_from_slice(payload))),
            DONE if len >= 4 => Some(SessionEvent::Done {
                exit_code: i32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]),
                cwd: String::from_utf8_lossy(&payload[4..]).into_owned(),
            }),
            DROPPED if len == 8 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(payload);
                Some(SessionEvent::Dropped { bytes: u64::from_le_bytes(n) })
            }
            _ => None,
        };
        match event {
            Some(event) => events.push(event),
            None => {
                tracing::warn!(
                    tag,
                    len,
                    "a session backlog frame is not understood; the rest is left out"
                );
                break;
            }
        }
        bytes = &bytes[FRAME_HEADER + len..];
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(dir: &Path, id: &str, max_bytes: u64) -> Backlog {
        Backlog::new(path_in(dir, id), max_bytes)
    }

    fn events() -> Vec<SessionEvent> {
        vec![
            SessionEvent::Stdout(Bytes::from_static(b"late\n")),
            SessionEvent::Stderr(Bytes::from_static(b"bad\n")),
            SessionEvent::Dropped { bytes: 12 },
            SessionEvent::Done { exit_code: -4, cwd: "/tmp/dir with space".into() },
        ]
    }

    #[test]
    fn events_come_back_in_order_and_a_cut_frame_is_left_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut backlog = at(dir.path(), "s1", 1 << 20);
        for e in events() {
            assert!(backlog.append(&e));
        }
        assert!(backlog.append(&SessionEvent::Pending));
        // Past its bound the file takes nothing more.
        let mut small = at(dir.path(), "small", 12);
        assert!(small.append(&events()[0]));
        assert!(!small.append(&events()[1]));
        assert_eq!(at(dir.path(), "small", 12).load(), events()[..1].to_vec());
        assert_eq!(at(dir.path(), "s1", 1 << 20).load(), events());
        // A crash in the middle of a frame's write: the whole frames before it are kept.
        let path = path_in(dir.path(), "s1");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(&[STDOUT, 9, 0, 0, 0, b'x']);
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(at(dir.path(), "s1", 1 << 20).load(), events());
        // Past the cap, only the whole frames inside it.
        assert_eq!(at(dir.path(), "s1", 10).load(), events()[..1].to_vec());
    }

    #[test]
    fn a_kept_end_counts_only_while_the_record_says_running() {
        let out = SessionEvent::Stdout(Bytes::from_static(b"x"));
        let done = SessionEvent::Done { exit_code: 0, cwd: "/".into() };
        let after = SessionEvent::Stdout(Bytes::from_static(b"bg"));
        let kept = vec![out.clone(), done.clone(), after.clone()];
        assert_eq!(kept_undelivered(kept.clone(), true), kept);
        assert_eq!(kept_undelivered(kept, false), vec![after.clone()]);
        assert_eq!(kept_undelivered(vec![after.clone()], false), vec![after]);
    }

    #[test]
    fn a_cleared_backlog_is_empty_and_appends_go_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut backlog = at(dir.path(), "s2", 1 << 20);
        assert!(backlog.append(&events()[0]));
        backlog.clear();
        assert!(at(dir.path(), "s2", 1 << 20).load().is_empty());
        assert!(backlog.append(&events()[1]));
        assert_eq!(at(dir.path(), "s2", 1 << 20).load(), events()[1..2].to_vec());
        // A backlog taken back after a restart empties the file it read.
        let mut again = at(dir.path(), "s2", 1 << 20);
        assert_eq!(again.load().len(), 1);
        again.clear();
        assert!(at(dir.path(), "s2", 1 << 20).load().is_empty());
    }
}
