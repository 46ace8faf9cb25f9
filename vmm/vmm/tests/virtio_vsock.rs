//! The userspace virtio-vsock device and its Unix-socket backend, driven the way the guest's
//! driver would (the test writes the rings into guest memory and the transport's registers):
//! a host connection's `CONNECT` handshake, data both ways, hang-up; then a fuzz run of random
//! packets and descriptor chains, after which the device still serves a clean connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use brig_vmm::virtio::mmio::MmioTransport;
use brig_vmm::virtio::vsock::{Vsock, VsockBackend};
use rand::{Rng as _, SeedableRng};

mod common;

use common::{Rings, QUEUE_SIZE};

const GUEST_CID: u64 = 3;
const HEADER: usize = 44;
const RX_BUF_LEN: u32 = 0x2000;

/// The test's stand-in for the guest driver.
struct Driver {
    rings: Rings,
    backend: VsockBackend,
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
        let (dev, backend) = Vsock::new(GUEST_CID, &dir.path().join("v.sock")).expect("vsock");
        let rings = Rings::new(MmioTransport::new(Box::new(dev)), 3, RX_BUF_LEN);
        Driver { rings, backend, _dir: dir }
    }

    fn uds(&self) -> std::path::PathBuf {
        self.backend.path.clone()
    }

    fn send(&mut self, bytes: &[u8]) {
        self.rings.send(bytes);
    }

    /// Lets the backend read the host sockets and deliver to the guest; then the packets the
    /// guest received since last time, its RX buffers given back.
    fn receive(&mut self) -> Vec<Received> {
        for _ in 0..50 {
            if self.backend.step() {
                self.rings.dev.poll(&self.rings.view);
            }
            if self.rings.used_idx(0) != self.rings.rx_seen {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut out = Vec::new();
        for buf in self.rings.take_received() {
            if buf.len() >= HEADER {
                let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4"));
                let op = u16::from_le_bytes(buf[30..32].try_into().expect("2"));
                out.push((op, u32_at(16), u32_at(20), buf[HEADER..].to_vec()));
            }
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
            let head = d.rings.tx_next % QUEUE_SIZE;
            d.rings.desc(
                1,
                head,
                rng.random(),
                rng.random(),
                rng.random::<u16>() & 7,
                rng.random_range(0..QUEUE_SIZE),
            );
            d.rings.offer_tx(head);
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

/// A host reader that takes nothing for a while: the guest's data waits in the connection's
/// buffer instead of holding the vCPU thread (each send returns at once), arrives whole and in
/// order once the host reads, frees credit for the guest as it goes out, and a guest that sends
/// past the window it was granted has its connection reset rather than growing the buffer.
#[test]
fn a_slow_host_reader_never_stalls_the_guest_and_loses_nothing() {
    let mut d = Driver::new();
    let (mut host, host_port) = d.connect(1024);
    let window = 256usize << 10;
    let chunk = 32usize << 10;
    let data: Vec<u8> = (0..window).map(|i| (i * 7 % 251) as u8).collect();
    let started = std::time::Instant::now();
    for piece in data.chunks(chunk) {
        d.send(&packet(1024, host_port, 5, piece, 64 << 10));
    }
    // Before, a full socket made each packet wait up to a second on the vCPU thread.
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "sending the window took {:?}",
        started.elapsed()
    );
    // The host reads it all while the backend writes out what waits.
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; window];
        host.read_exact(&mut got).map(|_| (got, host))
    });
    let mut updates = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        updates += d.receive().iter().filter(|p| p.0 == 6).count();
    }
    let (got, mut host) = reader.join().expect("reader").expect("the host read the window");
    assert!(got == data, "the guest's bytes arrived changed or out of order");
    updates += d.receive().iter().filter(|p| p.0 == 6).count();
    assert!(updates > 0, "the guest never heard of the space that was freed");
    // Past the window, with the host reading nothing: the connection is reset.
    let flood = vec![0x55u8; chunk];
    let mut reset = false;
    for _ in 0..(2 * window / chunk + 8) {
        d.send(&packet(1024, host_port, 5, &flood, 64 << 10));
        if d.receive().iter().any(|p| p.0 == 3 && p.2 == 1024) {
            reset = true;
            break;
        }
    }
    assert!(reset, "a guest ignoring its credit was never reset");
    host.get_mut().set_nonblocking(true).expect("nonblocking");
    let mut sink = vec![0u8; 1 << 20];
    while matches!(host.get_mut().read(&mut sink), Ok(n) if n > 0) {}
}

/// A device restored from a snapshot has lost its host sockets: it tells the driver with a
/// transport reset event (so the guest drops its connections at once), and only then delivers
/// new connections, which work as before.
#[test]
fn a_restored_device_resets_the_transport_then_serves_new_connections() {
    let mut d = Driver::new();
    let (_old, _) = d.connect(1024);
    // The driver keeps event buffers available on queue 2 (4 bytes: virtio_vsock_event).
    const EVENT_BUF: u64 = 0xd000;
    d.rings.desc(2, 0, EVENT_BUF, 4, common::WRITE, 0);
    d.rings.put_avail(2, 0, 0);
    d.rings.set_avail_idx(2, 1);
    d.rings.mem.write(EVENT_BUF, &[0xff; 4]).expect("poison");
    let saved = d.rings.dev.save_state();

    // The snapshot's VM comes back in a new VMM: new device, new socket, same queues.
    let dir = tempfile::tempdir().expect("tmp");
    let (dev, backend) = Vsock::new(GUEST_CID, &dir.path().join("v2.sock")).expect("vsock");
    d.rings.dev = MmioTransport::restore(Box::new(dev), &saved).expect("restore");
    d.backend = backend;
    assert_eq!(d.rings.used_idx(2), 0);
    let rx_used = d.rings.used_idx(0);
    let mut host = UnixStream::connect(d.uds()).expect("connect");
    writeln!(host, "CONNECT 2048").expect("connect line");
    // First round: the reset event alone, nothing on RX yet.
    assert!(d.backend.step(), "the backend reports the pending reset");
    assert!(d.rings.dev.poll(&d.rings.view), "the reset interrupts the driver");
    assert_eq!(d.rings.used_idx(2), 1, "one event used");
    let mut event = [0u8; 4];
    d.rings.mem.read(EVENT_BUF, &mut event).expect("event");
    assert_eq!(u32::from_le_bytes(event), 0, "VIRTIO_VSOCK_EVENT_TRANSPORT_RESET");
    assert_eq!(d.rings.used_idx(0), rx_used, "no connection request before the reset was taken");
    // Then the new connection's request, and bytes both ways.
    let got = d.receive();
    let request = got.iter().find(|p| p.0 == 1).unwrap_or_else(|| panic!("no REQUEST: {got:?}"));
    let host_port = request.1;
    d.send(&packet(2048, host_port, 2, &[], 64 << 10));
    let mut reader = BufReader::new(host);
    let mut line = String::new();
    reader.read_line(&mut line).expect("OK line");
    assert_eq!(line, format!("OK {host_port}\n"));
    d.send(&packet(2048, host_port, 5, b"after restore", 64 << 10));
    let mut got = [0u8; 13];
    reader.read_exact(&mut got).expect("bytes");
    assert_eq!(&got, b"after restore");
    assert_eq!(d.rings.used_idx(2), 1, "the reset is sent once");
}
