//! The vCPUs of a Linux VM and the threads that run them. vCPU 0 runs on the thread that calls
//! [`crate::linux::LinuxVm::run`]; every further vCPU runs on a thread of its own, started on
//! the first run. All of them serve exits the same way ([`ExitHandler`]). Before `run` returns
//! the other vCPUs are parked: out of `KVM_RUN`, any port or MMIO access they were in the
//! middle of completed, waiting on a condition variable. So whoever called `run` can read or
//! save the whole VM consistently, and the next `run` lets them go on.
//!
//! A vCPU that meets the end of the VM (shutdown, a failure) records it and kicks vCPU 0,
//! whose `run` then returns it.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kvm_ioctls::{VcpuExit, VcpuFd};

use crate::machine::{Devices, Ending, MMIO_BASE, SNAPSHOT_TRIGGER};
use crate::serial::{Console, COM1};
use crate::virtio::mmio::window_of;

/// A vCPU, locked by whichever thread runs it or reads its state.
pub type SharedVcpu = Arc<Mutex<VcpuFd>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What serving an exit needs: the console, the virtio devices and guest memory.
#[derive(Clone)]
pub(crate) struct ExitHandler {
    pub console: Arc<Mutex<Console>>,
    pub devices: Devices,
    pub view: crate::memory::GuestView,
    pub snapshot_trigger: bool,
}

impl ExitHandler {
    /// Serves one exit; `Some` when the VM (or this run) ends with it.
    pub fn handle(&self, exit: VcpuExit<'_>) -> Option<Ending> {
        match exit {
            VcpuExit::IoOut(port, data) => {
                if (COM1..COM1 + 8).contains(&port) {
                    let _ = lock(&self.console).write((port - COM1) as u8, data[0]);
                } else if port == 0x64 && data.first() == Some(&0xfe) {
                    return Some(Ending::Shutdown); // i8042 reset line
                }
            }
            VcpuExit::IoIn(port, data) => {
                let value = if (COM1..COM1 + 8).contains(&port) {
                    lock(&self.console).read((port - COM1) as u8)
                } else {
                    0xff
                };
                data.iter_mut().for_each(|b| *b = value);
            }
            VcpuExit::MmioRead(addr, data) => {
                let devices = lock(&self.devices);
                match window_of(MMIO_BASE, addr, devices.len()) {
                    Some((i, offset)) => devices[i].0.read(offset, data),
                    None => data.iter_mut().for_each(|b| *b = 0),
                }
            }
            VcpuExit::MmioWrite(addr, data) if addr >= MMIO_BASE => {
                let mut devices = lock(&self.devices);
                if let Some((i, offset)) = window_of(MMIO_BASE, addr, devices.len()) {
                    let (device, irq) = &mut devices[i];
                    if device.write(offset, data, &self.view) {
                        let _ = irq.write(1);
                    }
                }
            }
            VcpuExit::MmioWrite(addr, _) if addr == SNAPSHOT_TRIGGER && self.snapshot_trigger => {
                return Some(Ending::SnapshotRequested)
            }
            VcpuExit::MmioWrite(..) | VcpuExit::Hlt => {}
            VcpuExit::Shutdown => return Some(Ending::Shutdown),
            VcpuExit::InternalError => return Some(Ending::Failed("KVM internal error".into())),
            VcpuExit::FailEntry(reason, _) => {
                return Some(Ending::Failed(format!("entry failed: {reason:#x}")))
            }
            VcpuExit::SystemEvent(kind, _) => {
                return Some(
                    if kind == kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN
                        || kind == kvm_bindings::KVM_SYSTEM_EVENT_RESET
                    {
                        Ending::Shutdown
                    } else {
                        Ending::Failed(format!("system event {kind}"))
                    },
                );
            }
            other => return Some(Ending::Failed(format!("unexpected exit {other:?}"))),
        }
        None
    }
}

/// Runs `vcpu` once with `immediate_exit` set: a port or MMIO access it is in the middle of
/// completes without running further guest code (Firecracker's pause), so its saved
/// registers point past it.
pub(crate) fn complete_pending_io(vcpu: &mut VcpuFd) {
    vcpu.set_kvm_immediate_exit(1);
    let _ = vcpu.run();
    vcpu.set_kvm_immediate_exit(0);
}

/// How the threads of vCPUs 1.. and vCPU 0 find each other.
#[derive(Default)]
struct Parking {
    /// Set while the other vCPUs must stay out of the guest.
    stop: AtomicBool,
    /// How many of them are parked.
    parked: Mutex<usize>,
    changed: Condvar,
    /// How the VM ended, when a vCPU other than 0 met its end.
    ending: Mutex<Option<Ending>>,
    ended: AtomicBool,
    /// vCPU 0's thread, to kick when another vCPU ends the VM.
    first_thread: AtomicU64,
}

/// The threads of vCPUs 1.. of a VM.
pub(crate) struct Secondaries {
    parking: Arc<Parking>,
    /// Their pthread ids (as u64: a pointer on musl).
    threads: Vec<u64>,
}

impl Secondaries {
    /// Starts a thread per vCPU in `vcpus` (the VM's vCPUs after the first), parked.
    pub fn start(vcpus: &[SharedVcpu], handler: &ExitHandler) -> Secondaries {
        crate::machine::install_kick_handler();
        let parking = Arc::new(Parking { stop: AtomicBool::new(true), ..Parking::default() });
        let mut threads = Vec::new();
        for (i, vcpu) in vcpus.iter().enumerate() {
            let (vcpu, handler, parking) = (vcpu.clone(), handler.clone(), parking.clone());
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let spawned =
                std::thread::Builder::new().name(format!("vcpu{}", i + 1)).spawn(move || {
                    // SAFETY: pthread_self has no preconditions.
                    let _ = tx.send(unsafe { libc::pthread_self() } as u64);
                    secondary(&vcpu, &handler, &parking);
                });
            if spawned.is_ok() {
                if let Ok(thread) = rx.recv() {
                    threads.push(thread);
                }
            }
        }
        let secondaries = Secondaries { parking, threads };
        secondaries.wait_parked();
        secondaries
    }

    /// Lets the vCPUs run (called on vCPU 0's thread as its run starts).
    pub fn release(&self) {
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        self.parking.first_thread.store(me as u64, Ordering::SeqCst);
        // Under the lock the parked threads wait with, so none misses the wake-up.
        let _parked = lock(&self.parking.parked);
        self.parking.stop.store(false, Ordering::SeqCst);
        self.parking.changed.notify_all();
    }

    /// How the VM ended on another vCPU, once (checked by vCPU 0 after every exit).
    pub fn ending(&self) -> Option<Ending> {
        if !self.parking.ended.load(Ordering::SeqCst) {
            return None;
        }
        self.parking.ended.store(false, Ordering::SeqCst);
        lock(&self.parking.ending).take()
    }

    /// Stops every vCPU thread outside the guest and waits until all are parked.
    pub fn park(&self) {
        self.parking.stop.store(true, Ordering::SeqCst);
        self.wait_parked();
    }

    fn wait_parked(&self) {
        let mut parked = lock(&self.parking.parked);
        while *parked < self.threads.len() {
            // A kick that lands just before a thread enters the guest is lost: kick again until
            // every thread has parked.
            for thread in &self.threads {
                // SAFETY: every thread in `threads` runs `secondary` until the process exits,
                // and the kick signal has a handler (installed in `start`).
                unsafe {
                    libc::pthread_kill(*thread as libc::pthread_t, crate::machine::kick_signal())
                };
            }
            parked = self
                .parking
                .changed
                .wait_timeout(parked, Duration::from_millis(2))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The loop of a vCPU other than the first.
fn secondary(vcpu: &SharedVcpu, handler: &ExitHandler, parking: &Parking) {
    loop {
        if parking.stop.load(Ordering::SeqCst) {
            complete_pending_io(&mut lock(vcpu));
            let mut parked = lock(&parking.parked);
            *parked += 1;
            parking.changed.notify_all();
            while parking.stop.load(Ordering::SeqCst) {
                parked = parking.changed.wait(parked).unwrap_or_else(PoisonError::into_inner);
            }
            *parked -= 1;
            continue;
        }
        let mut fd = lock(vcpu);
        let ending = match fd.run() {
            Ok(exit) => handler.handle(exit),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => None,
            Err(e) => Some(Ending::Failed(format!("KVM_RUN: {e}"))),
        };
        drop(fd);
        if let Some(ending) = ending {
            *lock(&parking.ending) = Some(ending);
            parking.ended.store(true, Ordering::SeqCst);
            parking.stop.store(true, Ordering::SeqCst);
            let first = parking.first_thread.load(Ordering::SeqCst);
            if first != 0 {
                // SAFETY: `first` is the thread running vCPU 0 (it lives as long as the
                // process), and the kick signal has a handler.
                unsafe {
                    libc::pthread_kill(first as libc::pthread_t, crate::machine::kick_signal())
                };
            }
        }
    }
}
