//! The userspace virtio-net device on a real tap, driven the way the guest's driver would (the
//! test writes the rings into guest memory and the transport's registers). The test runs in a
//! network namespace of its own, where the tap is created, and plays the outside world with a
//! raw packet socket on the tap: a frame the guest transmits comes out of the tap, a frame
//! sent into the tap lands in a receive buffer behind a virtio-net header; frames for a guest
//! that posts no buffers wait in a bounded queue; random chains never break the device.
#![allow(unsafe_code)]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use brig_vmm::virtio::mmio::MmioTransport;
use brig_vmm::virtio::net::{Net, NetBackend, HEADER, MAX_WAITING};
use brig_vmm::virtio::Backend;
use common::{Rings, QUEUE_SIZE};
use rand::{Rng as _, SeedableRng};

const TAP: &str = "brigtest0";
const MAC: [u8; 6] = [0x06, 0xb7, 0x16, 0, 0, 2];
/// An experimental EtherType, so frames the kernel sends on its own are told apart.
const ETHERTYPE: [u8; 2] = [0x88, 0xb5];

fn frame(src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&src);
    f.extend_from_slice(&ETHERTYPE);
    f.extend_from_slice(payload);
    f.resize(f.len().max(60), 0);
    f
}

fn ours(f: &[u8]) -> bool {
    f.get(12..14) == Some(&ETHERTYPE[..])
}

/// A raw packet socket bound to the tap (the wire's other end).
fn wire() -> OwnedFd {
    // SAFETY: plain socket/bind/setsockopt calls on a descriptor we own; the sockaddr_ll and
    // timeval are initialized and their sizes passed.
    unsafe {
        let fd =
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW, (libc::ETH_P_ALL as u16).to_be() as i32);
        assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
        let name = std::ffi::CString::new(TAP).expect("name");
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        let rc = libc::bind(
            fd,
            &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as u32,
        );
        OwnedFd::from_raw_fd(fd)
    }
}

fn wire_send(fd: &OwnedFd, f: &[u8]) {
    // SAFETY: `f` is a live buffer of the given length.
    let n = unsafe { libc::send(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    assert_eq!(n, f.len() as isize, "send: {}", std::io::Error::last_os_error());
}

/// Our frames seen on the wire within a short wait.
fn wire_receive(fd: &OwnedFd) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 2048];
    loop {
        // SAFETY: `buf` is a live buffer of the given length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return out;
        }
        if ours(&buf[..n as usize]) {
            out.push(buf[..n as usize].to_vec());
        }
    }
}

/// A device on a new tap in a network namespace of this test's own, with the wire's end.
fn set_up() -> (Rings, NetBackend, OwnedFd) {
    // SAFETY: unshare only moves this thread (and what it starts) into a new network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare (needs root)");
    let tap = brig_vmm::virtio::net::open_tap(TAP).expect("tap");
    let up = std::process::Command::new("ip").args(["link", "set", TAP, "up"]).status();
    assert!(up.expect("ip").success());
    let (dev, backend) = Net::new(MAC, Arc::new(tap));
    let rings = Rings::new(MmioTransport::new(Box::new(dev)), 2, 2048);
    (rings, backend, wire())
}

/// Lets the backend read the tap and deliver; then our frames the guest received.
fn guest_receive(rings: &mut Rings, backend: &NetBackend) -> Vec<Vec<u8>> {
    for _ in 0..50 {
        backend.wait(Duration::from_millis(10));
        if backend.step() {
            rings.dev.poll(&rings.view);
        }
        if rings.used_idx(0) != rings.rx_seen {
            break;
        }
    }
    let got = rings.take_received();
    for buf in &got {
        assert!(buf.len() >= HEADER, "a receive buffer without a virtio-net header");
        assert_eq!(&buf[..HEADER], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0], "header");
    }
    got.into_iter().map(|b| b[HEADER..].to_vec()).filter(|f| ours(f)).collect()
}

#[test]
fn frames_cross_between_the_guest_and_the_tap_both_ways() {
    let (mut rings, backend, wire) = set_up();
    // The MAC is in the config space, the guest may read it byte by byte.
    let mut mac = [0u8; 6];
    for (i, b) in mac.iter_mut().enumerate() {
        let mut one = [0u8; 1];
        rings.dev.read(0x100 + i as u64, &mut one);
        *b = one[0];
    }
    assert_eq!(mac, MAC);

    // Guest to wire: the header is stripped, the frame arrives whole.
    let out = frame(MAC, b"from the guest");
    let mut packet = vec![0u8; HEADER];
    packet.extend_from_slice(&out);
    rings.send(&packet);
    let seen = wire_receive(&wire);
    assert_eq!(seen, vec![out], "the wire saw something else");

    // Wire to guest.
    let inbound = frame([2, 0, 0, 0, 0, 9], b"from the wire");
    wire_send(&wire, &inbound);
    assert_eq!(guest_receive(&mut rings, &backend), vec![inbound]);
}

#[test]
fn a_guest_without_buffers_costs_bounded_memory_and_random_chains_are_harmless() {
    let (mut rings, backend, wire) = set_up();
    // The guest takes nothing: its 16 buffers fill, and at most MAX_WAITING frames wait.
    for i in 0..(MAX_WAITING + 200) {
        wire_send(&wire, &frame([2, 0, 0, 0, 0, 9], &(i as u32).to_le_bytes()));
        if i % 32 == 0 {
            backend.step();
            rings.dev.poll(&rings.view);
        }
    }
    for _ in 0..5 {
        backend.step();
        rings.dev.poll(&rings.view);
    }
    assert_eq!(rings.used_idx(0), QUEUE_SIZE, "every posted buffer was used");
    // Draining delivers what waited, in order, and never more than the bound.
    let mut delivered = Vec::new();
    for _ in 0..100 {
        let got = guest_receive(&mut rings, &backend);
        if got.is_empty() {
            break;
        }
        delivered.extend(got);
    }
    let numbers: Vec<u32> =
        delivered.iter().map(|f| u32::from_le_bytes(f[14..18].try_into().expect("4"))).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "out of order: {numbers:?}");
    assert!(numbers.len() >= QUEUE_SIZE as usize, "only {} delivered", numbers.len());

    // Random chains on TX: any address, length, flags, loops.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e7);
    for _ in 0..3000 {
        let head = rings.tx_next % QUEUE_SIZE;
        let addr = if rng.random_bool(0.5) { rng.random() } else { rng.random_range(0..1 << 20) };
        let next = rng.random_range(0..QUEUE_SIZE);
        rings.desc(1, head, addr, rng.random(), rng.random::<u16>() & 7, next);
        rings.offer_tx(head);
    }
    // Still serving both ways.
    let out = frame(MAC, b"after the fuzz");
    let mut packet = vec![0u8; HEADER];
    packet.extend_from_slice(&out);
    wire_receive(&wire);
    rings.send(&packet);
    assert!(wire_receive(&wire).contains(&out));
    let inbound = frame([2, 0, 0, 0, 0, 9], b"and back");
    wire_send(&wire, &inbound);
    assert!(guest_receive(&mut rings, &backend).contains(&inbound));
}
