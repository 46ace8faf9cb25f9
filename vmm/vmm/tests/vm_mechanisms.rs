//! VMM mechanisms on this machine's KVM with the purpose-built guest: boot, port I/O dispatch,
//! snapshot → restore → identical state, restore into a pre-created VM, copy-on-write sharing
//! between VMs restored from one snapshot, and refusal of bad snapshots and guests.

use std::path::Path;

use brig_vmm::guest::{CODE_ADDR, LAST_REPLY_ADDR};
use brig_vmm::memory::MemoryError;
use brig_vmm::{Snapshot, SnapshotError, Vm, VmError};

const MIB: usize = 1 << 20;

/// A booted guest that answered twice (counter at 2), paused and saved in `dir`.
fn snapshot_in(dir: &Path) -> Snapshot {
    let mut vm = Vm::create(16 * MIB).expect("vm");
    vm.boot_test_guest(4).expect("boot");
    assert_eq!(vm.request(1).expect("answer"), 2);
    assert_eq!(vm.request(10).expect("answer"), 12);
    vm.pause().expect("pause");
    Snapshot::save(&vm, dir).expect("save")
}

fn last_reply(vm: &Vm) -> u32 {
    let mut b = [0u8; 4];
    vm.memory().read(LAST_REPLY_ADDR, &mut b).expect("read");
    u32::from_le_bytes(b)
}

#[test]
fn restore_brings_back_identical_state() {
    let dir = tempfile::tempdir().expect("tmp");
    let snap = snapshot_in(dir.path());
    snap.verify_memory().expect("memory digest");
    let loaded = Snapshot::load(dir.path()).expect("load");
    let mut vm = Vm::create(16 * MIB).expect("vm");
    loaded.restore_into(&mut vm).expect("restore");
    // Memory as saved, and the register counter continues where it stopped.
    assert_eq!(last_reply(&vm), 12);
    assert_eq!(vm.request(100).expect("answer"), 103);
    assert_eq!(last_reply(&vm), 103);
    // The snapshot file itself is untouched by the restored VM's write (MAP_PRIVATE).
    let mut again = Vm::create(16 * MIB).expect("vm");
    loaded.restore_into(&mut again).expect("restore again");
    assert_eq!(last_reply(&again), 12);
    assert_eq!(again.request(7).expect("answer"), 10);
}

/// (Rss, Pss) in KiB of this process's mappings of `vm.mem` files.
fn snapshot_mappings_kib() -> (u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let (mut rss, mut pss, mut inside) = (0, 0, false);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            inside = line.ends_with("/vm.mem");
            continue;
        }
        let value = || line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
        match first {
            "Rss:" if inside => rss += value().unwrap_or(0),
            "Pss:" if inside => pss += value().unwrap_or(0),
            _ => {}
        }
    }
    (rss, pss)
}

#[test]
fn vms_from_one_snapshot_share_its_pages() {
    let dir = tempfile::tempdir().expect("tmp");
    let snap = snapshot_in(dir.path());
    let mut a = Vm::create(16 * MIB).expect("a");
    let mut b = Vm::create(16 * MIB).expect("b");
    snap.restore_into(&mut a).expect("restore a");
    snap.restore_into(&mut b).expect("restore b");
    a.memory().touch_all();
    b.memory().touch_all();
    // Different guests, different answers: their vCPUs and written pages are their own.
    assert_eq!(a.request(1000).expect("a"), 1003);
    assert_eq!(b.request(2000).expect("b"), 2003);
    assert_eq!((last_reply(&a), last_reply(&b)), (1003, 2003));
    let (rss, pss) = snapshot_mappings_kib();
    // Two 16 MiB mappings fully resident, nearly every page shared: PSS is about half of RSS.
    assert!(rss >= 2 * 16 * 1024 - 64, "rss {rss} KiB");
    assert!(pss * 10 < rss * 6, "pages not shared: rss {rss} KiB, pss {pss} KiB");
}

#[test]
fn restore_into_a_pre_created_vm() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut pooled = Vm::create(16 * MIB).expect("pre-created");
    let snap = snapshot_in(dir.path());
    snap.restore_into(&mut pooled).expect("restore");
    assert_eq!(pooled.request(5).expect("answer"), 8);
}

#[test]
fn bad_snapshots_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    let snap = snapshot_in(dir.path());
    let mut small = Vm::create(8 * MIB).expect("vm");
    assert!(matches!(snap.restore_into(&mut small), Err(SnapshotError::MemorySize { .. })));

    let state = Snapshot::state_path(dir.path());
    let mut bytes = std::fs::read(&state).expect("state");
    bytes[40] ^= 0xff;
    std::fs::write(&state, &bytes).expect("write");
    assert!(matches!(Snapshot::load(dir.path()), Err(SnapshotError::Checksum(_))));
    bytes[40] ^= 0xff;
    std::fs::write(&state, &bytes).expect("write");

    let mem = Snapshot::memory_path(dir.path());
    let mut memory = std::fs::read(&mem).expect("mem");
    memory[0x1000] ^= 1;
    std::fs::write(&mem, &memory).expect("write");
    let loaded = Snapshot::load(dir.path()).expect("state is fine");
    assert!(matches!(loaded.verify_memory(), Err(SnapshotError::Checksum(_))));
    std::fs::write(&mem, &memory[..4096]).expect("truncate");
    let mut vm = Vm::create(16 * MIB).expect("vm");
    let err = loaded.restore_into(&mut vm).expect_err("short memory file");
    assert!(
        matches!(err, SnapshotError::Vm(VmError::Memory(MemoryError::SizeMismatch { .. }))),
        "{err:?}"
    );
}

#[test]
fn a_guest_touching_an_unknown_port_gets_a_typed_error() {
    let mut vm = Vm::create(16 * MIB).expect("vm");
    vm.boot_test_guest(1).expect("boot");
    // mov dx, 0x99; out dx, al; hlt
    vm.memory_mut().write(CODE_ADDR, &[0x66, 0xba, 0x99, 0x00, 0xee, 0xf4]).expect("code");
    let err = vm.request(1).expect_err("unknown port");
    assert!(matches!(err, VmError::UnexpectedExit(ref m) if m.contains("0x99")), "{err:?}");
    // Out-of-range guest addresses are refused, not followed.
    assert!(vm.memory_mut().write(u64::MAX - 2, b"xyz").is_err());
    assert!(vm.memory_mut().write(16 * MIB as u64 - 1, b"xy").is_err());
}
