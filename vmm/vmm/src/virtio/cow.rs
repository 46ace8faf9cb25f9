//! Disks behind virtio-blk: a plain file (or block device), or a copy-on-write disk that reads
//! a shared, read-only base image and keeps the VM's writes in a sparse overlay file of the
//! same size. A block of the overlay that holds data replaces the base's; a hole means "as in
//! the base". So many VMs boot one OS image without copying it, a VM's own changes cost only
//! the blocks it wrote, and a snapshot or fork copies the overlay alone (hole by hole, see
//! [`crate::sparse`]).
//!
//! ```text
//! base     ████████████████████████   shared, opened read-only
//! overlay  ··██····█████···········   sparse; 4 KiB blocks with data win
//! ```
//! Which blocks the overlay holds is read from its holes (`SEEK_DATA`/`SEEK_HOLE`) when it is
//! opened, then kept in memory; a write smaller than a block fills the rest from the base
//! first, so a block is always whole in one place.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The copy-on-write granularity.
pub const BLOCK: u64 = 4096;

pub use brig_vmm_api::launch::DiskSpec;

/// Opens the disk `spec` names.
pub fn open(spec: &DiskSpec) -> std::io::Result<Storage> {
    match &spec.overlay {
        Some(overlay) => Ok(Storage::Cow(CowDisk::open(&spec.path, overlay)?)),
        None => {
            let mut file =
                std::fs::OpenOptions::new().read(true).write(!spec.read_only).open(&spec.path)?;
            // A block device's metadata says 0 bytes; its end says how big it is.
            let size = file.seek(SeekFrom::End(0))?;
            Ok(Storage::Plain { file, size })
        }
    }
}

/// Where a disk's bytes are.
#[derive(Debug)]
pub enum Storage {
    Plain { file: File, size: u64 },
    Cow(CowDisk),
}

impl Storage {
    pub fn size(&self) -> u64 {
        match self {
            Storage::Plain { size, .. } => *size,
            Storage::Cow(c) => c.size,
        }
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Storage::Plain { file, .. } => file.read_exact_at(buf, offset),
            Storage::Cow(c) => c.read_at(buf, offset),
        }
    }

    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        match self {
            Storage::Plain { file, .. } => file.write_all_at(buf, offset),
            Storage::Cow(c) => c.write_at(buf, offset),
        }
    }

    pub fn sync(&self) -> std::io::Result<()> {
        match self {
            Storage::Plain { file, .. } => file.sync_data(),
            Storage::Cow(c) => c.overlay.sync_data(),
        }
    }
}

/// A read-only base with a sparse overlay taking the writes.
#[derive(Debug)]
pub struct CowDisk {
    base: File,
    overlay: File,
    size: u64,
    /// One bit per [`BLOCK`]: set when the overlay holds that block.
    present: Vec<u64>,
}

impl CowDisk {
    /// Opens `base` read-only and `overlay` (created, sized like the base, when missing).
    pub fn open(base: &Path, overlay: &Path) -> std::io::Result<CowDisk> {
        let mut base_file = File::open(base)?;
        let size = base_file.seek(SeekFrom::End(0))?;
        let overlay_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(overlay)?;
        let len = overlay_file.metadata()?.len();
        if len == 0 {
            overlay_file.set_len(size)?;
            // A file system that does not report holes would make the whole overlay look
            // written, hiding the base: refuse it rather than serve zeros.
            if size > 0 && data_at_or_after(&overlay_file, 0)?.is_some() {
                return Err(std::io::Error::other(format!(
                    "{}: its file system does not report holes (needed for a copy-on-write overlay)",
                    overlay.display()
                )));
            }
        } else if len != size {
            return Err(std::io::Error::other(format!(
                "overlay {} has {len} bytes, its base {} has {size}",
                overlay.display(),
                base.display()
            )));
        }
        let blocks = size.div_ceil(BLOCK);
        let mut disk = CowDisk {
            base: base_file,
            overlay: overlay_file,
            size,
            present: vec![0; blocks.div_ceil(64) as usize],
        };
        let mut at = 0;
        while let Some(data) = data_at_or_after(&disk.overlay, at)? {
            let hole = nix::unistd::lseek(
                disk.overlay.as_fd(),
                data as i64,
                nix::unistd::Whence::SeekHole,
            )
            .map_err(std::io::Error::from)? as u64;
            for block in data / BLOCK..hole.div_ceil(BLOCK).min(blocks) {
                disk.mark(block);
            }
            at = hole;
        }
        Ok(disk)
    }

    fn is_present(&self, block: u64) -> bool {
        self.present.get((block / 64) as usize).is_some_and(|w| w & (1 << (block % 64)) != 0)
    }

    fn mark(&mut self, block: u64) {
        if let Some(w) = self.present.get_mut((block / 64) as usize) {
            *w |= 1 << (block % 64);
        }
    }

    /// Blocks the overlay holds.
    pub fn blocks_written(&self) -> u64 {
        self.present.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    fn check(&self, len: usize, offset: u64) -> std::io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "past the disk's end")),
        }
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.check(buf.len(), offset)?;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let block = at / BLOCK;
            let from_overlay = self.is_present(block);
            // Extend over the following blocks from the same source: one read per run.
            let mut end = (block + 1) * BLOCK;
            while end < offset + buf.len() as u64 && self.is_present(end / BLOCK) == from_overlay {
                end += BLOCK;
            }
            let n = ((end - at) as usize).min(buf.len() - done);
            let source = if from_overlay { &self.overlay } else { &self.base };
            source.read_exact_at(&mut buf[done..done + n], at)?;
            done += n;
        }
        Ok(())
    }

    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.check(buf.len(), offset)?;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let block = at / BLOCK;
            let start = block * BLOCK;
            let n = (((block + 1) * BLOCK - at) as usize).min(buf.len() - done);
            if n as u64 != BLOCK && !self.is_present(block) {
                // Part of a block the overlay lacks: the rest comes from the base first.
                let len = BLOCK.min(self.size - start) as usize;
                let mut whole = vec![0u8; len];
                self.base.read_exact_at(&mut whole, start)?;
                let inner = (at - start) as usize;
                whole[inner..inner + n].copy_from_slice(&buf[done..done + n]);
                self.overlay.write_all_at(&whole, start)?;
            } else {
                self.overlay.write_all_at(&buf[done..done + n], at)?;
            }
            self.mark(block);
            done += n;
        }
        Ok(())
    }
}

/// The offset of the first data at or after `at` in `file`, or None when only holes follow.
fn data_at_or_after(file: &File, at: u64) -> std::io::Result<Option<u64>> {
    match nix::unistd::lseek(file.as_fd(), at as i64, nix::unistd::Whence::SeekData) {
        Ok(data) => Ok(Some(data as u64)),
        Err(nix::errno::Errno::ENXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_in_the_overlay_and_reads_merge_both() {
        let dir = tempfile::tempdir().expect("tmp");
        let base_path = dir.path().join("base");
        let base: Vec<u8> = (0..5 * BLOCK as usize + 100).map(|i| (i % 251) as u8).collect();
        std::fs::write(&base_path, &base).expect("base");
        let overlay_path = dir.path().join("overlay");
        let mut disk = CowDisk::open(&base_path, &overlay_path).expect("open");
        let mut expected = base.clone();
        // A sector in the middle of block 1, a whole block 3, and the short last block.
        for (at, len, byte) in [
            (BLOCK + 512, 512usize, 0xaa),
            (3 * BLOCK, BLOCK as usize, 0xbb),
            (5 * BLOCK + 10, 20, 0xcc),
        ] {
            disk.write_at(&vec![byte; len], at).expect("write");
            expected[at as usize..at as usize + len].fill(byte);
        }
        assert_eq!(disk.blocks_written(), 3);
        let mut all = vec![0u8; base.len()];
        disk.read_at(&mut all, 0).expect("read");
        assert_eq!(all, expected);
        // The base is untouched; the overlay holds only the written blocks.
        assert_eq!(std::fs::read(&base_path).expect("base"), base);
        // Reopened (a restore or a fork's copy), the overlay's blocks are found from its holes.
        drop(disk);
        let copy = dir.path().join("copy");
        crate::sparse::copy_sparse(&overlay_path, &copy).expect("copy");
        let again = CowDisk::open(&base_path, &copy).expect("reopen");
        assert_eq!(again.blocks_written(), 3);
        let mut all = vec![0u8; base.len()];
        again.read_at(&mut all, 0).expect("read");
        assert_eq!(all, expected);
        // Out of bounds is an error, not a short read.
        assert!(again.read_at(&mut [0u8; 16], base.len() as u64 - 8).is_err());
    }
}
