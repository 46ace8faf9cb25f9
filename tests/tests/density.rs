//! Dense overcommit: admission by use refuses with a clear, retryable error and loses nothing;
//! reclaimed sandboxes answer correctly; CPU QoS classes reach the cgroups and move at run time.

use std::time::Duration;

use brig_sdk::{Cmd, ErrorCode, QosClass, SandboxOptions};
use brig_tests::net::{metric, metrics_text};
use brig_tests::{image, Daemon};

fn config(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(file.path(), text).expect("write config");
    file
}

/// The value of a container's cgroup v1 cpu file (or v2 equivalent), found by sandbox id.
fn cpu_file(id: &str, v1: &str, v2: &str) -> Option<String> {
    for (root, file) in [("/sys/fs/cgroup/cpu", v1), ("/sys/fs/cgroup", v2)] {
        let Ok(parents) = std::fs::read_dir(root) else { continue };
        for p in parents.flatten().filter(|p| p.file_name().to_string_lossy().starts_with("brig-"))
        {
            if let Ok(text) = std::fs::read_to_string(p.path().join(id).join(file)) {
                return Some(text.trim().to_string());
            }
        }
    }
    None
}

#[tokio::test]
async fn an_overcommitted_node_refuses_clearly_and_loses_nothing() {
    // 1% of this machine's memory: room for three 64 MiB containers, not four.
    let cfg = config("[admission]\nmemory_overcommit_pct = 1\n");
    let path = cfg.path().to_string_lossy().to_string();
    let daemon = Daemon::start_with(&["--config", &path]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let total = client.node_status().await.expect("status").capacity.memory_total_bytes;
    let fits = (total / 100 / (64 << 20)) as usize;
    assert!(fits >= 1, "this test needs at least 6.4 GiB of memory");

    let opts = || SandboxOptions::container(&image("busybox")).memory_mib(64);
    let mut live = Vec::new();
    for i in 0..fits {
        let sb = client.create(opts()).await.expect("within the overcommit bound");
        let out = sb
            .exec_with(Cmd::shell(&format!(
                "echo state-{i} > /state; (while :; do sleep 1; done) > /dev/null 2>&1 &"
            )))
            .await
            .expect("exec");
        assert!(out.success());
        live.push(sb);
    }
    let refused = client.create(opts()).await.expect_err("past the overcommit bound");
    assert_eq!(refused.code(), Some(ErrorCode::ResourceExhausted), "{refused}");
    assert!(refused.retryable(), "a full node is worth retrying elsewhere: {refused}");
    assert!(refused.to_string().contains("node memory"), "says why: {refused}");

    // Nothing running was lost, and the node reports what it holds.
    for (i, sb) in live.iter().enumerate() {
        let out = sb.exec(["cat", "/state"]).await.expect("still answers");
        assert_eq!(out.stdout_text(), format!("state-{i}\n"));
    }
    let cap = client.node_status().await.expect("status").capacity;
    assert_eq!(cap.memory_requested_bytes, fits as u64 * (64 << 20));
    assert_eq!(cap.containers, fits as u64);
    assert!(cap.working_set_bytes > 0);

    // A reclaimed idle sandbox answers its next exec correctly.
    live[0].pause().await.expect("pause (reclaim)");
    let out = live[0].exec(["cat", "/state"]).await.expect("exec after reclaim");
    assert_eq!(out.stdout_text(), "state-0\n");

    // Room frees up when a sandbox goes, and the sum of what is asked follows.
    live.pop().expect("one").destroy().await.expect("destroy");
    let cap = client.node_status().await.expect("status").capacity;
    assert_eq!(cap.memory_requested_bytes, (fits as u64 - 1) * (64 << 20));
    client.create(opts()).await.expect("admitted again");
    let cap = client.node_status().await.expect("status").capacity;
    assert_eq!(cap.memory_requested_bytes, fits as u64 * (64 << 20));

    let text = metrics_text(daemon.state_dir()).expect("metrics");
    let series = "brig_admission_total{tier=\"container\",reason=\"memory_overcommit\"}";
    assert!(metric(&text, series) >= 1.0, "{text}");

    // A floor of free memory no machine has refuses even tiny sandboxes.
    let cfg = config("[admission]\nmin_free_mib = 100000000\n");
    let path = cfg.path().to_string_lossy().to_string();
    let strict = Daemon::start_with(&["--config", &path]).expect("brigd");
    let strict_client = strict.client().await.expect("connect");
    let err = strict_client.create(SandboxOptions::fncall()).await.expect_err("floor");
    assert_eq!(err.code(), Some(ErrorCode::ResourceExhausted), "{err}");
    assert!(err.to_string().contains("must stay free"), "{err}");
}

#[tokio::test]
async fn qos_classes_reach_the_cgroup_and_move_at_run_time() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bulk = client
        .create(SandboxOptions::container(&image("busybox")).qos(QosClass::BestEffort))
        .await
        .expect("create");
    let fast = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let shares = |id: &str| cpu_file(id, "cpu.shares", "cpu.weight");
    let idle = |id: &str| cpu_file(id, "cpu.idle", "cpu.idle");
    assert_eq!(bulk.status().await.expect("status").qos, QosClass::BestEffort);
    // The smallest weight (v1 shows 3 once cpu.idle puts the group under the idle policy).
    let weight = |id: &str| shares(id).and_then(|v| v.parse::<u64>().ok()).unwrap_or(u64::MAX);
    assert!(weight(bulk.id()) <= 3, "{:?}", shares(bulk.id()));
    if let Some(v) = idle(bulk.id()) {
        assert_eq!(v, "1");
    }
    assert!(matches!(shares(fast.id()).as_deref(), Some("1024") | Some("100")));

    // Setup done: the sandbox becomes latency-sensitive, and back.
    let info = bulk.set_qos(QosClass::LatencySensitive).await.expect("set qos");
    assert_eq!(info.qos, QosClass::LatencySensitive);
    assert!(matches!(shares(bulk.id()).as_deref(), Some("1024") | Some("100")));
    bulk.set_qos(QosClass::BestEffort).await.expect("set qos");
    let out = bulk.exec_with(Cmd::shell("echo works").timeout(Duration::from_secs(10))).await;
    assert_eq!(out.expect("exec").stdout_text(), "works\n");
    let cap = client.node_status().await.expect("status").capacity;
    assert_eq!((cap.best_effort, cap.latency_sensitive), (1, 1));
    let text = metrics_text(daemon.state_dir()).expect("metrics");
    assert_eq!(metric(&text, "brig_sandboxes_qos{class=\"best_effort\"}"), 1.0, "{text}");
}

/// Descriptors `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A `/proc/<pid>/status` field, e.g. `PPid`.
fn status_field(pid: u32, key: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

#[tokio::test]
async fn the_node_holds_one_descriptor_per_container_and_starts_shims_from_its_spawner() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let brigd = daemon.pid().expect("brigd pid");
    let small = || SandboxOptions::container(&image("busybox")).cpu_millis(10).memory_mib(32);
    let first = client.create(small()).await.expect("create");
    // The quota is set once the container runs, with a burst of one more quota; 10 millicores
    // are 5 ms per 500 ms periods (the node's smallest quota), not 1 ms per 100 ms.
    // v2's cpu.max reads "5000 500000".
    let quota = cpu_file(first.id(), "cpu.cfs_quota_us", "cpu.max").expect("quota");
    assert_eq!(quota.split_whitespace().next(), Some("5000"), "{quota}");
    let period = cpu_file(first.id(), "cpu.cfs_period_us", "cpu.max").expect("period");
    assert_eq!(period.split_whitespace().last(), Some("500000"), "{period}");
    if let Some(burst) = cpu_file(first.id(), "cpu.cfs_burst_us", "cpu.max.burst") {
        assert_eq!(burst, "5000");
    }
    // A core keeps the new cgroup's 100 ms period (the node skips writing what is already
    // there: each bandwidth write walks every task group on the host).
    let core = client.create(small().cpu_millis(1000)).await.expect("create a core");
    let quota = cpu_file(core.id(), "cpu.cfs_quota_us", "cpu.max").expect("quota");
    assert_eq!(quota.split_whitespace().next(), Some("100000"), "{quota}");
    let period = cpu_file(core.id(), "cpu.cfs_period_us", "cpu.max").expect("period");
    assert_eq!(period.split_whitespace().last(), Some("100000"), "{period}");
    core.destroy().await.expect("destroy the core");
    let before = open_fds(brigd);
    let mut sandboxes = Vec::new();
    for _ in 0..40 {
        sandboxes.push(client.create(small()).await.expect("create"));
    }
    let added = open_fds(brigd).saturating_sub(before);
    assert!(added <= 44, "40 containers took {added} descriptors in brigd");

    // Every shim is a child of the one spawner, itself a child of brigd.
    let spawner = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| status_field(p, "PPid") == Some(brigd) && cmdline(p).contains("--spawner"))
        .expect("a spawner under brigd");
    let shims: Vec<u32> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| status_field(p, "PPid") == Some(spawner))
        .collect();
    assert!(shims.len() >= 41, "{} shims under the spawner", shims.len());
    // Forked, not exec'd: each shim is called brig-shim and shares anonymous pages with the
    // spawner (its relocated code and the C library's data, which an exec'd shim writes itself).
    for &shim in shims.iter().take(5) {
        assert_eq!(cmdline(shim).trim_end(), "brig-shim");
        let rollup =
            std::fs::read_to_string(format!("/proc/{shim}/smaps_rollup")).expect("smaps_rollup");
        let kib = |key: &str| -> u64 {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix(" kB"))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{key} in {rollup}"))
        };
        let shared_anon = kib("Anonymous").saturating_sub(kib("Pss_Anon"));
        assert!(shared_anon >= 64, "shim {shim} shares {shared_anon} KiB:\n{rollup}");
    }
    // A spawner that dies is replaced; running containers never notice.
    let killed = std::process::Command::new("kill").args(["-9", &spawner.to_string()]).status();
    assert!(killed.expect("kill").success());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = client.create(small()).await.expect("create after the spawner died");
    for sb in [&first, &sandboxes[39], &after] {
        let out = sb.exec(["sh", "-c", "echo $((6 * 7))"]).await.expect("exec");
        assert_eq!(out.stdout_text(), "42\n");
    }
    // Superblocks: the overlay, the upper tmpfs (also /dev and the masks), proc and devpts are
    // the container's own; sysfs and the host's device nodes are shared.
    let mounts = after.exec(["cat", "/proc/self/mountinfo"]).await.expect("mountinfo");
    let text = mounts.stdout_text();
    let devices: std::collections::BTreeSet<&str> =
        text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert!(devices.len() <= 6, "{} superblocks:\n{text}", devices.len());
    let net = after.exec(["ls", "/sys/class/net"]).await.expect("ls");
    assert_eq!(net.stdout_text(), "lo\n");
    let shm =
        after.exec(["sh", "-c", "echo x > /dev/shm/y && cat /dev/shm/y && ls /proc/acpi | wc -l"]);
    assert_eq!(shm.await.expect("shm").stdout_text(), "x\n0\n");
    // Files still reach the root through an on-demand descriptor.
    after.write_file("/tmp/x", b"kept").await.expect("write");
    assert_eq!(after.read_file("/tmp/x").await.expect("read"), b"kept");
}

/// A node that is itself a VM holds the memory its sandboxes free instead of reporting it to
/// the hypervisor (which would take the pages' backing away, so the next create faults twice).
#[tokio::test]
async fn a_node_holds_freed_memory_from_its_hypervisor_while_it_runs() {
    const ORDER: &str = "/sys/module/page_reporting/parameters/page_reporting_order";
    let daemon = Daemon::start().expect("brigd");
    let text = metrics_text(daemon.state_dir()).expect("metrics");
    let state =
        |s: &str| metric(&text, &format!("brig_host_free_page_reporting{{state=\"{s}\"}} "));
    let Ok(order) = std::fs::read_to_string(ORDER) else {
        assert_eq!((state("absent"), state("reporting"), state("held")), (1.0, 0.0, 0.0));
        return;
    };
    // Held: the order is above every order a free block can have (one per buddyinfo column).
    let orders = std::fs::read_to_string("/proc/buddyinfo")
        .expect("buddyinfo")
        .lines()
        .map(|l| l.split_whitespace().skip_while(|w| *w != "zone").skip(2).count())
        .max()
        .expect("a zone");
    let order: usize = order.trim().parse().expect("an order");
    assert!(order >= orders, "free blocks of order {order} are still reported ({orders} orders)");
    assert_eq!((state("absent"), state("reporting"), state("held")), (0.0, 0.0, 1.0), "{text}");
}

/// A node raises the kernel's largest memory cgroup shrinker id at start, once per boot, so
/// a fill after a boot does not grow every memory cgroup's shrinker map as it goes.
#[tokio::test]
async fn a_node_reserves_memory_cgroup_shrinker_ids_once_per_boot() {
    let daemon = Daemon::start().expect("brigd");
    let run_dir = daemon.run_dir();
    let record_path = run_dir.parent().expect("run root").join("shrinker-ids.json");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    // The node's default: 10,000 containers of five superblocks each, on a thread of its own
    // (about a second the first time this boot; at once when an earlier node did it).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let record = loop {
        let record: Option<serde_json::Value> =
            std::fs::read(&record_path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        match record {
            Some(r) if r["boot_id"].as_str() == Some(boot.trim()) => break r,
            _ if std::time::Instant::now() > deadline => panic!("no record of this boot"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(record["ids"].as_u64().expect("ids") >= 50_000, "{record}");
    let text = metrics_text(daemon.state_dir()).expect("metrics");
    let ids = record["ids"].as_u64().expect("ids") as f64;
    assert_eq!(metric(&text, "brig_host_shrinker_ids_reserved "), ids, "{text}");
    // The reserving thread's mounts were never in the host's namespace, and it left nothing.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains("brig-shrinker-id"), "{mounts}");
    let scratch = run_dir.parent().expect("run root").join("shrinker-ids");
    assert_eq!(std::fs::read_dir(&scratch).map(|d| d.count()).unwrap_or(0), 0);
    // The node serves meanwhile and after.
    let client = daemon.client().await.expect("connect");
    let sandbox = client
        .create(SandboxOptions::container(&image("busybox")).memory_mib(32))
        .await
        .expect("create");
    let out = sandbox.exec_with(Cmd::shell("echo served")).await.expect("exec");
    assert_eq!(out.stdout_text(), "served\n");
}
