//! Re-laying out an EROFS blob into store chunks.
//!
//! `mkfs.erofs --blobdev` packs file chunks back to back at 4 KiB granularity, so the same
//! file lands at different offsets in different layers. The store instead gives every large
//! file chunk a slot of its own at a [`SLOT_BYTES`]-aligned address, so identical chunks of any
//! two layers are identical blobs (deduplicated by digest), and packs small chunks together so
//! a tree of small files is not one backend object per file:
//!
//! ```text
//! virtual blob of a layer:  | slot 0            | slot 1            | slot 2 …
//!                           | big chunk (own)   | small a|b|c (packed, 4 KiB aligned) |
//! store:                    chunks/<sha256(slot bytes)>   (only the bytes used, no padding)
//! ```
//! The meta image's chunk indexes are rewritten to the new addresses; a lazily served file of
//! `slots × SLOT_BYTES` bytes (zeros past each slot's data) is then the image's blob device.

use std::collections::HashMap;

use crate::erofs::{self, ErofsError, BLOCK};

/// Size of a store chunk (DSec and OverlayBD use 256 KiB).
pub const SLOT_BYTES: u64 = 256 << 10;
/// Chunks at least this large get a slot of their own (and deduplicate across layers).
pub const OWN_SLOT_MIN: u64 = 64 << 10;

/// A piece of the original blob placed in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub blob_offset: u64,
    pub len: u64,
    /// Offset inside the slot.
    pub at: u64,
}

/// One store chunk: what goes in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotPlan {
    pub pieces: Vec<Piece>,
    /// Bytes of data in the slot (the stored chunk's length).
    pub len: u64,
}

/// Plans slots for every chunk of `meta` and rewrites its chunk indexes to match.
pub fn plan(meta: &mut [u8]) -> Result<Vec<SlotPlan>, ErofsError> {
    let refs = erofs::chunk_refs(meta)?;
    let blocks_per_slot = SLOT_BYTES / BLOCK;
    let mut slots: Vec<SlotPlan> = Vec::new();
    let mut placed: HashMap<u64, u32> = HashMap::new();
    let mut pack: Option<usize> = None;
    for r in refs {
        if let Some(addr) = placed.get(&r.blob_offset) {
            erofs::set_blkaddr(meta, r.index_at, *addr)?;
            continue;
        }
        let aligned = r.len.div_ceil(BLOCK) * BLOCK;
        let (slot, at) = if r.len >= OWN_SLOT_MIN {
            slots.push(SlotPlan::default());
            (slots.len() - 1, 0)
        } else {
            match pack {
                Some(p) if slots[p].len.div_ceil(BLOCK) * BLOCK + aligned <= SLOT_BYTES => {
                    (p, slots[p].len.div_ceil(BLOCK) * BLOCK)
                }
                _ => {
                    slots.push(SlotPlan::default());
                    pack = Some(slots.len() - 1);
                    (slots.len() - 1, 0)
                }
            }
        };
        slots[slot].pieces.push(Piece { blob_offset: r.blob_offset, len: r.len, at });
        slots[slot].len = at + r.len;
        let addr = u32::try_from(slot as u64 * blocks_per_slot + at / BLOCK)
            .map_err(|_| ErofsError::OutOfBounds(r.index_at))?;
        placed.insert(r.blob_offset, addr);
        erofs::set_blkaddr(meta, r.index_at, addr)?;
    }
    erofs::fix_checksum(meta)?;
    Ok(slots)
}

/// Assembles a slot's bytes from the original blob.
pub fn assemble(slot: &SlotPlan, blob: &std::fs::File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; slot.len as usize];
    for piece in &slot.pieces {
        let dst = &mut bytes[piece.at as usize..(piece.at + piece.len) as usize];
        blob.read_exact_at(dst, piece.blob_offset)?;
    }
    Ok(bytes)
}
