//! virtio-net over a tap device, in userspace (there is no vhost here). No offloads are
//! offered, so every frame is a plain Ethernet frame behind a zeroed 12-byte `virtio_net_hdr`
//! (VIRTIO_F_VERSION_1 layout), and the tap carries no header of its own (`IFF_NO_PI`, no
//! `IFF_VNET_HDR`). The device offers its MAC address (VIRTIO_NET_F_MAC); queue 0 is receive,
//! queue 1 transmit.
//!
//! Threads: the vCPU thread serves the driver's notifications (transmitted frames go to the
//! tap, new receive buffers get frames that were waiting); a backend thread reads the tap and,
//! holding the device's lock, asks the transport to deliver (see [`NetBackend`]). At most
//! [`MAX_WAITING`] frames wait for receive buffers; a guest that never posts any loses frames,
//! not host memory.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

use super::state::{DeviceState, DeviceStateError};
use super::{DeviceError, VirtioDevice};

/// A net device's own saved state: frames from the tap the guest had not taken yet, so a
/// snapshot loses no received frame (at most [`MAX_WAITING`] of at most [`MAX_FRAME`] bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetState {
    pub waiting: Vec<Vec<u8>>,
}

impl NetState {
    /// The version 1 bytes (`count u32 | (len u32 | frame)…`).
    pub(crate) fn from_v1(bytes: &[u8]) -> Option<NetState> {
        parse_waiting(bytes).map(|frames| NetState { waiting: frames.into() })
    }

    fn within_bounds(&self) -> bool {
        self.waiting.len() <= MAX_WAITING && self.waiting.iter().all(|f| f.len() <= MAX_FRAME)
    }
}

pub const DEVICE_TYPE: u32 = 1;
/// `virtio_net_hdr` with `num_buffers` (VIRTIO_F_VERSION_1).
pub const HEADER: usize = 12;
const F_MAC: u64 = 1 << 5;
/// Largest frame taken from the guest or the tap (no TSO: an MTU-sized frame and then some).
pub const MAX_FRAME: usize = 65_550;
/// Frames kept for a guest that has no receive buffer free.
pub const MAX_WAITING: usize = 256;
const QUEUE_SIZES: [u16; 2] = [256, 256];
const RX: usize = 0;
const TX: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("/dev/net/tun: {0}")]
    Open(#[source] std::io::Error),
    #[error("attaching to tap {name:?}: {source}")]
    Attach {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("tap name {0:?} is empty or longer than 15 bytes")]
    Name(String),
}

/// Opens the tap device `name` (created by the host, e.g. in the sandbox's network namespace;
/// attaching to it needs CAP_NET_ADMIN, so do it before entering the jail).
pub fn open_tap(name: &str) -> Result<File, NetError> {
    if name.is_empty() || name.len() > 15 || name.contains('\0') {
        return Err(NetError::Name(name.into()));
    }
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(NetError::Open)?;
    // struct ifreq: 16 bytes of name, then the flags (a short) in the union.
    let mut ifreq = [0u8; 40];
    ifreq[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TAP | libc::IFF_NO_PI) as u16;
    ifreq[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq (40 bytes on x86_64), which `ifreq`
    // is, and `tun` is an open /dev/net/tun descriptor.
    let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF as _, ifreq.as_mut_ptr()) };
    if rc < 0 {
        return Err(NetError::Attach {
            name: name.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(tun)
}

/// Frames from the tap waiting for the guest's receive buffers, and counters.
#[derive(Debug, Default)]
pub struct NetShared {
    waiting: VecDeque<Vec<u8>>,
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Frames dropped: no room to wait, or larger than the guest's buffer.
    pub dropped: u64,
}

/// The device (lives in the transport, driven by the vCPU thread).
#[derive(Debug)]
pub struct Net {
    mac: [u8; 6],
    tap: Arc<File>,
    shared: Arc<Mutex<NetShared>>,
}

impl Net {
    /// A device with address `mac` on the open tap `tap`; returns it and the backend to run on
    /// its own thread.
    pub fn new(mac: [u8; 6], tap: Arc<File>) -> (Net, NetBackend) {
        let shared = Arc::new(Mutex::new(NetShared::default()));
        let backend = NetBackend { tap: tap.clone(), shared: shared.clone() };
        (Net { mac, tap, shared }, backend)
    }

    /// Moves waiting frames into the guest's receive buffers.
    fn deliver(
        shared: &mut NetShared,
        rx: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut used = false;
        while !shared.waiting.is_empty() {
            let Some(chain) = rx.iter(mem)?.next() else { break };
            let head = chain.head_index();
            let Some(frame) = shared.waiting.pop_front() else { break };
            let capacity: usize = chain
                .clone()
                .filter(|d| d.is_write_only())
                .map(|d| d.len() as usize)
                .fold(0usize, usize::saturating_add);
            if HEADER + frame.len() > capacity {
                shared.dropped += 1;
                rx.add_used(mem, head, 0)?;
                used = true;
                continue;
            }
            let mut packet = vec![0u8; HEADER];
            packet[10] = 1; // num_buffers
            packet.extend_from_slice(&frame);
            let written = super::write_chain(chain, mem, &packet);
            shared.rx_frames += 1;
            rx.add_used(mem, head, written as u32)?;
            used = true;
        }
        Ok(used)
    }

    pub fn shared(&self) -> Arc<Mutex<NetShared>> {
        self.shared.clone()
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE
    }

    fn features(&self) -> u64 {
        F_MAC
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.mac, offset, data);
    }

    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let Ok(mut shared) = self.shared.lock() else { return Ok(false) };
        let mut used = false;
        if index == TX {
            let tap = &self.tap;
            used |= super::serve_chains(queues, TX, mem, |chain| {
                let mut frame = Vec::new();
                for desc in chain.filter(|d| !d.is_write_only()) {
                    let n = (desc.len() as usize).min(MAX_FRAME + HEADER - frame.len());
                    let start = frame.len();
                    frame.resize(start + n, 0);
                    if mem.read_slice(&mut frame[start..], desc.addr()).is_err() {
                        frame.truncate(start);
                        break;
                    }
                }
                if frame.len() > HEADER {
                    // A tap takes a frame whole or not at all; a full one (its queue is the
                    // host's to drain) drops the frame, as a wire would.
                    let body = &frame[HEADER..];
                    match (&**tap).write(body) {
                        Ok(n) if n == body.len() => shared.tx_frames += 1,
                        _ => shared.dropped += 1,
                    }
                }
                Ok(0)
            })?;
        }
        if let Some(rx) = queues.get_mut(RX) {
            used |= Net::deliver(&mut shared, rx, mem)?;
        }
        Ok(used)
    }

    fn poll(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> Result<bool, DeviceError> {
        let Ok(mut shared) = self.shared.lock() else { return Ok(false) };
        match queues.get_mut(RX) {
            Some(rx) => Net::deliver(&mut shared, rx, mem),
            None => Ok(false),
        }
    }

    fn save_state(&self) -> DeviceState {
        let Ok(shared) = self.shared.lock() else { return DeviceState::Stateless };
        DeviceState::Net(NetState { waiting: shared.waiting.iter().cloned().collect() })
    }

    fn restore_state(&mut self, state: DeviceState) -> Result<(), DeviceStateError> {
        match state {
            DeviceState::Stateless => Ok(()),
            DeviceState::Net(net) if net.within_bounds() => {
                if let Ok(mut shared) = self.shared.lock() {
                    shared.waiting = net.waiting.into();
                }
                Ok(())
            }
            DeviceState::Net(net) => Err(DeviceStateError::Device(format!(
                "{} waiting frames, past the device's bounds",
                net.waiting.len()
            ))),
            other => Err(DeviceStateError::Device(format!("a net device got {other:?}"))),
        }
    }
}

/// The waiting frames in a saved net state; `None` when malformed or past the device's caps.
fn parse_waiting(state: &[u8]) -> Option<VecDeque<Vec<u8>>> {
    let word =
        |b: &[u8]| -> Option<usize> { Some(u32::from_le_bytes(b.try_into().ok()?) as usize) };
    let count = word(state.get(..4)?)?;
    if count > MAX_WAITING {
        return None;
    }
    let mut at = 4usize;
    let mut frames = VecDeque::with_capacity(count);
    for _ in 0..count {
        let len = word(state.get(at..at.checked_add(4)?)?)?;
        if len > MAX_FRAME {
            return None;
        }
        at += 4;
        frames.push_back(state.get(at..at.checked_add(len)?)?.to_vec());
        at += len;
    }
    (at == state.len()).then_some(frames)
}

/// The host side: reads frames from the tap. Run [`super::Backend::step`] and `wait` in a
/// loop on its own thread.
#[derive(Debug)]
pub struct NetBackend {
    tap: Arc<File>,
    shared: Arc<Mutex<NetShared>>,
}

impl super::Backend for NetBackend {
    fn wait(&self, limit: std::time::Duration) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let full = self.shared.lock().map(|s| s.waiting.len() >= MAX_WAITING).unwrap_or(true);
        let timeout = PollTimeout::try_from(limit).unwrap_or(PollTimeout::MAX);
        if full {
            // Wait for the guest to take frames, not for more of them.
            std::thread::sleep(limit);
            return;
        }
        let mut fds = [PollFd::new(self.tap.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, timeout);
    }

    fn step(&self) -> bool {
        let Ok(mut shared) = self.shared.lock() else { return false };
        let mut buf = vec![0u8; MAX_FRAME];
        while shared.waiting.len() < MAX_WAITING {
            match (&*self.tap).read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => shared.waiting.push_back(buf[..n].to_vec()),
            }
        }
        !shared.waiting.is_empty()
    }
}
