//! A small record rewritten in place: one file with two fixed slots, written in turn, each
//! holding a sequence number, the record's length and a SHA-256 of both with the record. The
//! newest intact slot is the record, so a write cut short (a crash of the machine mid-write)
//! leaves the one before it readable.
//!
//! ```text
//! offset 0        slot 0: seq (u64 LE) | len (u32 LE) | sha256(seq ‖ len ‖ body) | body
//! offset 16 KiB   slot 1: the same, written when seq is odd
//! ```
//! What it replaces, writing a temporary file and renaming it over the record, makes a new
//! inode and frees the old one (with its block) at every write. On a busy node that churn
//! costs: ext4 without a journal skips every recently freed inode at each allocation, and
//! with `discard` a freed block is discarded before the rename returns. A session's record
//! is rewritten twice per command.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Bytes a slot takes (its header included).
pub const SLOT_BYTES: u64 = 16 << 10;
const HEADER_BYTES: usize = 8 + 4 + 32;
/// The largest record a slot holds.
pub const MAX_BODY_BYTES: usize = SLOT_BYTES as usize - HEADER_BYTES;

/// An open slot file and the sequence number of its newest slot.
#[derive(Debug)]
pub struct SlotFile {
    file: File,
    seq: u64,
}

impl SlotFile {
    /// Creates the file at `path`, or empties one that is there.
    pub fn create(path: &Path) -> std::io::Result<SlotFile> {
        let file = File::options().read(true).write(true).create(true).truncate(true).open(path)?;
        Ok(SlotFile { file, seq: 0 })
    }

    /// Takes over the file at `path` (a spare: see [`crate::spare_files`]) as an empty slot
    /// file: both slots are overwritten with zeros, so no earlier record stays readable and no
    /// block is freed (on a file system mounted with `discard`, freeing one waits for the disk).
    pub fn reuse(path: &Path) -> std::io::Result<SlotFile> {
        let file = File::options().read(true).write(true).open(path)?;
        file.write_all_at(&vec![0u8; 2 * SLOT_BYTES as usize], 0)?;
        Ok(SlotFile { file, seq: 0 })
    }

    /// Opens the file at `path`, going on after its newest intact slot.
    pub fn open(path: &Path) -> std::io::Result<SlotFile> {
        Self::resume(File::options().read(true).write(true).open(path)?)
    }

    /// Opens the file at `path`, made empty if missing, going on after its newest intact slot.
    pub fn open_or_create(path: &Path) -> std::io::Result<SlotFile> {
        let options = File::options().read(true).write(true).create(true).truncate(false).clone();
        Self::resume(options.open(path)?)
    }

    fn resume(file: File) -> std::io::Result<SlotFile> {
        let seq = newest(&file)?.map_or(0, |(seq, _)| seq);
        Ok(SlotFile { file, seq })
    }

    /// Opens the file at `path` whose newest slot is known to be `seq` (kept from the last
    /// write, so a caller need not hold the file open between writes).
    pub fn at(path: &Path, seq: u64) -> std::io::Result<SlotFile> {
        let file = File::options().write(true).open(path)?;
        Ok(SlotFile { file, seq })
    }

    /// The sequence number of the newest slot written.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Writes `body` as the newest record, over the older of the two slots.
    pub fn write(&mut self, body: &[u8]) -> std::io::Result<()> {
        if body.len() > MAX_BODY_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a {}-byte record is over a slot's {MAX_BODY_BYTES}", body.len()),
            ));
        }
        let seq = self.seq + 1;
        let mut slot = Vec::with_capacity(HEADER_BYTES + body.len());
        slot.extend_from_slice(&seq.to_le_bytes());
        slot.extend_from_slice(&(body.len() as u32).to_le_bytes());
        slot.extend_from_slice(&digest(seq, body));
        slot.extend_from_slice(body);
        self.file.write_all_at(&slot, (seq % 2) * SLOT_BYTES)?;
        self.seq = seq;
        Ok(())
    }
}

/// The newest intact record of the file at `path`; `None` if no slot is intact (a file of
/// another format, or one whose only write was cut short).
pub fn read_newest(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let file = File::open(path)?;
    Ok(newest(&file)?.map(|(_, body)| body))
}

/// The record of the file at `path`: its newest intact slot, or else the whole file, at most
/// `max_whole_bytes` of it (a record written whole: too large for a slot, or by a node from
/// before slots).
pub fn read_record(path: &Path, max_whole_bytes: u64) -> std::io::Result<Vec<u8>> {
    if let Some(body) = read_newest(path)? {
        return Ok(body);
    }
    let mut bytes = Vec::new();
    let file = File::open(path)?;
    std::io::Read::read_to_end(&mut std::io::Read::take(file, max_whole_bytes), &mut bytes)?;
    Ok(bytes)
}

fn newest(file: &File) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let mut best: Option<(u64, Vec<u8>)> = None;
    for slot in 0..2 {
        let mut buf = vec![0u8; SLOT_BYTES as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], slot * SLOT_BYTES + filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        buf.truncate(filled);
        if let Some((seq, body)) = parse(&buf) {
            if best.as_ref().is_none_or(|(newest, _)| seq > *newest) {
                best = Some((seq, body.to_vec()));
            }
        }
    }
    Ok(best)
}

fn parse(slot: &[u8]) -> Option<(u64, &[u8])> {
    let seq = u64::from_le_bytes(slot.get(0..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(slot.get(8..12)?.try_into().ok()?) as usize;
    let sum = slot.get(12..HEADER_BYTES)?;
    let body = slot.get(HEADER_BYTES..HEADER_BYTES.checked_add(len)?)?;
    (seq > 0 && sum == digest(seq, body).as_slice()).then_some((seq, body))
}

fn digest(seq: u64, body: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(seq.to_le_bytes());
    hash.update((body.len() as u32).to_le_bytes());
    hash.update(body);
    hash.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_newest_intact_slot_is_read_and_the_inode_stays() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        let mut file = SlotFile::create(&path).expect("create");
        assert_eq!(read_newest(&path).expect("read"), None, "nothing written yet");
        let ino = std::fs::metadata(&path).expect("stat").ino();
        for n in 1..=5u32 {
            file.write(format!("record {n}").as_bytes()).expect("write");
            assert_eq!(read_newest(&path).expect("read"), Some(format!("record {n}").into_bytes()));
        }
        assert_eq!(std::fs::metadata(&path).expect("stat").ino(), ino, "rewritten in place");
        // Reopened, it goes on after the newest: the next write lands over the older slot.
        let mut again = SlotFile::open(&path).expect("open");
        again.write(b"record 6").expect("write");
        assert_eq!(read_newest(&path).expect("read").as_deref(), Some(&b"record 6"[..]));
        // A write cut short (seq 6 sits in slot 0): the one before it is read.
        let f = File::options().write(true).open(&path).expect("open");
        f.write_all_at(b"garbage", HEADER_BYTES as u64).expect("tear");
        assert_eq!(read_newest(&path).expect("read").as_deref(), Some(&b"record 5"[..]));
        assert!(SlotFile::create(&path).expect("create").write(&[0; MAX_BODY_BYTES + 1]).is_err());
    }

    #[test]
    fn a_reused_file_keeps_no_earlier_record() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("spare");
        let mut old = SlotFile::create(&path).expect("create");
        for n in 0..5 {
            old.write(format!("old {n}").as_bytes()).expect("write");
        }
        let ino = std::fs::metadata(&path).expect("stat").ino();
        let mut reused = SlotFile::reuse(&path).expect("reuse");
        assert_eq!(read_newest(&path).expect("read"), None);
        reused.write(b"new").expect("write");
        assert_eq!(reused.seq(), 1);
        assert_eq!(read_newest(&path).expect("read"), Some(b"new".to_vec()));
        assert_eq!(std::fs::metadata(&path).expect("stat").ino(), ino);
    }

    #[test]
    fn a_file_of_another_format_has_no_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.json");
        std::fs::write(&path, br#"{"session_id":"s1"}"#).expect("write");
        assert_eq!(read_newest(&path).expect("read"), None);
        // Written over in place, the old bytes past the new slot do not matter.
        let mut file = SlotFile::open(&path).expect("open");
        file.write(b"new").expect("write");
        assert_eq!(read_newest(&path).expect("read").as_deref(), Some(&b"new"[..]));
    }
}
