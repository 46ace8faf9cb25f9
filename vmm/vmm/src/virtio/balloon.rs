//! virtio-balloon (device type 5) with free-page reporting: how the host gets memory back from
//! a guest.
//!
//! - **Free-page reporting** (`VIRTIO_BALLOON_F_REPORTING`): the guest's page allocator hands
//!   the device blocks it has kept free for a while (Linux reports blocks of 2 MiB and up, two
//!   seconds after they were freed); the device discards their host pages, so memory a guest
//!   used once and freed stops costing the host anything. No host action is needed.
//! - **Inflation**: the host sets a target (pages the guest should give up, in the config
//!   space); the guest's driver allocates that many pages and hands their frame numbers over
//!   the inflate queue; the device discards them. Deflating returns them to the guest, which
//!   simply touches them again (no `MUST_TELL_HOST`). `DEFLATE_ON_OOM` lets a guest under
//!   memory pressure take pages back rather than kill its processes.
//!
//! Discarding is `madvise(MADV_DONTNEED)` on the host mapping: anonymous memory reads back as
//! zeros, a snapshot's copy-on-write mapping reads back as the snapshot file's (shared) pages.
//! A guest may report or inflate anything it likes, but only inside its own memory: every range
//! is bounds-checked against guest memory and clipped to whole host pages.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

use super::state::{DeviceState, DeviceStateError};
use super::{serve_chains, DeviceError, VirtioDevice};

/// A balloon's own saved state: the target and what the guest holds (`num_pages`, `actual`),
/// so a restored guest keeps its balloon as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BalloonState {
    pub target_pages: u32,
    pub actual_pages: u32,
}

impl BalloonState {
    /// The version 1 bytes (`target u32 | actual u32`).
    pub(crate) fn from_v1(bytes: &[u8]) -> Option<BalloonState> {
        let word = |b: &[u8]| Some(u32::from_le_bytes(b.try_into().ok()?));
        (bytes.len() == 8).then_some(())?;
        Some(BalloonState { target_pages: word(&bytes[..4])?, actual_pages: word(&bytes[4..])? })
    }
}

pub const DEVICE_TYPE: u32 = 5;
const F_DEFLATE_ON_OOM: u64 = 1 << 2;
const F_REPORTING: u64 = 1 << 5;
/// Queues in the order the Linux driver numbers them when only `REPORTING` is negotiated
/// (absent features' queues are skipped): inflate, deflate, reporting.
const INFLATE: usize = 0;
const DEFLATE: usize = 1;
const REPORTING: usize = 2;
const QUEUE_SIZES: [u16; 3] = [256, 256, 32];
/// The balloon's page size (virtio spec 5.5.6: frame numbers are in 4 KiB units).
const PFN_SHIFT: u32 = 12;
const PAGE: u64 = 1 << PFN_SHIFT;
/// Frame numbers taken from one descriptor at most (Linux sends up to 256).
const MAX_PFNS_PER_DESCRIPTOR: u32 = 4096;

/// What the host and the device share: the target the host sets, what the guest says it gave,
/// and counters. Cheap to clone; the VMM's control thread holds one.
#[derive(Debug, Default)]
pub struct BalloonShared {
    /// Pages the host asks the guest to give up (config `num_pages`).
    target_pages: AtomicU32,
    /// Pages the guest says it holds in the balloon (config `actual`).
    actual_pages: AtomicU32,
    /// Bytes discarded on the guest's free-page reports, and how many reports.
    pub reported_bytes: AtomicU64,
    pub reports: AtomicU64,
    /// Bytes discarded on inflation.
    pub inflated_bytes: AtomicU64,
    /// Bytes the guest took back on deflation.
    pub deflated_bytes: AtomicU64,
}

impl BalloonShared {
    /// Sets the balloon's target size; the caller then signals a configuration change.
    pub fn set_target_mib(&self, mib: u64) {
        let pages = (mib << 20) >> PFN_SHIFT;
        self.target_pages.store(u32::try_from(pages).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    pub fn target_mib(&self) -> u64 {
        (u64::from(self.target_pages.load(Ordering::Relaxed)) << PFN_SHIFT) >> 20
    }

    /// What the guest says the balloon holds.
    pub fn actual_mib(&self) -> u64 {
        (u64::from(self.actual_pages.load(Ordering::Relaxed)) << PFN_SHIFT) >> 20
    }
}

#[derive(Debug, Default)]
pub struct Balloon {
    shared: Arc<BalloonShared>,
}

impl Balloon {
    /// A balloon with an empty target, and the handle the host keeps to steer it.
    pub fn new() -> (Balloon, Arc<BalloonShared>) {
        let shared = Arc::new(BalloonShared::default());
        (Balloon { shared: shared.clone() }, shared)
    }

    /// A balloon steered through an existing handle (a restored VM's).
    pub fn with_shared(shared: Arc<BalloonShared>) -> Balloon {
        Balloon { shared }
    }
}

/// Discards the host pages behind guest range `[addr, addr+len)`: whole host pages inside the
/// range only. Returns the bytes discarded; a range outside guest memory discards nothing.
pub fn discard(mem: &GuestMemoryMmap, addr: u64, len: u64) -> u64 {
    let start = addr.div_ceil(PAGE) * PAGE;
    let Some(end) = addr.checked_add(len).map(|e| e / PAGE * PAGE) else { return 0 };
    if end <= start {
        return 0;
    }
    let Ok(span) = usize::try_from(end - start) else { return 0 };
    // The whole range must lie in one region of guest memory (a single mapping).
    let Some(region) = mem.find_region(GuestAddress(start)) else { return 0 };
    let Ok(slice) = region.get_slice(MemoryRegionAddress(start - region.start_addr().0), span)
    else {
        return 0;
    };
    let host = slice.ptr_guard_mut().as_ptr();
    // `host..host+span` is inside the guest-memory mapping (get_slice checked it against the
    // region, which lives as long as `mem`), and page-aligned (the region starts page-aligned,
    // start and end are page multiples).
    // SAFETY: guest RAM only (checked above); discarding it is what the guest asked for.
    let rc = unsafe { libc::madvise(host.cast(), span, libc::MADV_DONTNEED) };
    if rc == 0 {
        span as u64
    } else {
        0
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE
    }

    fn features(&self) -> u64 {
        F_DEFLATE_ON_OOM | F_REPORTING
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
        let shared = &self.shared;
        serve_chains(queues, index, mem, |chain| {
            for desc in chain {
                // Linux hands reports over as device-writable buffers and frame-number
                // arrays as device-readable ones; a descriptor in the wrong direction for its
                // queue is skipped.
                if desc.is_write_only() != (index == REPORTING) {
                    continue;
                }
                match index {
                    REPORTING => {
                        let freed = discard(mem, desc.addr().0, u64::from(desc.len()));
                        shared.reported_bytes.fetch_add(freed, Ordering::Relaxed);
                    }
                    INFLATE | DEFLATE => {
                        // An array of little-endian u32 frame numbers.
                        let count = (desc.len() / 4).min(MAX_PFNS_PER_DESCRIPTOR);
                        for i in 0..u64::from(count) {
                            let Some(at) = desc.addr().checked_add(i * 4) else { break };
                            let Ok(pfn) = mem.read_obj::<u32>(at) else { break };
                            let addr = u64::from(pfn) << PFN_SHIFT;
                            if index == INFLATE {
                                let freed = discard(mem, addr, PAGE);
                                shared.inflated_bytes.fetch_add(freed, Ordering::Relaxed);
                            } else {
                                shared.deflated_bytes.fetch_add(PAGE, Ordering::Relaxed);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if index == REPORTING {
                shared.reports.fetch_add(1, Ordering::Relaxed);
            }
            Ok(0)
        })
    }

    /// `num_pages` at 0, `actual` at 4 (both little-endian u32).
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 8];
        config[..4]
            .copy_from_slice(&self.shared.target_pages.load(Ordering::Relaxed).to_le_bytes());
        config[4..]
            .copy_from_slice(&self.shared.actual_pages.load(Ordering::Relaxed).to_le_bytes());
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset).ok().and_then(|o| config.get(o + i)).copied().unwrap_or(0);
        }
    }

    /// The driver writes `actual` (offset 4) as the balloon grows or shrinks.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if offset == 4 && data.len() == 4 {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(data);
            self.shared.actual_pages.store(u32::from_le_bytes(bytes), Ordering::Relaxed);
        }
    }

    fn save_state(&self) -> DeviceState {
        DeviceState::Balloon(BalloonState {
            target_pages: self.shared.target_pages.load(Ordering::Relaxed),
            actual_pages: self.shared.actual_pages.load(Ordering::Relaxed),
        })
    }

    fn restore_state(&mut self, state: DeviceState) -> Result<(), DeviceStateError> {
        match state {
            // A state from before balloons kept theirs.
            DeviceState::Stateless => Ok(()),
            DeviceState::Balloon(b) => {
                self.shared.target_pages.store(b.target_pages, Ordering::Relaxed);
                self.shared.actual_pages.store(b.actual_pages, Ordering::Relaxed);
                Ok(())
            }
            other => Err(DeviceStateError::Device(format!("a balloon got {other:?}"))),
        }
    }
}
