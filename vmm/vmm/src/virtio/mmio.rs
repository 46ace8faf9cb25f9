//! The virtio-mmio transport (virtio 1.x, register layout of spec 4.2.2): what a driver reads
//! and writes at the device's MMIO window. Reads and writes of any offset or width are safe:
//! unknown registers read as zero and ignore writes.

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::state::{self, DeviceStateError, SavedDevice, SavedTransport};
use super::{DeviceError, VirtioDevice};

/// Size of one device's MMIO window.
pub const WINDOW: u64 = 0x1000;
const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
const VENDOR: u32 = 0x4252_4947; // "BRIG"
const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// Device status bit: the device hit an error and needs a reset.
const STATUS_NEEDS_RESET: u32 = 0x40;
/// Device status bit: the driver is set up and running.
const DRIVER_OK: u32 = 4;

/// The device window holding `addr` among `count` windows from `base`, and the offset in it.
pub fn window_of(base: u64, addr: u64, count: usize) -> Option<(usize, u64)> {
    let rel = addr.checked_sub(base)?;
    let index = usize::try_from(rel / WINDOW).ok()?;
    (index < count).then_some((index, rel % WINDOW))
}

pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    queues: Vec<Queue>,
    queue_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    status: u32,
    interrupt_status: u32,
    /// Bumped on every configuration change the device announces.
    config_generation: u32,
    /// Queue notifications that used buffers.
    pub served: u64,
    /// Errors met while serving queues (the count, and the last one), for the VMM's log.
    pub errors: u64,
    pub last_error: Option<String>,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.device.device_type())
            .field("status", &self.status)
            .finish()
    }
}

impl MmioTransport {
    pub fn new(device: Box<dyn VirtioDevice>) -> MmioTransport {
        let queues =
            device.queue_max_sizes().iter().filter_map(|max| Queue::new(*max).ok()).collect();
        MmioTransport {
            device,
            queues,
            queue_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            interrupt_status: 0,
            config_generation: 0,
            served: 0,
            errors: 0,
            last_error: None,
        }
    }

    /// The transport's, its queues' and its device's state, as bytes for a snapshot (the
    /// current version of [`super::state`]).
    pub fn save_state(&self) -> Vec<u8> {
        let transport = SavedTransport {
            device_type: self.device.device_type(),
            status: self.status,
            interrupt_status: self.interrupt_status,
            queue_sel: self.queue_sel,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queues: self.queues.iter().map(|q| q.state().into()).collect(),
        };
        state::encode(&SavedDevice { transport, device: self.device.save_state() })
    }

    /// A transport for `device` in the state `bytes` hold (this version's or the one
    /// before).
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        bytes: &[u8],
    ) -> Result<MmioTransport, DeviceStateError> {
        Self::restore_saved(device, state::decode(bytes)?)
    }

    /// A transport for `device` in a decoded state; refused when the state is of another
    /// device type or describes impossible queues.
    pub fn restore_saved(
        mut device: Box<dyn VirtioDevice>,
        saved: SavedDevice,
    ) -> Result<MmioTransport, DeviceStateError> {
        let t = saved.transport;
        if t.device_type != device.device_type() {
            return Err(DeviceStateError::DeviceType {
                saved: t.device_type,
                built: device.device_type(),
            });
        }
        let expected = device.queue_max_sizes().len();
        if t.queues.len() != expected {
            return Err(DeviceStateError::Queues { saved: t.queues.len(), device: expected });
        }
        let queues = t
            .queues
            .iter()
            .map(|q| {
                Queue::try_from(virtio_queue::QueueState::from(*q))
                    .map_err(|e| DeviceStateError::Queue(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        device.restore_state(saved.device)?;
        let mut transport = MmioTransport::new(device);
        transport.queues = queues;
        transport.status = t.status;
        transport.interrupt_status = t.interrupt_status;
        transport.queue_sel = t.queue_sel;
        transport.device_features_sel = t.device_features_sel;
        transport.driver_features_sel = t.driver_features_sel;
        transport.driver_features = t.driver_features;
        Ok(transport)
    }

    pub fn device_type(&self) -> u32 {
        self.device.device_type()
    }

    fn features(&self) -> u64 {
        self.device.features() | VIRTIO_F_VERSION_1
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// The driver reads `data.len()` bytes at `offset` in the window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let value: u32 = match offset {
            0x000 => MAGIC,
            0x004 => VERSION,
            0x008 => self.device.device_type(),
            0x00c => VENDOR,
            0x010 => match self.device_features_sel {
                0 => self.features() as u32,
                1 => (self.features() >> 32) as u32,
                _ => 0,
            },
            0x034 => {
                self.queues.get(self.queue_sel as usize).map_or(0, |q| u32::from(q.max_size()))
            }
            0x044 => self.queues.get(self.queue_sel as usize).map_or(0, |q| u32::from(q.ready())),
            0x060 => self.interrupt_status,
            0x070 => self.status,
            0x0fc => self.config_generation,
            0x100.. => {
                self.device.read_config(offset - 0x100, data);
                return;
            }
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(i).copied().unwrap_or(0);
        }
    }

    /// The driver writes `data` at `offset`; a queue notification serves that queue. Returns
    /// whether the driver should be interrupted.
    pub fn write(&mut self, offset: u64, data: &[u8], mem: &GuestMemoryMmap) -> bool {
        let mut bytes = [0u8; 4];
        for (dst, src) in bytes.iter_mut().zip(data) {
            *dst = *src;
        }
        let v = u32::from_le_bytes(bytes);
        match offset {
            0x014 => self.device_features_sel = v,
            0x020 => {
                let shift = if self.driver_features_sel == 0 { 0 } else { 32 };
                if self.driver_features_sel <= 1 {
                    let mask = 0xffff_ffffu64 << shift;
                    let offered = self.features();
                    self.driver_features =
                        (self.driver_features & !mask) | ((u64::from(v) << shift) & offered);
                }
            }
            0x024 => self.driver_features_sel = v,
            0x030 => self.queue_sel = v,
            0x038 => {
                if let Some(q) = self.selected() {
                    q.set_size(v as u16);
                }
            }
            0x044 => {
                if let Some(q) = self.selected() {
                    q.set_ready(v == 1);
                }
            }
            0x050 => return self.notify(v as usize, mem),
            0x064 => self.interrupt_status &= !v,
            0x100.. => self.device.write_config(offset - 0x100, data),
            0x070 => {
                self.status = v;
                if v == 0 {
                    self.reset();
                }
            }
            0x080 | 0x084 | 0x090 | 0x094 | 0x0a0 | 0x0a4 => {
                if let Some(q) = self.selected() {
                    match offset {
                        0x080 => q.set_desc_table_address(Some(v), None),
                        0x084 => q.set_desc_table_address(None, Some(v)),
                        0x090 => q.set_avail_ring_address(Some(v), None),
                        0x094 => q.set_avail_ring_address(None, Some(v)),
                        0x0a0 => q.set_used_ring_address(Some(v), None),
                        _ => q.set_used_ring_address(None, Some(v)),
                    }
                }
            }
            _ => {}
        }
        false
    }

    /// The device's configuration changed (e.g. a new balloon target): the driver must re-read
    /// it. Returns whether to interrupt the driver (only once it is running).
    pub fn config_changed(&mut self) -> bool {
        self.config_generation = self.config_generation.wrapping_add(1);
        if self.status & DRIVER_OK == 0 {
            return false;
        }
        self.interrupt_status |= 2;
        true
    }

    fn reset(&mut self) {
        for q in &mut self.queues {
            q.reset();
        }
        self.driver_features = 0;
        self.interrupt_status = 0;
        self.queue_sel = 0;
    }

    fn notify(&mut self, index: usize, mem: &GuestMemoryMmap) -> bool {
        let Some(queue) = self.queues.get(index) else { return false };
        if !queue.is_valid(mem) {
            return false;
        }
        let result = self.device.process_queue(index, &mut self.queues, mem);
        self.settle(result)
    }

    /// Lets the device deliver what its backend has (from the backend's thread); `true` when
    /// the driver should be interrupted. Nothing happens before the driver is ready.
    pub fn poll(&mut self, mem: &GuestMemoryMmap) -> bool {
        if self.status & DRIVER_OK == 0 || !self.queues.iter().all(|q| q.is_valid(mem)) {
            return false;
        }
        let result = self.device.poll(&mut self.queues, mem);
        self.settle(result)
    }

    fn settle(&mut self, result: Result<bool, DeviceError>) -> bool {
        match result {
            Ok(true) => {
                self.interrupt_status |= 1;
                self.served += 1;
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.errors += 1;
                self.last_error = Some(e.to_string());
                if matches!(e, DeviceError::Queue(_)) {
                    // A queue the guest corrupted: mark the device broken (the driver must
                    // reset it), as the spec's DEVICE_NEEDS_RESET would.
                    self.status |= STATUS_NEEDS_RESET;
                }
                false
            }
        }
    }
}
