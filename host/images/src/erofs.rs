//! Just enough of the EROFS on-disk format to find, and move, the data chunks of an image that
//! `mkfs.erofs --chunksize=… --blobdev=…` wrote: the store re-lays them out so identical file
//! chunks of any layer become identical, content-addressed blobs.
//!
//! ```text
//! meta image:  [1024 B pad | superblock 128 B | … | inodes at meta_blkaddr·4096 + nid·32 …]
//! inode:       compact (32 B) or extended (64 B) | inline xattrs | chunk index[] (8 B each,
//!              aligned to 8) or inline tail data
//! chunk index: { advise u16, device_id u16, blkaddr u32 }   blkaddr in 4 KiB blocks of the
//!              blob device; 0xffffffff is a hole
//! dir block:   dirent[] { nid u64, nameoff u16, type u8, pad u8 } then the names
//! ```
//! Every offset read from the image is bounds-checked: a corrupt or hostile image yields
//! [`ErofsError`], never a panic.

use std::collections::HashSet;

pub const SUPER_OFFSET: usize = 1024;
pub const MAGIC: u32 = 0xE0F5_E1E2;
pub const BLOCK: u64 = 4096;
pub const NULL_ADDR: u32 = u32::MAX;

const LAYOUT_FLAT_PLAIN: u16 = 0;
const LAYOUT_FLAT_INLINE: u16 = 2;
const LAYOUT_CHUNK_BASED: u16 = 4;
const CHUNK_FORMAT_INDEXES: u16 = 0x20;
const CHUNK_FORMAT_BLKBITS_MASK: u16 = 0x1f;
const FT_DIR: u8 = 2;
/// Deepest directory nesting walked.
const MAX_DEPTH: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ErofsError {
    #[error("not an EROFS image (bad magic)")]
    BadMagic,
    #[error("EROFS block size 2^{0} is not supported (4 KiB only)")]
    BlockSize(u8),
    #[error("image truncated or corrupt at offset {0}")]
    OutOfBounds(u64),
    #[error("unsupported inode data layout {0}")]
    Layout(u16),
    #[error("directory tree deeper than {MAX_DEPTH}")]
    TooDeep,
}

fn u16_at(b: &[u8], off: u64) -> Result<u16, ErofsError> {
    let o = usize::try_from(off).map_err(|_| ErofsError::OutOfBounds(off))?;
    b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or(ErofsError::OutOfBounds(off))
}

fn u32_at(b: &[u8], off: u64) -> Result<u32, ErofsError> {
    let o = usize::try_from(off).map_err(|_| ErofsError::OutOfBounds(off))?;
    b.get(o..o + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(ErofsError::OutOfBounds(off))
}

fn u64_at(b: &[u8], off: u64) -> Result<u64, ErofsError> {
    let lo = u64::from(u32_at(b, off)?);
    let hi = u64::from(u32_at(b, off.checked_add(4).ok_or(ErofsError::OutOfBounds(off))?)?);
    Ok(lo | (hi << 32))
}

/// The parts of the superblock this module needs.
#[derive(Debug, Clone, Copy)]
struct Super {
    root_nid: u64,
    meta_base: u64,
}

fn superblock(meta: &[u8]) -> Result<Super, ErofsError> {
    let sb = SUPER_OFFSET as u64;
    if u32_at(meta, sb)? != MAGIC {
        return Err(ErofsError::BadMagic);
    }
    let blkszbits = *meta.get(SUPER_OFFSET + 12).ok_or(ErofsError::OutOfBounds(sb + 12))?;
    if blkszbits != 12 {
        return Err(ErofsError::BlockSize(blkszbits));
    }
    Ok(Super {
        root_nid: u64::from(u16_at(meta, sb + 14)?),
        meta_base: u64::from(u32_at(meta, sb + 40)?) * BLOCK,
    })
}

/// A decoded inode header.
#[derive(Debug, Clone, Copy)]
struct Inode {
    /// Byte offset of the inode in the image.
    at: u64,
    layout: u16,
    mode: u16,
    size: u64,
    raw: u32,
    /// Inode header plus inline xattrs.
    header_len: u64,
}

fn inode(meta: &[u8], sb: &Super, nid: u64) -> Result<Inode, ErofsError> {
    let at = nid
        .checked_mul(32)
        .and_then(|o| o.checked_add(sb.meta_base))
        .ok_or(ErofsError::OutOfBounds(nid))?;
    let format = u16_at(meta, at)?;
    let extended = format & 1 == 1;
    let layout = (format >> 1) & 0x7;
    let icount = u64::from(u16_at(meta, at + 2)?);
    let mode = u16_at(meta, at + 4)?;
    let (size, base) =
        if extended { (u64_at(meta, at + 8)?, 64) } else { (u64::from(u32_at(meta, at + 8)?), 32) };
    let raw = u32_at(meta, at + 16)?;
    let xattrs = if icount == 0 { 0 } else { 12 + (icount - 1) * 4 };
    Ok(Inode { at, layout, mode, size, raw, header_len: base + xattrs })
}

/// One data chunk of a regular file, stored on the blob device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    /// Where the chunk index entry is in the meta image (its `blkaddr` is at +4).
    pub index_at: u64,
    /// Byte offset of the chunk in the blob.
    pub blob_offset: u64,
    /// Bytes of file data in the chunk.
    pub len: u64,
}

/// Every blob-device chunk referenced by the image, in inode-walk order.
pub fn chunk_refs(meta: &[u8]) -> Result<Vec<ChunkRef>, ErofsError> {
    let sb = superblock(meta)?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(sb.root_nid, 0usize)];
    while let Some((nid, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(ErofsError::TooDeep);
        }
        if !seen.insert(nid) {
            continue;
        }
        let ino = inode(meta, &sb, nid)?;
        let is_dir = ino.mode & 0o170000 == 0o040000;
        let is_reg = ino.mode & 0o170000 == 0o100000;
        if is_dir {
            for child in dir_entries(meta, &ino)? {
                if child.name != "." && child.name != ".." {
                    stack.push((child.nid, depth + 1));
                }
            }
        } else if is_reg && ino.layout == LAYOUT_CHUNK_BASED {
            let format = (ino.raw & 0xffff) as u16;
            if format & CHUNK_FORMAT_INDEXES == 0 {
                continue; // 4-byte block addresses on the primary device: data is in the meta image.
            }
            let chunk_bits = 12 + u32::from(format & CHUNK_FORMAT_BLKBITS_MASK);
            let chunk = 1u64 << chunk_bits;
            let count = ino.size.div_ceil(chunk);
            if count > meta.len() as u64 / 8 {
                return Err(ErofsError::OutOfBounds(ino.at));
            }
            let first = (ino.at + ino.header_len).div_ceil(8) * 8;
            for i in 0..count {
                let index_at = first + i * 8;
                let blkaddr = u32_at(meta, index_at + 4)?;
                if blkaddr == NULL_ADDR {
                    continue;
                }
                let len = chunk.min(ino.size - i * chunk);
                out.push(ChunkRef { index_at, blob_offset: u64::from(blkaddr) * BLOCK, len });
            }
        }
    }
    Ok(out)
}

/// Recomputes the superblock checksum (CRC32C of the first block from the superblock on, with
/// the checksum field zeroed) after the image was edited; inodes can live in that block.
pub fn fix_checksum(meta: &mut [u8]) -> Result<(), ErofsError> {
    let compat = u32_at(meta, SUPER_OFFSET as u64 + 8)?;
    if compat & 1 == 0 {
        return Ok(());
    }
    let block = meta
        .get_mut(SUPER_OFFSET..BLOCK as usize)
        .ok_or(ErofsError::OutOfBounds(SUPER_OFFSET as u64))?;
    block[4..8].copy_from_slice(&[0; 4]);
    // The kernel seeds with ~0 and does not invert the result: the complement of standard CRC32C.
    let crc = !crc32c::crc32c(block);
    block[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Points the chunk index entry at `index_at` to block `blkaddr` of the blob.
pub fn set_blkaddr(meta: &mut [u8], index_at: u64, blkaddr: u32) -> Result<(), ErofsError> {
    let o = usize::try_from(index_at + 4).map_err(|_| ErofsError::OutOfBounds(index_at))?;
    let slot = meta.get_mut(o..o + 4).ok_or(ErofsError::OutOfBounds(index_at))?;
    slot.copy_from_slice(&blkaddr.to_le_bytes());
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Dirent {
    nid: u64,
    name: String,
    kind: u8,
}

/// The directory's data blocks, in order (full blocks from `raw`, tail inline if so laid out).
fn dir_blocks<'a>(meta: &'a [u8], ino: &Inode) -> Result<Vec<&'a [u8]>, ErofsError> {
    let mut blocks = Vec::new();
    let full = match ino.layout {
        LAYOUT_FLAT_PLAIN => ino.size.div_ceil(BLOCK),
        LAYOUT_FLAT_INLINE => ino.size / BLOCK,
        other => return Err(ErofsError::Layout(other)),
    };
    if full > meta.len() as u64 / BLOCK + 1 {
        return Err(ErofsError::OutOfBounds(ino.at));
    }
    for i in 0..full {
        let start = (u64::from(ino.raw) + i) * BLOCK;
        let len = BLOCK.min(ino.size - i * BLOCK);
        blocks.push(slice(meta, start, len)?);
    }
    let tail = ino.size % BLOCK;
    if ino.layout == LAYOUT_FLAT_INLINE && tail > 0 {
        blocks.push(slice(meta, ino.at + ino.header_len, tail)?);
    }
    Ok(blocks)
}

fn slice(b: &[u8], start: u64, len: u64) -> Result<&[u8], ErofsError> {
    let s = usize::try_from(start).map_err(|_| ErofsError::OutOfBounds(start))?;
    let e = usize::try_from(start + len).map_err(|_| ErofsError::OutOfBounds(start))?;
    b.get(s..e).ok_or(ErofsError::OutOfBounds(start))
}

fn dir_entries(meta: &[u8], ino: &Inode) -> Result<Vec<Dirent>, ErofsError> {
    let mut out = Vec::new();
    for block in dir_blocks(meta, ino)? {
        if block.len() < 12 {
            continue;
        }
        let first_nameoff = u64::from(u16_at(block, 8)?);
        if first_nameoff < 12 || first_nameoff % 12 != 0 || first_nameoff > block.len() as u64 {
            return Err(ErofsError::OutOfBounds(ino.at));
        }
        let count = first_nameoff / 12;
        for i in 0..count {
            let d = i * 12;
            let nid = u64_at(block, d)?;
            let start = u64::from(u16_at(block, d + 8)?);
            let kind = *block.get((d + 10) as usize).ok_or(ErofsError::OutOfBounds(d))?;
            let end =
                if i + 1 < count { u64::from(u16_at(block, d + 20)?) } else { block.len() as u64 };
            let raw = slice(block, start, end.saturating_sub(start))?;
            let raw = match raw.iter().position(|b| *b == 0) {
                Some(p) => &raw[..p],
                None => raw,
            };
            out.push(Dirent { nid, name: String::from_utf8_lossy(raw).into_owned(), kind });
        }
    }
    Ok(out)
}

/// Paths of every entry in the image (for inspection), with directories marked by `/`.
pub fn list_paths(meta: &[u8]) -> Result<Vec<String>, ErofsError> {
    let sb = superblock(meta)?;
    let mut out = Vec::new();
    let mut stack = vec![(sb.root_nid, String::new(), 0usize)];
    let mut seen = HashSet::new();
    while let Some((nid, path, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(ErofsError::TooDeep);
        }
        if !seen.insert(nid) {
            continue;
        }
        let ino = inode(meta, &sb, nid)?;
        for child in dir_entries(meta, &ino)? {
            if child.name == "." || child.name == ".." {
                continue;
            }
            let full = format!("{path}/{}", child.name);
            if child.kind == FT_DIR {
                out.push(format!("{full}/"));
                stack.push((child.nid, full, depth + 1));
            } else {
                out.push(full);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(chunk_refs(&[0u8; 100]), Err(ErofsError::OutOfBounds(1024)));
        let mut bogus = vec![0u8; 8192];
        bogus[1024..1028].copy_from_slice(&MAGIC.to_le_bytes());
        bogus[1024 + 12] = 12;
        bogus[1024 + 14] = 0xff;
        bogus[1024 + 15] = 0xff;
        assert!(chunk_refs(&bogus).is_err());
        for seed in 0u32..200 {
            let mut img = bogus.clone();
            for (i, b) in img.iter_mut().enumerate().skip(1024 + 16) {
                *b = ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 11) as u8;
            }
            let _ = chunk_refs(&img);
            let _ = list_paths(&img);
        }
    }
}
