//! virtio-rng: fills the driver's write-only buffers with bytes from the host's getrandom(2).
//! A request is capped at [`MAX_BYTES_PER_REQUEST`], so a guest cannot make us produce
//! unbounded output.

use std::io::Read;

use virtio_queue::Queue;
use vm_memory::{Bytes, GuestMemoryMmap};

use super::{serve_chains, DeviceError, VirtioDevice};

pub const MAX_BYTES_PER_REQUEST: usize = 64 << 10;
const QUEUE_SIZES: [u16; 1] = [256];

#[derive(Debug, Default)]
pub struct Rng {
    /// Bytes handed to the guest so far.
    pub served: u64,
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        4
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut random = std::fs::File::open("/dev/urandom").map_err(DeviceError::Entropy)?;
        let mut buf = vec![0u8; MAX_BYTES_PER_REQUEST];
        let served = &mut self.served;
        serve_chains(queues, index, mem, |chain| {
            let mut written = 0usize;
            for desc in chain {
                if !desc.is_write_only() || written >= MAX_BYTES_PER_REQUEST {
                    continue;
                }
                let len = (desc.len() as usize).min(MAX_BYTES_PER_REQUEST - written);
                random.read_exact(&mut buf[..len]).map_err(DeviceError::Entropy)?;
                // A descriptor pointing outside guest memory fails here; the chain is returned
                // with what was written so far.
                if mem.write_slice(&buf[..len], desc.addr()).is_err() {
                    break;
                }
                written += len;
            }
            *served += written as u64;
            Ok(written as u32)
        })
    }
}
