//! The hostile-agent suite: what agents were seen doing in production rollouts, each run in a
//! real sandbox. Every attempt must end blocked or contained, with the node healthy, a bystander
//! sandbox answering, and the attempt in the sandbox's audit trail. Each group writes its rows
//! to `artifacts/reports/hostile-<group>.md`; `scripts/test.sh` prints them.

use std::time::{Duration, Instant};

use brig_sdk::{AuditKind, Client, Cmd, ExecOutput, Sandbox, SandboxOptions};
use brig_tests::hostile::Report;
use brig_tests::net::Mirror;
use brig_tests::{image, Daemon};

async fn run(sb: &Sandbox, script: &str, timeout_s: u64) -> ExecOutput {
    sb.exec_with(Cmd::shell(script).timeout(Duration::from_secs(timeout_s)).output_limit(1 << 20))
        .await
        .expect("the exec request itself must succeed")
}

/// The node answers, a bystander sandbox answers, and the attacker's sandbox still runs
/// commands (or the attack is reported as not contained).
async fn healthy(client: &Client, bystander: &Sandbox, attacker: &Sandbox) -> Result<(), String> {
    let started = Instant::now();
    client.node_status().await.map_err(|e| format!("node down: {e}"))?;
    let out = bystander.exec(["echo", "ok"]).await.map_err(|e| format!("bystander: {e}"))?;
    if out.stdout_text() != "ok\n" {
        return Err("bystander gave a wrong answer".into());
    }
    let again = attacker.exec(["echo", "alive"]).await.map_err(|e| format!("attacker: {e}"))?;
    if again.stdout_text() != "alive\n" {
        return Err("the attacked sandbox no longer runs commands".into());
    }
    if started.elapsed() > Duration::from_secs(20) {
        return Err(format!("health checks took {:?}", started.elapsed()));
    }
    Ok(())
}

/// Whether the sandbox's audit trail holds an exec whose command contains `marker`, with its
/// end recorded.
async fn audited(sb: &Sandbox, marker: &str) -> bool {
    let events = sb.audit(0).await.expect("audit");
    let start = events.iter().find_map(|e| match &e.kind {
        AuditKind::ExecStart { exec_id, argv, .. } if argv.join(" ").contains(marker) => {
            Some(*exec_id)
        }
        _ => None,
    });
    start.is_some_and(|id| {
        events
            .iter()
            .any(|e| matches!(&e.kind, AuditKind::ExecEnd { exec_id, .. } if *exec_id == id))
    })
}

/// A group of attempts against one node, with a bystander sandbox that must keep answering.
struct Suite<'a> {
    report: Report,
    client: &'a Client,
    bystander: &'a Sandbox,
}

impl Suite<'_> {
    /// One attempt: run `script`, judge the output with `check` (Ok(outcome) when contained),
    /// then require health and an audit record.
    async fn attempt(
        &mut self,
        sb: &Sandbox,
        name: &str,
        script: &str,
        timeout_s: u64,
        check: impl Fn(&ExecOutput) -> Result<String, String>,
    ) {
        attempt_inner(
            &mut self.report,
            self.client,
            self.bystander,
            sb,
            name,
            script,
            timeout_s,
            &check,
        )
        .await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn attempt_inner(
    report: &mut Report,
    client: &Client,
    bystander: &Sandbox,
    sb: &Sandbox,
    name: &str,
    script: &str,
    timeout_s: u64,
    check: &dyn Fn(&ExecOutput) -> Result<String, String>,
) {
    let out = run(sb, script, timeout_s).await;
    let verdict = check(&out);
    let health = healthy(client, bystander, sb).await;
    let audit = audited(sb, script).await;
    let (ok, outcome) = match (verdict, health, audit) {
        (Ok(outcome), Ok(()), true) => {
            (true, format!("{outcome}; node and bystander fine; audited"))
        }
        (Err(why), _, _) => (false, format!("{why} (stdout {:?})", tail(&out.stdout_text()))),
        (_, Err(why), _) => (false, why),
        (_, _, false) => (false, "not in the audit trail".into()),
    };
    report.row(name, ok, outcome);
}

fn tail(s: &str) -> String {
    s.chars().rev().take(200).collect::<Vec<_>>().into_iter().rev().collect()
}

fn describe(out: &ExecOutput) -> String {
    let r = &out.result;
    format!(
        "exit {:?}, signal {:?}, timed out {}, oom {}, truncated {}",
        r.exit_code, r.signal, r.timed_out, r.oom_killed, r.truncated
    )
}

#[tokio::test]
async fn resource_bombs_are_contained() {
    // Writable layers on disk even where the kernel has no XFS quotas (an image per layer).
    let daemon =
        Daemon::start_with_config("[container]\nwritable_layer = \"disk\"\n", &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bystander = client.create(SandboxOptions::container(&image("busybox"))).await.expect("b");
    let sb = client
        .create(SandboxOptions::container(&image("busybox")).memory_mib(128).pids(64).disk_mib(32))
        .await
        .expect("create");
    let mut suite =
        Suite { report: Report::new("resources"), client: &client, bystander: &bystander };

    suite
        .attempt(&sb, "fork bomb", "b(){ b|b& }; b; sleep 5", 4, |out| {
            (out.result.timed_out || !out.success())
                .then(|| format!("pids capped at 64, {}", describe(out)))
                .ok_or_else(|| "the bomb ran to completion".into())
        })
        .await;
    suite
        .attempt(&sb, "memory bomb", "x=aaaaaaaa; while :; do x=$x$x; done", 30, |out| {
            out.result
                .oom_killed
                .then(|| format!("OOM-killed inside its 128 MiB cgroup, {}", describe(out)))
                .ok_or_else(|| format!("not OOM-killed: {}", describe(out)))
        })
        .await;
    suite
        .attempt(
            &sb,
            "disk fill",
            "dd if=/dev/zero of=/fill bs=1M 2>&1 | grep -o 'No space left on device'; rm -f /fill",
            30,
            |out| {
                out.stdout_text()
                    .contains("No space left")
                    .then(|| {
                        "ENOSPC at its 32 MiB writable layer; the host disk untouched".to_string()
                    })
                    .ok_or_else(|| "no ENOSPC".into())
            },
        )
        .await;
    // A disk larger than the memory limit: the writable layer is on the node's disk, not in
    // the sandbox's memory, so filling it is ENOSPC and not an OOM kill.
    let big = client
        .create(SandboxOptions::container(&image("busybox")).memory_mib(128).disk_mib(512))
        .await
        .expect("create");
    suite
        .attempt(
            &big,
            "disk fill past the memory limit",
            "echo intact > /keep; dd if=/dev/zero of=/fill bs=1M 2>&1 | grep -o 'No space left on device'; cat /keep",
            120,
            |out| {
                let text = out.stdout_text();
                (text.contains("No space left") && text.ends_with("intact\n") && !out.result.oom_killed)
                    .then(|| "ENOSPC at its 512 MiB disk under 128 MiB of memory; not OOM-killed; an earlier file intact".to_string())
                    .ok_or_else(|| format!("no ENOSPC or the file lost: {}", describe(out)))
            },
        )
        .await;
    // An upload past the disk's size: a typed error, and the sandbox lives on.
    let _ = run(&big, "rm -f /fill", 30).await;
    let zeros = tokio::io::AsyncReadExt::take(tokio::io::repeat(0), 600 << 20);
    let uploaded = big.upload("/upload.bin", zeros).await;
    let verdict = match &uploaded {
        Err(brig_sdk::Error::Server {
            code: brig_proto::ErrorCode::ResourceExhausted,
            message,
        }) => Ok(format!("resource_exhausted ({})", tail(message))),
        other => Err(format!("not a typed full-disk error: {other:?}")),
    };
    let health = healthy(&client, &bystander, &big).await;
    let kept = run(&big, "cat /keep", 10).await.stdout_text() == "intact\n";
    let (ok, outcome) = match (verdict, health, kept) {
        (Ok(v), Ok(()), true) => (true, format!("{v}; the sandbox runs on, its files intact")),
        (Err(why), _, _) | (_, Err(why), _) => (false, why),
        (_, _, false) => (false, "an earlier file was lost".into()),
    };
    suite.report.row("upload past the disk size", ok, outcome);
    suite
        .attempt(&sb, "`yes` flood", "yes", 3, |out| {
            let bytes = out.stdout.len();
            (out.result.truncated && bytes <= 1 << 20)
                .then(|| format!("output capped at {bytes} bytes (truncated), {}", describe(out)))
                .ok_or_else(|| format!("{bytes} bytes, {}", describe(out)))
        })
        .await;
    // A needle in a host file, and the same needle in a file of the sandbox: the scan finds
    // its own and never the host's (named outright, and under / and /proc). The pattern comes
    // from a file, so no command line holds the needle.
    let needle = format!("brig-needle-{}-{:?}", std::process::id(), Instant::now());
    let host_file = format!("/tmp/brig-hostile-needle-{}", std::process::id());
    std::fs::write(&host_file, &needle).expect("host needle");
    sb.write_file("/work/pattern", needle.as_bytes()).await.expect("pattern");
    sb.write_file("/work/own-needle", needle.as_bytes()).await.expect("own needle");
    // The named files first (a quick, whole answer even when the scan below runs out of
    // time under load), then the scan of everything, whose output a timeout may cut.
    let scan = format!(
        "grep -l -f /work/pattern /work/own-needle {host_file} 2>/dev/null; \
         grep -rl -f /work/pattern / /proc 2>/dev/null \
         | grep -v -e '^/work/pattern$' -e '^/work/own-needle$'; echo scanned"
    );
    suite
        .attempt(&sb, "grep -r over / and /proc", &scan, 8, |out| {
            let text = out.stdout_text();
            let found: Vec<&str> = text.lines().filter(|l| *l != "scanned").collect();
            if found.iter().any(|l| l.contains("brig-hostile-needle")) {
                Err(format!("the host's file was found from inside: {found:?}"))
            } else if !found.contains(&"/work/own-needle") {
                Err(format!("the scan did not find the sandbox's own needle: {}", describe(out)))
            } else {
                Ok(format!(
                    "found its own needle only ({} matches), {}",
                    found.len(),
                    describe(out)
                ))
            }
        })
        .await;
    let _ = std::fs::remove_file(&host_file);
    suite.report.finish();
}

#[tokio::test]
async fn escapes_and_tampering_are_blocked() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bystander = client.create(SandboxOptions::container(&image("busybox"))).await.expect("b");
    let sb = client
        .create(SandboxOptions::container(&image("debian-12")).read_only_path("/usr/bin"))
        .await
        .expect("create");
    let mut suite =
        Suite { report: Report::new("escapes"), client: &client, bystander: &bystander };
    let denied = |out: &ExecOutput| {
        let text = out.stdout_text() + &out.stderr_text();
        (!out.success() || text.contains("denied") || text.contains("not permitted"))
            .then(|| format!("refused: {}", tail(text.trim())))
            .ok_or_else(|| format!("allowed: {}", describe(out)))
    };

    suite
        .attempt(
            &sb,
            "overwrite /bin/bash",
            "echo 'echo pwned' > /bin/bash || cp /bin/true /usr/bin/bash",
            10,
            denied,
        )
        .await;
    let session = sb.open_session().await.expect("a new session after the attempt");
    let shell = session.run("echo \"bash $BASH_VERSION\"", Duration::from_secs(10)).await;
    let fine = shell.as_ref().is_ok_and(|o| o.stdout_text().starts_with("bash 5"));
    suite.report.row(
        "new session after it",
        fine,
        format!("session runs the image's bash: {fine}"),
    );

    suite
        .attempt(&sb, "kill every process", "kill -9 -1; sleep 1", 10, |out| {
            Ok(format!(
                "only its own processes died ({}); the shim, its pid 1, takes no signal from inside",
                describe(out)
            ))
        })
        .await;
    suite
        .attempt(
            &sb,
            "read /proc/kpagecgroup",
            "head -c 8 /proc/kpagecgroup | od -An -tx1",
            10,
            |out| {
                (out.stdout_text().trim().is_empty())
                    .then(|| format!("nothing read: {}", tail(out.stderr_text().trim())))
                    .ok_or_else(|| "read host page data".into())
            },
        )
        .await;
    suite.attempt(&sb, "mount", "mount -t tmpfs brig /mnt", 10, denied).await;
    suite.attempt(&sb, "unshare", "unshare -m -r true", 10, denied).await;
    let py = |body: &str| format!("python3 -c \"{body}\"");
    suite.attempt(&sb,
        "ptrace an outside process",
        &py("import ctypes,os; l=ctypes.CDLL(None,use_errno=True); r=l.ptrace(16,1,0,0); print(r, os.strerror(ctypes.get_errno()))"),
        10,
        |out| {
            out.stdout_text()
                .starts_with("-1")
                .then(|| format!("refused: {}", out.stdout_text().trim()))
                .ok_or_else(|| "attached".into())
        },
    )
    .await;
    suite.attempt(&sb,
        "raw socket",
        &py("import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"),
        10,
        denied,
    )
    .await;
    suite.attempt(&sb,
        "XFS extent-swap ioctl",
        &py("import fcntl,os,errno; fd=os.open('/tmp/x',os.O_CREAT|os.O_RDWR)\ntry: fcntl.ioctl(fd,0xc0c0586d,bytes(192))\nexcept OSError as e: print(errno.errorcode[e.errno])"),
        10,
        |out| {
            (out.stdout_text().trim() == "EPERM")
                .then(|| "refused by the seccomp filter (EPERM)".to_string())
                .ok_or_else(|| format!("reached the kernel: {}", out.stdout_text().trim()))
        },
    )
    .await;
    suite.report.finish();
}

#[tokio::test]
async fn network_probes_are_dropped_and_audited() {
    let mirror = Mirror::start("mirror").expect("mirror");
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bystander = client.create(SandboxOptions::container(&image("busybox"))).await.expect("b");
    // A service on the node itself, on every address.
    let node_service = std::net::TcpListener::bind("0.0.0.0:0").expect("listen");
    node_service.set_nonblocking(true).expect("nonblocking");
    let node_port = node_service.local_addr().expect("addr").port();
    let sb = client
        .create(SandboxOptions::container(&image("busybox")).egress([mirror.rule()]))
        .await
        .expect("create");
    let peer = client
        .create(SandboxOptions::container(&image("busybox")).egress(Vec::<String>::new()))
        .await
        .expect("peer");
    let info = sb.status().await.expect("status");
    let addr: std::net::Ipv4Addr = info.address.expect("address").parse().expect("ip");
    let gateway = std::net::Ipv4Addr::from(u32::from(addr) - 1);
    let peer_addr = peer.status().await.expect("status").address.expect("peer address");
    run(&peer, "nc -l -p 7777 >/dev/null 2>&1 &", 5).await;
    let mut suite =
        Suite { report: Report::new("network"), client: &client, bystander: &bystander };
    let none_open = |out: &ExecOutput| {
        (!out.stdout_text().contains("open"))
            .then(|| "every connection dropped".to_string())
            .ok_or_else(|| out.stdout_text())
    };

    let scan = format!(
        "for p in 22 80 443 7070 9464 {node_port}; do (nc -w 2 {gateway} $p </dev/null && echo open $p) & done; wait"
    );
    suite.attempt(&sb, "port scan of the node", &scan, 15, none_open).await;
    let accepted = node_service.accept().is_ok();
    suite.report.row(
        "… reaching a node service on 0.0.0.0",
        !accepted,
        format!("node service saw a connection: {accepted}"),
    );
    let lo = format!("nc -w 2 127.0.0.1 {node_port} </dev/null && echo open");
    suite.attempt(&sb, "node loopback services", &lo, 10, none_open).await;
    let outside = format!("nc -w 2 {} 22 </dev/null && echo open", mirror.addr);
    suite.attempt(&sb, "outside the egress rules", &outside, 10, none_open).await;
    let lateral = format!("nc -w 2 {peer_addr} 7777 </dev/null && echo open");
    suite.attempt(&sb, "another sandbox", &lateral, 10, none_open).await;

    // The kernel's drop records reach the audit trail a moment later.
    let mut denied = Vec::new();
    for _ in 0..50 {
        denied = sb
            .audit(0)
            .await
            .expect("audit")
            .into_iter()
            .filter_map(|e| match e.kind {
                AuditKind::Egress { allowed: false, dst, port, .. } => Some((dst, port)),
                _ => None,
            })
            .collect();
        let want = [gateway.to_string(), mirror.addr.clone(), peer_addr.clone()];
        if want.iter().all(|w| denied.iter().any(|(d, _)| d == w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = |dst: &str| denied.iter().any(|(d, _)| d == dst);
    let all = seen(&gateway.to_string()) && seen(&mirror.addr) && seen(&peer_addr);
    suite.report.row(
        "denials in the audit trail",
        all,
        format!("{} denied connections recorded", denied.len()),
    );
    suite.report.finish();
}
