//! Files with holes: guest memory and disks are mostly zeros or never written, and a snapshot
//! should cost only what is really there (on disk, in the page cache, and in the cgroup of the
//! VMM that writes it).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

const PAGE: usize = 4096;

/// Writes `bytes` to the (empty) file `f`, leaving all-zero pages as holes.
pub fn write_sparse(f: &File, bytes: &[u8]) -> std::io::Result<()> {
    let mut offset = 0u64;
    for page in bytes.chunks(PAGE) {
        if page.iter().any(|b| *b != 0) {
            f.write_all_at(page, offset)?;
        }
        offset += page.len() as u64;
    }
    f.set_len(bytes.len() as u64)
}

/// Copies `from` to `to` (created or truncated), only the data: holes stay holes.
pub fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut src = File::open(from)?;
    let len = src.metadata()?.len();
    let mut dst = File::create(to)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let fd = std::os::fd::AsFd::as_fd(&src);
        // The next data at or after `at`, and the hole after it; no more data ends the copy.
        let Ok(data) = nix::unistd::lseek(fd, at as i64, nix::unistd::Whence::SeekData) else {
            break;
        };
        let hole = nix::unistd::lseek(fd, data, nix::unistd::Whence::SeekHole)
            .map_err(std::io::Error::from)?;
        src.seek(SeekFrom::Start(data as u64))?;
        dst.seek(SeekFrom::Start(data as u64))?;
        let mut left = (hole - data) as u64;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = src.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            dst.write_all(&buf[..n])?;
            left -= n as u64;
        }
        at = hole as u64;
    }
    dst.set_len(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_stay_holes_and_data_is_kept() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut bytes = vec![0u8; 64 * PAGE];
        bytes[5 * PAGE + 7] = 1;
        bytes[40 * PAGE..41 * PAGE].fill(0xab);
        let path = dir.path().join("mem");
        write_sparse(&File::create(&path).expect("create"), &bytes).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), bytes);
        let used =
            |p: &Path| std::os::unix::fs::MetadataExt::blocks(&p.metadata().expect("meta")) * 512;
        assert!(used(&path) < 16 * PAGE as u64, "zero pages were written: {}", used(&path));
        let copy = dir.path().join("copy");
        copy_sparse(&path, &copy).expect("copy");
        assert_eq!(std::fs::read(&copy).expect("read"), bytes);
        assert!(used(&copy) < 16 * PAGE as u64, "the copy filled the holes: {}", used(&copy));
    }
}
