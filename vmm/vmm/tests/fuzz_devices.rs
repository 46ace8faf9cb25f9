//! Fuzzing of the virtio devices from the guest's side and of the device state a snapshot
//! file carries (property-based: proptest, so CI runs it on stable in bounded time;
//! `PROPTEST_CASES` raises the count). Random descriptor tables and available rings (any
//! address, length, flags, loops) on every queue of rng, blk, balloon and vsock; random vsock
//! packets; random saved transport and device state. The devices never panic, answer within
//! guest memory, and a device restored from any bytes is either refused or well formed.

mod common;

use std::sync::Arc;

use brig_vmm::virtio::balloon::Balloon;
use brig_vmm::virtio::blk::Block;
use brig_vmm::virtio::mmio::MmioTransport;
use brig_vmm::virtio::net::Net;
use brig_vmm::virtio::rng::Rng;
use brig_vmm::virtio::vsock::Vsock;
use brig_vmm::virtio::VirtioDevice;
use common::{Rings, QUEUE_SIZE, RINGS};
use proptest::prelude::*;

/// One descriptor as a guest may write it: addresses mostly inside the 1 MiB of guest
/// memory, sometimes anywhere.
fn descriptor() -> impl Strategy<Value = Descriptor> {
    (
        prop_oneof![0u64..(1 << 20), any::<u64>()],
        prop_oneof![0u32..8192, any::<u32>()],
        0u16..8,
        0u16..QUEUE_SIZE + 2,
    )
}

/// A descriptor table entry: address, length, flags, next.
type Descriptor = (u64, u32, u16, u16);
/// A round: which queue, the descriptors written (by index), the heads made available.
type Round = (usize, Vec<(u16, Descriptor)>, Vec<u16>);

fn round() -> impl Strategy<Value = Round> {
    (
        0usize..3,
        proptest::collection::vec((0u16..QUEUE_SIZE, descriptor()), 0..6),
        proptest::collection::vec(0u16..QUEUE_SIZE + 2, 0..4),
    )
}

fn device(kind: u8, dir: &std::path::Path) -> (Box<dyn VirtioDevice>, usize) {
    match kind {
        0 => (Box::new(Rng::default()), 1),
        1 => {
            let path = dir.join("disk");
            std::fs::write(&path, vec![0u8; 64 << 10]).expect("disk");
            (Box::new(Block::open(&path, false, "fuzz").expect("blk")), 1)
        }
        2 => (Box::new(Balloon::new().0), 3),
        _ => {
            let (dev, backend) = Vsock::new(3, &dir.join("v.sock")).expect("vsock");
            std::mem::forget(backend);
            (Box::new(dev), 3)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_queues_never_break_a_device(kind in 0u8..4, rounds in proptest::collection::vec(round(), 1..12)) {
        let dir = tempfile::tempdir().expect("tmp");
        let (dev, queues) = device(kind, dir.path());
        let mut rings = Rings::new(MmioTransport::new(dev), queues, 256);
        let mut idx = [QUEUE_SIZE, 0, 0];
        for (queue, descs, heads) in rounds {
            let queue = queue % queues;
            for (index, (addr, len, flags, next)) in descs {
                rings.desc(queue, index, addr, len, flags, next);
            }
            for head in heads {
                rings.put_avail(queue, idx[queue], head);
                idx[queue] = idx[queue].wrapping_add(1);
            }
            rings.set_avail_idx(queue, idx[queue]);
            rings.reg(0x050, queue as u32);
            // The used ring never runs ahead of what was offered.
            prop_assert!(rings.used_idx(queue) <= idx[queue]);
        }
        // Still a device: its magic register reads back.
        let mut magic = [0u8; 4];
        rings.dev.read(0x000, &mut magic);
        prop_assert_eq!(&magic, b"virt");
    }

    #[test]
    fn random_vsock_packets_never_break_the_device(packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..40)) {
        let dir = tempfile::tempdir().expect("tmp");
        let (dev, queues) = device(3, dir.path());
        let mut rings = Rings::new(MmioTransport::new(dev), queues, 256);
        for mut bytes in packets {
            if bytes.len() >= 44 {
                // A plausible header half the time: to the guest's CID, stream type.
                bytes[8..16].copy_from_slice(&2u64.to_le_bytes());
                bytes[28..30].copy_from_slice(&1u16.to_le_bytes());
            }
            rings.send(&bytes);
            let received = rings.take_received();
            prop_assert!(received.len() <= usize::from(QUEUE_SIZE));
        }
    }

    #[test]
    fn any_saved_state_restores_a_sound_device_or_is_refused(kind in 0u8..5, bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let dir = tempfile::tempdir().expect("tmp");
        let dev: Box<dyn VirtioDevice> = match kind {
            4 => {
                let tap = Arc::new(std::fs::File::open("/dev/null").expect("null"));
                Box::new(Net::new([6, 0, 0, 0, 0, 1], tap).0)
            }
            k => device(k, dir.path()).0,
        };
        let expected = dev.device_type();
        if let Ok(t) = MmioTransport::restore(dev, &bytes) {
            // What was accepted saves back to state of the same device.
            let saved = brig_vmm::virtio::state::decode(&t.save_state()).expect("own state decodes");
            prop_assert_eq!(saved.transport.device_type, expected);
        }
    }

    #[test]
    fn saved_states_round_trip(kind in 0u8..4) {
        let dir = tempfile::tempdir().expect("tmp");
        let (dev, queues) = device(kind, dir.path());
        let rings = Rings::new(MmioTransport::new(dev), queues, 256);
        let saved = rings.dev.save_state();
        let (fresh, _) = device(kind, dir.path());
        let restored = MmioTransport::restore(fresh, &saved).expect("own state restores");
        prop_assert_eq!(restored.save_state(), saved);
    }
}

#[test]
fn the_rings_sit_inside_guest_memory() {
    for (desc, avail, used) in RINGS {
        assert!(desc < avail && avail < used && used < (1 << 20));
    }
}
