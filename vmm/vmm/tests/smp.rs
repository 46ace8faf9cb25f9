//! More than one vCPU, natively on this machine's KVM with a purpose-built guest: each vCPU
//! spins writing its own letter to the console port, so the console shows which vCPUs ran.
//! vCPU 0 runs on the test's thread and vCPU 1 on its own; a snapshot taken through the control
//! socket while both run stops both, saves both, and a VM restored from it runs both again.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use brig_vmm::linux::{Ending, LinuxVm};
use brig_vmm_api::control::{decode_line, encode_line, ControlReply, ControlRequest};
use kvm_bindings::{kvm_mp_state, KVM_MP_STATE_RUNNABLE};

/// `mov dx, 0x3f8; again: out dx, al; jmp again` (the letter is in AL).
const SPIN: [u8; 7] = [0x66, 0xba, 0xf8, 0x03, 0xee, 0xeb, 0xfd];
const SPIN_ADDR: u64 = 0x2000;

/// A 2-vCPU VM where vCPU `i` writes `a + i` forever.
fn spinning_vm() -> LinuxVm {
    let mut vm = LinuxVm::create(32, 2, false).expect("VM (needs /dev/kvm)");
    brig_vmm::guest::load(vm.memory_mut(), 0).expect("page tables");
    vm.memory_mut().write(SPIN_ADDR, &SPIN).expect("code");
    for i in 0..2 {
        vm.with_vcpu(i, |v| {
            let sregs = v.get_sregs().expect("sregs");
            v.set_sregs(&brig_vmm::guest::sregs(sregs)).expect("set sregs");
            let regs = kvm_bindings::kvm_regs {
                rip: SPIN_ADDR,
                rax: u64::from(b'a') + i as u64,
                rflags: 0x2,
                rsp: 0x8000,
                ..Default::default()
            };
            v.set_regs(&regs).expect("set regs");
            // vCPU 1 would wait for INIT/SIPI from a guest kernel; this guest has none.
            v.set_mp_state(kvm_mp_state { mp_state: KVM_MP_STATE_RUNNABLE }).expect("mp state");
        })
        .expect("vCPU");
    }
    vm
}

/// How many of each letter the console holds now.
fn letters(vm: &LinuxVm) -> (usize, usize) {
    let console = vm.console.lock().expect("console");
    let kept = &console.writer().kept;
    (kept.iter().filter(|b| **b == b'a').count(), kept.iter().filter(|b| **b == b'b').count())
}

#[test]
fn both_vcpus_run_and_come_back_from_a_snapshot_taken_while_they_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut vm = spinning_vm();
    assert_eq!(vm.vcpu_count(), 2);
    assert_eq!(vm.run(Duration::from_millis(200)), Ending::TimedOut);
    let (a, b) = letters(&vm);
    assert!(a > 0 && b > 0, "vCPU 0 wrote {a}, vCPU 1 wrote {b}");

    // Running again continues both (vCPU 1 was parked, not stopped for good).
    vm.run(Duration::from_millis(200));
    let (a2, b2) = letters(&vm);
    assert!(a2 > a && b2 > b, "after a second run: {a}->{a2}, {b}->{b2}");

    // A snapshot through the control socket while both vCPUs run.
    let ctl = dir.path().join("vm.ctl");
    brig_vmm::control::serve(&ctl, vm.control_handles()).expect("control socket");
    let snap = dir.path().join("snap");
    let asker = {
        let (ctl, snap) = (ctl.clone(), snap.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut stream = UnixStream::connect(&ctl).expect("connect");
            let request = ControlRequest::Snapshot { dir: snap.clone() };
            stream.write_all(encode_line(&request).as_bytes()).expect("send");
            let mut answer = String::new();
            BufReader::new(stream).read_line(&mut answer).expect("answer");
            answer
        })
    };
    let ending = brig_vmm::control::run(&mut vm, Duration::from_millis(600), &[]);
    assert_eq!(ending, Ending::TimedOut);
    let answer = asker.join().expect("asker");
    let reply: ControlReply = decode_line(&answer).expect("a typed reply");
    assert!(matches!(reply, ControlReply::Saved { .. }), "{reply:?}");

    let side = brig_vmm::linux_snapshot::HostSide::default();
    let mut restored = brig_vmm::linux_snapshot::restore(&snap, false, &side).expect("restore");
    assert_eq!(restored.vcpu_count(), 2, "the snapshot has both vCPUs");
    for i in 0..2 {
        let rip = restored.with_vcpu(i, |v| v.get_regs().expect("regs").rip).expect("vCPU");
        assert!((SPIN_ADDR..SPIN_ADDR + SPIN.len() as u64).contains(&rip), "vCPU {i} at {rip:#x}");
    }
    assert_eq!(restored.run(Duration::from_millis(200)), Ending::TimedOut);
    let (a, b) = letters(&restored);
    assert!(a > 0 && b > 0, "after restore vCPU 0 wrote {a}, vCPU 1 wrote {b}");
}

#[test]
fn a_waiting_vm_with_one_vcpu_takes_a_two_vcpu_snapshot() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut vm = spinning_vm();
    vm.run(Duration::from_millis(100));
    brig_vmm::linux_snapshot::save(&vm, dir.path()).expect("save");
    let waiting = LinuxVm::create(32, 1, false).expect("VM");
    let side = brig_vmm::linux_snapshot::HostSide::default();
    let mut restored =
        brig_vmm::linux_snapshot::restore_into(waiting, dir.path(), &side).expect("restore");
    assert_eq!(restored.vcpu_count(), 2);
    restored.run(Duration::from_millis(200));
    let (a, b) = letters(&restored);
    assert!(a > 0 && b > 0, "vCPU 0 wrote {a}, vCPU 1 wrote {b}");
}
