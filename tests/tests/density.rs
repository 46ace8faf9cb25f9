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

    // Room frees up when a sandbox goes.
    live.pop().expect("one").destroy().await.expect("destroy");
    client.create(opts()).await.expect("admitted again");

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
