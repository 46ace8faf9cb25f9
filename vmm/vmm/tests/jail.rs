//! The VMM's jail on a real KVM VM (the purpose-built guest restored from a snapshot): the
//! jailed process still restores and serves its guest, and from outside it has no
//! capabilities, no_new_privs, a seccomp filter, a mount namespace of its own where only the
//! named directory is writable, and sits in the cgroup it was given.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn vmm() -> &'static str {
    env!("CARGO_BIN_EXE_brig-vmm")
}

fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// The options of mount point `point` in `pid`'s namespace.
fn mount_options(pid: u32, point: &str) -> Option<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4) == Some(&point)).then(|| fields.get(5).unwrap_or(&"").to_string())
    })
}

#[test]
fn a_jailed_vmm_serves_its_guest_with_nothing_else_left() {
    let dir = tempfile::tempdir().expect("tmp");
    let snap = dir.path().join("snap");
    let out = Command::new(vmm())
        .args(["snapshot", "--out"])
        .arg(&snap)
        .output()
        .expect("brig-vmm snapshot (needs /dev/kvm)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let writable = dir.path().join("vm");
    std::fs::create_dir_all(&writable).expect("dir");
    // A cgroup to join, in whichever hierarchy this host has.
    let cgroup = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"]
        .iter()
        .map(std::path::Path::new)
        .find(|root| root.join("cgroup.procs").exists())
        .map(|root| root.join(format!("brig-jail-test-{}", std::process::id())));
    if let Some(cg) = &cgroup {
        std::fs::create_dir_all(cg).expect("cgroup");
    }
    let mut cmd = Command::new(vmm());
    cmd.args(["restore", "--snapshot"])
        .arg(&snap)
        .arg("--jail")
        .arg("--jail-writable")
        .arg(&writable);
    if let Some(cg) = &cgroup {
        cmd.arg("--jail-cgroup").arg(cg.join("cgroup.procs"));
    }
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn");
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("first answer");
    assert!(line.contains(r#""reply":1002"#), "the jailed VMM did not restore: {line:?}");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "5").expect("request");
    line.clear();
    stdout.read_line(&mut line).expect("answer");
    assert!(!line.trim().is_empty(), "no answer from the jailed guest");

    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2", "no seccomp filter");
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).expect("mnt ns");
    assert_ne!(ns(&pid.to_string()), ns("self"), "no mount namespace of its own");
    let root = mount_options(pid, "/").expect("root mount");
    assert!(root.split(',').any(|o| o == "ro"), "root stays writable: {root}");
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let writable_text = writable.to_str().expect("utf-8");
    // The visible mount at each point is the last one listed (mounts may be stacked).
    let mut visible = std::collections::BTreeMap::new();
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if let (Some(point), Some(options)) = (f.get(4), f.get(5)) {
            visible.insert(*point, *options);
        }
    }
    let left_writable: Vec<&str> = visible
        .iter()
        .filter(|(point, options)| **point != writable_text && options.starts_with("rw"))
        .map(|(point, _)| *point)
        .collect();
    assert!(left_writable.is_empty(), "mounts left writable: {left_writable:?}");
    let own = mount_options(pid, writable_text).expect("writable mount");
    assert!(own.split(',').any(|o| o == "rw"), "the VM's directory is not writable: {own}");
    if let Some(cg) = &cgroup {
        let name = cg.file_name().expect("name").to_string_lossy().into_owned();
        let member = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
        assert!(member.contains(&name), "not in its cgroup: {member}");
    }
    drop(stdin);
    assert!(child.wait().expect("wait").success(), "the jailed VMM did not end cleanly");
    if let Some(cg) = &cgroup {
        let _ = std::fs::remove_dir(cg);
    }
}
