//! The userspace virtio-vsock device and its Unix-socket backend, driven the way the guest's
//! driver would (the test writes the rings into guest memory and the transport's registers):
//! a host connection's `CONNECT` handshake, data both ways, hang-up; then a fuzz run of random
//! packets and descriptor chains, after which the device still serves a clean connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use brig_vmm::memory::GuestMemory;
use brig_vmm::virtio::mmio::MmioTransport;
use brig_vmm::virtio::vsock::{Vsock, VsockBackend};
use rand::{Rng as _, SeedableRng};

const GUEST_CID: u64 = 3;
const HEADER: usize = 44;
const QUEUE_SIZE: u16 = 16;
/// Ring addresses of queues 0 (RX), 1 (TX) and 2 (events): descriptors, avail, used.
const RINGS: [(u64, u64, u64); 3] =
    [(0x4000, 0x5000, 0x6000), (0x7000, 0x8000, 0x9000), (0xa000, 0xb000, 0xc000)];
const RX_BUFS: u64 = 0x2_0000;
const RX_BUF_LEN: u32 = 0x2000;
const TX_BUF: u64 = 0x8_0000;
const WRITE: u16 = 2;

/// The test's stand-in for the guest driver.
struct Driver {
    mem: GuestMemory,
    view: vm_memory::GuestMemoryMmap,
    dev: MmioTransport,
    backend: VsockBackend,
    tx_next: u16,
    rx_seen: u16,
    _dir: tempfile::TempDir,
}

fn packet(src_port: u32, dst_port: u32, op: u16, payload: &[u8], buf_alloc: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER + payload.len());
    h.extend_from_slice(&GUEST_CID.to_le_bytes());
    h.extend_from_slice(&2u64.to_le_bytes());
    h.extend_from_slice(&src_port.to_le_bytes());
    h.extend_from_slice(&dst_port.to_le_bytes());
    h.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes()); // stream
    h.extend_from_slice(&op.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // flags
    h.extend_from_slice(&buf_alloc.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // fwd_cnt
    h.extend_from_slice(payload);
    h
}

/// A packet the device put in an RX buffer: (op, src_port, dst_port, payload).
type Received = (u16, u32, u32, Vec<u8>);

impl Driver {
    fn new() -> Driver {
        let dir = tempfile::tempdir().expect("tmp");
        let mem = GuestMemory::anonymous(1 << 20).expect("memory");
        let view = mem.view().expect("view");
        let (dev, backend) = Vsock::new(GUEST_CID, &dir.path().join("v.sock")).expect("vsock");
        let mut dev = MmioTransport::new(Box::new(dev));
        let reg =
            |dev: &mut MmioTransport, off: u64, v: u32| dev.write(off, &v.to_le_bytes(), &view);
        reg(&mut dev, 0x070, 0x3);
        for (i, (desc, avail, used)) in RINGS.iter().enumerate() {
            reg(&mut dev, 0x030, i as u32);
            reg(&mut dev, 0x038, u32::from(QUEUE_SIZE));
            reg(&mut dev, 0x080, *desc as u32);
            reg(&mut dev, 0x090, *avail as u32);
            reg(&mut dev, 0x0a0, *used as u32);
            reg(&mut dev, 0x044, 1);
        }
        reg(&mut dev, 0x070, 0xf);
        let mut d = Driver { mem, view, dev, backend, tx_next: 0, rx_seen: 0, _dir: dir };
        // Every RX descriptor is a device-writable buffer, all offered at once.
        for i in 0..QUEUE_SIZE {
            d.desc(0, i, RX_BUFS + u64::from(i) * u64::from(RX_BUF_LEN), RX_BUF_LEN, WRITE, 0);
            d.put_avail(0, i, i);
        }
        d.set_avail_idx(0, QUEUE_SIZE);
        d
    }

    fn uds(&self) -> std::path::PathBuf {
        self.backend.path.clone()
    }

    fn desc(&mut self, queue: usize, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = Vec::new();
        d.extend_from_slice(&addr.to_le_bytes());
        d.extend_from_slice(&len.to_le_bytes());
        d.extend_from_slice(&flags.to_le_bytes());
        d.extend_from_slice(&next.to_le_bytes());
        self.mem.write(RINGS[queue].0 + u64::from(index) * 16, &d).expect("descriptor");
    }

    fn put_avail(&mut self, queue: usize, slot: u16, head: u16) {
        let at = RINGS[queue].1 + 4 + u64::from(slot % QUEUE_SIZE) * 2;
        self.mem.write(at, &head.to_le_bytes()).expect("avail slot");
    }

    fn set_avail_idx(&mut self, queue: usize, idx: u16) {
        self.mem.write(RINGS[queue].1 + 2, &idx.to_le_bytes()).expect("avail idx");
    }

    fn used_idx(&self, queue: usize) -> u16 {
        let mut b = [0u8; 2];
        self.mem.read(RINGS[queue].2 + 2, &mut b).expect("used idx");
        u16::from_le_bytes(b)
    }

    /// The guest sends one packet on TX (one device-readable descriptor) and notifies.
    fn send(&mut self, bytes: &[u8]) {
        self.mem.write(TX_BUF, bytes).expect("tx buffer");
        let slot = self.tx_next;
        self.desc(1, slot % QUEUE_SIZE, TX_BUF, bytes.len() as u32, 0, 0);
        self.put_avail(1, slot, slot % QUEUE_SIZE);
        self.tx_next = slot.wrapping_add(1);
        self.set_avail_idx(1, self.tx_next);
        self.dev.write(0x050, &1u32.to_le_bytes(), &self.view);
    }

    /// Lets the backend read the host sockets and deliver to the guest; then the packets the
    /// guest received since last time, its RX buffers given back.
    fn receive(&mut self) -> Vec<Received> {
        for _ in 0..50 {
            if self.backend.step() {
                self.dev.poll(&self.view);
            }
            if self.used_idx(0) != self.rx_seen {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut out = Vec::new();
        while self.rx_seen != self.used_idx(0) {
            let at = RINGS[0].2 + 4 + u64::from(self.rx_seen % QUEUE_SIZE) * 8;
            let mut elem = [0u8; 8];
            self.mem.read(at, &mut elem).expect("used elem");
            let id = u32::from_le_bytes(elem[..4].try_into().expect("4")) as u16;
            let len = u32::from_le_bytes(elem[4..].try_into().expect("4")) as usize;
            let mut buf = vec![0u8; len];
            self.mem.read(RX_BUFS + u64::from(id) * u64::from(RX_BUF_LEN), &mut buf).expect("rx");
            if len >= HEADER {
                let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4"));
                let op = u16::from_le_bytes(buf[30..32].try_into().expect("2"));
                out.push((op, u32_at(16), u32_at(20), buf[HEADER..].to_vec()));
            }
            // Offer the buffer again.
            let avail = self.rx_seen.wrapping_add(QUEUE_SIZE);
            self.put_avail(0, avail, id);
            self.set_avail_idx(0, avail.wrapping_add(1));
            self.rx_seen = self.rx_seen.wrapping_add(1);
        }
        out
    }

    /// A host connection to guest port `port`, through the handshake; returns the stream
    /// and the host-side port the device chose.
    fn connect(&mut self, port: u32) -> (BufReader<UnixStream>, u32) {
        let mut host = UnixStream::connect(self.uds()).expect("connect");
        host.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        writeln!(host, "CONNECT {port}").expect("connect line");
        let got = self.receive();
        let request =
            got.iter().find(|p| p.0 == 1).unwrap_or_else(|| panic!("no REQUEST: {got:?}"));
        assert_eq!(request.2, port, "REQUEST to the wrong port");
        let host_port = request.1;
        self.send(&packet(port, host_port, 2, &[], 64 << 10));
        let mut reader = BufReader::new(host);
        let mut line = String::new();
        reader.read_line(&mut line).expect("OK line");
        // As Firecracker answers: OK and the host-side port of the new connection.
        assert_eq!(line, format!("OK {host_port}\n"));
        (reader, host_port)
    }
}

#[test]
fn a_host_connection_carries_bytes_both_ways_and_hangs_up() {
    let mut d = Driver::new();
    let (mut host, host_port) = d.connect(1024);
    // Guest to host.
    d.send(&packet(1024, host_port, 5, b"hello host", 64 << 10));
    let mut got = [0u8; 10];
    host.read_exact(&mut got).expect("bytes from the guest");
    assert_eq!(&got, b"hello host");
    // Host to guest, as RW packets within the credit the guest granted.
    host.get_mut().write_all(b"hello guest").expect("write");
    let packets = d.receive();
    let data: Vec<u8> = packets.iter().filter(|p| p.0 == 5).flat_map(|p| p.3.clone()).collect();
    assert_eq!(data, b"hello guest", "{packets:?}");
    assert!(packets.iter().all(|p| p.1 == host_port && p.2 == 1024));
    // A packet for a connection that does not exist gets a reset.
    d.send(&packet(1024, 77, 5, b"stray", 64 << 10));
    let packets = d.receive();
    assert!(packets.iter().any(|p| p.0 == 3 && p.2 == 1024), "no RST: {packets:?}");
    // The host hangs up: the guest is told to shut the stream down.
    drop(host);
    let packets = d.receive();
    assert!(packets.iter().any(|p| p.0 == 4), "no SHUTDOWN after hang-up: {packets:?}");
    // A second connection works as the first.
    let (mut again, port) = d.connect(1024);
    d.send(&packet(1024, port, 5, b"again", 64 << 10));
    let mut five = [0u8; 5];
    again.read_exact(&mut five).expect("bytes");
    assert_eq!(&five, b"again");
}

#[test]
fn random_packets_and_chains_never_break_the_device() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x50c4);
    let mut d = Driver::new();
    let (mut host, host_port) = d.connect(1024);
    for round in 0..3000u32 {
        let mut bytes = vec![0u8; rng.random_range(0..200)];
        rng.fill(&mut bytes[..]);
        if rng.random_bool(0.5) && bytes.len() >= HEADER {
            // A mostly plausible header with random op, ports, length and credit.
            let fake = packet(
                if rng.random_bool(0.5) { 1024 } else { rng.random() },
                if rng.random_bool(0.5) { host_port } else { rng.random() },
                rng.random_range(0..9),
                &[],
                rng.random(),
            );
            bytes[..HEADER].copy_from_slice(&fake);
            bytes[24..28].copy_from_slice(&rng.random::<u32>().to_le_bytes());
        }
        if rng.random_bool(0.2) {
            // A chain with a random descriptor: anywhere, any length, maybe a loop.
            let slot = d.tx_next;
            let head = slot % QUEUE_SIZE;
            d.desc(
                1,
                head,
                rng.random(),
                rng.random(),
                rng.random::<u16>() & 7,
                rng.random_range(0..QUEUE_SIZE),
            );
            d.put_avail(1, slot, head);
            d.tx_next = slot.wrapping_add(1);
            d.set_avail_idx(1, d.tx_next);
            d.dev.write(0x050, &1u32.to_le_bytes(), &d.view);
        } else {
            d.send(&bytes);
        }
        // The last thousand rounds the guest takes no answers at all.
        if round % 50 == 0 && round < 1000 {
            d.receive();
        }
    }
    // The host side may have been reset by the fuzz; a fresh connection still works. The
    // guest took none of the answers for a while: the device kept at most a bounded backlog.
    let _ = host.get_mut().write_all(b"x");
    let mut backlog = 0;
    loop {
        let got = d.receive().len();
        if got == 0 {
            break;
        }
        backlog += got;
    }
    assert!(backlog > 100, "the flood produced only {backlog} answers");
    assert!(backlog <= 1100, "{backlog} packets were waiting for the guest");
    let (mut fresh, port) = d.connect(2048);
    d.send(&packet(2048, port, 5, b"still serving", 64 << 10));
    let mut got = [0u8; 13];
    fresh.read_exact(&mut got).expect("bytes after the fuzz");
    assert_eq!(&got, b"still serving");
}
