//! Containers in a container-host VM, end to end. This machine's KVM cannot boot Linux, so the
//! node runs inside an emulated host (QEMU TCG with nested SVM, see `brig_tests::emulated`):
//! brigd there, with `[container_host] placement = "vm"`, boots a container-host VM on
//! brig-vmm (Debian's kernel, the layer images as disks, brig-agent running the node's own
//! container runtime) and places container sandboxes in it. From outside, through QEMU's UDP
//! forward, the SDK creates one and reads where it runs, and runs the same container checks the
//! host-kernel test runs (`brig_tests::behaviour`); then the emulated host kills brigd
//! (`kill -9`) and starts it again, and the test sees a running and a paused container come
//! back in the adopted VM with their files and processes, and a command and two sessions that
//! ran through the crash answer again; then the emulated host kills the VM's
//! VMM (`tests/emulated/chost.sh`), and the test sees its sandbox fail with `sandbox_lost` and
//! the reason, and a new container land in a fresh VM.
//! Emulated timings prove nothing about speed and are not asserted.

use std::time::{Duration, Instant};

use brig_sdk::{Client, ErrorCode, Placement, SandboxOptions, SandboxState, Tier};
use brig_tests::behaviour::{check_container, check_oversized_reads, Pace};
use brig_tests::emulated::{self, free_udp_port, wait_for_restart};

#[test]
fn containers_run_in_a_container_host_vm_and_a_dead_vm_fails_them_inside_an_emulated_host() {
    let port = free_udp_port();
    let run = emulated::run_driven(
        emulated::qemu(Some(port), None, "brig.l1=chost"),
        port,
        Duration::from_secs(900),
        Duration::from_secs(600),
        "container-host.log",
        drive_from_outside,
    );
    let (log, status, outside) = (run.log, run.status, run.outside);
    let has = |marker: &str| log.contains(marker);
    assert!(has("BRIG-L1-UP kvm=yes"), "the emulated host has no KVM (status {status}):\n{log}");
    let report = match &outside {
        Ok(report) => report.clone(),
        Err(e) => panic!("driving brigd from outside failed: {e}\n{log}"),
    };
    println!("{report}");
    assert!(has("BRIG-L1-BRIGD-RESTARTED"), "brigd was not restarted:\n{log}");
    assert!(has("BRIG-L1-UNRECORDED sb-"), "no record was removed:\n{log}");
    assert!(
        has("destroying a container no record claims"),
        "the unrecorded container was not destroyed in its VM:\n{log}"
    );
    assert!(has("BRIG-L1-CHOST killed chost-0"), "the VM was not killed:\n{log}");
    assert!(has("BRIG-L1-OUTSIDE-DONE"), "{log}");
}

/// The SDK's part, through the port forward: the shared container checks in a container-host
/// VM; then a kill of that VM (asked of the emulated host) fails its sandbox with the reason,
/// and the next container lands in a fresh VM. Returns a report of what passed.
async fn drive_from_outside(client: Client) -> Result<String, String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let in_vm = || SandboxOptions::container("busybox").placement(Placement::Vm);
    let node = client.node_status().await.map_err(e("node status"))?;
    if !node.tiers.contains(&Tier::Container) {
        return Err(format!("brigd offers no containers: {node:?}"));
    }
    // The first container boots the first container-host VM, and runs its image there.
    let first = client.create(in_vm()).await.map_err(e("create"))?;
    let placement = first.status().await.map_err(e("status"))?.placement.unwrap_or_default();
    if placement != "vm:chost-0" {
        return Err(format!("the first container is placed at {placement:?}"));
    }
    let out = first
        .exec(["sh", "-c", "echo host=$(hostname) busybox=$(test -x /bin/busybox && echo yes)"])
        .await
        .map_err(e("exec"))?;
    let text = out.stdout_text();
    if !text.starts_with("host=sandbox-") || !text.ends_with(" busybox=yes\n") {
        return Err(format!("the container did not run its image: {out:?}"));
    }
    first.destroy().await.map_err(e("destroy"))?;
    let (placement, passed) = check_container(&client, in_vm(), Pace { slow: 10 }).await?;
    if placement != "vm:chost-0" {
        return Err(format!("placed at {placement:?}"));
    }
    let mut report = format!("in {placement}, passed {} checks:\n", passed.len());
    for name in &passed {
        report.push_str(&format!("  {name}\n"));
    }

    // File reads a guest makes endless are refused, and brigd holds nothing after.
    let reader = client.create(in_vm()).await.map_err(e("create"))?;
    report.push_str(&check_oversized_reads(&client, &reader).await?);
    report.push('\n');
    reader.destroy().await.map_err(e("destroy"))?;

    report.push_str(&check_adoption(&client).await?);

    // The VM dies under a running sandbox.
    let victim = client.create(in_vm()).await.map_err(e("create"))?;
    victim.exec(["true"]).await.map_err(e("exec before the kill"))?;
    client
        .create(SandboxOptions::fncall().label("phase", "kill-host"))
        .await
        .map_err(e("create the kill marker"))?;
    let asked = Instant::now();
    loop {
        let state = victim.status().await.map_err(e("status"))?.state;
        if state == SandboxState::Failed {
            break;
        }
        if asked.elapsed() > Duration::from_secs(300) {
            return Err(format!("the sandbox still says {state:?} after the kill"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let err = victim.exec(["true"]).await.err().ok_or("exec in a dead VM succeeded")?;
    if err.code() != Some(ErrorCode::SandboxLost) || !err.to_string().contains("chost-0") {
        return Err(format!("exec in a dead VM: {err}"));
    }
    report.push_str(&format!("after the kill: {err}\n"));
    victim.destroy().await.map_err(e("destroy the lost sandbox"))?;

    // The next container lands in a fresh VM.
    let fresh = client.create(in_vm()).await.map_err(e("create after the kill"))?;
    let placement = fresh.status().await.map_err(e("status"))?.placement.unwrap_or_default();
    if placement == "vm:chost-0" || !placement.starts_with("vm:chost-") {
        return Err(format!("after the kill, placed at {placement:?}"));
    }
    let out = fresh.exec(["echo", "fresh"]).await.map_err(e("exec in the fresh VM"))?;
    if out.stdout != b"fresh\n" {
        return Err(format!("exec in the fresh VM: {out:?}"));
    }
    report.push_str(&format!("a new container runs in {placement}\n"));
    fresh.destroy().await.map_err(e("destroy"))?;
    client
        .create(SandboxOptions::fncall().label("phase", "done"))
        .await
        .map_err(e("create the done marker"))?;
    Ok(report)
}

/// brigd is killed (`kill -9`) and started again: it adopts the container-host VM, and a
/// running container comes back with its files and a process of its own, a command and
/// sessions that ran through the crash (read again by id, answering with their state), a
/// paused one comes back paused and resumes on its next request; one whose record the emulated host removed
/// meanwhile is gone (its container destroyed in the VM, which the console log shows).
async fn check_adoption(client: &Client) -> Result<String, String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let in_vm = || SandboxOptions::container("busybox").placement(Placement::Vm);
    let running = client.create(in_vm()).await.map_err(e("create"))?;
    let state = emulated::prepare_adopted(&running).await?;
    // A command and two sessions that run through the crash.
    let kept = emulated::start_kept_work(&running).await?;
    let paused = client.create(in_vm()).await.map_err(e("create"))?;
    paused.exec(["sh", "-c", "echo paused > /tmp/state"]).await.map_err(e("exec"))?;
    paused.pause().await.map_err(e("pause"))?;
    let unrecorded =
        client.create(in_vm().label("role", "unrecorded")).await.map_err(e("create"))?;
    let marker = client
        .create(SandboxOptions::fncall().label("phase", "restart"))
        .await
        .map_err(e("create the restart marker"))?;
    wait_for_restart(client, &marker).await?;
    let placement = running.status().await.map_err(e("status"))?.placement.unwrap_or_default();
    if placement != "vm:chost-0" {
        return Err(format!("after the restart, the container is placed at {placement:?}"));
    }
    emulated::check_adopted(&running, &state).await?;
    emulated::check_kept_work(&running, kept, "the restart").await?;
    emulated::check_paused_adopted(&paused, b"paused\n").await?;
    match unrecorded.status().await {
        Err(err) if err.code() == Some(ErrorCode::NotFound) => {}
        other => return Err(format!("a sandbox with no record after the restart: {other:?}")),
    }
    for sb in [&running, &paused] {
        sb.destroy().await.map_err(e("destroy after the restart"))?;
    }
    Ok("after a kill -9 of brigd: a running and a paused container adopted in vm:chost-0, \
        with a command and two sessions that ran through it\n"
        .into())
}
