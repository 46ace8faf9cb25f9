//! Snapshot and restore of a Linux VM: memory, every vCPU (registers, FPU/XSAVE, XCRs, debug
//! registers, LAPIC, MSRs, MP state, pending events, CPUID, TSC rate), the in-kernel PIC pair,
//! IOAPIC and PIT, the KVM clock, and the console UART.
//!
//! ```text
//! vm.state  "BRIGLXSN" | version u32 | memory size u64 | sections… | sha256(all before)
//!           section = tag u32 | len u32 | bytes (KVM structs as laid out by the kernel ABI)
//!           per-vCPU sections come once per vCPU, in vCPU order (version 1: one vCPU)
//! vm.mem    guest memory (restores map it MAP_PRIVATE: VMs from one snapshot share pages)
//! ```
//! Save follows Firecracker's order (pause so a pending I/O completes, then read); restore sets
//! VM-wide state first, then each vCPU: LAPIC after sregs, MSRs after the LAPIC, events last.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
};
use sha2::{Digest, Sha256};
use vm_superio::serial::SerialState;

use crate::linux::{BootError, LinuxVm};

const MAGIC: &[u8; 8] = b"BRIGLXSN";
pub const VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum LinuxSnapshotError {
    #[error("snapshot file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a Brig Linux VM snapshot, or is truncated")]
    Malformed(PathBuf),
    #[error("snapshot version {0}; this VMM reads versions 1 to {VERSION}")]
    Version(u32),
    #[error("snapshot {0} is corrupt (checksum mismatch)")]
    Checksum(PathBuf),
    #[error("KVM: {0}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error("the snapshot has {snapshot} bytes of guest memory, the waiting VM {vm}")]
    MemorySize { snapshot: u64, vm: u64 },
    /// A virtio device's saved state: of a newer VMM, or corrupt.
    #[error("a virtio device's state: {0}")]
    Device(#[from] crate::virtio::state::DeviceStateError),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> LinuxSnapshotError {
    move |e| LinuxSnapshotError::Kvm(what, e)
}

use crate::kvm_abi::from_bytes as unpod;

fn pod<T: crate::kvm_abi::KvmAbi>(value: &T) -> Vec<u8> {
    crate::kvm_abi::bytes_of(value).to_vec()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
enum Tag {
    Regs = 1,
    Sregs,
    Xsave,
    Xcrs,
    DebugRegs,
    Lapic,
    Msrs,
    MpState,
    Events,
    Cpuid,
    TscKhz,
    PicMaster,
    PicSlave,
    Ioapic,
    Pit,
    Clock,
    Serial,
    /// One per virtio device, in attach order.
    Device,
}

struct Sections(Vec<(u32, Vec<u8>)>);

impl Sections {
    fn get(&self, tag: Tag) -> Option<&[u8]> {
        self.0.iter().find(|(t, _)| *t == tag as u32).map(|(_, b)| b.as_slice())
    }

    fn all(&self, tag: Tag) -> impl Iterator<Item = &[u8]> {
        self.0.iter().filter(move |(t, _)| *t == tag as u32).map(|(_, b)| b.as_slice())
    }
}

/// Host-side settings a restored VM's devices need (they are not part of the snapshot).
#[derive(Debug, Clone, Default)]
pub struct HostSide {
    /// The Unix socket host processes reach the guest's vsock through.
    pub vsock_uds: Option<PathBuf>,
    pub guest_cid: u64,
    /// The VM's disks in attach order.
    pub disks: Vec<crate::virtio::cow::DiskSpec>,
    /// The tap a network device is attached to (opened before the jail) and its MAC.
    pub net: Option<(Arc<File>, [u8; 6])>,
}

/// What a restored device needs beside its transport: a backend thread (vsock, net), a
/// balloon's host handle.
enum DeviceHostPart {
    None,
    Backend(Box<dyn crate::virtio::Backend>),
    Balloon(Arc<crate::virtio::balloon::BalloonShared>),
}

/// A device of `device_type` in its power-on state, to restore saved transport state into.
fn new_device(
    device_type: u32,
    host: &HostSide,
    disks: &mut std::slice::Iter<'_, crate::virtio::cow::DiskSpec>,
) -> Option<(Box<dyn crate::virtio::VirtioDevice>, DeviceHostPart)> {
    match device_type {
        2 => {
            let spec = disks.next()?;
            let id = spec.path.file_name()?.to_string_lossy().into_owned();
            let disk = crate::virtio::blk::Block::from_spec(spec, &id).ok()?;
            Some((Box::new(disk), DeviceHostPart::None))
        }
        4 => Some((Box::new(crate::virtio::rng::Rng::default()), DeviceHostPart::None)),
        crate::virtio::balloon::DEVICE_TYPE => {
            let (balloon, shared) = crate::virtio::balloon::Balloon::new();
            Some((Box::new(balloon), DeviceHostPart::Balloon(shared)))
        }
        19 => {
            let (dev, backend) =
                crate::virtio::vsock::Vsock::new(host.guest_cid, host.vsock_uds.as_deref()?)
                    .ok()?;
            Some((Box::new(dev), DeviceHostPart::Backend(Box::new(backend))))
        }
        crate::virtio::net::DEVICE_TYPE => {
            let (tap, mac) = host.net.clone()?;
            let (dev, backend) = crate::virtio::net::Net::new(mac, tap);
            Some((Box::new(dev), DeviceHostPart::Backend(Box::new(backend))))
        }
        _ => None,
    }
}

fn irqchip(vm: &LinuxVm, chip: u32) -> Result<kvm_irqchip, LinuxSnapshotError> {
    let mut c = kvm_irqchip { chip_id: chip, ..Default::default() };
    vm.vm.get_irqchip(&mut c).map_err(kvm("get irqchip"))?;
    Ok(c)
}

fn serial_bytes(s: &SerialState) -> Vec<u8> {
    let mut out = vec![
        s.baud_divisor_low,
        s.baud_divisor_high,
        s.interrupt_enable,
        s.interrupt_identification,
        s.line_control,
        s.line_status,
        s.modem_control,
        s.modem_status,
        s.scratch,
    ];
    out.extend_from_slice(&s.in_buffer);
    out
}

fn serial_state(b: &[u8]) -> Option<SerialState> {
    let f = b.get(..9)?;
    Some(SerialState {
        baud_divisor_low: f[0],
        baud_divisor_high: f[1],
        interrupt_enable: f[2],
        interrupt_identification: f[3],
        line_control: f[4],
        line_status: f[5],
        modem_control: f[6],
        modem_status: f[7],
        scratch: f[8],
        in_buffer: b[9..].to_vec(),
    })
}

/// The sections of one stopped vCPU.
fn save_vcpu(
    vm: &LinuxVm,
    v: &kvm_ioctls::VcpuFd,
    dir: &Path,
) -> Result<Vec<(Tag, Vec<u8>)>, LinuxSnapshotError> {
    let index_list = vm.kvm.get_msr_index_list().map_err(kvm("MSR index list"))?;
    let entries: Vec<kvm_msr_entry> = index_list
        .as_slice()
        .iter()
        .map(|i| kvm_msr_entry { index: *i, ..Default::default() })
        .collect();
    let mut msrs =
        Msrs::from_entries(&entries).map_err(|_| LinuxSnapshotError::Malformed(dir.into()))?;
    let read = v.get_msrs(&mut msrs).map_err(kvm("get MSRs"))?;
    let msr_bytes: Vec<u8> = msrs.as_slice()[..read]
        .iter()
        .flat_map(|e| e.index.to_le_bytes().into_iter().chain(e.data.to_le_bytes()))
        .collect();
    let cpuid = v.get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES).map_err(kvm("get CPUID"))?;
    let cpuid_bytes: Vec<u8> = cpuid.as_slice().iter().flat_map(pod).collect();
    let tsc = v.get_tsc_khz().unwrap_or(0);
    Ok(vec![
        (Tag::Regs, pod(&v.get_regs().map_err(kvm("get regs"))?)),
        (Tag::Sregs, pod(&v.get_sregs().map_err(kvm("get sregs"))?)),
        (Tag::Xsave, pod(&v.get_xsave().map_err(kvm("get xsave"))?)),
        (Tag::Xcrs, pod(&v.get_xcrs().map_err(kvm("get xcrs"))?)),
        (Tag::DebugRegs, pod(&v.get_debug_regs().map_err(kvm("get debug regs"))?)),
        (Tag::Lapic, pod(&v.get_lapic().map_err(kvm("get LAPIC"))?)),
        (Tag::Msrs, msr_bytes),
        (Tag::MpState, pod(&v.get_mp_state().map_err(kvm("get MP state"))?)),
        (Tag::Events, pod(&v.get_vcpu_events().map_err(kvm("get events"))?)),
        (Tag::Cpuid, cpuid_bytes),
        (Tag::TscKhz, tsc.to_le_bytes().to_vec()),
    ])
}

/// Saves a stopped VM (after [`LinuxVm::run`] returned, which parks every vCPU but the
/// first) into `dir`, its devices held still for the whole save (see [`save_quiesced`]).
pub fn save(vm: &LinuxVm, dir: &Path) -> Result<(), LinuxSnapshotError> {
    let devices = vm.devices.clone();
    let held = crate::linux::lock_devices(&devices);
    save_quiesced(vm, &held, dir)
}

/// Saves a stopped VM into `dir` while the caller holds its device lock (`held`): device
/// backends (vsock's host sockets, net's tap) write guest memory only through the transports
/// behind that lock, so nothing changes guest RAM or device state between the moment the
/// device state is read and the end of the memory dump. Keep holding it for anything that must
/// match the saved memory (disk copies).
pub fn save_quiesced(
    vm: &LinuxVm,
    held: &[(crate::virtio::mmio::MmioTransport, vmm_sys_util::eventfd::EventFd)],
    dir: &Path,
) -> Result<(), LinuxSnapshotError> {
    let io = |path: PathBuf| move |source| LinuxSnapshotError::Io { path, source };
    let mut sections = Vec::new();
    for (index, vcpu) in vm.vcpus.iter().enumerate() {
        let mut v = crate::vcpus::lock(vcpu);
        if index == 0 {
            // The others completed theirs as they parked.
            crate::vcpus::complete_pending_io(&mut v);
        }
        sections.extend(save_vcpu(vm, &v, dir)?);
    }
    let console = crate::vcpus::lock(&vm.console).state();
    sections.extend([
        (Tag::PicMaster, pod(&irqchip(vm, KVM_IRQCHIP_PIC_MASTER)?)),
        (Tag::PicSlave, pod(&irqchip(vm, KVM_IRQCHIP_PIC_SLAVE)?)),
        (Tag::Ioapic, pod(&irqchip(vm, KVM_IRQCHIP_IOAPIC)?)),
        (Tag::Pit, pod(&vm.vm.get_pit2().map_err(kvm("get PIT"))?)),
        (Tag::Clock, pod(&vm.vm.get_clock().map_err(kvm("get clock"))?)),
        (Tag::Serial, serial_bytes(&console)),
    ]);
    sections.extend(held.iter().map(|(d, _)| (Tag::Device, d.save_state())));
    std::fs::create_dir_all(dir).map_err(io(dir.into()))?;
    let mem_path = dir.join("vm.mem");
    let f = File::create(&mem_path).map_err(io(mem_path.clone()))?;
    crate::sparse::write_sparse(&f, vm.memory.as_slice()).map_err(io(mem_path.clone()))?;
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(vm.memory.size() as u64).to_le_bytes());
    for (tag, bytes) in sections {
        out.extend_from_slice(&(tag as u32).to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    let state = dir.join("vm.state");
    std::fs::write(&state, out).map_err(io(state))
}

fn parse(path: &Path, bytes: &[u8]) -> Result<(u64, Sections), LinuxSnapshotError> {
    let bad = || LinuxSnapshotError::Malformed(path.into());
    if bytes.len() < 52 || &bytes[..8] != MAGIC {
        return Err(bad());
    }
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    let version = u32::from_le_bytes(body[8..12].try_into().map_err(|_| bad())?);
    if !(1..=VERSION).contains(&version) {
        return Err(LinuxSnapshotError::Version(version));
    }
    if Sha256::digest(body).as_slice() != digest {
        return Err(LinuxSnapshotError::Checksum(path.into()));
    }
    let mem = u64::from_le_bytes(body[12..20].try_into().map_err(|_| bad())?);
    let mut sections = Vec::new();
    let mut at = 20;
    while at < body.len() {
        let head = body.get(at..at + 8).ok_or_else(bad)?;
        let tag = u32::from_le_bytes(head[..4].try_into().map_err(|_| bad())?);
        let len = u32::from_le_bytes(head[4..].try_into().map_err(|_| bad())?) as usize;
        let data = body.get(at + 8..at + 8 + len).ok_or_else(bad)?;
        sections.push((tag, data.to_vec()));
        at += 8 + len;
    }
    Ok((mem, Sections(sections)))
}

/// Reads a state file's bytes as a restore does before it touches KVM: header, version,
/// checksum, sections, and every virtio device's saved state; the guest memory size it needs
/// and how many sections it has. (The entry point the snapshot fuzzer drives.)
pub fn parse_state(bytes: &[u8]) -> Result<(u64, usize), LinuxSnapshotError> {
    let (mem, sections) = parse(Path::new("vm.state"), bytes)?;
    for saved in sections.all(Tag::Device) {
        crate::virtio::state::decode(saved)?;
    }
    Ok((mem, sections.0.len()))
}

/// The guest memory size a snapshot in `dir` needs, and its parsed state.
fn read_state(dir: &Path) -> Result<(PathBuf, u64, Sections), LinuxSnapshotError> {
    let state_path = dir.join("vm.state");
    let bytes = std::fs::read(&state_path)
        .map_err(|source| LinuxSnapshotError::Io { path: state_path.clone(), source })?;
    let (mem, sections) = parse(&state_path, &bytes)?;
    Ok((state_path, mem, sections))
}

/// A fresh VM restored from `dir`, ready to [`LinuxVm::run`].
pub fn restore(
    dir: &Path,
    echo_console: bool,
    host: &HostSide,
) -> Result<LinuxVm, LinuxSnapshotError> {
    let (state_path, mem, sections) = read_state(dir)?;
    let vm = LinuxVm::create((mem >> 20) as usize, 1, echo_console)?;
    restore_state(vm, dir, &state_path, &sections, host)
}

/// `vm`, created ahead (a warm VMM's), restored from `dir`: saves creating the KVM VM and its
/// memory on the path to a running sandbox. Its memory size must be the snapshot's.
pub fn restore_into(
    vm: LinuxVm,
    dir: &Path,
    host: &HostSide,
) -> Result<LinuxVm, LinuxSnapshotError> {
    let (state_path, mem, sections) = read_state(dir)?;
    if vm.memory.size() as u64 != mem {
        return Err(LinuxSnapshotError::MemorySize { snapshot: mem, vm: vm.memory.size() as u64 });
    }
    restore_state(vm, dir, &state_path, &sections, host)
}

/// Sets one vCPU's saved state; `nth` finds its section of a kind.
fn restore_vcpu<'a>(
    v: &kvm_ioctls::VcpuFd,
    nth: &dyn Fn(Tag) -> Result<&'a [u8], LinuxSnapshotError>,
    bad: &dyn Fn() -> LinuxSnapshotError,
) -> Result<(), LinuxSnapshotError> {
    let entry_size = std::mem::size_of::<kvm_bindings::kvm_cpuid_entry2>();
    let entries: Vec<kvm_bindings::kvm_cpuid_entry2> =
        nth(Tag::Cpuid)?.chunks(entry_size).filter_map(unpod).collect();
    let cpuid = CpuId::from_entries(&entries).map_err(|_| bad())?;
    v.set_cpuid2(&cpuid).map_err(kvm("set CPUID"))?;
    let tsc = u32::from_le_bytes(nth(Tag::TscKhz)?.try_into().map_err(|_| bad())?);
    if tsc != 0 {
        let _ = v.set_tsc_khz(tsc);
    }
    let mp: kvm_mp_state = unpod(nth(Tag::MpState)?).ok_or_else(bad)?;
    v.set_mp_state(mp).map_err(kvm("set MP state"))?;
    let sregs: kvm_sregs = unpod(nth(Tag::Sregs)?).ok_or_else(bad)?;
    v.set_sregs(&sregs).map_err(kvm("set sregs"))?;
    let regs: kvm_regs = unpod(nth(Tag::Regs)?).ok_or_else(bad)?;
    v.set_regs(&regs).map_err(kvm("set regs"))?;
    let xsave: kvm_xsave = unpod(nth(Tag::Xsave)?).ok_or_else(bad)?;
    // SAFETY: the buffer is a whole kvm_xsave as KVM_GET_XSAVE produced it on this kind of
    // host; KVM checks its contents.
    unsafe { v.set_xsave(&xsave) }.map_err(kvm("set xsave"))?;
    let xcrs: kvm_xcrs = unpod(nth(Tag::Xcrs)?).ok_or_else(bad)?;
    v.set_xcrs(&xcrs).map_err(kvm("set xcrs"))?;
    let dregs: kvm_debugregs = unpod(nth(Tag::DebugRegs)?).ok_or_else(bad)?;
    v.set_debug_regs(&dregs).map_err(kvm("set debug regs"))?;
    let lapic: kvm_lapic_state = unpod(nth(Tag::Lapic)?).ok_or_else(bad)?;
    v.set_lapic(&lapic).map_err(kvm("set LAPIC"))?;
    let msr_entries: Vec<kvm_msr_entry> = nth(Tag::Msrs)?
        .chunks(12)
        .filter(|c| c.len() == 12)
        .map(|c| kvm_msr_entry {
            index: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            data: u64::from_le_bytes([c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]]),
            ..Default::default()
        })
        .collect();
    let msrs = Msrs::from_entries(&msr_entries).map_err(|_| bad())?;
    v.set_msrs(&msrs).map_err(kvm("set MSRs"))?;
    let events: kvm_vcpu_events = unpod(nth(Tag::Events)?).ok_or_else(bad)?;
    v.set_vcpu_events(&events).map_err(kvm("set events"))
}

fn restore_state(
    mut vm: LinuxVm,
    dir: &Path,
    state_path: &Path,
    s: &Sections,
    host: &HostSide,
) -> Result<LinuxVm, LinuxSnapshotError> {
    let bad = || LinuxSnapshotError::Malformed(state_path.to_owned());
    let get = |tag: Tag| s.get(tag).ok_or_else(bad);
    let mem_path = dir.join("vm.mem");
    let file = File::open(&mem_path)
        .map_err(|source| LinuxSnapshotError::Io { path: mem_path.clone(), source })?;
    vm.memory.map_private(&file).map_err(BootError::from)?;
    let mut backends = Vec::new();
    let mut disks = host.disks.iter();
    for (index, saved) in s.all(Tag::Device).enumerate() {
        let saved = crate::virtio::state::decode(saved)?;
        let (device, backend) =
            new_device(saved.transport.device_type, host, &mut disks).ok_or_else(bad)?;
        let transport = crate::virtio::mmio::MmioTransport::restore_saved(device, saved)?;
        vm.attach(transport)?;
        match backend {
            DeviceHostPart::Backend(b) => backends.push((b, index)),
            DeviceHostPart::Balloon(shared) => vm.balloon = Some((index, shared)),
            DeviceHostPart::None => {}
        }
    }

    // VM-wide state first.
    for (tag, chip) in [
        (Tag::PicMaster, KVM_IRQCHIP_PIC_MASTER),
        (Tag::PicSlave, KVM_IRQCHIP_PIC_SLAVE),
        (Tag::Ioapic, KVM_IRQCHIP_IOAPIC),
    ] {
        let mut c: kvm_irqchip = unpod(get(tag)?).ok_or_else(bad)?;
        c.chip_id = chip;
        vm.vm.set_irqchip(&c).map_err(kvm("set irqchip"))?;
    }
    let pit: kvm_pit_state2 = unpod(get(Tag::Pit)?).ok_or_else(bad)?;
    vm.vm.set_pit2(&pit).map_err(kvm("set PIT"))?;
    let mut clock: kvm_clock_data = unpod(get(Tag::Clock)?).ok_or_else(bad)?;
    clock.flags = 0;
    vm.vm.set_clock(&clock).map_err(kvm("set clock"))?;

    // Then each vCPU.
    let count = s.all(Tag::Regs).count();
    if count == 0 {
        return Err(bad());
    }
    vm.add_vcpus(count)?;
    for (index, vcpu) in vm.vcpus.iter().enumerate() {
        let nth = |tag: Tag| s.all(tag).nth(index).ok_or_else(bad);
        restore_vcpu(&crate::vcpus::lock(vcpu), &nth, &bad)?;
    }
    let serial = serial_state(get(Tag::Serial)?).ok_or_else(bad)?;
    vm.restore_console(&serial)?;
    for (backend, index) in backends {
        vm.start_backend(backend, index);
    }
    Ok(vm)
}
