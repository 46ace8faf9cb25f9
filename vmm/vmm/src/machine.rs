//! What the run loop, the control socket and snapshots share about a running machine: how a
//! run ends, where the virtio devices sit and how they are locked, and the vCPU's request
//! slot with its kick signal. A module of its own below `linux`, `vcpus`, `control` and
//! `linux_snapshot`, so none of them reaches up into another for these.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use crate::virtio::balloon::BalloonShared;
use crate::virtio::mmio::MmioTransport;

/// How a boot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The guest reset or powered off (triple fault with `reboot=t`, or the i8042 reset line).
    Shutdown,
    /// The run was stopped after this long.
    TimedOut,
    /// KVM could not run the guest (e.g. PVM meeting an instruction it cannot emulate).
    Failed(String),
    /// The guest wrote [`SNAPSHOT_TRIGGER`]; the vCPU is stopped after that write.
    SnapshotRequested,
    /// The control socket asked the vCPU to stop (see [`VcpuRequests`]).
    ControlRequest,
}

/// Guest physical base of the first virtio-mmio window (above RAM, below 4 GiB); device `i`
/// is at `MMIO_BASE + i * WINDOW` on GSI `FIRST_GSI + i`.
pub const MMIO_BASE: u64 = 0xd100_0000;

/// The VM's virtio devices with their interrupt lines; shared with device backend threads.
pub type Devices = Arc<Mutex<Vec<(MmioTransport, EventFd)>>>;

/// The VM's devices, locked: while the guard lives no backend thread reaches guest memory or
/// device state (a snapshot holds it from reading device state to the end of its disk copies).
pub fn lock_devices(devices: &Devices) -> std::sync::MutexGuard<'_, Vec<(MmioTransport, EventFd)>> {
    devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub const FIRST_GSI: u32 = 5;

/// A guest physical address (not RAM) whose write asks the VMM to snapshot the VM: a test
/// guest does `devmem 0xd0000000 32 1` at the point it wants to be resumed from.
pub const SNAPSHOT_TRIGGER: u64 = 0xd000_0000;

/// The signal that kicks the vCPU thread out of KVM_RUN (its handler does nothing; the
/// interrupted ioctl returns EINTR and the run loop looks at [`VcpuRequests`]).
pub(crate) fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int) {}

/// Installs the kick signal's handler (process-wide; idempotent).
pub(crate) fn install_kick_handler() {
    // SAFETY: the handler does nothing (async-signal-safe); installing it without SA_RESTART
    // makes a blocked KVM_RUN return EINTR, which every run loop handles.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_kick as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(kick_signal(), &action, std::ptr::null_mut());
    }
}

/// What the vCPU thread does when it stops for a control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuRequest {
    /// Save the VM to this directory and run on.
    Snapshot(PathBuf),
    /// Save the VM to this directory and exit.
    Pause(PathBuf),
}

/// Where the vCPU thread sends a request's outcome.
pub type Answer = SyncSender<Result<(), String>>;

/// Requests for the vCPU thread, with the channel its answer goes back on.
#[derive(Debug, Default)]
pub struct VcpuRequests {
    pending: AtomicBool,
    slot: Mutex<Option<(VcpuRequest, Answer)>>,
    /// The vCPU thread's pthread id (0 until the run loop starts).
    vcpu_thread: AtomicU64,
}

impl VcpuRequests {
    /// Called by the run loop's thread before it enters the guest: installs the kick handler
    /// and records where to send it.
    pub fn register_vcpu_thread(&self) {
        install_kick_handler();
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        self.vcpu_thread.store(me as u64, Ordering::SeqCst);
    }

    /// Whether a request waits (checked by the run loop after every exit).
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Takes the waiting request (on the vCPU thread).
    pub fn take(&self) -> Option<(VcpuRequest, Answer)> {
        let taken = self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        self.pending.store(false, Ordering::SeqCst);
        taken
    }

    /// Hands `request` to the vCPU thread and waits for its answer: the vCPU must stop within
    /// `timeout`; the save it then runs (guest memory, disk copies) may take longer.
    pub(crate) fn submit(&self, request: VcpuRequest, timeout: Duration) -> Result<(), String> {
        let (tx, rx): (_, Receiver<Result<(), String>>) = sync_channel(1);
        {
            let mut slot = self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.is_some() {
                return Err("another request is in progress".into());
            }
            *slot = Some((request, tx));
        }
        self.pending.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + timeout;
        while self.pending.load(Ordering::SeqCst) {
            if std::time::Instant::now() >= deadline {
                self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                self.pending.store(false, Ordering::SeqCst);
                return Err("the vCPU did not stop in time".into());
            }
            // A kick that lands just before the vCPU enters the guest is lost, so kick again
            // until the vCPU takes the request (not after: the save it then runs is better
            // left uninterrupted).
            let thread = self.vcpu_thread.load(Ordering::SeqCst);
            if thread != 0 {
                // SAFETY: `thread` is the live vCPU thread of this process (it runs until the
                // process exits), and the signal has a handler installed by that thread.
                unsafe { libc::pthread_kill(thread as libc::pthread_t, kick_signal()) };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Taken: the vCPU thread answers once the save is done (it always answers; if it
        // died, so did this process).
        rx.recv().unwrap_or_else(|_| Err("the vCPU thread went away".into()))
    }
}

/// What the control thread reaches: the devices (to signal a balloon change), the balloon's
/// handle and its device index, and the vCPU request slot.
#[derive(Clone)]
pub struct ControlHandles {
    pub devices: Devices,
    pub balloon: Option<(usize, Arc<BalloonShared>)>,
    pub requests: Arc<VcpuRequests>,
}
