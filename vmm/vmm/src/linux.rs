//! Booting a Linux bzImage: an in-kernel interrupt controller and PIT, CPUID from KVM, the
//! 64-bit boot protocol (zero page, command line, initramfs, e820 map) set up the way
//! Firecracker does it, a 16550 console, and an exit loop that serves the legacy ports a kernel
//! probes. vCPU 0 runs on the calling thread, any further vCPU on its own (see
//! [`crate::vcpus`]).
#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_fpu, kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use crate::vcpus::{ExitHandler, Secondaries, SharedVcpu};
use linux_loader::bootparam::boot_params;
use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::{bzimage::BzImage, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::acpi::MmioDevice;
use crate::long_mode;
use crate::memory::GuestMemory;
use crate::serial::{console, Console};
use crate::virtio::mmio::{MmioTransport, WINDOW};

const ZERO_PAGE: u64 = 0x7000;
const CMDLINE: u64 = 0x2_0000;
const CMDLINE_MAX: usize = 4096;
const HIMEM_START: u64 = 0x10_0000;
const EBDA_START: u64 = 0x9_fc00;
const TSS_ADDRESS: usize = 0xfffb_d000;
const E820_RAM: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("KVM: {0}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error("kernel {0}")]
    Kernel(String),
    #[error("initramfs {0}")]
    Initrd(String),
    #[error("command line: {0}")]
    Cmdline(String),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error("guest memory: {0}")]
    GuestMemory(String),
    #[error("eventfd: {0}")]
    EventFd(#[source] std::io::Error),
}

pub use crate::machine::{lock_devices, Devices, Ending, FIRST_GSI, MMIO_BASE, SNAPSHOT_TRIGGER};

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> BootError {
    move |e| BootError::Kvm(what, e)
}

pub struct LinuxVm {
    pub(crate) kvm: Kvm,
    pub(crate) vm: VmFd,
    /// vCPU 0 first; each is locked by the thread running it.
    pub(crate) vcpus: Vec<SharedVcpu>,
    /// The threads of vCPUs 1.., started by the first [`LinuxVm::run`].
    secondaries: Option<Secondaries>,
    pub(crate) memory: GuestMemory,
    pub console: Arc<Mutex<Console>>,
    /// The console's interrupt line (registered as an irqfd for GSI 4).
    irq: EventFd,
    /// Stop with [`Ending::SnapshotRequested`] when the guest writes [`SNAPSHOT_TRIGGER`].
    pub snapshot_trigger: bool,
    /// virtio-mmio devices with their interrupt lines, windows from [`MMIO_BASE`].
    pub(crate) devices: Devices,
    view: crate::memory::GuestView,
    /// The balloon device's index and handle, when the VM has one.
    pub balloon: Option<(usize, Arc<crate::virtio::balloon::BalloonShared>)>,
    /// Requests from the control socket for the vCPU thread.
    pub requests: Arc<crate::machine::VcpuRequests>,
}

impl LinuxVm {
    /// The VM without a guest: KVM VM with TSS, in-kernel irqchip and PIT, `mem_mib` of
    /// anonymous memory in slot 0, `vcpus` vCPUs (at least one), and the console on IRQ 4.
    pub fn create(mem_mib: usize, vcpus: usize, echo_console: bool) -> Result<LinuxVm, BootError> {
        let size = mem_mib << 20;
        let kvm_handle = Kvm::new().map_err(kvm("open /dev/kvm"))?;
        let vm = kvm_handle.create_vm().map_err(kvm("create VM"))?;
        vm.set_tss_address(TSS_ADDRESS).map_err(kvm("TSS address"))?;
        vm.create_irq_chip().map_err(kvm("irqchip"))?;
        let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
        vm.create_pit2(pit).map_err(kvm("PIT"))?;
        let memory = GuestMemory::anonymous(size)?;
        // SAFETY: the madvise covers exactly our own anonymous mapping; huge pages only change
        // how the kernel backs it.
        unsafe {
            libc::madvise(memory.host_address() as *mut libc::c_void, size, libc::MADV_HUGEPAGE)
        };
        let region = memory.slot();
        // SAFETY: the region is exactly `memory`'s mapping, owned by the LinuxVm, which drops the
        // VmFd before the memory.
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm("memory region"))?;
        let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(BootError::EventFd)?;
        vm.register_irqfd(&irq, 4).map_err(kvm("irqfd for COM1"))?;
        let line = irq.try_clone().map_err(BootError::EventFd)?;
        let view = memory.view()?;
        let mut linux = LinuxVm {
            kvm: kvm_handle,
            vm,
            vcpus: Vec::new(),
            secondaries: None,
            memory,
            console: Arc::new(Mutex::new(console(line, echo_console))),
            irq,
            snapshot_trigger: false,
            devices: Arc::new(Mutex::new(Vec::new())),
            view,
            balloon: None,
            requests: Arc::default(),
        };
        linux.add_vcpus(vcpus.max(1))?;
        Ok(linux)
    }

    /// Creates vCPUs until the VM has `count` (a restore of a snapshot with more vCPUs than a
    /// waiting VM was made with); with more than `count`, the extra ones are left unused.
    pub(crate) fn add_vcpus(&mut self, count: usize) -> Result<(), BootError> {
        while self.vcpus.len() < count {
            let fd = self.vm.create_vcpu(self.vcpus.len() as u64).map_err(kvm("vCPU"))?;
            self.vcpus.push(Arc::new(Mutex::new(fd)));
        }
        self.vcpus.truncate(count);
        Ok(())
    }

    /// How many vCPUs the VM runs.
    pub fn vcpu_count(&self) -> usize {
        self.vcpus.len()
    }

    /// Attaches a virtio-mmio device with its own interrupt line; returns where the guest
    /// finds it. Attach before [`LinuxVm::describe_devices`].
    pub fn attach(&mut self, device: MmioTransport) -> Result<MmioDevice, BootError> {
        let mut devices = lock_devices(&self.devices);
        let i = devices.len() as u32;
        let gsi = FIRST_GSI + i;
        let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(BootError::EventFd)?;
        self.vm.register_irqfd(&irq, gsi).map_err(kvm("irqfd for a virtio device"))?;
        devices.push((device, irq));
        Ok(MmioDevice { base: MMIO_BASE + u64::from(i) * WINDOW, size: WINDOW, gsi })
    }

    fn device_descriptions(&self) -> Vec<MmioDevice> {
        (0..lock_devices(&self.devices).len() as u32)
            .map(|i| MmioDevice {
                base: MMIO_BASE + u64::from(i) * WINDOW,
                size: WINDOW,
                gsi: FIRST_GSI + i,
            })
            .collect()
    }

    /// A VM with `mem_mib` of memory and `vcpus` vCPUs, the kernel at 1 MiB, `initrd` at the
    /// top of memory and `cmdline` in the zero page. vCPU 0 starts at the kernel's 64-bit
    /// entry; the others wait for the guest to start them (INIT/SIPI, served by KVM's LAPIC).
    pub fn boot(
        mem_mib: usize,
        vcpus: usize,
        kernel: &Path,
        initrd: Option<&Path>,
        cmdline: &str,
        echo_console: bool,
        devices: Vec<MmioTransport>,
    ) -> Result<LinuxVm, BootError> {
        let mut linux = LinuxVm::create(mem_mib, vcpus, echo_console)?;
        for device in devices {
            linux.attach(device)?;
        }
        let described = linux.device_descriptions();
        let rsdp = crate::acpi::write_tables(&mut linux.memory, &described, linux.vcpus.len())
            .map_err(|e| BootError::GuestMemory(e.to_string()))?;
        let size = mem_mib << 20;
        let view_owner = linux.memory.view()?;
        let view = view_owner.memory();
        let mut image = File::open(kernel)
            .map_err(|e| BootError::Kernel(format!("{}: {e}", kernel.display())))?;
        let loaded = BzImage::load(view, None, &mut image, Some(GuestAddress(HIMEM_START)))
            .map_err(|e| BootError::Kernel(format!("{}: {e}", kernel.display())))?;
        let mut cl = Cmdline::new(CMDLINE_MAX).map_err(|e| BootError::Cmdline(e.to_string()))?;
        cl.insert_str(cmdline).map_err(|e| BootError::Cmdline(e.to_string()))?;
        linux_loader::loader::load_cmdline(view, GuestAddress(CMDLINE), &cl)
            .map_err(|e| BootError::Cmdline(e.to_string()))?;

        let mut params = boot_params::default();
        if let Some(hdr) = loaded.setup_header {
            params.hdr = hdr;
        }
        params.hdr.type_of_loader = 0xff;
        params.hdr.boot_flag = 0xaa55;
        params.hdr.header = 0x5372_6448;
        params.hdr.cmd_line_ptr = CMDLINE as u32;
        params.hdr.cmdline_size = cmdline.len() as u32 + 1;
        params.hdr.kernel_alignment = 0x0100_0000;
        if let Some(path) = initrd {
            let data = std::fs::read(path)
                .map_err(|e| BootError::Initrd(format!("{}: {e}", path.display())))?;
            let max = u64::from(params.hdr.initrd_addr_max).min(size as u64 - 1);
            let addr = (max + 1 - data.len() as u64) & !0xfff;
            if addr <= loaded.kernel_end {
                return Err(BootError::Initrd("does not fit in guest memory".into()));
            }
            view.write_slice(&data, GuestAddress(addr))
                .map_err(|e| BootError::GuestMemory(e.to_string()))?;
            params.hdr.ramdisk_image = addr as u32;
            params.hdr.ramdisk_size = data.len() as u32;
        }
        let e820 = [(0, EBDA_START), (HIMEM_START, size as u64 - HIMEM_START)];
        for (i, (addr, len)) in e820.iter().enumerate() {
            params.e820_table[i].addr = *addr;
            params.e820_table[i].size = *len;
            params.e820_table[i].r#type = E820_RAM;
        }
        params.e820_entries = e820.len() as u8;
        params.acpi_rsdp_addr = rsdp;
        LinuxBootConfigurator::write_bootparams::<vm_memory::GuestMemoryMmap>(
            &BootParams::new::<boot_params>(&params, GuestAddress(ZERO_PAGE)),
            view,
        )
        .map_err(|e| BootError::GuestMemory(e.to_string()))?;
        // Identity page tables and GDT (the kernel's 64-bit entry wants paging on).
        long_mode::write_tables(&mut linux.memory)?;
        let supported =
            linux.kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm("CPUID"))?;
        let count = linux.vcpus.len();
        for (index, vcpu) in linux.vcpus.iter().enumerate() {
            let vcpu = crate::vcpus::lock(vcpu);
            let mut cpuid = supported.clone();
            cpuid_for(&mut cpuid, index, count);
            vcpu.set_cpuid2(&cpuid).map_err(kvm("set CPUID"))?;
            let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
            vcpu.set_fpu(&fpu).map_err(kvm("FPU"))?;
            set_lint(&vcpu)?;
        }
        let vcpu = crate::vcpus::lock(&linux.vcpus[0]);
        let sregs = vcpu.get_sregs().map_err(kvm("get sregs"))?;
        vcpu.set_sregs(&long_mode::sregs(sregs)).map_err(kvm("set sregs"))?;
        let entry = loaded.kernel_load.raw_value() + 0x200;
        let regs = kvm_bindings::kvm_regs {
            rip: entry,
            rsp: 0x8ff0,
            rbp: 0x8ff0,
            rsi: ZERO_PAGE,
            rflags: 0x2,
            ..Default::default()
        };
        vcpu.set_regs(&regs).map_err(kvm("set regs"))?;
        drop(vcpu);
        Ok(linux)
    }

    pub fn memory(&self) -> &GuestMemory {
        &self.memory
    }

    pub fn memory_mut(&mut self) -> &mut GuestMemory {
        &mut self.memory
    }

    /// Calls `f` with vCPU `index` (none past the last), locked against its run loop: for
    /// reading or setting its state while the VM is stopped.
    pub fn with_vcpu<R>(&self, index: usize, f: impl FnOnce(&VcpuFd) -> R) -> Option<R> {
        self.vcpus.get(index).map(|v| f(&crate::vcpus::lock(v)))
    }

    /// Runs a device's backend (vsock's sockets, net's tap) on its own thread for the device
    /// at `index`: outside input reaches the guest through the transport, with an interrupt
    /// when buffers were used. The thread ends with the process.
    pub fn start_backend(&self, backend: Box<dyn crate::virtio::Backend>, index: usize) {
        let devices = self.devices.clone();
        let view = self.view.clone();
        std::thread::spawn(move || loop {
            if backend.step() {
                let mut devices = lock_devices(&devices);
                if let Some((transport, irq)) = devices.get_mut(index) {
                    if transport.poll(&view) {
                        let _ = irq.write(1);
                    }
                }
            }
            // Sleep until a host socket is ready (at most 20 ms, so credit the guest grants
            // is noticed soon), instead of spinning.
            backend.wait(std::time::Duration::from_millis(20));
        });
    }

    /// What the control socket's thread needs to steer this VM.
    pub fn control_handles(&self) -> crate::machine::ControlHandles {
        crate::machine::ControlHandles {
            devices: self.devices.clone(),
            balloon: self.balloon.clone(),
            requests: self.requests.clone(),
        }
    }

    /// Per device: its type and how many queue notifications it served.
    pub fn device_stats(&self) -> Vec<(u32, u64)> {
        lock_devices(&self.devices).iter().map(|(d, _)| (d.device_type(), d.served)).collect()
    }

    /// Replaces the console with one in `state` (a restore), keeping its interrupt line.
    pub fn restore_console(
        &mut self,
        state: &vm_superio::serial::SerialState,
    ) -> Result<(), BootError> {
        let line = self.irq.try_clone().map_err(BootError::EventFd)?;
        let echo = crate::vcpus::lock(&self.console).writer().echo;
        let log = crate::serial::ConsoleLog { echo, ..Default::default() };
        *crate::vcpus::lock(&self.console) = vm_superio::Serial::from_state(
            state,
            crate::serial::IrqTrigger(line),
            vm_superio::serial::NoEvents,
            log,
        )
        .map_err(|e| BootError::EventFd(std::io::Error::other(format!("{e:?}"))))?;
        Ok(())
    }

    /// Runs the guest until it shuts down or fails, or until an exit after `limit` (a guest
    /// that never exits is stopped by the process's own watchdog, see `brig-vmm boot`). vCPU 0
    /// runs on this thread; when this returns, every other vCPU is parked, so the VM's state
    /// can be read or saved, and the next call lets them go on.
    pub fn run(&mut self, limit: Duration) -> Ending {
        let handler = ExitHandler {
            console: self.console.clone(),
            devices: self.devices.clone(),
            view: self.view.clone(),
            snapshot_trigger: self.snapshot_trigger,
        };
        let secondaries =
            self.secondaries.get_or_insert_with(|| Secondaries::start(&self.vcpus[1..], &handler));
        secondaries.release();
        let ending = run_first(&self.vcpus[0], &handler, secondaries, &self.requests, limit);
        secondaries.park();
        ending
    }
}

/// vCPU 0's loop (see [`LinuxVm::run`]).
fn run_first(
    vcpu: &SharedVcpu,
    handler: &ExitHandler,
    secondaries: &Secondaries,
    requests: &crate::machine::VcpuRequests,
    limit: Duration,
) -> Ending {
    let started = Instant::now();
    let mut vcpu = crate::vcpus::lock(vcpu);
    loop {
        if started.elapsed() >= limit {
            return Ending::TimedOut;
        }
        if requests.pending() {
            return Ending::ControlRequest;
        }
        if let Some(ending) = secondaries.ending() {
            return ending;
        }
        match vcpu.run() {
            Ok(exit) => {
                if let Some(ending) = handler.handle(exit) {
                    return ending;
                }
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => return Ending::Failed(format!("KVM_RUN: {e}")),
        }
    }
}

/// CPUID for vCPU `index` of `count`: its APIC id (leaf 1 EBX[31:24], leaves 0xB and 0x1F
/// EDX), the logical processor count (leaf 1 EBX[23:16], with HTT when more than one), and
/// "running under a hypervisor" (leaf 1 ECX bit 31), so the guest reads KVM's leaves and uses
/// kvmclock instead of calibrating against the PIT.
fn cpuid_for(cpuid: &mut kvm_bindings::CpuId, index: usize, count: usize) {
    let id = index as u32;
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                entry.ecx |= 1 << 31;
                entry.ebx = (entry.ebx & 0xffff) | (id << 24) | ((count as u32 & 0xff) << 16);
                if count > 1 {
                    entry.edx |= 1 << 28;
                }
            }
            0xb | 0x1f => entry.edx = id,
            _ => {}
        }
    }
}

/// LINT0 as ExtINT, LINT1 as NMI (what a BIOS leaves), so the PIC's interrupts reach the CPU.
fn set_lint(vcpu: &VcpuFd) -> Result<(), BootError> {
    let mut lapic = vcpu.get_lapic().map_err(kvm("get LAPIC"))?;
    for (offset, mode) in [(0x350usize, 7u32), (0x360, 4)] {
        let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[offset + i] as u8);
        let value = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
        for (i, b) in value.to_le_bytes().iter().enumerate() {
            lapic.regs[offset + i] = *b as libc::c_char;
        }
    }
    vcpu.set_lapic(&lapic).map_err(kvm("set LAPIC"))
}
