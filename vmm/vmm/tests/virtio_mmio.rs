//! virtio over MMIO with a real guest: the guest reads the transport's registers and notifies a
//! queue through MMIO exits; the test stands in for the rest of the guest driver (writing the
//! queue's rings into guest memory and the setup registers). Plus a fuzz run of random queues
//! and descriptors against the devices: they never panic, never touch memory outside the
//! guest's and never produce more than their caps. virtio-blk and virtio-balloon are driven
//! register by register the same way.

use brig_vmm::guest::CODE_ADDR;
use brig_vmm::memory::GuestMemory;
use brig_vmm::virtio::mmio::MmioTransport;
use brig_vmm::virtio::rng::{Rng, MAX_BYTES_PER_REQUEST};
use brig_vmm::{Vm, VmError};
use rand::{Rng as _, SeedableRng};

const MIB: usize = 1 << 20;
const DESC: u64 = 0x4000;
const AVAIL: u64 = 0x5000;
const USED: u64 = 0x6000;
const BUF: u64 = 0x7000;
const WRITE: u16 = 2;

/// Guest code: read the magic register and answer it; notify queue 0; answer the used index.
const GUEST: [u8; 34] = [
    0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x30, // mov eax, [0x30000000]
    0x66, 0xba, 0x11, 0x00, //                   mov dx, 0x11
    0xef, //                                     out dx, eax
    0xb8, 0x00, 0x00, 0x00, 0x00, //             mov eax, 0
    0x89, 0x04, 0x25, 0x50, 0x00, 0x00, 0x30, // mov [0x30000050], eax
    0x0f, 0xb7, 0x04, 0x25, 0x02, 0x60, 0x00, 0x00, // movzx eax, word [0x6002]
    0xef, //                                     out dx, eax
    0xf4, //                                     hlt
];

fn reg(vm: &mut Vm, base: u64, offset: u64, value: u32) {
    assert!(vm.mmio_write(base + offset, &value.to_le_bytes()), "no device at {base:#x}");
}

fn desc(mem: &mut GuestMemory, index: u64, addr: u64, len: u32, flags: u16, next: u16) {
    let mut d = Vec::new();
    d.extend_from_slice(&addr.to_le_bytes());
    d.extend_from_slice(&len.to_le_bytes());
    d.extend_from_slice(&flags.to_le_bytes());
    d.extend_from_slice(&next.to_le_bytes());
    mem.write(DESC + index * 16, &d).expect("descriptor");
}

/// The driver's setup of queue 0 (size 4) through the transport registers.
fn set_up_queue(vm: &mut Vm, base: u64) {
    reg(vm, base, 0x070, 0x3); // ACKNOWLEDGE | DRIVER
    reg(vm, base, 0x024, 1);
    reg(vm, base, 0x020, 1); // VIRTIO_F_VERSION_1 (bit 32)
    reg(vm, base, 0x070, 0xb); // | FEATURES_OK
    reg(vm, base, 0x030, 0);
    reg(vm, base, 0x038, 4);
    reg(vm, base, 0x080, DESC as u32);
    reg(vm, base, 0x090, AVAIL as u32);
    reg(vm, base, 0x0a0, USED as u32);
    reg(vm, base, 0x044, 1);
    reg(vm, base, 0x070, 0xf); // | DRIVER_OK
}

#[test]
fn a_guest_drives_virtio_rng_through_mmio() {
    let mut vm = Vm::create(16 * MIB).expect("vm");
    vm.boot_test_guest(1).expect("boot");
    vm.memory_mut().write(CODE_ADDR, &GUEST).expect("code");
    let base = vm.attach(MmioTransport::new(Box::new(Rng::default())));
    set_up_queue(&mut vm, base);
    let mem = vm.memory_mut();
    desc(mem, 0, BUF, 64, WRITE, 0);
    desc(mem, 1, BUF + 64, 64, WRITE, 0);
    // A hostile descriptor: far outside guest memory.
    desc(mem, 2, 0xffff_0000_0000, 64, WRITE, 0);
    mem.write(AVAIL, &[0, 0, 3, 0, 0, 0, 1, 0, 2, 0]).expect("avail ring");

    // First answer: the magic value the guest read through an MMIO exit.
    assert_eq!(vm.request(0).expect("magic"), 0x7472_6976);
    // Second: the used index after the guest's notify made the device serve three chains.
    assert_eq!(vm.request(0).expect("used idx"), 3);
    let mut random = [0u8; 128];
    vm.memory().read(BUF, &mut random).expect("buffers");
    assert!(random.iter().filter(|b| **b != 0).count() > 100, "buffers not filled");
    let mut used = [0u8; 28];
    vm.memory().read(USED, &mut used).expect("used ring");
    let len = |i: usize| u32::from_le_bytes(used[8 + i * 8..12 + i * 8].try_into().expect("4"));
    assert_eq!((len(0), len(1), len(2)), (64, 64, 0), "the hostile chain wrote nothing");
    // The guest ends with hlt: a typed outcome, not a crash.
    assert!(matches!(vm.request(0), Err(VmError::GuestDied(_))));
    // An MMIO access where no device is: a typed error too.
    assert!(!vm.mmio_write(0x3100_0000, &[0; 4]));
}

#[test]
fn random_queues_and_descriptors_never_escape() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xb419);
    let mut mem = GuestMemory::anonymous(MIB).expect("memory");
    let view = mem.view().expect("view");
    for round in 0..3000 {
        // Every other round the balloon, which discards guest pages on the guest's word: it
        // must never touch memory outside the guest's.
        let mut dev = if round % 2 == 0 {
            MmioTransport::new(Box::new(Rng::default()))
        } else {
            MmioTransport::new(Box::new(brig_vmm::virtio::balloon::Balloon::new().0))
        };
        // Random register writes, as a confused or hostile driver would make.
        for _ in 0..rng.random_range(0..12) {
            let offset = u64::from(rng.random_range(0u32..0x110)) & !3;
            let value = match rng.random_range(0..4) {
                0 => rng.random::<u32>(),
                1 => rng.random_range(0..0x10000),
                _ => {
                    [0x1u32, 0xf, 4, DESC as u32, AVAIL as u32, USED as u32][rng.random_range(0..6)]
                }
            };
            dev.write(offset, &value.to_le_bytes(), &view);
        }
        for (off, v) in [(0x038u64, 8u32), (0x080, DESC as u32), (0x090, AVAIL as u32)] {
            if rng.random_bool(0.9) {
                dev.write(off, &v.to_le_bytes(), &view);
            }
        }
        dev.write(0x0a0, &(USED as u32).to_le_bytes(), &view);
        dev.write(0x044, &1u32.to_le_bytes(), &view);
        // Random descriptors and avail ring: addresses anywhere, lengths up to 4 GiB, loops.
        for i in 0..16u64 {
            let addr =
                if rng.random_bool(0.5) { rng.random_range(0..MIB as u64) } else { rng.random() };
            let mut d = Vec::new();
            d.extend_from_slice(&addr.to_le_bytes());
            d.extend_from_slice(&rng.random::<u32>().to_le_bytes());
            d.extend_from_slice(&(rng.random::<u16>() & 0x7).to_le_bytes());
            d.extend_from_slice(&rng.random_range(0u16..20).to_le_bytes());
            mem.write(DESC + i * 16, &d).expect("desc");
        }
        let mut avail = vec![0u8, 0];
        avail.extend_from_slice(&rng.random_range(0u16..40).to_le_bytes());
        for _ in 0..8 {
            avail.extend_from_slice(&rng.random_range(0u16..20).to_le_bytes());
        }
        mem.write(AVAIL, &avail).expect("avail");
        mem.write(USED, &[0u8; 4]).expect("used");
        dev.write(0x050, &rng.random_range(0u32..4).to_le_bytes(), &view);
        // Reads of any register at any width are answered.
        let mut out = [0u8; 8];
        dev.read(u64::from(rng.random_range(0u32..0x200)), &mut out[..rng.random_range(1..=8)]);
        let mut used_idx = [0u8; 2];
        mem.read(USED + 2, &mut used_idx).expect("used idx");
        let chains = u64::from(u16::from_le_bytes(used_idx));
        assert!(chains <= 40, "round {round}: {chains} chains used");
    }
}

#[test]
fn a_request_gets_at_most_the_cap_whatever_the_descriptors_say() {
    let mut mem = GuestMemory::anonymous(4 * MIB).expect("memory");
    let view = mem.view().expect("view");
    let mut dev = MmioTransport::new(Box::new(Rng::default()));
    for (off, v) in [
        (0x038u64, 4u32),
        (0x080, DESC as u32),
        (0x090, AVAIL as u32),
        (0x0a0, USED as u32),
        (0x044, 1),
    ] {
        dev.write(off, &v.to_le_bytes(), &view);
    }
    // One chain of three 1 MiB write-only buffers.
    desc(&mut mem, 0, 0x10_0000, MIB as u32, WRITE | 1, 1);
    desc(&mut mem, 1, 0x20_0000, MIB as u32, WRITE | 1, 2);
    desc(&mut mem, 2, 0x30_0000, MIB as u32, WRITE, 0);
    mem.write(AVAIL, &[0, 0, 1, 0, 0, 0]).expect("avail");
    assert!(dev.write(0x050, &0u32.to_le_bytes(), &view), "driver not interrupted");
    let mut used = [0u8; 16];
    mem.read(USED, &mut used).expect("used");
    let written = u32::from_le_bytes(used[8..12].try_into().expect("4"));
    assert_eq!(written as usize, MAX_BYTES_PER_REQUEST);
}

/// A virtio-blk request in guest memory: header, one data buffer, status byte.
fn blk_request(mem: &mut GuestMemory, kind: u32, sector: u64, len: u32, device_writes: bool) {
    let mut header = Vec::new();
    header.extend_from_slice(&kind.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&sector.to_le_bytes());
    mem.write(0x8000, &header).expect("header");
    desc(mem, 0, 0x8000, 16, 1, 1);
    desc(mem, 1, 0x9000, len, 1 | if device_writes { WRITE } else { 0 }, 2);
    desc(mem, 2, 0xa000, 1, WRITE, 0);
}

/// Serves the request in descriptors 0-2 as the `round`-th request; returns the status.
fn blk_serve(
    mem: &mut GuestMemory,
    dev: &mut MmioTransport,
    view: &vm_memory::GuestMemoryMmap,
    round: u16,
) -> u8 {
    mem.write(AVAIL + 4 + u64::from(round) * 2, &0u16.to_le_bytes()).expect("ring slot");
    mem.write(AVAIL + 2, &(round + 1).to_le_bytes()).expect("avail idx");
    mem.write(0xa000, &[0xff]).expect("status");
    dev.write(0x050, &0u32.to_le_bytes(), view);
    let mut status = [0u8];
    mem.read(0xa000, &mut status).expect("status");
    status[0]
}

fn blk_device(mem: &GuestMemory, path: &std::path::Path, read_only: bool) -> MmioTransport {
    let view = mem.view().expect("view");
    let disk = brig_vmm::virtio::blk::Block::open(path, read_only, "disk0").expect("disk");
    let mut dev = MmioTransport::new(Box::new(disk));
    for (off, v) in [
        (0x038u64, 8u32),
        (0x080, DESC as u32),
        (0x090, AVAIL as u32),
        (0x0a0, USED as u32),
        (0x044, 1),
    ] {
        dev.write(off, &v.to_le_bytes(), &view);
    }
    dev
}

#[test]
fn virtio_blk_reads_writes_and_refuses_what_it_must() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("disk.img");
    let pattern: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &pattern).expect("disk");
    let mut mem = GuestMemory::anonymous(MIB).expect("memory");
    let view = mem.view().expect("view");
    let mut dev = blk_device(&mem, &path, false);
    // Capacity in sectors at the start of the config space.
    let mut cap = [0u8; 8];
    dev.read(0x100, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 128);

    blk_request(&mut mem, 0, 2, 1024, true);
    assert_eq!(blk_serve(&mut mem, &mut dev, &view, 0), 0, "read");
    let mut got = vec![0u8; 1024];
    mem.read(0x9000, &mut got).expect("data");
    assert_eq!(got, pattern[1024..2048]);

    mem.write(0x9000, &[0xab; 512]).expect("payload");
    blk_request(&mut mem, 1, 4, 512, false);
    assert_eq!(blk_serve(&mut mem, &mut dev, &view, 1), 0, "write");
    assert_eq!(std::fs::read(&path).expect("disk")[2048..2560], [0xab; 512]);

    // Past the end of the disk, and a buffer in the wrong direction: I/O errors.
    blk_request(&mut mem, 0, 127, 1024, true);
    assert_eq!(blk_serve(&mut mem, &mut dev, &view, 2), 1, "read past the end");
    blk_request(&mut mem, 0, 0, 512, false);
    assert_eq!(blk_serve(&mut mem, &mut dev, &view, 3), 1, "read into a device-readable buffer");
    blk_request(&mut mem, 99, 0, 512, true);
    assert_eq!(blk_serve(&mut mem, &mut dev, &view, 4), 2, "unknown request type");

    // A read-only disk refuses writes and the file stays as it was.
    let mut ro = blk_device(&mem, &path, true);
    let before = std::fs::read(&path).expect("disk");
    mem.write(USED, &[0u8; 4]).expect("used");
    blk_request(&mut mem, 1, 0, 512, false);
    assert_eq!(blk_serve(&mut mem, &mut ro, &view, 0), 1, "write to a read-only disk");
    assert_eq!(std::fs::read(&path).expect("disk"), before);
}

/// Sets up queue `index` (size 4) of `dev` at the test's ring addresses, driver running.
fn ready_queue(dev: &mut MmioTransport, view: &vm_memory::GuestMemoryMmap, index: u32) {
    for (off, v) in [
        (0x070u64, 0x3u32),
        (0x030, index),
        (0x038, 4),
        (0x080, DESC as u32),
        (0x090, AVAIL as u32),
        (0x0a0, USED as u32),
        (0x044, 1),
        (0x070, 0xf),
    ] {
        dev.write(off, &v.to_le_bytes(), view);
    }
}

/// Offers descriptor 0 as the `round`-th request on the queue and notifies queue `index`.
fn offer(
    mem: &mut GuestMemory,
    dev: &mut MmioTransport,
    view: &vm_memory::GuestMemoryMmap,
    index: u32,
    round: u16,
) {
    mem.write(AVAIL + 4 + u64::from(round) * 2, &0u16.to_le_bytes()).expect("ring slot");
    mem.write(AVAIL + 2, &(round + 1).to_le_bytes()).expect("avail idx");
    dev.write(0x050, &index.to_le_bytes(), view);
}

fn used_idx(mem: &GuestMemory) -> u16 {
    let mut b = [0u8; 2];
    mem.read(USED + 2, &mut b).expect("used idx");
    u16::from_le_bytes(b)
}

#[test]
fn virtio_balloon_discards_what_the_guest_reports_and_nothing_else() {
    use brig_vmm::virtio::balloon::Balloon;
    use std::sync::atomic::Ordering;
    const SIZE: usize = 4 * MIB;
    let mut mem = GuestMemory::anonymous(SIZE).expect("memory");
    let view = mem.view().expect("view");
    mem.write(0x20_0000, &vec![0xaa; 2 * MIB]).expect("fill");
    let (balloon, shared) = Balloon::new();
    let mut dev = MmioTransport::new(Box::new(balloon));

    // Free-page reporting (queue 2): a 1 MiB block comes back as zeros, its neighbour stays.
    ready_queue(&mut dev, &view, 2);
    desc(&mut mem, 0, 0x20_0000, MIB as u32, WRITE, 0);
    offer(&mut mem, &mut dev, &view, 2, 0);
    assert_eq!(used_idx(&mem), 1, "the report was not returned");
    let mut page = vec![0u8; 4096];
    mem.read(0x20_0000, &mut page).expect("read");
    assert!(page.iter().all(|b| *b == 0), "reported memory still holds its old contents");
    mem.read(0x2f_f000, &mut page).expect("read");
    assert!(page.iter().all(|b| *b == 0), "the end of the reported block was kept");
    mem.read(0x30_0000, &mut page).expect("read");
    assert!(page.iter().all(|b| *b == 0xaa), "memory past the report was discarded");
    assert_eq!(shared.reported_bytes.load(Ordering::Relaxed), MIB as u64);

    // A report reaching past guest memory, or partly covering pages, discards nothing outside
    // whole pages inside guest memory.
    desc(&mut mem, 0, 0x30_0000, (4 * MIB) as u32, WRITE, 0);
    offer(&mut mem, &mut dev, &view, 2, 1);
    desc(&mut mem, 0, 0x30_0800, 0x1000, WRITE, 0);
    offer(&mut mem, &mut dev, &view, 2, 2);
    // A report in a device-readable buffer is not what Linux sends: skipped.
    desc(&mut mem, 0, 0x30_0000, 0x1000, 0, 0);
    offer(&mut mem, &mut dev, &view, 2, 3);
    assert_eq!(used_idx(&mem), 4);
    mem.read(0x30_0000, &mut page).expect("read");
    assert!(page.iter().all(|b| *b == 0xaa), "a bad report discarded memory");
    assert_eq!(shared.reported_bytes.load(Ordering::Relaxed), MIB as u64);

    // Inflation (queue 0): the frame numbers' pages are discarded; frame numbers outside
    // guest memory are ignored.
    let mut dev2 = MmioTransport::new(Box::new(Balloon::with_shared(shared.clone())));
    mem.write(USED, &[0u8; 4]).expect("used");
    ready_queue(&mut dev2, &view, 0);
    let pfns: Vec<u8> = [0x350u32, 0xffff_ff00].iter().flat_map(|p| p.to_le_bytes()).collect();
    mem.write(0x8000, &pfns).expect("pfns");
    desc(&mut mem, 0, 0x8000, 8, 0, 0);
    offer(&mut mem, &mut dev2, &view, 0, 0);
    mem.read(0x35_0000, &mut page).expect("read");
    assert!(page.iter().all(|b| *b == 0), "the inflated page kept its contents");
    mem.read(0x35_1000, &mut page).expect("read");
    assert!(page.iter().all(|b| *b == 0xaa), "a page next to the inflated one was discarded");
    assert_eq!(shared.inflated_bytes.load(Ordering::Relaxed), 4096);

    // The host's target is in the config space; the driver's `actual` comes back.
    shared.set_target_mib(8);
    let mut word = [0u8; 4];
    dev2.read(0x100, &mut word);
    assert_eq!(u32::from_le_bytes(word), 2048);
    dev2.write(0x104, &1024u32.to_le_bytes(), &view);
    assert_eq!(shared.actual_mib(), 4);
    // A configuration change interrupts a running driver and bumps the generation.
    let mut generation = [0u8; 4];
    dev2.read(0x0fc, &mut generation);
    assert!(dev2.config_changed());
    let mut after = [0u8; 4];
    dev2.read(0x0fc, &mut after);
    assert_ne!(generation, after);
    dev2.read(0x060, &mut word);
    assert_eq!(u32::from_le_bytes(word) & 2, 2, "no configuration-change interrupt");
}
