//! virtio-blk over a host file or block device: read-only layer images, writable disks, and
//! copy-on-write disks over a shared base image (see [`super::cow`]). Every request is
//! checked against the disk's size and the guest's descriptors; a bad request gets an error
//! status, never a host-side read or write out of bounds.

use std::path::Path;

use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::cow::{DiskSpec, Storage};
use super::{serve_chains, DeviceError, VirtioDevice};

const SECTOR: u64 = 512;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;
const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;
const QUEUE_SIZES: [u16; 1] = [256];
/// Largest single request (bytes of data).
const MAX_REQUEST: u64 = 4 << 20;

#[derive(Debug)]
pub struct Block {
    storage: Storage,
    size: u64,
    read_only: bool,
    id: [u8; 20],
}

impl Block {
    /// A disk backed by `path`; `read_only` opens it for reading and tells the guest so.
    pub fn open(path: &Path, read_only: bool, id: &str) -> std::io::Result<Block> {
        Block::from_spec(&DiskSpec { path: path.into(), read_only, overlay: None }, id)
    }

    /// The disk `spec` describes, with `id` as its serial.
    pub fn from_spec(spec: &DiskSpec, id: &str) -> std::io::Result<Block> {
        let storage = super::cow::open(spec)?;
        let size = storage.size() / SECTOR * SECTOR;
        let mut serial = [0u8; 20];
        for (d, s) in serial.iter_mut().zip(id.bytes()) {
            *d = s;
        }
        Ok(Block { storage, size, read_only: spec.read_only, id: serial })
    }

    /// Serves one request; returns the status and the bytes written into guest memory.
    fn serve(
        &mut self,
        kind: u32,
        sector: u64,
        data: &[(GuestAddress, u32, bool)],
        mem: &GuestMemoryMmap,
    ) -> (u8, u32) {
        let total: u64 = data.iter().map(|(_, len, _)| u64::from(*len)).sum();
        let Some(start) = sector.checked_mul(SECTOR) else { return (S_IOERR, 0) };
        match kind {
            T_IN | T_OUT => {
                if total > MAX_REQUEST || start.checked_add(total).is_none_or(|end| end > self.size)
                {
                    return (S_IOERR, 0);
                }
                if kind == T_OUT && self.read_only {
                    return (S_IOERR, 0);
                }
                let mut offset = start;
                let mut written = 0u32;
                for (addr, len, device_writes) in data {
                    let mut buf = vec![0u8; *len as usize];
                    let ok = if kind == T_IN {
                        *device_writes
                            && self.storage.read_at(&mut buf, offset).is_ok()
                            && mem.write_slice(&buf, *addr).is_ok()
                    } else {
                        !*device_writes
                            && mem.read_slice(&mut buf, *addr).is_ok()
                            && self.storage.write_at(&buf, offset).is_ok()
                    };
                    if !ok {
                        return (S_IOERR, written);
                    }
                    if kind == T_IN {
                        written += len;
                    }
                    offset += u64::from(*len);
                }
                (S_OK, written)
            }
            T_FLUSH => match self.read_only || self.storage.sync().is_ok() {
                true => (S_OK, 0),
                false => (S_IOERR, 0),
            },
            T_GET_ID => match data.first() {
                Some((addr, len, true)) => {
                    let n = (*len as usize).min(self.id.len());
                    match mem.write_slice(&self.id[..n], *addr) {
                        Ok(()) => (S_OK, n as u32),
                        Err(_) => (S_IOERR, 0),
                    }
                }
                _ => (S_IOERR, 0),
            },
            _ => (S_UNSUPP, 0),
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        2
    }

    fn features(&self) -> u64 {
        F_FLUSH | if self.read_only { F_RO } else { 0 }
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&(self.size / SECTOR).to_le_bytes(), offset, data);
    }

    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        serve_chains(queues, index, mem, |chain| {
            let descs: Vec<(GuestAddress, u32, bool)> =
                chain.map(|d| (d.addr(), d.len(), d.is_write_only())).collect();
            let written = match (descs.first(), descs.last()) {
                (Some(&(hdr, hdr_len, false)), Some(&(status, status_len, true)))
                    if descs.len() >= 2 && hdr_len >= 16 && status_len >= 1 =>
                {
                    let mut header = [0u8; 16];
                    let (code, n) = match mem.read_slice(&mut header, hdr) {
                        Ok(()) => {
                            let kind =
                                u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
                            let sector =
                                u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]));
                            self.serve(kind, sector, &descs[1..descs.len() - 1], mem)
                        }
                        Err(_) => (S_IOERR, 0),
                    };
                    let _ = mem.write_obj(code, status);
                    n + 1
                }
                // Not a well-formed request: give the chain back unused.
                _ => 0,
            };
            Ok(written)
        })
    }
}
