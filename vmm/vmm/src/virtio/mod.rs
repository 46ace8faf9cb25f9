//! virtio over MMIO: the transport's register file ([`mmio`]) and devices behind it
//! ([`rng`], [`blk`], [`vsock`], [`balloon`], [`net`]). Queues are split virtqueues from the `virtio-queue` crate over `vm-memory`, which
//! bounds-check every descriptor a guest hands us: a malicious guest can only hurt itself.

pub mod balloon;
pub mod blk;
pub mod cow;
pub mod mmio;
pub mod net;
pub mod rng;
pub mod state;
pub mod vsock;

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;

/// Errors a device hits while serving a queue; the device stops serving that request, the VM
/// goes on.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("virtio queue: {0}")]
    Queue(#[from] virtio_queue::Error),
    #[error("guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("entropy source: {0}")]
    Entropy(#[source] std::io::Error),
}

/// A virtio device behind an MMIO transport.
pub trait VirtioDevice: Send {
    /// Device type (virtio spec 5): 4 for entropy.
    fn device_type(&self) -> u32;
    /// Feature bits offered (VIRTIO_F_VERSION_1 is added by the transport).
    fn features(&self) -> u64 {
        0
    }
    /// Largest size of each queue.
    fn queue_max_sizes(&self) -> &[u16];
    /// Serves the driver's notification of queue `index` (the device may use any of its
    /// queues in answer); `true` when any buffer was used (the driver should be interrupted).
    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError>;

    /// Delivers what the device's backend has for the driver (called from the backend's own
    /// thread when it has news); `true` when any buffer was used.
    fn poll(&mut self, _queues: &mut [Queue], _mem: &GuestMemoryMmap) -> Result<bool, DeviceError> {
        Ok(false)
    }

    /// Reads the device-specific configuration space (offset from its start).
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    /// The driver writes the device-specific configuration space (ignored unless the device
    /// has writable fields).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    /// The device's own state beyond its transport and queues, for a snapshot
    /// ([`state::DeviceState::Stateless`] for a device that keeps none between requests).
    fn save_state(&self) -> state::DeviceState {
        state::DeviceState::Stateless
    }

    /// Takes back what [`VirtioDevice::save_state`] gave, on a device just built for a
    /// restored VM, before the guest runs again; a state of another device, or past the
    /// device's bounds, is refused. Host resources (sockets, taps) are new: a device tells the
    /// driver what it lost here.
    fn restore_state(&mut self, state: state::DeviceState) -> Result<(), state::DeviceStateError> {
        state.expect_stateless()
    }
}

/// The host side of a device with outside input (vsock's Unix sockets, net's tap), run on a
/// thread of its own: `wait` sleeps until there may be input (at most `limit`), `step` takes
/// it and says whether the guest has something waiting (then the transport delivers it).
pub trait Backend: Send {
    fn wait(&self, limit: std::time::Duration);
    fn step(&self) -> bool;
}

/// Writes `bytes` into the device-writable descriptors of `chain`, in order, as far as they
/// reach; returns how many bytes went in (a descriptor outside guest memory ends the write).
pub(crate) fn write_chain(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    bytes: &[u8],
) -> usize {
    use vm_memory::Bytes;
    let mut written = 0usize;
    for desc in chain.filter(|d| d.is_write_only()) {
        if written == bytes.len() {
            break;
        }
        let n = (desc.len() as usize).min(bytes.len() - written);
        if mem.write_slice(&bytes[written..written + n], desc.addr()).is_err() {
            break;
        }
        written += n;
    }
    written
}

/// Answers a read of a device's configuration space laid out as `config`: bytes past its end
/// read as zero.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| config.get(o.checked_add(i)?))
            .copied()
            .unwrap_or(0);
    }
}

/// Serves every chain the driver made available on `queues[index]`: `serve` handles one chain
/// and says how many bytes it wrote into it; the chain then goes back to the driver. Returns
/// whether any chain was used (the driver should be interrupted).
pub(crate) fn serve_chains<'m>(
    queues: &mut [Queue],
    index: usize,
    mem: &'m GuestMemoryMmap,
    mut serve: impl FnMut(DescriptorChain<&'m GuestMemoryMmap>) -> Result<u32, DeviceError>,
) -> Result<bool, DeviceError> {
    let Some(queue) = queues.get_mut(index) else { return Ok(false) };
    let mut used = false;
    while let Some(chain) = queue.iter(mem)?.next() {
        let head = chain.head_index();
        let written = serve(chain)?;
        queue.add_used(mem, head, written)?;
        used = true;
    }
    Ok(used)
}
