//! virtio over MMIO: the transport's register file ([`mmio`]) and devices behind it
//! ([`rng`]). Queues are split virtqueues from the `virtio-queue` crate over `vm-memory`, which
//! bounds-check every descriptor a guest hands us: a malicious guest can only hurt itself.

pub mod mmio;
pub mod rng;

use virtio_queue::Queue;
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
    /// Serves the available buffers of queue `index`; `true` when any was used (the driver
    /// should be interrupted).
    fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError>;
}
