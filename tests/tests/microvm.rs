//! Linux guests on brig-vmm.
//!
//! This machine's KVM (PVM) cannot run a Linux kernel, so the end-to-end boot runs inside an
//! emulated host (QEMU TCG with an emulated AMD-V CPU, docs/GUEST.md section 2): its initramfs
//! loads KVM with nested SVM and runs the static brig-vmm, which boots Debian's cloud kernel with an
//! initramfs and command line, passes its console through and gives it a virtio-rng described
//! in ACPI and a virtio-vsock; the guest starts brig-agent and asks for a snapshot; a second
//! brig-vmm process resumes it (device and queue state included) from the snapshot files, and
//! the host runs a command in it through the agent over vsock. Then the node's tier library
//! (brig-vmtier) makes its own snapshot and runs two isolated VMs from it, gets memory back from
//! a guest (free-page reporting, the balloon), pauses and resumes one and forks it; last, brigd serves
//! the microvm tier and this test drives it with the SDK through QEMU's port forward. The
//! emulated host's side is `tests/emulated/l1-init.sh`.
//! Emulated timings prove nothing about speed and are not asserted. Natively, the boot
//! protocol's zero page is checked as the kernel will read it.

use std::time::Duration;

use brig_sdk::{Client, Cmd, ErrorCode, ExecEvent, SandboxOptions, SandboxState, Tier};
use brig_tests::behaviour::{
    check_command_data, check_exec_output, check_output_cap, check_oversized_reads,
    check_streamed_stdin, check_streaming, Pace,
};
use brig_tests::emulated::{self, free_udp_port, vm_artifact};
use brig_vmm::linux::LinuxVm;
use brig_vmm::virtio::{mmio::MmioTransport, rng::Rng};

#[test]
fn a_linux_guest_boots_snapshots_and_resumes_on_brig_vmm_inside_an_emulated_host() {
    let port = free_udp_port();
    let run = emulated::run_driven(
        emulated::qemu(Some(port), None, ""),
        port,
        Duration::from_secs(1200),
        Duration::from_secs(840),
        "microvm-linux-boot.log",
        drive_from_outside,
    );
    let (log, status, outside) = (run.log, run.status, run.outside);
    let has = |marker: &str| log.contains(marker);
    assert!(has("BRIG-L1-UP kvm=yes"), "the emulated host has no KVM (status {status}):\n{log}");
    assert!(has("BRIG-L2-UP kernel=6."), "the guest did not reach init:\n{log}");
    assert!(has("brig.test=1"), "the command line did not reach the guest:\n{log}");
    // Linux found the virtio-mmio device in our ACPI tables and reads entropy from it.
    assert!(has("BRIG-L2-RNG current=virtio_rng.0 bytes="), "virtio-rng not in use:\n{log}");
    // virtio-blk: the busybox EROFS layer (read-only) under an overlay whose upper half is on
    // a writable ext4 disk.
    assert!(
        has("BRIG-L2-DISKS layers=1 layer-files=") && has("merged=written in the guest"),
        "{log}"
    );
    // The guest asked for a snapshot; brig-vmm saved it and exited 4.
    assert!(has("BRIG-L1-SNAPSHOT rc=4"), "no snapshot:\n{log}");
    // A new brig-vmm process restored it; the guest went on with its tmpfs intact and rebooted.
    assert!(has("BRIG-L2-RESUMED state=made-before-snapshot-"), "the guest did not resume:\n{log}");
    // The restored virtio-rng (transport and queue state from the snapshot) keeps serving.
    let after = log.split("BRIG-L1-SNAPSHOT").nth(1).unwrap_or("");
    assert!(after.contains(" rng=") && after.contains("requests served) [(4, "), "{log}");
    // The host ran a command in the restored guest through brig-agent over our userspace
    // virtio-vsock: output, stderr and exit status came back.
    assert!(after.contains("hello from "), "no command output over vsock:\n{log}");
    assert!(after.contains("made-before-snapshot-") && after.contains("oops"), "{log}");
    assert!(after.contains("disk after resume: written in the guest"), "disks lost:\n{log}");
    assert!(has("BRIG-L1-EXEC rc=7"), "the exit status did not come back:\n{log}");
    assert!(after.contains("(19, "), "the vsock device served nothing:\n{log}");
    assert!(has("brig-vmm: Shutdown"), "brig-vmm did not see the guest shut down:\n{log}");
    assert!(has("BRIG-L1-RESULT rc=0"), "the restored VM failed:\n{log}");
    // The node's tier library on the same guest: snapshot spawn of two VMs, isolated commands,
    // destroy with cleanup.
    for step in [
        "created vm-b from the snapshot",
        "isolated guests",
        "each VMM runs jailed",
        "vm-b resumed into a warm VMM",
        "two vCPUs online after restore",
        "files move in and out of the guest intact",
        "a shell session keeps its state",
        "a kept session outlives its connection and is taken back by id",
        "each VM has its own hostname and random stream",
        "a timed-out command is killed in the guest",
        "free-page reporting: the VMM held",
        "the balloon takes",
        "pause stops the VMM",
        "fork: two children start from the running VM's state and diverge",
        "destroy reaps the VMM",
        "a restarted tier adopts the VMs it recorded and stops the rest",
    ] {
        assert!(has(&format!("BRIG-VMTIER-OK {step}")), "vmtier step {step:?} missing:\n{log}");
    }
    assert!(has("BRIG-L1-VMTIER rc=0"), "brig-vmtier failed:\n{log}");
    // The SDK on this side of the emulated host: create, streamed exec, files, pause and
    // implicit resume, fork.
    if let Err(e) = &outside {
        let what = "driving the emulated host's brigd from outside failed";
        panic!("{}", emulated::failure(what, e, &log));
    }
    assert!(has("BRIG-L1-BRIGD-RESTARTED"), "brigd was not restarted:\n{log}");
    assert!(has("BRIG-L1-VMM-KILLED sb-"), "no VMM was killed under brigd:\n{log}");
    assert!(has("BRIG-L1-OUTSIDE-DONE"), "the emulated host did not see the end:\n{log}");
}

/// The SDK against brigd in the emulated host (through QEMU's UDP forward): a microvm sandbox
/// is created, runs commands with streamed output, keeps a shell session, moves files, pauses and resumes on the next
/// request, forks into two children that start from its state; a sandbox of two stacked
/// layers sees both; then a sandbox labelled
/// `phase=done` tells the emulated host to finish.
async fn drive_from_outside(client: Client) -> Result<(), String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let sb = client.create(SandboxOptions::tier(Tier::Microvm)).await.map_err(e("create"))?;
    let pace = Pace { slow: 10 };
    check_exec_output(&sb).await?;
    check_command_data(&sb).await?;
    check_streaming(&sb, pace).await?;
    // Stdin from the request.
    let out = sb
        .exec_with(
            Cmd::new(["sh", "-c", "cat; echo; cd /tmp && pwd"])
                .stdin(b"to-stdin".to_vec())
                .cwd("/"),
        )
        .await
        .map_err(e("exec with stdin"))?;
    if out.stdout != b"to-stdin\n/tmp\n" {
        return Err(format!("stdin: {out:?}"));
    }
    check_output_cap(&sb, pace).await?;
    check_streamed_stdin(&sb).await?;
    // A command outlives its client: listed, attached again by id, killed.
    let running = sb
        .exec_stream(Cmd::new(["sh", "-c", "echo started; sleep 60; echo never"]))
        .await
        .map_err(e("exec_stream"))?;
    let id = running.exec_id();
    drop(running);
    let listed = sb.execs().await.map_err(e("execs"))?;
    if !listed.iter().any(|x| x.exec_id == id && x.result.is_none()) {
        return Err(format!("exec {id} not listed as running: {listed:?}"));
    }
    let mut again = sb.attach(id).await.map_err(e("attach"))?;
    match again.next().await {
        Some(Ok(ExecEvent::Stdout(b))) if &b[..] == b"started\n" => {}
        other => return Err(format!("attached, first event: {other:?}")),
    }
    sb.kill(id).await.map_err(e("kill"))?;
    let out = again.collect().await.map_err(e("collect after kill"))?;
    if !out.stdout.is_empty() || !out.result.killed {
        return Err(format!("after kill: {out:?}"));
    }
    // A shell session: state kept between commands.
    let shell = sb.open_session().await.map_err(e("open_session"))?;
    shell
        .run("mkdir -p /work && cd /work && X=kept", Duration::from_secs(30))
        .await
        .map_err(e("session run"))?;
    let out = shell.run("echo $X", Duration::from_secs(30)).await.map_err(e("session run"))?;
    if out.stdout != b"kept\n" || out.cwd != "/work" || out.exit_code != Some(0) {
        return Err(format!("session: {out:?}"));
    }
    shell.close().await.map_err(e("session close"))?;
    let blob: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    sb.write_file("/work/blob", &blob).await.map_err(e("write_file"))?;
    if sb.read_file("/work/blob").await.map_err(e("read_file"))? != blob {
        return Err("the file changed in transit".into());
    }
    check_oversized_reads(&client, &sb).await?;
    check_guest_files(&sb).await?;
    sb.exec(["sh", "-c", "echo kept-in-memory > /tmp/state"]).await.map_err(e("exec"))?;
    // A command and two sessions that run through the pause (the guest keeps them in the
    // saved VM; brigd takes them back after the resume).
    let kept = emulated::start_kept_work(&sb).await?;
    sb.pause().await.map_err(e("pause"))?;
    let state = sb.status().await.map_err(e("status"))?.state;
    if state != SandboxState::Paused {
        return Err(format!("after pause: {state:?}"));
    }
    // Any request resumes it, with its memory as it was.
    let out = sb.exec(["cat", "/tmp/state", "/work/blob"]).await.map_err(e("exec"))?;
    if !out.stdout.starts_with(b"kept-in-memory\n") || out.stdout.len() != 15 + blob.len() {
        return Err(format!("after resume: {} bytes, {:?}", out.stdout.len(), out.stderr));
    }
    emulated::check_kept_work(&sb, kept, "the pause").await?;
    check_fork_mid_stream(&sb, pace).await?;
    let kids = sb.fork(2).await.map_err(e("fork"))?;
    let mut names = vec![sb.exec(["hostname"]).await.map_err(e("exec"))?.stdout];
    for kid in &kids {
        let out = kid.exec(["cat", "/tmp/state"]).await.map_err(e("exec in a child"))?;
        if out.stdout != b"kept-in-memory\n" {
            return Err(format!("child {}: {out:?}", kid.id()));
        }
        names.push(kid.exec(["hostname"]).await.map_err(e("exec"))?.stdout);
    }
    names.sort();
    names.dedup();
    if names.len() != 3 {
        return Err(format!("children share a hostname: {names:?}"));
    }
    for s in kids.iter().chain(std::iter::once(&sb)) {
        s.destroy().await.map_err(e("destroy"))?;
    }
    // An image of two layers stacked (base first), each a read-only disk of the VM.
    let stacked = client
        .create(SandboxOptions::tier(Tier::Microvm).image("busybox+extra"))
        .await
        .map_err(e("create busybox+extra"))?;
    let out = stacked
        .exec(["sh", "-c", "cat /etc/extra-layer.txt; test -x /bin/busybox && echo busybox-too"])
        .await
        .map_err(e("exec in busybox+extra"))?;
    if out.stdout != b"from the extra layer\nbusybox-too\n" {
        return Err(format!("layers not stacked: {out:?}"));
    }
    // Its files live on its writable disk, which a fork copies while the parent stands still.
    stacked
        .exec(["sh", "-c", "echo on-the-disk > /data.txt && sync"])
        .await
        .map_err(e("write on the disk"))?;
    let kid = stacked.fork(1).await.map_err(e("fork of an image sandbox"))?;
    let kid = kid.first().ok_or("fork made no child")?;
    let out = kid.exec(["cat", "/data.txt", "/etc/extra-layer.txt"]).await.map_err(e("exec"))?;
    if out.stdout != b"on-the-disk\nfrom the extra layer\n" {
        return Err(format!("forked image sandbox: {out:?}"));
    }
    kid.destroy().await.map_err(e("destroy"))?;
    stacked.destroy().await.map_err(e("destroy"))?;
    check_adoption(&client).await?;
    client
        .create(SandboxOptions::tier(Tier::Microvm).label("phase", "done"))
        .await
        .map_err(e("create the done marker"))?;
    Ok(())
}

/// brigd is killed (kill -9) in the emulated host and started again: a running microVM is
/// adopted with its processes and memory, a command that ran through the crash is read again
/// by id whole and with its real status, sessions answer under their ids with their state
/// (one idle, one with a command running through the crash), a paused one resumes on its next
/// request, and a sandbox whose VMM was killed meanwhile answers `sandbox_lost` and can be
/// destroyed.
async fn check_adoption(client: &Client) -> Result<(), String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let vm = || SandboxOptions::tier(Tier::Microvm);
    let running = client.create(vm()).await.map_err(e("create"))?;
    // A file and a process of the guest's own (a session of its own).
    let state = emulated::prepare_adopted(&running).await?;
    // A command and two sessions that run through the crash.
    let kept = emulated::start_kept_work(&running).await?;
    let paused = client.create(vm()).await.map_err(e("create"))?;
    paused.exec(["sh", "-c", "echo paused-memory > /tmp/state"]).await.map_err(e("exec"))?;
    paused.pause().await.map_err(e("pause"))?;
    let doomed = client.create(vm().label("role", "doomed")).await.map_err(e("create"))?;
    let marker = client.create(vm().label("phase", "restart")).await.map_err(e("create"))?;
    emulated::wait_for_restart(client, &marker).await?;
    emulated::check_adopted(&running, &state).await?;
    emulated::check_kept_work(&running, kept, "the restart").await?;
    emulated::check_paused_adopted(&paused, b"paused-memory\n").await?;
    match doomed.exec(["true"]).await {
        Err(err) if err.code() == Some(brig_sdk::ErrorCode::SandboxLost) => {}
        other => return Err(format!("a VM whose VMM was killed answered {other:?}")),
    }
    for sb in [&running, &paused, &doomed] {
        sb.destroy().await.map_err(e("destroy after the restart"))?;
    }
    Ok(())
}

/// A fork while the guest streams output over vsock at full rate: the snapshot holds the
/// devices still from reading their state to the end of the memory dump, so the parent's
/// stream goes on with no byte lost or torn, and the child (whose vsock is reset on restore)
/// starts from the snapshot and serves new commands.
async fn check_fork_mid_stream(sb: &brig_sdk::Sandbox, pace: Pace) -> Result<(), String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let lines = 100_000u32;
    let expected: String = (1..=lines).map(|i| format!("{i}\n")).collect();
    let mut stream = sb
        .exec_stream(Cmd::new(["seq", "1", &lines.to_string()]).timeout(pace_secs(pace, 60)))
        .await
        .map_err(e("exec_stream seq"))?;
    let mut got = Vec::with_capacity(expected.len());
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(b))) => got.extend_from_slice(&b),
        other => return Err(format!("the stream did not start: {other:?}")),
    }
    let kids = sb.fork(1).await.map_err(e("fork mid-stream"))?;
    let streamed_during_fork = got.len();
    while let Some(event) = stream.next().await {
        match event.map_err(e("stream after the fork"))? {
            ExecEvent::Stdout(b) => got.extend_from_slice(&b),
            ExecEvent::Stderr(b) => return Err(format!("stderr: {}", String::from_utf8_lossy(&b))),
            ExecEvent::Exited(r) if r.exit_code == Some(0) => break,
            ExecEvent::Exited(r) => return Err(format!("seq ended with {r:?}")),
        }
    }
    if got != expected.as_bytes() {
        let first_bad = got.iter().zip(expected.as_bytes()).position(|(a, b)| a != b);
        return Err(format!(
            "the stream through the fork: {} of {} bytes, first difference at {first_bad:?} \
             ({streamed_during_fork} bytes had arrived when the fork began)",
            got.len(),
            expected.len()
        ));
    }
    let kid = kids.first().ok_or("the fork made no child")?;
    let out = kid.exec(["echo", "child after the stream"]).await.map_err(e("exec in the child"))?;
    if out.stdout != b"child after the stream\n" {
        return Err(format!("child after a mid-stream fork: {out:?}"));
    }
    kid.destroy().await.map_err(e("destroy the child"))?;
    Ok(())
}

/// The VM's own files through its agent: stat, list, mkdir and remove, and a missing file is
/// `NotFound` (not an internal error).
async fn check_guest_files(sb: &brig_sdk::Sandbox) -> Result<(), String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    sb.mkdir("/work/d/e", true).await.map_err(e("mkdir -p"))?;
    let blob = sb.stat("/work/blob").await.map_err(e("stat"))?;
    if blob.kind != brig_proto::FileKind::File || blob.size != 200_000 {
        return Err(format!("stat /work/blob: {blob:?}"));
    }
    let listed = sb.list_dir("/work").await.map_err(e("list"))?;
    let names: Vec<&str> = listed.iter().map(|f| f.path.as_str()).collect();
    let has = |name: &str| names.iter().any(|p| p.ends_with(name));
    if !has("/blob") || !has("/d") {
        return Err(format!("list /work: {names:?}"));
    }
    let refused = sb.remove("/work/d", false).await;
    if refused.is_ok() {
        return Err("a non-empty directory was removed without recursive".into());
    }
    sb.remove("/work/d", true).await.map_err(e("remove -r"))?;
    for (what, result) in [
        ("stat of a removed directory", sb.stat("/work/d").await.map(drop)),
        ("read of a missing file", sb.read_file("/work/missing").await.map(drop)),
    ] {
        match result {
            Err(err) if err.code() == Some(ErrorCode::NotFound) => {}
            other => return Err(format!("{what}: {other:?}, not NotFound")),
        }
    }
    Ok(())
}

fn pace_secs(pace: Pace, secs: u64) -> Duration {
    Duration::from_secs(secs * u64::from(pace.slow))
}

#[test]
fn the_zero_page_says_what_the_kernel_needs() {
    let cmdline = "console=ttyS0 reboot=t panic=-1 brig.check=zero-page";
    let vm = LinuxVm::boot(
        128,
        2,
        &vm_artifact("vmlinuz"),
        Some(&vm_artifact("l2-initrd.gz")),
        cmdline,
        false,
        vec![MmioTransport::new(Box::new(Rng::default()))],
    )
    .expect("set up the boot");
    let mem = vm.memory();
    let read = |addr: u64, len: usize| {
        let mut b = vec![0u8; len];
        mem.read(addr, &mut b).expect("read");
        b
    };
    let u32_at = |addr: u64| u32::from_le_bytes(read(addr, 4).try_into().expect("4"));
    const ZERO_PAGE: u64 = 0x7000;
    // setup_header at 0x1f1: "HdrS" at 0x202, loader type 0xff, command line pointer.
    assert_eq!(&read(ZERO_PAGE + 0x202, 4), b"HdrS");
    assert_eq!(read(ZERO_PAGE + 0x210, 1)[0], 0xff);
    let cmd_ptr = u64::from(u32_at(ZERO_PAGE + 0x228));
    assert_eq!(&read(cmd_ptr, cmdline.len() + 1)[..cmdline.len()], cmdline.as_bytes());
    assert_eq!(read(cmd_ptr + cmdline.len() as u64, 1)[0], 0, "command line not terminated");
    // The initramfs sits where the header says, whole.
    let (ramdisk, size) = (u64::from(u32_at(ZERO_PAGE + 0x218)), u32_at(ZERO_PAGE + 0x21c));
    let initrd = std::fs::read(vm_artifact("l2-initrd.gz")).expect("initrd");
    assert_eq!(size as usize, initrd.len());
    assert_eq!(read(ramdisk, 64), initrd[..64].to_vec());
    assert!(ramdisk + u64::from(size) <= 128 << 20);
    // Two RAM ranges in the e820 map, none over the legacy hole.
    assert_eq!(read(ZERO_PAGE + 0x1e8, 1)[0], 2);
    let entry = |i: u64| {
        let e = read(ZERO_PAGE + 0x2d0 + i * 20, 20);
        let addr = u64::from_le_bytes(e[0..8].try_into().expect("8"));
        let len = u64::from_le_bytes(e[8..16].try_into().expect("8"));
        (addr, len, u32::from_le_bytes(e[16..20].try_into().expect("4")))
    };
    assert_eq!(entry(0), (0, 0x9_fc00, 1));
    assert_eq!(entry(1), (0x10_0000, (128 << 20) - 0x10_0000, 1));
    // The RSDP is where the zero page says, and the DSDT names the virtio-mmio device.
    let rsdp = u64::from_le_bytes(read(ZERO_PAGE + 0x070, 8).try_into().expect("8"));
    assert_eq!(&read(rsdp, 8), b"RSD PTR ");
    let tables = read(rsdp, 0x2000);
    assert!(tables.windows(8).any(|w| w == b"LNRO0005"), "no virtio-mmio device described");
    // The protected-mode kernel is loaded at 1 MiB.
    assert!(read(0x10_0000, 4096).iter().any(|b| *b != 0), "kernel not loaded");
}

#[tokio::test]
async fn brigd_offers_microvm_only_where_linux_guests_run() {
    let config = format!(
        "[microvm]\nkernel = {:?}\ninitrd = {:?}\n",
        vm_artifact("vmlinuz"),
        vm_artifact("l2-initrd.gz")
    );
    let daemon = brig_tests::Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("client");
    let status = client.node_status().await.expect("status");
    let virtualization = brig_vmm::Virtualization::detect();
    let offered = status.tiers.contains(&brig_sdk::Tier::Microvm);
    assert_eq!(offered, virtualization.runs_linux(), "{status:?} on {virtualization:?}");
    if !offered {
        // Asking anyway gets a typed answer that says why, and the daemon goes on.
        let err = client
            .create(brig_sdk::SandboxOptions::tier(brig_sdk::Tier::Microvm))
            .await
            .expect_err("no microvm tier here");
        assert_eq!(err.code(), Some(brig_sdk::ErrorCode::Unavailable), "{err}");
        assert!(err.to_string().contains(virtualization.as_str()), "{err}");
        client.create(brig_sdk::SandboxOptions::fncall()).await.expect("fncall still works");
    }
}
