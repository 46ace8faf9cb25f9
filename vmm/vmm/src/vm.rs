//! One VM: KVM handles, guest memory in slot 0, one vCPU, and the exit loop.
#![allow(unsafe_code)]

use std::time::Instant;

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};

use crate::guest;
use crate::memory::{GuestMemory, MemoryError};
use crate::virtio::mmio::{window_of, MmioTransport, WINDOW};

/// Guest physical address of the first virtio-mmio window (inside the test guest's identity map,
/// above its RAM); each further device takes the next [`WINDOW`].
pub const MMIO_BASE: u64 = 0x3000_0000;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("KVM: {what}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("the guest did something this VMM does not serve: {0}")]
    UnexpectedExit(String),
    #[error("the guest stopped (shutdown or internal error): {0}")]
    GuestDied(String),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// A VM with one vCPU.
pub struct Vm {
    _kvm: Kvm,
    _vm: VmFd,
    vcpu: VcpuFd,
    memory: GuestMemory,
    /// The `vm-memory` view of `memory` devices use.
    view: crate::memory::GuestView,
    devices: Vec<MmioTransport>,
    /// Time spent creating the VM (KVM objects and the memory slot).
    pub create_micros: u64,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm").field("memory", &self.memory.size()).finish()
    }
}

impl Vm {
    /// Creates a VM with `mem_bytes` of anonymous guest memory in slot 0 and one vCPU. This is
    /// the expensive part of starting a VM (the first memory slot costs milliseconds on PVM);
    /// a warm pool does it ahead of time.
    pub fn create(mem_bytes: usize) -> Result<Vm, VmError> {
        let started = Instant::now();
        let kvm_handle = Kvm::new().map_err(kvm("open /dev/kvm"))?;
        let vm = kvm_handle.create_vm().map_err(kvm("create VM"))?;
        let memory = GuestMemory::anonymous(mem_bytes)?;
        let region = memory.slot();
        // SAFETY: the region covers exactly `memory`'s mapping, which the Vm owns and unmaps
        // only after the VmFd (declared earlier, dropped earlier) has gone.
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm("set memory region"))?;
        let vcpu = vm.create_vcpu(0).map_err(kvm("create vCPU"))?;
        let view = memory.view()?;
        Ok(Vm {
            _kvm: kvm_handle,
            _vm: vm,
            vcpu,
            view,
            devices: Vec::new(),
            memory,
            create_micros: started.elapsed().as_micros() as u64,
        })
    }

    /// Attaches a virtio device; returns the guest physical base of its MMIO window.
    pub fn attach(&mut self, device: MmioTransport) -> u64 {
        self.devices.push(device);
        MMIO_BASE + (self.devices.len() as u64 - 1) * WINDOW
    }

    pub fn device(&self, index: usize) -> Option<&MmioTransport> {
        self.devices.get(index)
    }

    fn window(&self, addr: u64) -> Option<(usize, u64)> {
        window_of(MMIO_BASE, addr, self.devices.len())
    }

    /// An MMIO write as the guest would do it (the exit handler's path); `false` when no
    /// device is there.
    pub fn mmio_write(&mut self, addr: u64, data: &[u8]) -> bool {
        let Some((i, offset)) = self.window(addr) else { return false };
        self.devices[i].write(offset, data, &self.view);
        true
    }

    /// An MMIO read as the guest would do it; `false` when no device is there.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        let Some((i, offset)) = self.window(addr) else { return false };
        self.devices[i].read(offset, data);
        true
    }

    pub fn memory(&self) -> &GuestMemory {
        &self.memory
    }

    pub fn memory_mut(&mut self) -> &mut GuestMemory {
        &mut self.memory
    }

    /// Loads the test guest and points the vCPU at it.
    pub fn boot_test_guest(&mut self, touch_mib: u64) -> Result<(), VmError> {
        guest::load(&mut self.memory, touch_mib)?;
        let sregs = self.vcpu.get_sregs().map_err(kvm("get sregs"))?;
        self.vcpu.set_sregs(&guest::sregs(sregs)).map_err(kvm("set sregs"))?;
        self.vcpu.set_regs(&guest::regs()).map_err(kvm("set regs"))?;
        Ok(())
    }

    pub fn regs(&self) -> Result<(kvm_regs, kvm_sregs), VmError> {
        Ok((
            self.vcpu.get_regs().map_err(kvm("get regs"))?,
            self.vcpu.get_sregs().map_err(kvm("get sregs"))?,
        ))
    }

    pub fn set_regs(&self, regs: &kvm_regs, sregs: &kvm_sregs) -> Result<(), VmError> {
        self.vcpu.set_sregs(sregs).map_err(kvm("set sregs"))?;
        self.vcpu.set_regs(regs).map_err(kvm("set regs"))
    }

    /// Runs the vCPU until the guest answers `request`; returns the answer.
    pub fn request(&mut self, request: u32) -> Result<u32, VmError> {
        loop {
            match self.vcpu.run() {
                Ok(VcpuExit::IoIn(guest::REQUEST_PORT, data)) => {
                    let bytes = request.to_le_bytes();
                    let n = data.len().min(4);
                    data[..n].copy_from_slice(&bytes[..n]);
                }
                Ok(VcpuExit::IoOut(guest::REPLY_PORT, data)) => {
                    let mut bytes = [0u8; 4];
                    let n = data.len().min(4);
                    bytes[..n].copy_from_slice(&data[..n]);
                    return Ok(u32::from_le_bytes(bytes));
                }
                Ok(VcpuExit::IoOut(port, _)) | Ok(VcpuExit::IoIn(port, _)) => {
                    return Err(VmError::UnexpectedExit(format!("port I/O on {port:#x}")))
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    let Some((i, offset)) = window_of(MMIO_BASE, addr, self.devices.len()) else {
                        return Err(VmError::UnexpectedExit(format!("MMIO read at {addr:#x}")));
                    };
                    self.devices[i].read(offset, data);
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    let Some((i, offset)) = window_of(MMIO_BASE, addr, self.devices.len()) else {
                        return Err(VmError::UnexpectedExit(format!("MMIO write at {addr:#x}")));
                    };
                    self.devices[i].write(offset, data, &self.view);
                }
                Ok(VcpuExit::Hlt) => return Err(VmError::GuestDied("hlt".into())),
                Ok(VcpuExit::Shutdown) => return Err(VmError::GuestDied("shutdown".into())),
                Ok(VcpuExit::InternalError) => {
                    return Err(VmError::GuestDied("KVM internal error".into()))
                }
                Ok(VcpuExit::FailEntry(reason, _)) => {
                    return Err(VmError::GuestDied(format!("entry failed: {reason:#x}")))
                }
                Ok(other) => return Err(VmError::UnexpectedExit(format!("{other:?}"))),
                Err(e) if e.errno() == libc::EINTR => continue,
                Err(source) => return Err(VmError::Kvm { what: "run vCPU", source }),
            }
        }
    }

    /// Completes the port I/O the guest is in the middle of (the last `out` of an answer) without
    /// running further guest code, so saved registers point past it (Firecracker's order: set
    /// `immediate_exit`, run once, expect EINTR).
    pub fn pause(&mut self) -> Result<(), VmError> {
        self.vcpu.set_kvm_immediate_exit(1);
        let result = match self.vcpu.run() {
            Err(e) if e.errno() == libc::EINTR => Ok(()),
            Ok(exit) => Err(VmError::UnexpectedExit(format!("while pausing: {exit:?}"))),
            Err(source) => Err(VmError::Kvm { what: "pause vCPU", source }),
        };
        self.vcpu.set_kvm_immediate_exit(0);
        result
    }
}
