//! The VMM's control socket on a real KVM VM (no guest needed for these requests): memory
//! statistics, the balloon target reaching the device's config space, and clear errors for
//! bad requests, with the VMM serving on.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use brig_vmm::linux::LinuxVm;
use brig_vmm::virtio::{balloon::Balloon, mmio::MmioTransport};

fn ask(
    stream: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    line: &str,
) -> serde_json::Value {
    writeln!(stream, "{line}").expect("send");
    let mut answer = String::new();
    reader.read_line(&mut answer).expect("answer");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
}

#[test]
fn the_control_socket_reports_memory_and_steers_the_balloon() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut vm = LinuxVm::create(64, 1, false).expect("VM (needs /dev/kvm)");
    let (balloon, shared) = Balloon::new();
    vm.attach(MmioTransport::new(Box::new(balloon))).expect("attach");
    vm.balloon = Some((0, shared.clone()));
    let path = dir.path().join("vm.ctl");
    brig_vmm::control::serve(&path, vm.control_handles()).expect("serve");
    let mut stream = UnixStream::connect(&path).expect("connect");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));

    let stats = ask(&mut stream, &mut reader, "stats");
    assert!(stats["rss_kib"].as_u64().unwrap_or(0) > 0, "{stats}");
    assert_eq!(stats["balloon"]["target_mib"], 0, "{stats}");

    let ok = ask(&mut stream, &mut reader, "balloon 32");
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(shared.target_mib(), 32);
    let stats = ask(&mut stream, &mut reader, "stats");
    assert_eq!(stats["balloon"]["target_mib"], 32, "{stats}");

    for bad in ["balloon lots", "explode", "snapshot", ""] {
        let answer = ask(&mut stream, &mut reader, bad);
        assert!(answer["error"].is_string(), "{bad:?} gave {answer}");
    }
    // Still serving, on a new connection too.
    let mut again = UnixStream::connect(&path).expect("connect");
    let mut again_reader = BufReader::new(again.try_clone().expect("clone"));
    assert!(ask(&mut again, &mut again_reader, "stats")["rss_kib"].is_u64());
}

#[test]
fn a_vm_without_a_balloon_says_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let vm = LinuxVm::create(32, 1, false).expect("VM (needs /dev/kvm)");
    let path = dir.path().join("vm.ctl");
    brig_vmm::control::serve(&path, vm.control_handles()).expect("serve");
    let mut stream = UnixStream::connect(&path).expect("connect");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    assert!(ask(&mut stream, &mut reader, "stats")["balloon"].is_null());
    let answer = ask(&mut stream, &mut reader, "balloon 8");
    assert!(answer["error"].as_str().unwrap_or("").contains("no balloon"), "{answer}");
}
