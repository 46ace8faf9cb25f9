//! The VMM's control socket on a real KVM VM (no guest needed for these requests): memory
//! statistics, the balloon target reaching the device's config space, and clear errors for
//! bad requests, with the VMM serving on.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use brig_vmm::linux::LinuxVm;
use brig_vmm::virtio::{balloon::Balloon, mmio::MmioTransport};
use brig_vmm_api::control::{decode_line, encode_line, ControlReply, ControlRequest, MAX_LINE};

/// Sends one raw line and reads the typed reply.
fn ask_raw(
    stream: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    line: &str,
) -> ControlReply {
    writeln!(stream, "{line}").expect("send");
    let mut answer = String::new();
    reader.read_line(&mut answer).expect("answer");
    decode_line(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
}

fn ask(
    stream: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    request: &ControlRequest,
) -> ControlReply {
    ask_raw(stream, reader, encode_line(request).trim_end())
}

fn stats(stream: &mut UnixStream, reader: &mut BufReader<UnixStream>) -> (u64, Option<u64>) {
    match ask(stream, reader, &ControlRequest::Stats {}) {
        ControlReply::Stats { rss_kib, balloon } => (rss_kib, balloon.map(|b| b.target_mib)),
        other => panic!("stats gave {other:?}"),
    }
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

    let (rss_kib, target) = stats(&mut stream, &mut reader);
    assert!(rss_kib > 0);
    assert_eq!(target, Some(0));

    let done = ask(&mut stream, &mut reader, &ControlRequest::Balloon { target_mib: 32 });
    assert_eq!(done, ControlReply::Done);
    assert_eq!(shared.target_mib(), 32);
    assert_eq!(stats(&mut stream, &mut reader).1, Some(32));

    let bad_requests = [
        "stats",
        "balloon 32",
        r#"{"op":"balloon","target_mib":"lots"}"#,
        r#"{"op":"explode"}"#,
        r#"{"op":"snapshot"}"#,
        r#"{"op":"snapshot","dir":"relative"}"#,
        r#"{"op":"stats","extra":true}"#,
        "",
    ];
    for bad in bad_requests {
        let answer = ask_raw(&mut stream, &mut reader, bad);
        assert!(matches!(answer, ControlReply::Error { .. }), "{bad:?} gave {answer:?}");
    }
    assert_eq!(stats(&mut stream, &mut reader).1, Some(32), "still serving this connection");
    // An oversized line is refused and ends that connection only.
    let huge = format!("{{\"op\":\"snapshot\",\"dir\":\"/{}\"}}", "a".repeat(MAX_LINE));
    // The VMM may answer and hang up before the whole line is written: a broken pipe on the
    // write is expected then, and the answer is already waiting.
    if let Err(e) = writeln!(stream, "{huge}") {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "send: {e}");
    }
    let mut line = String::new();
    reader.read_line(&mut line).expect("answer");
    let answer = decode_line(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert!(matches!(answer, ControlReply::Error { ref message } if message.contains("at most")));
    // Still serving, on a new connection.
    let mut again = UnixStream::connect(&path).expect("connect");
    let mut again_reader = BufReader::new(again.try_clone().expect("clone"));
    assert!(stats(&mut again, &mut again_reader).0 > 0);
}

#[test]
fn a_vm_without_a_balloon_says_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let vm = LinuxVm::create(32, 1, false).expect("VM (needs /dev/kvm)");
    let path = dir.path().join("vm.ctl");
    brig_vmm::control::serve(&path, vm.control_handles()).expect("serve");
    let mut stream = UnixStream::connect(&path).expect("connect");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    assert_eq!(stats(&mut stream, &mut reader).1, None);
    let answer = ask(&mut stream, &mut reader, &ControlRequest::Balloon { target_mib: 8 });
    assert!(
        matches!(answer, ControlReply::Error { ref message } if message.contains("no balloon")),
        "{answer:?}"
    );
}
