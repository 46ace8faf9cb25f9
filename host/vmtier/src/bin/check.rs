//! `brig-vmtier-check KERNEL INITRD CMDLINE DIR`: drives the microVM tier end to end where
//! Linux guests run (the emulated host in the tests): two VMs from one snapshot, commands in
//! each, isolation between them, exit statuses, memory reclaim (free-page reporting and the
//! balloon), pause and resume, fork, destroy and cleanup. Prints `BRIG-VMTIER-OK`
//! lines, or an error and exit status 1.
#![forbid(unsafe_code)]

use std::time::Duration;

use brig_container::session::{Session, SessionEvent, SessionKeep};
use brig_vmtier::{MicroVm, VmStats, VmTier, VmTierConfig, VmTierError};

/// Whether `dir` holds a file of VM `id`.
fn dir_has(dir: &str, id: &str) -> bool {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{id}.")))
        })
        .unwrap_or(false)
}

/// A VMM runs jailed: no capabilities, no_new_privs, seccomp, its own mount namespace, and
/// its own cgroup where the host has cgroups.
fn check_jail(vm: &MicroVm) -> anyhow::Result<()> {
    let pid = vm.pid().ok_or_else(|| anyhow::anyhow!("no VMM pid"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field =
        |key: &str| status.lines().find_map(|l| l.strip_prefix(&format!("{key}:"))).map(str::trim);
    for (key, want) in [("CapEff", "0000000000000000"), ("NoNewPrivs", "1"), ("Seccomp", "2")] {
        anyhow::ensure!(field(key) == Some(want), "VMM {key}: {:?}", field(key));
    }
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    anyhow::ensure!(ns(&pid.to_string()) != ns("self"), "the VMM shares our mount namespace");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    anyhow::ensure!(cgroup.contains(&format!("/{}", vm.id)), "the VMM's cgroup: {cgroup}");
    println!(
        "BRIG-VMTIER-OK each VMM runs jailed (no capabilities, seccomp, own mounts, own cgroup)"
    );
    Ok(())
}

/// Runs `command` in `session` and collects its events until it is done or pending.
async fn session_run(
    session: &Session,
    command: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<(Vec<u8>, Option<SessionEvent>)> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let run = async {
        match command {
            Some(c) => session.run(c, timeout, tx).await,
            None => session.wait(timeout, tx).await,
        }
    };
    let collect = async {
        let (mut out, mut last) = (Vec::new(), None);
        while let Some(event) = rx.recv().await {
            match event {
                SessionEvent::Stdout(b) | SessionEvent::Stderr(b) => out.extend_from_slice(&b),
                other => last = Some(other),
            }
        }
        (out, last)
    };
    let (ran, collected) = tokio::join!(run, collect);
    ran?;
    Ok(collected)
}

/// A shell session in the guest: state kept between commands, input to a running command,
/// an interrupt that stops the command and not the shell.
async fn session_steps(tier: &VmTier, vm: &MicroVm) -> anyhow::Result<()> {
    let limit = Duration::from_secs(30);
    let session =
        tier.open_session(vm, "/bin/sh", vec![("GREETING".into(), "hi".into())], "/", None).await?;
    session_run(&session, Some("cd /tmp && export STEP=two"), limit).await?;
    let (out, last) = session_run(&session, Some("echo $GREETING $STEP $(pwd)"), limit).await?;
    anyhow::ensure!(out == b"hi two /tmp\n", "session state: {out:?} {last:?}");
    anyhow::ensure!(
        matches!(&last, Some(SessionEvent::Done { exit_code: 0, cwd }) if cwd == "/tmp"),
        "{last:?}"
    );
    // A command reading its input: it waits, gets a line, answers.
    let (_, pending) =
        session_run(&session, Some("read line; echo got-$line"), Duration::from_millis(500))
            .await?;
    anyhow::ensure!(matches!(pending, Some(SessionEvent::Pending)), "{pending:?}");
    session.input(b"hello\n").await?;
    let (out, _) = session_run(&session, None, limit).await?;
    anyhow::ensure!(out == b"got-hello\n", "input: {out:?}");
    // (A child shell: busybox may run `sleep` inside the session's shell itself, which
    // ignores SIGINT by design.)
    let (_, pending) = session_run(
        &session,
        Some("sh -c 'sleep 60; echo not-interrupted'"),
        Duration::from_millis(500),
    )
    .await?;
    anyhow::ensure!(matches!(pending, Some(SessionEvent::Pending)), "{pending:?}");
    session.interrupt().await?;
    let (_, done) = session_run(&session, None, limit).await?;
    anyhow::ensure!(
        matches!(done, Some(SessionEvent::Done { exit_code, .. }) if exit_code != 0),
        "interrupt: {done:?}"
    );
    let (out, _) = session_run(&session, Some("echo $STEP"), limit).await?;
    anyhow::ensure!(out == b"two\n", "the shell did not survive the interrupt: {out:?}");
    session.close().await;
    println!(
        "BRIG-VMTIER-OK a shell session keeps its state, takes input and survives an interrupt"
    );
    kept_session_steps(tier, vm).await
}

/// A kept session outlives its connection (the node going away) with its state and the
/// command running in it; it is taken back from its record, and closing it ends it for good.
async fn kept_session_steps(tier: &VmTier, vm: &MicroVm) -> anyhow::Result<()> {
    let limit = Duration::from_secs(30);
    let keep = SessionKeep { dir: tier.sessions_dir(vm), session_id: "s-check".into() };
    let session = tier.open_session(vm, "/bin/sh", Vec::new(), "/", Some(keep)).await?;
    session_run(&session, Some("cd /tmp && export KEPT=yes"), limit).await?;
    let (_, pending) =
        session_run(&session, Some("sleep 2; echo after-$KEPT"), Duration::from_millis(300))
            .await?;
    anyhow::ensure!(matches!(pending, Some(SessionEvent::Pending)), "{pending:?}");
    drop(session);
    let mut taken = tier.resume_sessions(vm).await;
    anyhow::ensure!(taken.len() == 1 && taken[0].0 == "s-check", "taken back: {}", taken.len());
    let (_, session) = taken.remove(0);
    let (out, done) = session_run(&session, None, limit).await?;
    anyhow::ensure!(out == b"after-yes\n", "the running command's output: {out:?}");
    anyhow::ensure!(matches!(done, Some(SessionEvent::Done { exit_code: 0, .. })), "{done:?}");
    let (out, _) = session_run(&session, Some("echo $KEPT $(pwd)"), limit).await?;
    anyhow::ensure!(out == b"yes /tmp\n", "the kept shell's state: {out:?}");
    session.close().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = tier.resume_sessions(vm).await;
    anyhow::ensure!(again.is_empty(), "a closed session came back: {}", again.len());
    println!("BRIG-VMTIER-OK a kept session outlives its connection and is taken back by id");
    Ok(())
}

/// Polls `vm`'s memory figures until `done` holds them (60 s at most).
async fn stats_until(
    tier: &VmTier,
    vm: &MicroVm,
    what: &str,
    done: impl Fn(&VmStats) -> bool,
) -> anyhow::Result<VmStats> {
    let started = std::time::Instant::now();
    loop {
        let stats = tier.stats(vm).await?;
        if done(&stats) {
            return Ok(stats);
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "{what}: {stats:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Memory a guest frees comes back to the host (free-page reporting), and the balloon takes
/// more on request and gives it back.
async fn memory_steps(tier: &VmTier, vm: &MicroVm) -> anyhow::Result<()> {
    let limit = Duration::from_secs(60);
    let before = tier.stats(vm).await?;
    let fill = "dd if=/dev/zero of=/tmp/fill bs=1M count=96 2>&1";
    anyhow::ensure!(tier.exec(vm, fill, limit).await?.exit_code == 0, "filling the guest");
    let full = tier.stats(vm).await?;
    anyhow::ensure!(tier.exec(vm, "rm /tmp/fill", limit).await?.exit_code == 0, "rm");
    let reported = stats_until(tier, vm, "free-page reporting", |s| {
        s.reported_mib >= before.reported_mib + 32 && s.rss_kib + (32 << 10) <= full.rss_kib
    })
    .await;
    let back = match reported {
        Ok(back) => back,
        Err(e) => {
            let diag = "for d in /sys/bus/virtio/devices/*; do echo $d $(cat $d/device) \
                $(cat $d/features) $(ls $d/driver -l 2>/dev/null | sed 's/.*drivers//'); done; \
                grep -i -E 'MemFree|report' /proc/meminfo /proc/vmstat; cat /proc/buddyinfo";
            let out = tier.exec(vm, diag, limit).await?;
            anyhow::bail!(
                "{e:#} (full: {full:?}); guest: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    println!(
        "BRIG-VMTIER-OK free-page reporting: the VMM held {} MiB with 96 MiB filled, {} MiB \
         after the guest freed it ({} MiB reported)",
        full.rss_kib >> 10,
        back.rss_kib >> 10,
        back.reported_mib - before.reported_mib
    );
    tier.set_balloon(vm, 64).await?;
    let inflated =
        stats_until(tier, vm, "balloon inflation", |s| s.balloon_actual_mib >= 64).await?;
    tier.set_balloon(vm, 0).await?;
    stats_until(tier, vm, "balloon deflation", |s| s.balloon_actual_mib == 0).await?;
    let out = tier.exec(vm, "echo alive", limit).await?;
    anyhow::ensure!(out.stdout == b"alive\n", "after the balloon: {out:?}");
    println!(
        "BRIG-VMTIER-OK the balloon takes {} MiB on request and gives it back",
        inflated.balloon_actual_mib
    );
    Ok(())
}

/// Pause (the VM saved, its VMM gone) and resume with its state; fork of a running VM into
/// two children that start from its state and diverge; saved snapshots removed with their VMs.
async fn lifecycle_steps(tier: &VmTier, vm: &MicroVm, dir: &str) -> anyhow::Result<()> {
    let limit = Duration::from_secs(30);
    let state = tier.exec(vm, "echo before-pause-$$ > /tmp/state; cat /tmp/state", limit).await?;
    let pid = vm.pid().ok_or_else(|| anyhow::anyhow!("no VMM pid"))?;
    let freed = tier.pause(vm).await?;
    anyhow::ensure!(vm.is_paused() && vm.pid().is_none(), "not paused");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    anyhow::ensure!(stat.is_empty() || stat.contains(") Z "), "the paused VM's VMM runs on");
    let refused = tier.exec(vm, "true", limit).await;
    anyhow::ensure!(matches!(refused, Err(VmTierError::Paused)), "{refused:?}");
    tier.resume(vm).await?;
    let again = tier.exec(vm, "cat /tmp/state", limit).await?;
    anyhow::ensure!(again.stdout == state.stdout, "state after resume: {again:?} vs {state:?}");
    anyhow::ensure!(vm.pid().is_some_and(|p| p != pid), "no new VMM");
    println!(
        "BRIG-VMTIER-OK pause stops the VMM ({} MiB freed) and resume brings the guest back",
        freed >> 20
    );
    tier.exec(vm, "echo fork-point > /tmp/fork-mark", limit).await?;
    let names = [("vm-c".to_string(), None), ("vm-d".to_string(), None)];
    let mut kids = Vec::new();
    for kid in tier.fork(vm, &names).await? {
        kids.push(kid?);
    }
    let mut hostnames = vec![tier.exec(vm, "hostname", limit).await?.stdout];
    for kid in &kids {
        let mark = tier.exec(kid, "cat /tmp/fork-mark", limit).await?;
        anyhow::ensure!(mark.stdout == b"fork-point\n", "{}: {mark:?}", kid.id);
        hostnames.push(tier.exec(kid, "hostname", limit).await?.stdout);
    }
    hostnames.sort();
    hostnames.dedup();
    anyhow::ensure!(hostnames.len() == 3, "forks share a hostname: {hostnames:?}");
    tier.exec(&kids[0], "echo only-in-c > /tmp/kid", limit).await?;
    for other in [vm, &kids[1]] {
        let out = tier.exec(other, "cat /tmp/kid 2>/dev/null || echo none", limit).await?;
        anyhow::ensure!(out.stdout == b"none\n", "{} saw its sibling's file", other.id);
    }
    for kid in &kids {
        tier.destroy(kid).await;
    }
    let saved = std::path::Path::new(dir).join("saved");
    let left: Vec<_> = std::fs::read_dir(&saved).map(|d| d.flatten().count()).into_iter().collect();
    // Only the parent's own pause snapshot (its memory source since the resume) remains.
    anyhow::ensure!(left == [1], "saved snapshots left: {left:?}");
    println!("BRIG-VMTIER-OK fork: two children start from the running VM's state and diverge");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 5, "usage: brig-vmtier-check KERNEL INITRD CMDLINE DIR");
    let vmm = std::env::current_exe()?.with_file_name("brig-vmm");
    let cfg = VmTierConfig {
        vmm,
        kernel: args[1].clone().into(),
        initrd: args[2].clone().into(),
        cmdline: args[3].clone(),
        mem_mib: 256,
        vcpus: 2,
        dir: args[4].clone().into(),
        ksm: false,
        warm: 1,
        root_image: None,
        boot_limit: std::time::Duration::from_secs(180),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let restart_cfg = cfg.clone();
    rt.block_on(async {
        let tier = VmTier::open(cfg)?;
        tier.remove_orphans(&[]);
        println!("BRIG-VMTIER-OK tier open on {}", tier.virtualization().as_str());
        let t = std::time::Instant::now();
        let a = tier.create("vm-a", &[]).await?;
        println!(
            "BRIG-VMTIER-OK created vm-a (snapshot made) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let t = std::time::Instant::now();
        let b = tier.create("vm-b", &[]).await?;
        println!(
            "BRIG-VMTIER-OK created vm-b from the snapshot in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        check_jail(&b)?;
        // vm-b was resumed into a warm VMM the pool started after vm-a's snapshot.
        let log = std::fs::read_to_string(b.log()).unwrap_or_default();
        anyhow::ensure!(log.contains("into a waiting VM"), "vm-b's VMM was not a warm one: {log}");
        println!("BRIG-VMTIER-OK vm-b resumed into a warm VMM (jailed, VM created ahead)");
        let limit = Duration::from_secs(30);
        // Both vCPUs came back from the snapshot, and the second one runs guest work.
        let smp = "cat /sys/devices/system/cpu/online; busybox taskset -c 1 cat /proc/self/stat";
        let out = tier.exec(&b, smp, limit).await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let online = lines.next().unwrap_or_default().trim().to_owned();
        let ran_on = lines.next().and_then(|l| l.split_whitespace().nth(38)).unwrap_or_default();
        anyhow::ensure!(online == "0-1" && ran_on == "1", "vCPUs after restore: {out:?}");
        println!("BRIG-VMTIER-OK two vCPUs online after restore, work pinned to vCPU 1 runs there");
        let out = tier.exec(&a, "echo only-in-a > /tmp/mark; cat /tmp/mark; exit 3", limit).await?;
        anyhow::ensure!(out.stdout == b"only-in-a\n" && out.exit_code == 3, "vm-a: {out:?}");
        let out = tier.exec(&b, "cat /tmp/mark 2>&1; echo err >&2; exit 0", limit).await?;
        anyhow::ensure!(
            String::from_utf8_lossy(&out.stdout).contains("No such file") && out.stderr == b"err\n",
            "vm-b saw vm-a's file or lost stderr: {out:?}"
        );
        println!("BRIG-VMTIER-OK isolated guests, stdout/stderr/exit status through the agent");
        let name_a = tier.exec(&a, "hostname", limit).await?.stdout;
        let name_b = tier.exec(&b, "hostname", limit).await?.stdout;
        anyhow::ensure!(
            name_a != name_b && name_a.starts_with(b"brig-"),
            "identities: {name_a:?} {name_b:?}"
        );
        let uuid = "cat /proc/sys/kernel/random/uuid";
        let (ua, ub) =
            (tier.exec(&a, uuid, limit).await?.stdout, tier.exec(&b, uuid, limit).await?.stdout);
        anyhow::ensure!(ua != ub, "both VMs drew the same random uuid");
        println!("BRIG-VMTIER-OK each VM has its own hostname and random stream");
        // A command past its timeout is stopped, and the VM keeps serving.
        let slow = tier.exec(&a, "sleep 30", Duration::from_secs(2)).await;
        anyhow::ensure!(matches!(slow, Err(brig_vmtier::VmTierError::ExecTimeout(_))), "{slow:?}");
        let procs =
            tier.exec(&a, "sleep 1; ps 2>/dev/null | grep -c '[s]leep 30' || true", limit).await?;
        anyhow::ensure!(
            String::from_utf8_lossy(&procs.stdout).trim() == "0",
            "sleep survived: {procs:?}"
        );
        println!("BRIG-VMTIER-OK a timed-out command is killed in the guest");
        let blob: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        tier.write_file(&a, "/tmp/in/blob.bin", &blob).await?;
        let size = tier.exec(&a, "wc -c < /tmp/in/blob.bin", limit).await?.stdout;
        anyhow::ensure!(
            String::from_utf8_lossy(&size).trim() == "300000",
            "size in guest: {size:?}"
        );
        anyhow::ensure!(
            tier.read_file(&a, "/tmp/in/blob.bin", brig_vmtier::MAX_GUEST_FILE).await? == blob,
            "file changed in transit"
        );
        anyhow::ensure!(
            tier.read_file(&a, "/nonexistent", brig_vmtier::MAX_GUEST_FILE).await.is_err(),
            "missing file read"
        );
        println!("BRIG-VMTIER-OK files move in and out of the guest intact");
        session_steps(&tier, &b).await?;
        memory_steps(&tier, &b).await?;
        lifecycle_steps(&tier, &b, &args[4]).await?;
        let pid = a.pid();
        let uds = a.uds.clone();
        tier.destroy(&a).await;
        let gone = pid.is_none_or(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
        anyhow::ensure!(gone && !uds.exists(), "vm-a's VMM or socket survived destroy");
        let out = tier.exec(&b, "echo still-here", limit).await?;
        anyhow::ensure!(out.stdout == b"still-here\n", "vm-b after vm-a's destroy: {out:?}");
        tier.destroy(&b).await;
        println!("BRIG-VMTIER-OK destroy reaps the VMM and removes its socket");
        restart_steps(tier, restart_cfg).await
    })
}

/// Names `what` on the console and awaits it for at most `limit`: past that, an error that
/// says which step stalled.
async fn within<T>(
    what: &str,
    limit: Duration,
    step: impl std::future::Future<Output = T>,
) -> anyhow::Result<T> {
    println!("BRIG-VMTIER-STEP {what}");
    tokio::time::timeout(limit, step)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: not done in {} s", limit.as_secs()))
}

/// A daemon that dies without destroying its VMs: the next one adopts the VMs it recorded (a
/// running one keeps its VMM and guest state, a paused one resumes on demand), refuses a pid
/// file it cannot prove, reuses the environment snapshot, and stops the VMM no record claims.
async fn restart_steps(tier: VmTier, cfg: VmTierConfig) -> anyhow::Result<()> {
    let limit = Duration::from_secs(30);
    // Each step is named on the console before it starts and bounded, so a stall under TCG
    // says where it is instead of running into the test's deadline.
    let step = Duration::from_secs(180);
    let dir = cfg.dir.clone();
    let kept = within("create vm-kept", step, tier.create("vm-kept", &[])).await??;
    let state = within(
        "exec in vm-kept",
        step,
        tier.exec(&kept, "echo kept-$$ > /tmp/state; cat /tmp/state", limit),
    )
    .await??
    .stdout;
    let paused = within("create vm-paused", step, tier.create("vm-paused", &[])).await??;
    within("exec in vm-paused", step, tier.exec(&paused, "echo paused-state > /tmp/state", limit))
        .await??;
    within("pause vm-paused", step, tier.pause(&paused)).await??;
    let stray = within("create vm-stray", step, tier.create("vm-stray", &[])).await??;
    let (kept_record, paused_record) = (kept.record(), paused.record());
    let (kept_pid, stray_pid) = (kept.pid(), stray.pid().ok_or_else(|| anyhow::anyhow!("no pid"))?);
    let marker = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path().join("made-for"))
        .find(|p| p.exists())
        .ok_or_else(|| anyhow::anyhow!("no environment snapshot marker"))?;
    let marker_made = std::fs::metadata(&marker)?.modified()?;
    // The daemon dies: nothing is destroyed.
    for vm in [kept, paused, stray] {
        std::mem::forget(vm);
    }
    println!("BRIG-VMTIER-STEP the first tier ends, the next opens");
    drop(tier);
    // A pid file naming the kept VM's VMM for a VM that VMM does not serve.
    std::fs::copy(dir.join("vm-kept.pid"), dir.join("vm-forged.pid"))?;
    let next = VmTier::open(cfg)?;
    let forged = within("adopt vm-forged", step, next.adopt("vm-forged", &kept_record)).await?;
    anyhow::ensure!(matches!(forged, Err(VmTierError::Lost(_))), "forged: {forged:?}");
    let kept = within("adopt vm-kept", step, next.adopt("vm-kept", &kept_record)).await??;
    anyhow::ensure!(
        kept.pid() == kept_pid && kept.is_running(),
        "vm-kept adopted as {:?}",
        kept.pid()
    );
    let paused = within("adopt vm-paused", step, next.adopt("vm-paused", &paused_record)).await??;
    anyhow::ensure!(paused.is_paused() && paused.pid().is_none(), "vm-paused not paused");
    println!("BRIG-VMTIER-STEP remove orphans");
    next.remove_orphans(&["vm-kept".to_string(), "vm-paused".to_string()]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = std::fs::read_to_string(format!("/proc/{stray_pid}/stat")).unwrap_or_default();
    anyhow::ensure!(status.is_empty() || status.contains(") Z "), "the stray VMM runs: {status}");
    let dir_text = dir.to_string_lossy();
    for gone in ["vm-stray", "vm-forged"] {
        anyhow::ensure!(!dir_has(&dir_text, gone), "{gone}'s files were left behind");
    }
    anyhow::ensure!(kept.is_running(), "the adopted VMM was stopped with the strays");
    let again = within("exec in adopted vm-kept", step, next.exec(&kept, "cat /tmp/state", limit))
        .await??
        .stdout;
    anyhow::ensure!(again == state, "vm-kept's guest state: {again:?} vs {state:?}");
    within("resume adopted vm-paused", step, next.resume(&paused)).await??;
    let out =
        within("exec in resumed vm-paused", step, next.exec(&paused, "cat /tmp/state", limit))
            .await??
            .stdout;
    anyhow::ensure!(out == b"paused-state\n", "vm-paused after resume: {out:?}");
    let fresh = within("create vm-fresh", step, next.create("vm-fresh", &[])).await??;
    anyhow::ensure!(
        std::fs::metadata(&marker)?.modified()? == marker_made,
        "the environment snapshot was made again"
    );
    for vm in [&kept, &paused, &fresh] {
        within("destroy", step, next.destroy(vm)).await?;
    }
    let saved = dir.join("saved");
    let left = std::fs::read_dir(&saved).map(|d| d.flatten().count()).unwrap_or(0);
    anyhow::ensure!(left == 0, "{left} saved snapshots left after destroy");
    println!("BRIG-VMTIER-OK a restarted tier adopts the VMs it recorded and stops the rest");
    Ok(())
}
