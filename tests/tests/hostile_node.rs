//! The hostile suite for the node's own surface (native SDK; the E2B API reaches the same node
//! code): an agent shapes its sandbox's files to stall the node or to act through the node
//! with the host's rights, a client reads a flood of output slowly, a harness sends commands,
//! environments and labels past every bound. Every attempt must be refused with a typed error
//! (or, for output, delivered whole) while the node and a bystander sandbox answer within 1 s.

use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, ErrorCode, ExecEvent, Sandbox, SandboxOptions};
use brig_tests::hostile::{worst_bystander_latency, Report};
use brig_tests::{image, Daemon};

/// How fast the node and the bystander must answer while an attack runs.
const BYSTANDER_BUDGET: Duration = Duration::from_secs(1);

/// `Ok(outcome)` if `result` is a refusal with `code`.
fn refused<T: std::fmt::Debug>(
    result: &Result<T, brig_sdk::Error>,
    code: ErrorCode,
) -> Result<String, String> {
    match result {
        Err(e) if e.code() == Some(code) => Ok(format!("{code:?}: {e}")),
        Err(e) => Err(format!("refused with the wrong code ({:?}): {e}", e.code())),
        Ok(v) => Err(format!("not refused: {v:?}")),
    }
}

async fn sh(sb: &Sandbox, script: &str) -> String {
    let out = sb.exec(["sh", "-c", script]).await.expect("exec");
    assert!(out.success(), "{script}: {}", out.stderr_text());
    out.stdout_text()
}

/// Runs `attack`, probing the bystander meanwhile; one report row from `judge`.
async fn attempt<T>(
    report: &mut Report,
    client: &Client,
    bystander: &Sandbox,
    name: &str,
    attack: impl std::future::Future<Output = T>,
    judge: impl FnOnce(&T) -> Result<String, String>,
) {
    let started = Instant::now();
    let (value, worst) = worst_bystander_latency(client, bystander, attack).await;
    let took = started.elapsed();
    let (ok, outcome) = match (judge(&value), worst) {
        (Ok(outcome), Ok(worst)) if worst <= BYSTANDER_BUDGET => {
            (true, format!("{outcome}; answered in {took:?}; bystander's worst {worst:?}"))
        }
        (Ok(_), Ok(worst)) => (false, format!("the bystander waited {worst:?}")),
        (Ok(_), Err(why)) => (false, why),
        (Err(why), _) => (false, why),
    };
    report.row(name, ok, outcome);
}

#[tokio::test]
async fn fifos_devices_and_kernel_files_are_refused_without_stalling_the_node() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bystander = client.create(SandboxOptions::container(&image("busybox"))).await.expect("b");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let mut report = Report::new("files");
    sh(&sb, "mkdir -p /workspace && mkfifo /workspace/answer.txt /workspace/input.txt").await;

    // Uploads into FIFOs nobody opens: before, each held one of the node's async workers.
    let uploads = futures::future::join_all(
        (0..8).map(|_| sb.write_file("/workspace/answer.txt", b"the answer")),
    );
    attempt(&mut report, &client, &bystander, "8 uploads into a FIFO", uploads, |all| {
        let refusals: Result<Vec<_>, _> =
            all.iter().map(|r| refused(r, ErrorCode::BadRequest)).collect();
        refusals.map(|r| format!("8 refused, e.g. {}", r[0]))
    })
    .await;
    let downloads = futures::future::join_all((0..8).map(|_| sb.read_file("/workspace/input.txt")));
    attempt(&mut report, &client, &bystander, "8 downloads from a FIFO", downloads, |all| {
        let refusals: Result<Vec<_>, _> =
            all.iter().map(|r| refused(r, ErrorCode::BadRequest)).collect();
        refusals.map(|r| format!("8 refused, e.g. {}", r[0]))
    })
    .await;

    // What the sandbox's own root is refused, it is refused through the API too.
    let own =
        sb.exec(["sh", "-c", "echo 1 > /proc/1/timerslack_ns && echo wrote"]).await.expect("exec");
    assert!(!own.stdout_text().contains("wrote"), "the sandbox's root wrote pid 1's timer slack");
    let kernel_writes = [
        ("write /proc/1/timerslack_ns", "/proc/1/timerslack_ns"),
        ("write /proc/self/autogroup", "/proc/self/autogroup"),
        ("write /sys/kernel/uevent_helper", "/sys/kernel/uevent_helper"),
    ];
    for (name, path) in kernel_writes {
        let write = sb.write_file(path, b"1");
        attempt(&mut report, &client, &bystander, name, write, |r| {
            refused(r, ErrorCode::BadRequest)
        })
        .await;
    }
    let special_reads = [
        ("read /proc/1/mem (the shim's memory)", "/proc/1/mem"),
        ("read /proc/1/environ", "/proc/1/environ"),
        ("read /sys/kernel/uevent_seqnum (size lies)", "/sys/kernel/uevent_seqnum"),
        ("read /dev/tty", "/dev/tty"),
        ("read /dev/zero (endless)", "/dev/zero"),
    ];
    // The shim's root is out of the sandbox's reach, and so out of the API's: it acts with
    // the sandbox's rights (refused at the magic link, or by the kernel before it).
    let magic = sb.read_file("/proc/1/root/etc/passwd");
    attempt(
        &mut report,
        &client,
        &bystander,
        "read through a magic link (/proc/1/root)",
        magic,
        |r| refused(r, ErrorCode::PermissionDenied).or_else(|_| refused(r, ErrorCode::BadRequest)),
    )
    .await;
    for (name, path) in special_reads {
        let read = sb.read_file(path);
        attempt(&mut report, &client, &bystander, name, read, |r| {
            refused(r, ErrorCode::BadRequest)
        })
        .await;
    }
    let mkdir = sb.mkdir("/sys/fs/cgroup/brig-hostile", false);
    attempt(&mut report, &client, &bystander, "mkdir in sysfs/cgroupfs", mkdir, |r| {
        r.as_ref()
            .err()
            .filter(|e| matches!(e.code(), Some(ErrorCode::BadRequest | ErrorCode::NotFound)))
            .map(|e| format!("{:?}: {e}", e.code()))
            .ok_or_else(|| format!("not refused: {r:?}"))
    })
    .await;
    let remove = sb.remove("/proc/1/fd", true);
    attempt(&mut report, &client, &bystander, "remove in procfs", remove, |r| {
        refused(r, ErrorCode::BadRequest)
    })
    .await;

    // The sandbox's own files still move both ways, and a FIFO left behind harms nothing.
    sb.write_file("/workspace/ok.txt", b"fine\n").await.expect("a regular upload");
    assert_eq!(sb.read_file("/workspace/ok.txt").await.expect("download"), b"fine\n");
    assert_eq!(sh(&sb, "cat /workspace/ok.txt").await, "fine\n");
    report.finish();
    sb.destroy().await.expect("destroy");
    bystander.destroy().await.expect("destroy");
}

/// A client that stops reading a 40 MiB output for 3 s, then reads on, gets every byte and
/// no note of dropped output: the command waited for it.
#[tokio::test]
async fn a_slow_reader_gets_all_of_a_commands_output() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bystander = client.create(SandboxOptions::container(&image("busybox"))).await.expect("b");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    const TOTAL: u64 = 40 << 20;
    let cmd = Cmd::shell("dd if=/dev/zero bs=1048576 count=40 2>/dev/null; echo done >&2")
        .output_limit(64 << 20)
        .timeout(Duration::from_secs(120));
    let mut stream = sb.exec_stream(cmd).await.expect("exec");
    let read_slowly = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (mut stdout, mut stderr, mut result) = (0u64, Vec::new(), None);
        while let Some(event) = stream.next().await {
            match event.expect("output") {
                ExecEvent::Stdout(b) => stdout += b.len() as u64,
                ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                ExecEvent::Exited(r) => result = Some(r),
            }
        }
        (stdout, String::from_utf8_lossy(&stderr).into_owned(), result)
    };
    let ((stdout, stderr, result), worst) =
        worst_bystander_latency(&client, &bystander, read_slowly).await;
    let result = result.expect("an exit");
    assert_eq!(result.exit_code, Some(0), "{result:?}");
    assert_eq!(stdout, TOTAL, "stdout bytes (stderr: {stderr:?})");
    assert_eq!(stderr, "done\n", "no note of dropped output");
    let worst = worst.expect("bystander");
    assert!(worst <= BYSTANDER_BUDGET, "the bystander waited {worst:?}");
    sb.destroy().await.expect("destroy");
}

/// Commands, environments and labels past their bounds are refused with a typed error before
/// anything runs, and the sandbox goes on running commands.
#[tokio::test]
async fn oversized_commands_environments_and_labels_are_bad_requests() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let big = "x".repeat(1 << 20);
    let cases = [
        ("1 MiB argument", sb.exec_with(Cmd::new(["echo", big.as_str()])).await.map(|_| ())),
        ("1 MiB env value", sb.exec_with(Cmd::new(["true"]).env("BIG", &big)).await.map(|_| ())),
        ("NUL in an env name", sb.exec_with(Cmd::new(["true"]).env("A\0B", "v")).await.map(|_| ())),
    ];
    for (name, result) in cases {
        let code = result.as_ref().err().and_then(|e| e.code());
        assert_eq!(code, Some(ErrorCode::BadRequest), "{name}: {result:?}");
    }
    let out = sb.exec(["echo", "still here"]).await.expect("exec");
    assert_eq!(out.stdout_text(), "still here\n");

    let mut labels = SandboxOptions::container(&image("busybox"));
    for i in 0..10_000 {
        labels = labels.label(&format!("k{i}"), "v");
    }
    let refused = client.create(labels).await.map(|_| ());
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some(ErrorCode::BadRequest),
        "{refused:?}"
    );
    let env = SandboxOptions::container(&image("busybox")).env("A\0B", "v");
    let refused = client.create(env).await.map(|_| ());
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some(ErrorCode::BadRequest),
        "{refused:?}"
    );
    assert_eq!(client.list(&[]).await.expect("list").len(), 1, "nothing made by a refused create");
    sb.destroy().await.expect("destroy");
}

/// Finished commands' output is kept on the node's disk (the container's spool), not in
/// brigd's memory: 48 commands of 4 MiB each (192 MiB) leave brigd's memory flat and list with
/// nothing buffered, and a client that attaches later still gets every byte.
#[tokio::test]
async fn finished_output_is_kept_on_disk_not_in_the_nodes_memory() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    // One command first, so what the node allocates once is not counted.
    let mb4 = "head -c 4194304 /dev/zero | tr '\\0' x";
    sh(&sb, mb4).await;
    let before = brig_tests::hostile_http::rss_mib(&daemon);
    let mut ids = Vec::new();
    for _ in 0..48 {
        let mut stream = sb.exec_stream(Cmd::shell(mb4).output_limit(8 << 20)).await.expect("exec");
        ids.push(stream.exec_id());
        while let Some(event) = stream.next().await {
            if matches!(event.expect("event"), ExecEvent::Exited(_)) {
                break;
            }
        }
    }
    let after = brig_tests::hostile_http::rss_mib(&daemon);
    assert!(
        after <= before + 64,
        "192 MiB of finished output grew brigd from {before} MiB to {after} MiB"
    );
    let listed = sb.execs().await.expect("execs");
    let first = listed.iter().find(|e| e.exec_id == ids[0]).expect("the first is listed");
    assert_eq!(first.buffered_bytes, 0, "a finished command's output stays in memory");
    let kept = sb.attach(ids[0]).await.expect("attach").collect().await.expect("output");
    assert_eq!(kept.stdout.len(), 4 << 20, "{}", kept.stderr_text());
    assert!(kept.stdout.iter().all(|b| *b == b'x'));
    assert_eq!(kept.stderr_text(), "", "no note of output let go");
    assert_eq!(kept.result.exit_code, Some(0));
    sb.destroy().await.expect("destroy");
}
