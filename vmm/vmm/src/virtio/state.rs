//! A virtio device's saved state, typed and versioned: its transport (registers and queues)
//! and the device's own state, each device's a serde type of its own ([`DeviceState`]).
//!
//! ```text
//! version 2   "BRDV" | version u16 LE | postcard(SavedDevice)
//! version 1   the hand-laid format before it (no magic; it starts with the device type):
//!             u32 × 6 | driver features u64 | queue count u32 | per queue u16 × 4, u8 × 2,
//!             u64 × 3 | device len u32 | device bytes (balloon: target u32, actual u32;
//!             net: count u32, then len u32 + frame each; others none)
//! ```
//! A version 1 state restores (VMs saved by an older VMM resume). A newer version than this
//! VMM reads is a typed [`DeviceStateError::Version`], so skew is told apart from corruption
//! ([`DeviceStateError::Malformed`]).

use serde::{Deserialize, Serialize};

use super::balloon::BalloonState;
use super::net::NetState;

const MAGIC: &[u8; 4] = b"BRDV";
/// The version this VMM writes; it reads it and every one before.
pub const VERSION: u16 = 2;

/// Why a saved device state cannot be restored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceStateError {
    #[error("device state version {found}; this VMM reads versions 1 to {VERSION}")]
    Version { found: u16 },
    #[error("device state is malformed: {0}")]
    Malformed(String),
    #[error("the state is of device type {saved}; the device is of type {built}")]
    DeviceType { saved: u32, built: u32 },
    #[error("the state has {saved} queues; the device has {device}")]
    Queues { saved: usize, device: usize },
    #[error("a saved queue is impossible: {0}")]
    Queue(String),
    #[error("the device refused its state: {0}")]
    Device(String),
}

/// One device's saved state: its transport, then its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDevice {
    pub transport: SavedTransport,
    pub device: DeviceState,
}

/// The transport's registers and queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedTransport {
    pub device_type: u32,
    pub status: u32,
    pub interrupt_status: u32,
    pub queue_sel: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub driver_features: u64,
    pub queues: Vec<SavedQueue>,
}

/// A split virtqueue's state (`virtio_queue::QueueState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedQueue {
    pub max_size: u16,
    pub next_avail: u16,
    pub next_used: u16,
    pub size: u16,
    pub event_idx_enabled: bool,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
}

impl From<virtio_queue::QueueState> for SavedQueue {
    fn from(q: virtio_queue::QueueState) -> SavedQueue {
        SavedQueue {
            max_size: q.max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            size: q.size,
            event_idx_enabled: q.event_idx_enabled,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        }
    }
}

impl From<SavedQueue> for virtio_queue::QueueState {
    fn from(q: SavedQueue) -> virtio_queue::QueueState {
        virtio_queue::QueueState {
            max_size: q.max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            size: q.size,
            event_idx_enabled: q.event_idx_enabled,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        }
    }
}

/// A device's own state beyond its transport and queues.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceState {
    /// Nothing kept between requests (entropy, block, vsock).
    #[default]
    Stateless,
    Balloon(BalloonState),
    Net(NetState),
}

impl DeviceState {
    /// The state a device of no kept state takes back: only [`DeviceState::Stateless`].
    pub fn expect_stateless(self) -> Result<(), DeviceStateError> {
        match self {
            DeviceState::Stateless => Ok(()),
            other => Err(DeviceStateError::Device(format!("a stateless device got {other:?}"))),
        }
    }
}

/// `saved` as bytes, in the current version.
pub fn encode(saved: &SavedDevice) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    // Serializing plain integers, byte vectors and enums into a Vec cannot fail.
    out.extend(postcard::to_allocvec(saved).unwrap_or_default());
    out
}

/// A saved state read back, from this version or the one before.
pub fn decode(bytes: &[u8]) -> Result<SavedDevice, DeviceStateError> {
    let Some(rest) = bytes.strip_prefix(MAGIC) else { return decode_v1(bytes) };
    let (version, body) = rest.split_at_checked(2).ok_or_else(|| malformed("no version"))?;
    let found = u16::from_le_bytes([version[0], version[1]]);
    if found != VERSION {
        return Err(DeviceStateError::Version { found });
    }
    let (saved, left) =
        postcard::take_from_bytes::<SavedDevice>(body).map_err(|e| malformed(&e.to_string()))?;
    if !left.is_empty() {
        return Err(malformed("bytes after the state"));
    }
    Ok(saved)
}

fn malformed(why: &str) -> DeviceStateError {
    DeviceStateError::Malformed(why.to_string())
}

/// Reads the hand-laid version 1 format.
fn decode_v1(bytes: &[u8]) -> Result<SavedDevice, DeviceStateError> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], DeviceStateError> {
        let end = at.checked_add(n).ok_or_else(|| malformed("length overflows"))?;
        let b = bytes.get(at..end).ok_or_else(|| malformed("cut short"))?;
        at = end;
        Ok(b)
    };
    let mut u32s = [0u32; 6];
    for v in &mut u32s {
        *v = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default());
    }
    let driver_features = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
    // A queue takes 34 bytes: a count past what the bytes hold is malformed before any
    // allocation.
    if count > bytes.len() / 34 {
        return Err(malformed("more queues than bytes"));
    }
    let mut queues = Vec::with_capacity(count);
    for _ in 0..count {
        let mut u16s = [0u16; 4];
        for v in &mut u16s {
            *v = u16::from_le_bytes(take(2)?.try_into().unwrap_or_default());
        }
        let flags = take(2)?;
        let (event_idx_enabled, ready) = (flags[0] != 0, flags[1] != 0);
        let mut u64s = [0u64; 3];
        for v in &mut u64s {
            *v = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        }
        queues.push(SavedQueue {
            max_size: u16s[0],
            next_avail: u16s[1],
            next_used: u16s[2],
            size: u16s[3],
            event_idx_enabled,
            ready,
            desc_table: u64s[0],
            avail_ring: u64s[1],
            used_ring: u64s[2],
        });
    }
    // A state from before devices kept their own has nothing more.
    let own = match take(4) {
        Ok(len) => take(u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize)?,
        Err(_) => &[],
    };
    let device_type = u32s[0];
    let device = match (device_type, own.is_empty()) {
        (_, true) => DeviceState::Stateless,
        (super::balloon::DEVICE_TYPE, false) => {
            DeviceState::Balloon(BalloonState::from_v1(own).ok_or_else(|| malformed("balloon"))?)
        }
        (super::net::DEVICE_TYPE, false) => {
            DeviceState::Net(NetState::from_v1(own).ok_or_else(|| malformed("net frames"))?)
        }
        (other, false) => return Err(malformed(&format!("device type {other} keeps no state"))),
    };
    let transport = SavedTransport {
        device_type,
        status: u32s[1],
        interrupt_status: u32s[2],
        queue_sel: u32s[3],
        device_features_sel: u32s[4],
        driver_features_sel: u32s[5],
        driver_features,
        queues,
    };
    Ok(SavedDevice { transport, device })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(device: DeviceState, device_type: u32) -> SavedDevice {
        let queue = SavedQueue {
            max_size: 256,
            next_avail: 7,
            next_used: 6,
            size: 128,
            event_idx_enabled: true,
            ready: true,
            desc_table: 0x1000,
            avail_ring: 0x2000,
            used_ring: 0x3000,
        };
        let transport = SavedTransport {
            device_type,
            status: 15,
            interrupt_status: 1,
            queue_sel: 1,
            device_features_sel: 1,
            driver_features_sel: 0,
            driver_features: 1 << 32,
            queues: vec![queue, queue],
        };
        SavedDevice { transport, device }
    }

    /// The version 1 bytes of `s`, as the VMM before typed state wrote them.
    fn encode_v1(s: &SavedDevice, own: &[u8]) -> Vec<u8> {
        let t = &s.transport;
        let mut out = Vec::new();
        for v in [
            t.device_type,
            t.status,
            t.interrupt_status,
            t.queue_sel,
            t.device_features_sel,
            t.driver_features_sel,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&t.driver_features.to_le_bytes());
        out.extend_from_slice(&(t.queues.len() as u32).to_le_bytes());
        for q in &t.queues {
            for v in [q.max_size, q.next_avail, q.next_used, q.size] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.push(u8::from(q.event_idx_enabled));
            out.push(u8::from(q.ready));
            for v in [q.desc_table, q.avail_ring, q.used_ring] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.extend_from_slice(&(own.len() as u32).to_le_bytes());
        out.extend_from_slice(own);
        out
    }

    #[test]
    fn states_round_trip_and_the_previous_version_still_reads() {
        let balloon = BalloonState { target_pages: 300, actual_pages: 200 };
        let net = NetState { waiting: vec![vec![1, 2, 3], vec![]] };
        for s in [
            saved(DeviceState::Stateless, 19),
            saved(DeviceState::Balloon(balloon), super::super::balloon::DEVICE_TYPE),
            saved(DeviceState::Net(net), super::super::net::DEVICE_TYPE),
        ] {
            assert_eq!(decode(&encode(&s)).expect("current"), s);
        }
        // Version 1, as an older VMM saved them.
        let mut own = 300u32.to_le_bytes().to_vec();
        own.extend_from_slice(&200u32.to_le_bytes());
        let b = saved(DeviceState::Balloon(balloon), super::super::balloon::DEVICE_TYPE);
        assert_eq!(decode(&encode_v1(&b, &own)).expect("v1 balloon"), b);
        let mut frames = 2u32.to_le_bytes().to_vec();
        frames.extend_from_slice(&3u32.to_le_bytes());
        frames.extend_from_slice(&[1, 2, 3]);
        frames.extend_from_slice(&0u32.to_le_bytes());
        let n = saved(
            DeviceState::Net(NetState { waiting: vec![vec![1, 2, 3], vec![]] }),
            super::super::net::DEVICE_TYPE,
        );
        assert_eq!(decode(&encode_v1(&n, &frames)).expect("v1 net"), n);
        let v = saved(DeviceState::Stateless, 19);
        assert_eq!(decode(&encode_v1(&v, &[])).expect("v1 vsock"), v);
    }

    #[test]
    fn skew_and_corruption_are_told_apart() {
        let mut newer = encode(&saved(DeviceState::Stateless, 4));
        newer[4..6].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(decode(&newer), Err(DeviceStateError::Version { found: 3 }));
        let mut cut = encode(&saved(DeviceState::Stateless, 4));
        cut.truncate(cut.len() - 3);
        assert!(matches!(decode(&cut), Err(DeviceStateError::Malformed(_))));
        let mut longer = encode(&saved(DeviceState::Stateless, 4));
        longer.push(0);
        assert!(matches!(decode(&longer), Err(DeviceStateError::Malformed(_))));
        assert!(matches!(decode(b"BRDV"), Err(DeviceStateError::Malformed(_))));
        assert!(matches!(decode(&[1, 2, 3]), Err(DeviceStateError::Malformed(_))));
        // A version 1 state of a stateless device with bytes of its own is corrupt.
        let v = saved(DeviceState::Stateless, 19);
        assert!(matches!(decode(&encode_v1(&v, &[9])), Err(DeviceStateError::Malformed(_))));
    }
}
