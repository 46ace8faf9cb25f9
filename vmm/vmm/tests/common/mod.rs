//! The tests' stand-in for a guest's virtio driver: split virtqueues laid out in guest memory
//! and set up through the transport's registers, a receive queue whose buffers are all
//! offered at once, and a transmit queue fed one readable descriptor at a time.
#![allow(dead_code)]

use brig_vmm::memory::GuestMemory;
use brig_vmm::virtio::mmio::MmioTransport;

pub const QUEUE_SIZE: u16 = 16;
/// Ring addresses of queues 0 (RX), 1 (TX) and 2: descriptors, avail, used.
pub const RINGS: [(u64, u64, u64); 3] =
    [(0x4000, 0x5000, 0x6000), (0x7000, 0x8000, 0x9000), (0xa000, 0xb000, 0xc000)];
pub const RX_BUFS: u64 = 0x2_0000;
pub const TX_BUF: u64 = 0x8_0000;
pub const WRITE: u16 = 2;

pub struct Rings {
    pub mem: GuestMemory,
    pub view: brig_vmm::memory::GuestView,
    pub dev: MmioTransport,
    pub tx_next: u16,
    pub rx_seen: u16,
    rx_buf_len: u32,
}

impl Rings {
    /// `dev` with `queues` queues set up and driver-ready, every RX descriptor a writable
    /// buffer of `rx_buf_len` bytes, all offered.
    pub fn new(dev: MmioTransport, queues: usize, rx_buf_len: u32) -> Rings {
        let mem = GuestMemory::anonymous(1 << 20).expect("memory");
        let view = mem.view().expect("view");
        let mut r = Rings { mem, view, dev, tx_next: 0, rx_seen: 0, rx_buf_len };
        r.reg(0x070, 0x3);
        for (i, (desc, avail, used)) in RINGS.iter().take(queues).enumerate() {
            r.reg(0x030, i as u32);
            r.reg(0x038, u32::from(QUEUE_SIZE));
            r.reg(0x080, *desc as u32);
            r.reg(0x090, *avail as u32);
            r.reg(0x0a0, *used as u32);
            r.reg(0x044, 1);
        }
        r.reg(0x070, 0xf);
        for i in 0..QUEUE_SIZE {
            r.desc(0, i, r.rx_buf(i), rx_buf_len, WRITE, 0);
            r.put_avail(0, i, i);
        }
        r.set_avail_idx(0, QUEUE_SIZE);
        r
    }

    pub fn reg(&mut self, offset: u64, value: u32) {
        self.dev.write(offset, &value.to_le_bytes(), &self.view);
    }

    fn rx_buf(&self, id: u16) -> u64 {
        RX_BUFS + u64::from(id) * u64::from(self.rx_buf_len)
    }

    pub fn desc(&mut self, queue: usize, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = Vec::new();
        d.extend_from_slice(&addr.to_le_bytes());
        d.extend_from_slice(&len.to_le_bytes());
        d.extend_from_slice(&flags.to_le_bytes());
        d.extend_from_slice(&next.to_le_bytes());
        self.mem.write(RINGS[queue].0 + u64::from(index) * 16, &d).expect("descriptor");
    }

    pub fn put_avail(&mut self, queue: usize, slot: u16, head: u16) {
        let at = RINGS[queue].1 + 4 + u64::from(slot % QUEUE_SIZE) * 2;
        self.mem.write(at, &head.to_le_bytes()).expect("avail slot");
    }

    pub fn set_avail_idx(&mut self, queue: usize, idx: u16) {
        self.mem.write(RINGS[queue].1 + 2, &idx.to_le_bytes()).expect("avail idx");
    }

    pub fn used_idx(&self, queue: usize) -> u16 {
        let mut b = [0u8; 2];
        self.mem.read(RINGS[queue].2 + 2, &mut b).expect("used idx");
        u16::from_le_bytes(b)
    }

    /// Makes the chain headed by descriptor `head` available on TX (queue 1) and notifies.
    pub fn offer_tx(&mut self, head: u16) {
        let slot = self.tx_next;
        self.put_avail(1, slot, head);
        self.tx_next = slot.wrapping_add(1);
        self.set_avail_idx(1, self.tx_next);
        self.reg(0x050, 1);
    }

    /// The guest sends `bytes` on TX as one device-readable descriptor.
    pub fn send(&mut self, bytes: &[u8]) {
        self.mem.write(TX_BUF, bytes).expect("tx buffer");
        let head = self.tx_next % QUEUE_SIZE;
        self.desc(1, head, TX_BUF, bytes.len() as u32, 0, 0);
        self.offer_tx(head);
    }

    /// What the device wrote into RX buffers since last time, each buffer offered again.
    pub fn take_received(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while self.rx_seen != self.used_idx(0) {
            let at = RINGS[0].2 + 4 + u64::from(self.rx_seen % QUEUE_SIZE) * 8;
            let mut elem = [0u8; 8];
            self.mem.read(at, &mut elem).expect("used elem");
            let id = u32::from_le_bytes(elem[..4].try_into().expect("4")) as u16;
            let len = u32::from_le_bytes(elem[4..].try_into().expect("4")) as usize;
            let mut buf = vec![0u8; len.min(self.rx_buf_len as usize)];
            self.mem.read(self.rx_buf(id), &mut buf).expect("rx");
            out.push(buf);
            let avail = self.rx_seen.wrapping_add(QUEUE_SIZE);
            self.put_avail(0, avail, id);
            self.set_avail_idx(0, avail.wrapping_add(1));
            self.rx_seen = self.rx_seen.wrapping_add(1);
        }
        out
    }
}
