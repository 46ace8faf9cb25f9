//! The full-VM tier end to end. This machine's KVM cannot boot Linux, so it runs inside an
//! emulated host (QEMU TCG with nested SVM, see `brig_tests::emulated`) whose first disk is the
//! Debian image `scripts/build-fullvm-image.sh` builds: systemd as init, its own kernel and
//! initramfs, PostgreSQL, brig-agent as a service. brigd there offers `--tier fullvm` (the
//! emulated host only sets it up: `tests/emulated/fullvm.sh`), and this test drives it with
//! the SDK through QEMU's UDP forward, checking each step as it happens: a sandbox boots the
//! image on brig-vmm with a copy-on-write overlay of its own; runs commands; starts PostgreSQL
//! and queries it from inside; pauses and resumes implicitly with its files and running
//! service intact; forks (the child carries the running database, the parent does not see the
//! child's files); and both are removed, leaving no disks, sockets or network namespaces
//! behind (the emulated host counts them once the test says it is done). The sandbox has
//! egress rules: its virtio-net is a tap in a network namespace of its own, and it reaches the
//! one service they allow (a web server in another namespace of the emulated host) but not
//! that server's other port, which the audit trail records as denied; after the resume and in
//! the fork's child (a network of its own) the service still answers.
//! Emulated timings prove nothing about speed and are not asserted.

use std::time::{Duration, Instant};

use brig_sdk::{AuditKind, Client, Sandbox, SandboxOptions, SandboxState, Tier};
use brig_tests::artifacts;
use brig_tests::emulated::{self, free_udp_port};

#[test]
fn a_debian_vm_boots_systemd_serves_postgres_and_forks_inside_an_emulated_host() {
    let image = artifacts().join("fullvm").join("rootfs.ext4");
    assert!(image.exists(), "{} is missing: run scripts/build-fullvm-image.sh", image.display());
    let port = free_udp_port();
    let run = emulated::run_driven(
        emulated::qemu(Some(port), Some(&image), "brig.l1=fullvm"),
        port,
        Duration::from_secs(1500),
        Duration::from_secs(600),
        "fullvm-boot.log",
        drive_from_outside,
    );
    let (log, status, outside) = (run.log, run.status, run.outside);
    let has = |marker: &str| log.contains(marker);
    assert!(has("BRIG-L1-UP kvm=yes"), "the emulated host has no KVM (status {status}):\n{log}");
    assert!(!has("BRIG-L1-FULLVM no remote service"), "no web service to reach:\n{log}");
    match &outside {
        Ok(report) => println!("{report}"),
        Err(e) => {
            panic!("{}", emulated::failure("driving brigd in the emulated host failed", e, &log))
        }
    }
    assert!(has("BRIG-L1-FULLVM brigd restarted"), "brigd was not restarted:\n{log}");
    // Counted by the emulated host after the test destroyed everything it made.
    assert!(has("BRIG-L1-FULLVM leftovers=0 netns=0"), "a removed VM left something:\n{log}");
}

/// A shell line that fetches the allowed service's page over the VM's network.
const WEB: &str =
    "exec 3<>/dev/tcp/10.77.0.2/8080 && printf 'GET /hello.txt HTTP/1.0\\r\\n\\r\\n' >&3 \
                   && tail -1 <&3";
const PAGE: &str = "hello from the allowed service\n";

/// Runs `script` with bash in `sb`; its stdout, or what went wrong (with stderr).
async fn bash(sb: &Sandbox, script: &str) -> Result<String, String> {
    let out = sb
        .exec(["bash", "-c", script])
        .await
        .map_err(|e| format!("exec {script:?} in {}: {e}", sb.id()))?;
    if out.result.exit_code != Some(0) {
        return Err(format!(
            "{script:?} in {} ended {:?}: {}{}",
            sb.id(),
            out.result,
            out.stdout_text(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out.stdout_text())
}

/// Expects `script`'s stdout in `sb` to be `want`.
async fn expect(sb: &Sandbox, what: &str, script: &str, want: &str) -> Result<(), String> {
    let got = bash(sb, script).await?;
    if got != want {
        return Err(format!("{what}: {got:?}, expected {want:?}"));
    }
    Ok(())
}

/// The SDK's part: every step of the scenario, checked as it happens; then a sandbox labelled
/// `phase=done` tells the emulated host to count what is left and finish.
async fn drive_from_outside(client: Client) -> Result<String, String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let mut report = String::new();
    let node = client.node_status().await.map_err(e("node status"))?;
    if !node.tiers.contains(&Tier::Fullvm) {
        return Err(format!("brigd does not offer fullvm: {node:?}"));
    }
    let started = Instant::now();
    let sb = client
        .create(SandboxOptions::tier(Tier::Fullvm).egress(["web"]))
        .await
        .map_err(e("create --tier fullvm --egress web"))?;
    report.push_str(&format!("{} booted ({:?} emulated)\n", sb.id(), started.elapsed()));
    // The image's own init ran the system to the end, on two vCPUs, from the virtio-blk root.
    expect(
        &sb,
        "the system",
        "echo init=$(cat /proc/1/comm) state=$(systemctl is-system-running --wait) \
         cpus=$(nproc) root=$(findmnt -no SOURCE /)",
        "init=systemd state=running cpus=2 root=/dev/vda\n",
    )
    .await?;
    // Egress: the allowed service answers; the same server's other port does not, and the
    // audit trail records the attempt as denied.
    expect(&sb, "the allowed service", WEB, PAGE).await?;
    let denied = bash(
        &sb,
        "timeout 5 bash -c 'exec 3<>/dev/tcp/10.77.0.2/8081' 2>/dev/null && echo reached; true",
    )
    .await?;
    if !denied.is_empty() {
        return Err("a denied port answered".into());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = sb.audit(0).await.map_err(e("audit"))?;
        let recorded = events.iter().any(|ev| {
            matches!(&ev.kind, AuditKind::Egress { allowed: false, dst, port: Some(8081), .. }
                if dst == "10.77.0.2")
        });
        if recorded {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the denied connection is not in the audit trail: {events:?}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    report.push_str("egress: the allowed service answers, the other port is denied and audited\n");
    // A service: PostgreSQL starts under systemd and answers a client inside the VM, over TCP.
    expect(
        &sb,
        "PostgreSQL",
        "systemctl start postgresql && pg_isready -q -t 120 -h 127.0.0.1 && \
         su postgres -c 'psql -h /var/run/postgresql -tAc \"select 40 + 2\"'",
        "42\n",
    )
    .await?;
    bash(&sb, "echo kept-across-pause > /root/mark").await?;
    sb.pause().await.map_err(e("pause"))?;
    let state = sb.status().await.map_err(e("status"))?.state;
    if state != SandboxState::Paused {
        return Err(format!("after pause: {state:?}"));
    }
    // The next request resumes it with its files, its running service and its network.
    let alive = "echo mark=$(cat /root/mark) postgres=$(pg_isready -t 30 -h 127.0.0.1 >/dev/null \
                 && echo up)";
    let carried = "mark=kept-across-pause postgres=up\n";
    expect(&sb, "after the resume", alive, carried).await?;
    expect(&sb, "the service after the resume", WEB, PAGE).await?;
    report.push_str("PostgreSQL answers; paused and resumed with files, service and network\n");
    // A fork: the child carries the running database and has a network of its own; the
    // parent does not see the child's files; each has its own hostname.
    let kids = sb.fork(1).await.map_err(e("fork"))?;
    let child = kids.first().ok_or("the fork made no child")?;
    expect(child, "the child", alive, carried).await?;
    expect(child, "the service from the child", WEB, PAGE).await?;
    bash(child, "echo child-only > /root/child").await?;
    expect(&sb, "the parent", "test -e /root/child && echo yes || echo no", "no\n").await?;
    let hosts = (bash(&sb, "hostname").await?, bash(child, "hostname").await?);
    if hosts.0 == hosts.1 || !hosts.1.starts_with("brig-") {
        return Err(format!("parent and child hostnames: {hosts:?}"));
    }
    report.push_str(&format!("forked: {} runs the database, hostnames {hosts:?}\n", child.id()));
    child.destroy().await.map_err(e("destroy the child"))?;
    // brigd is killed (kill -9) and restarted in the emulated host: the VM is adopted with
    // its running service, its files and its network (egress rules included).
    let marker = client
        .create(SandboxOptions::fncall().label("phase", "restart"))
        .await
        .map_err(e("create the restart marker"))?;
    emulated::wait_for_restart(&client, &marker).await?;
    expect(&sb, "after brigd's restart", alive, carried).await?;
    expect(&sb, "the service after brigd's restart", WEB, PAGE).await?;
    report.push_str("brigd killed and restarted: the VM was adopted with service and network\n");
    sb.destroy().await.map_err(e("destroy"))?;
    client
        .create(SandboxOptions::fncall().label("phase", "done"))
        .await
        .map_err(e("create the done marker"))?;
    Ok(report)
}
