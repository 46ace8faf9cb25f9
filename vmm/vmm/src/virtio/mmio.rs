//! The virtio-mmio transport (virtio 1.x, register layout of spec 4.2.2): what a driver reads
//! and writes at the device's MMIO window. Reads and writes of any offset or width are safe:
//! unknown registers read as zero and ignore writes.

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

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

    /// The transport's, its queues' and its device's state, as bytes (for snapshots):
    /// `u32 × 6 | driver features u64 | queue count u32 | per queue … | device len u32 | device`.
    pub fn save_state(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [
            self.device.device_type(),
            self.status,
            self.interrupt_status,
            self.queue_sel,
            self.device_features_sel,
            self.driver_features_sel,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.driver_features.to_le_bytes());
        out.extend_from_slice(&(self.queues.len() as u32).to_le_bytes());
        for q in &self.queues {
            let st = q.state();
            for v in [st.max_size, st.next_avail, st.next_used, st.size] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(u8::from(st.event_idx_enabled));
            out.push(u8::from(st.ready));
            for v in [st.desc_table, st.avail_ring, st.used_ring] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        // The device's own state last (absent in snapshots older than it: empty).
        let own = self.device.save_state();
        out.extend_from_slice(&u32::try_from(own.len()).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&own);
        out
    }

    /// The device type a saved state is for (to build the device before restoring).
    pub fn saved_device_type(bytes: &[u8]) -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?))
    }

    /// A transport for `device` in the saved state; `None` when the bytes are malformed or
    /// describe impossible queues.
    pub fn restore(mut device: Box<dyn VirtioDevice>, bytes: &[u8]) -> Option<MmioTransport> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let b = bytes.get(at..at.checked_add(n)?)?;
            at += n;
            Some(b)
        };
        let mut u32s = [0u32; 6];
        for v in &mut u32s {
            *v = u32::from_le_bytes(take(4)?.try_into().ok()?);
        }
        if u32s[0] != device.device_type() {
            return None;
        }
        let driver_features = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        if count != device.queue_max_sizes().len() {
            return None;
        }
        let mut queues = Vec::with_capacity(count);
        for _ in 0..count {
            let mut u16s = [0u16; 4];
            for v in &mut u16s {
                *v = u16::from_le_bytes(take(2)?.try_into().ok()?);
            }
            let flags = take(2)?;
            let mut u64s = [0u64; 3];
            for v in &mut u64s {
                *v = u64::from_le_bytes(take(8)?.try_into().ok()?);
            }
            let state = virtio_queue::QueueState {
                max_size: u16s[0],
                next_avail: u16s[1],
                next_used: u16s[2],
                size: u16s[3],
                event_idx_enabled: flags[0] != 0,
                ready: flags[1] != 0,
                desc_table: u64s[0],
                avail_ring: u64s[1],
                used_ring: u64s[2],
            };
            queues.push(Queue::try_from(state).ok()?);
        }
        // A snapshot from before devices kept their own state has nothing more.
        let own = match take(4) {
            Some(len) => take(u32::from_le_bytes(len.try_into().ok()?) as usize)?,
            None => &[],
        };
        if !device.restore_state(own) {
            return None;
        }
        let mut t = MmioTransport::new(device);
        t.queues = queues;
        t.status = u32s[1];
        t.interrupt_status = u32s[2];
        t.queue_sel = u32s[3];
        t.device_features_sel = u32s[4];
        t.driver_features_sel = u32s[5];
        t.driver_features = driver_features;
        Some(t)
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
