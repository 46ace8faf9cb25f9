//! virtio-vsock in userspace (there is no vhost here), host side over Unix sockets the way
//! Firecracker does it: a host process connects to the VM's socket and writes
//! `CONNECT <port>\n`; the device opens a stream to that guest port and answers `OK <port>\n`;
//! then bytes flow both ways under vsock's credit accounting. Streams only; connections the
//! guest opens towards the host are refused (RST) in this cut.
//!
//! Threads: the vCPU thread serves the driver's notifications (TX packets go to host sockets);
//! a backend thread polls the host sockets and, holding the device's lock, queues packets for
//! the guest and asks the transport to deliver them (see [`VsockBackend`]). The vCPU thread
//! never waits on a host socket: guest data a host reader is not taking yet waits in the
//! connection's own buffer (at most the receive window the guest was granted), and the backend
//! writes it out when the socket has room; only bytes written out count as consumed, so the
//! guest's credit holds a slow reader's connection back and no other.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

use super::{DeviceError, VirtioDevice};

mod backend;
pub use backend::VsockBackend;

const HOST_CID: u64 = 2;
const HEADER: usize = 44;
const TYPE_STREAM: u16 = 1;
const OP_REQUEST: u16 = 1;
const OP_RESPONSE: u16 = 2;
const OP_RST: u16 = 3;
const OP_SHUTDOWN: u16 = 4;
const OP_RW: u16 = 5;
const OP_CREDIT_UPDATE: u16 = 6;
const OP_CREDIT_REQUEST: u16 = 7;
const SHUTDOWN_RCV: u32 = 1;
const SHUTDOWN_SEND: u32 = 2;
/// Receive buffer we advertise per connection.
const BUF_ALLOC: u32 = 256 << 10;
/// Largest payload we put in one packet to the guest.
const MAX_PAYLOAD: usize = 4096;
/// Largest TX chain we read (header + payload); longer ones are refused.
const MAX_TX: usize = HEADER + (64 << 10);
const QUEUE_SIZES: [u16; 3] = [256, 256, 256];
/// Control packets waiting for the guest, at most (see `Vsock::reply_later`).
const MAX_QUEUED_REPLIES: usize = 1024;
const RX: usize = 0;
const TX: usize = 1;
const EVENT: usize = 2;
/// `virtio_vsock_event.id`: the transport was reset (its connections are gone).
const EVENT_TRANSPORT_RESET: u32 = 0;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Header {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    len: u32,
    type_: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

impl Header {
    fn parse(b: &[u8]) -> Option<Header> {
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u16_at = |i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?));
        Some(Header {
            src_cid: u64_at(0)?,
            dst_cid: u64_at(8)?,
            src_port: u32_at(16)?,
            dst_port: u32_at(20)?,
            len: u32_at(24)?,
            type_: u16_at(28)?,
            op: u16_at(30)?,
            flags: u32_at(32)?,
            buf_alloc: u32_at(36)?,
            fwd_cnt: u32_at(40)?,
        })
    }

    fn bytes(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

#[derive(Debug, PartialEq, Eq)]
enum ConnState {
    /// REQUEST sent to the guest, no answer yet.
    Connecting,
    Established,
}

#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    state: ConnState,
    /// Guest data the host socket has not taken yet (at most [`BUF_ALLOC`]).
    to_host: VecDeque<u8>,
    /// The guest shut the stream down: hang up once `to_host` is written out.
    guest_done: bool,
    /// Bytes of guest data written to the host socket (our fwd_cnt).
    fwd_cnt: u32,
    /// Bytes we sent to the guest.
    tx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
}

impl Conn {
    fn new(stream: UnixStream) -> Conn {
        Conn {
            stream,
            state: ConnState::Connecting,
            to_host: VecDeque::new(),
            guest_done: false,
            fwd_cnt: 0,
            tx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
        }
    }

    /// How much the guest can take now.
    fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc.saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    /// Writes what the host socket takes now of the buffered guest data, never waiting.
    /// Returns how many bytes went out, or the socket's error (the connection is then dead).
    fn flush(&mut self) -> std::io::Result<usize> {
        let mut written = 0;
        while !self.to_host.is_empty() {
            let (front, _) = self.to_host.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.to_host.drain(..n);
                    written += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(written)
    }

    /// Counts `n` bytes as consumed; true when the guest should hear of the freed space (once
    /// a quarter of the window has gone by).
    fn consumed(&mut self, n: usize) -> bool {
        let before = self.fwd_cnt / (BUF_ALLOC / 4);
        self.fwd_cnt = self.fwd_cnt.wrapping_add(n as u32);
        n > 0 && self.fwd_cnt / (BUF_ALLOC / 4) != before
    }
}

/// Connections and packets waiting for the guest; shared by the device and its backend.
#[derive(Debug, Default)]
pub struct VsockShared {
    /// By (host port, guest port).
    conns: HashMap<(u32, u32), Conn>,
    /// Host streams that have not finished their `CONNECT` line.
    pending: Vec<(UnixStream, Vec<u8>)>,
    to_guest: VecDeque<(Header, Vec<u8>)>,
    next_host_port: u32,
    /// A transport reset event waits for the guest's event queue (set on restore: the host
    /// sockets of the guest's connections did not survive the snapshot).
    reset_pending: bool,
}

/// The device (lives in the transport, driven by the vCPU thread).
#[derive(Debug)]
pub struct Vsock {
    guest_cid: u64,
    shared: Arc<Mutex<VsockShared>>,
}

impl Vsock {
    /// A device for guest `guest_cid`, accepting host connections on the Unix socket `uds`.
    /// Returns the device and the backend to run on its own thread.
    pub fn new(guest_cid: u64, uds: &Path) -> std::io::Result<(Vsock, VsockBackend)> {
        let _ = std::fs::remove_file(uds);
        let listener = UnixListener::bind(uds)?;
        listener.set_nonblocking(true)?;
        let shared =
            Arc::new(Mutex::new(VsockShared { next_host_port: 1 << 30, ..Default::default() }));
        let backend =
            VsockBackend { listener, shared: shared.clone(), guest_cid, path: uds.to_owned() };
        Ok((Vsock { guest_cid, shared }, backend))
    }

    fn reply(&self, to: &Header, op: u16, fwd_cnt: u32) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: to.dst_port,
            dst_port: to.src_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: BUF_ALLOC,
            fwd_cnt,
            ..Header::default()
        }
    }

    /// Queues a control packet (reset, credit update) for the guest. A guest that floods us
    /// with bad packets and never takes the answers finds further answers dropped, so the
    /// queue (host memory) stays bounded; the answers are advisory.
    fn reply_later(&self, shared: &mut VsockShared, header: Header) {
        if shared.to_guest.len() < MAX_QUEUED_REPLIES {
            shared.to_guest.push_back((header, Vec::new()));
        }
    }

    /// Handles one packet from the guest.
    fn handle_guest_packet(&self, shared: &mut VsockShared, h: Header, payload: &[u8]) {
        let key = (h.dst_port, h.src_port);
        if h.type_ != TYPE_STREAM || h.dst_cid != HOST_CID {
            self.reply_later(shared, self.reply(&h, OP_RST, 0));
            return;
        }
        let Some(conn) = shared.conns.get_mut(&key) else {
            if h.op != OP_RST {
                self.reply_later(shared, self.reply(&h, OP_RST, 0));
            }
            return;
        };
        conn.peer_buf_alloc = h.buf_alloc;
        conn.peer_fwd_cnt = h.fwd_cnt;
        match h.op {
            OP_RESPONSE if conn.state == ConnState::Connecting => {
                conn.state = ConnState::Established;
                let _ = conn.stream.write_all(format!("OK {}\n", h.dst_port).as_bytes());
            }
            OP_RW if conn.state == ConnState::Established => {
                // A guest that sends past the window it was granted is broken or hostile: the
                // buffer would grow without bound, so its connection is reset instead.
                if conn.guest_done || conn.to_host.len() + payload.len() > BUF_ALLOC as usize {
                    shared.conns.remove(&key);
                    self.reply_later(shared, self.reply(&h, OP_RST, 0));
                    return;
                }
                conn.to_host.extend(payload);
                match conn.flush() {
                    Ok(n) => {
                        if conn.consumed(n) {
                            let update = self.reply(&h, OP_CREDIT_UPDATE, conn.fwd_cnt);
                            self.reply_later(shared, update);
                        }
                    }
                    Err(_) => {
                        shared.conns.remove(&key);
                        self.reply_later(shared, self.reply(&h, OP_RST, 0));
                    }
                }
            }
            OP_CREDIT_REQUEST => {
                let update = self.reply(&h, OP_CREDIT_UPDATE, conn.fwd_cnt);
                self.reply_later(shared, update);
            }
            OP_CREDIT_UPDATE => {}
            OP_SHUTDOWN if !conn.to_host.is_empty() => {
                // Written out first; the backend hangs up once the buffer is empty.
                conn.guest_done = true;
            }
            OP_SHUTDOWN | OP_RST => {
                let _ = conn.stream.shutdown(std::net::Shutdown::Both);
                shared.conns.remove(&key);
                if h.op == OP_SHUTDOWN {
                    self.reply_later(shared, self.reply(&h, OP_RST, 0));
                }
            }
            _ => {
                shared.conns.remove(&key);
                self.reply_later(shared, self.reply(&h, OP_RST, 0));
            }
        }
    }

    /// Moves queued packets into the guest's RX buffers.
    fn deliver(
        &self,
        shared: &mut VsockShared,
        rx: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut used = false;
        while !shared.to_guest.is_empty() {
            let Some(chain) = rx.iter(mem)?.next() else { break };
            let head = chain.head_index();
            let capacity: usize = chain
                .clone()
                .filter(|d| d.is_write_only())
                .map(|d| d.len() as usize)
                .fold(0usize, usize::saturating_add);
            if capacity < HEADER {
                // A buffer too small for a header: hand it back unused.
                rx.add_used(mem, head, 0)?;
                used = true;
                continue;
            }
            let Some((mut h, mut data)) = shared.to_guest.pop_front() else { break };
            if HEADER + data.len() > capacity {
                // Split what does not fit into the next packet, so no byte is lost.
                let rest = data.split_off(capacity - HEADER);
                let mut tail = h;
                tail.len = rest.len() as u32;
                h.len = data.len() as u32;
                shared.to_guest.push_front((tail, rest));
            }
            let mut packet = h.bytes().to_vec();
            packet.extend_from_slice(&data);
            let written = super::write_chain(chain, mem, &packet);
            rx.add_used(mem, head, written as u32)?;
            used = true;
        }
        Ok(used)
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        19
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.guest_cid.to_le_bytes(), offset, data);
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
            let Some(tx) = queues.get_mut(TX) else { return Ok(false) };
            while let Some(chain) = tx.iter(mem)?.next() {
                let head = chain.head_index();
                let mut bytes = Vec::new();
                for desc in chain.filter(|d| !d.is_write_only()) {
                    let n = (desc.len() as usize).min(MAX_TX.saturating_sub(bytes.len()));
                    let start = bytes.len();
                    bytes.resize(start + n, 0);
                    if mem.read_slice(&mut bytes[start..], desc.addr()).is_err() {
                        bytes.truncate(start);
                        break;
                    }
                }
                tx.add_used(mem, head, 0)?;
                used = true;
                if let Some(h) = Header::parse(&bytes) {
                    let end = (HEADER + h.len as usize).min(bytes.len());
                    self.handle_guest_packet(&mut shared, h, &bytes[HEADER..end]);
                }
            }
        }
        if Vsock::send_reset(&mut shared, queues.get_mut(EVENT), mem)? {
            // New connections go out on a later round, after the driver took the reset.
            return Ok(true);
        }
        if let Some(rx) = queues.get_mut(RX) {
            used |= self.deliver(&mut shared, rx, mem)?;
        }
        Ok(used)
    }

    fn poll(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> Result<bool, DeviceError> {
        let Ok(mut shared) = self.shared.lock() else { return Ok(false) };
        if Vsock::send_reset(&mut shared, queues.get_mut(EVENT), mem)? {
            // New connections go out on a later round, after the driver took the reset.
            return Ok(true);
        }
        match queues.get_mut(RX) {
            Some(rx) => self.deliver(&mut shared, rx, mem),
            None => Ok(false),
        }
    }

    /// No connection outlives a snapshot (its host socket belonged to the VMM that saved it),
    /// so there is nothing of them to save; a restored device tells the driver with a
    /// transport reset event, and the guest drops its connections at once instead of waiting
    /// on peers that are gone.
    fn restore_state(
        &mut self,
        state: super::state::DeviceState,
    ) -> Result<(), super::state::DeviceStateError> {
        if let Ok(mut shared) = self.shared.lock() {
            shared.reset_pending = true;
        }
        state.expect_stateless()
    }
}

impl Vsock {
    /// Puts a pending transport reset event into the guest's event queue, if it has a buffer.
    fn send_reset(
        shared: &mut VsockShared,
        events: Option<&mut Queue>,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let Some(events) = events.filter(|_| shared.reset_pending) else { return Ok(false) };
        let Some(chain) = events.iter(mem)?.next() else { return Ok(false) };
        let head = chain.head_index();
        let written = super::write_chain(chain, mem, &EVENT_TRANSPORT_RESET.to_le_bytes());
        events.add_used(mem, head, written as u32)?;
        shared.reset_pending = false;
        Ok(true)
    }
}
