//! E2B's own SDKs, unchanged, against brigd's E2B-compatible API: the `e2b` package from PyPI
//! runs our pytest suite (`tests/e2b/`) and the `e2b` package from npm runs a short script
//! (`tests/e2b-js/`), each with nothing but E2B's environment variables pointing at a real
//! brigd on loopback. The SDKs and runners are installed by `scripts/install-deps.sh`.

use std::path::PathBuf;
use std::process::Command;

use brig_tests::cluster::{node_of, Cluster};
use brig_tests::net::Mirror;
use brig_tests::registry::{busybox_base, write_image, Registry};
use brig_tests::{artifacts, image, repo_root, Daemon};

/// A daemon whose `base` template is the Debian image and whose `image` metadata key picks
/// an image directly; sandboxes get a 200 MiB disk, so a 300 MiB upload passes the quota.
/// Webhooks go only to public addresses (the default).
fn daemon() -> Daemon {
    daemon_config("public", "")
}

/// [`daemon`] with more configuration, and webhooks delivered anywhere (the suite's receivers
/// listen on loopback).
fn daemon_with(extra: &str) -> Daemon {
    daemon_config("any", extra)
}

fn daemon_config(webhook_targets: &str, extra: &str) -> Daemon {
    let config = format!(
        "[e2b]\nimage_metadata_key = \"image\"\ndisk_mib = 200\nmemory_mib = 512\n\
         webhook_targets = {webhook_targets:?}\n[e2b.templates]\nbase = {:?}\n{extra}",
        image("debian-12")
    );
    let _ = image("busybox");
    Daemon::start_with_config(&config, &[]).expect("brigd")
}

fn tool(rel: &str) -> PathBuf {
    let path = artifacts().join(rel);
    assert!(path.exists(), "{} is missing: run scripts/install-deps.sh", path.display());
    path
}

#[test]
fn the_e2b_python_sdk_runs_unchanged_against_brigd() {
    // A registry with one image, for the template builds' `from_image` (BRIG_TEST_IMAGE_REF).
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let layer = busybox_base().file("etc/pulled", 0o644, b"from a registry\n");
    write_image(layout.path(), "e2b", &[layer], &["PATH=/bin"]).expect("image");
    let reference = registry.push(layout.path(), "e2b", "brig/e2b").expect("push");
    let daemon = daemon_with(&format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr));
    let mirror = Mirror::start("brig e2b test").expect("a web service to reach");
    let url = daemon.e2b_url().expect("E2B API address");
    let out = Command::new(tool("venv/bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10"])
        .arg(repo_root().join("tests/e2b"))
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_VOLUME_API_URL", &url)
        .env("E2B_API_KEY", daemon.access_token().expect("token"))
        .env("BRIG_TEST_WEB", format!("{}:{}", mirror.addr, mirror.port))
        .env("BRIG_WEBHOOK_TARGETS", "any")
        .env("BRIG_TEST_IMAGE_REF", &reference)
        .output()
        .expect("running pytest");
    let report = report(&out);
    assert!(out.status.success(), "the E2B suite failed:\n{report}\nbrigd:\n{}", tail(&daemon));
}

/// The oldest supported E2B SDK (2.45.1, which checks API keys on the client) against brigd:
/// its keys, commands and files cases, and webhooks kept out of the node (the default
/// `webhook_targets`).
#[test]
fn the_oldest_supported_e2b_python_sdk_runs_against_brigd() {
    let daemon = daemon();
    let url = daemon.e2b_url().expect("E2B API address");
    let suite = repo_root().join("tests/e2b");
    let out = Command::new(tool("venv-e2b-oldest/bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(
            ["test_api_keys.py", "test_commands.py", "test_files.py", "test_webhook_targets.py"]
                .map(|f| suite.join(f)),
        )
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", daemon.access_token().expect("token"))
        .output()
        .expect("running pytest");
    let report = report(&out);
    assert!(out.status.success(), "e2b 2.45.1:\n{report}\nbrigd:\n{}", tail(&daemon));
    assert!(!report.contains("skipped"), "2.45.1 checks keys: nothing is skipped\n{report}");
}

/// E2B's SDK across a `kill -9` of brigd: a process started with stdin before the crash is
/// listed after it, takes more input by `send_stdin`, ends at `close_stdin`, and its output
/// read again through `commands.connect` has both lines (`tests/e2b/restart_phases.py`).
#[test]
fn an_e2b_process_takes_stdin_across_a_brigd_crash() {
    let config = format!("[e2b]\n[e2b.templates]\nbase = {:?}\n", image("debian-12"));
    let mut daemon = Daemon::start_with_config(&config, &["--on-exit", "keep"]).expect("brigd");
    let url = daemon.e2b_url().expect("E2B API address");
    let token = daemon.access_token().expect("token");
    let phase = |args: &[&str]| {
        let out = Command::new(tool("venv/bin/python"))
            .arg(repo_root().join("tests/e2b/restart_phases.py"))
            .args(args)
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_API_KEY", &token)
            .output()
            .expect("running the script");
        (out.status.success(), report(&out))
    };
    let (ok, started) = phase(&["start"]);
    assert!(ok, "before the crash:\n{started}\nbrigd:\n{}", tail(&daemon));
    assert!(started.starts_with("sb-"), "{started}");
    let ids: Vec<String> = started.split_whitespace().take(2).map(str::to_string).collect();
    daemon.crash().expect("crash");
    daemon.start_again().expect("start again");
    assert_eq!(daemon.e2b_url().expect("E2B API address"), url, "the E2B API moved");
    let (ok, resumed) = phase(&["resume", &ids[0], &ids[1]]);
    assert!(ok, "after the crash:\n{resumed}\nbrigd:\n{}", tail(&daemon));
    assert!(resumed.contains("ok"), "{resumed}");
}

/// E2B's debug layout: API on 127.0.0.1:3000, envd on 127.0.0.1:49983, the SDK configured by
/// `E2B_DEBUG=true` alone.
#[test]
fn the_e2b_sdk_in_debug_mode_finds_brigd_on_the_debug_ports() {
    let config = format!(
        "[e2b]\nlisten = \"127.0.0.1:3000\"\nenvd_listen = \"127.0.0.1:49983\"\n\
         [e2b.templates]\nbase = {:?}\n",
        image("debian-12")
    );
    let daemon =
        Daemon::start_with_config(&config, &["--e2b-listen", "127.0.0.1:3000"]).expect("brigd");
    let out = Command::new(tool("venv/bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(repo_root().join("tests/e2b/test_debug_layout.py"))
        .env("E2B_DEBUG", "true")
        .env("E2B_API_KEY", daemon.access_token().expect("token"))
        .env_remove("E2B_API_URL")
        .env_remove("E2B_SANDBOX_URL")
        .output()
        .expect("running pytest");
    let report = report(&out);
    assert!(out.status.success(), "debug layout:\n{report}\nbrigd:\n{}", tail(&daemon));
    assert!(report.contains("1 passed"), "{report}");
}

#[test]
fn the_e2b_js_sdk_runs_unchanged_against_brigd() {
    let daemon = daemon();
    let url = daemon.e2b_url().expect("E2B API address");
    // ESM resolves packages from the script's own folder: run a copy beside node_modules.
    let script = tool("node").join("smoke.mjs");
    std::fs::copy(repo_root().join("tests/e2b-js/smoke.mjs"), &script).expect("copy the script");
    let out = Command::new("node")
        .arg(&script)
        .current_dir(tool("node"))
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_VOLUME_API_URL", &url)
        .env("E2B_API_KEY", daemon.access_token().expect("token"))
        .output()
        .expect("running node");
    let report = report(&out);
    assert!(out.status.success(), "the JS SDK failed:\n{report}\nbrigd:\n{}", tail(&daemon));
    assert!(report.contains("e2b-js: ok"), "{report}");
}

/// The E2B API of a control-plane replica: creates are placed on the cluster's nodes, and
/// commands, files and pause/connect reach each sandbox where it runs.
#[test]
fn a_control_replica_serves_the_e2b_api_for_its_cluster() {
    let cluster = Cluster::start(1, 2, &[]).expect("cluster");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(cluster.wait_healthy(2)).expect("two healthy nodes");
    let control = &cluster.controls[0];
    let url = control.e2b_url().expect("the replica's E2B API");
    // A project-scoped token is an E2B API key like any other; its sandboxes count against
    // the project, and it sees only them.
    let token = rt
        .block_on(async {
            let admin = cluster.admin().await?;
            admin.set_project("e2b-team", brig_sdk::ProjectLimits::default()).await?;
            admin.set_project("other-team", brig_sdk::ProjectLimits::default()).await?;
            let other = admin.create_token("other-team").await?;
            anyhow::Ok((admin.create_token("e2b-team").await?, other))
        })
        .expect("project tokens");
    let (token, other) = token;
    let out = Command::new(tool("venv/bin/python"))
        .arg(repo_root().join("tests/e2b/cluster_smoke.py"))
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &token)
        .env("OTHER_PROJECT_KEY", &other)
        .output()
        .expect("running the script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "through the replica:\n{stdout}\n{}\nreplica:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(control)
    );
    let nodes: std::collections::BTreeSet<u32> =
        stdout.lines().filter(|l| l.starts_with("sb-")).map(node_of).collect();
    assert_eq!(nodes.len(), 2, "eight sandboxes all landed on one node: {stdout}");
}

/// A run's stdout and stderr, printed (nextest shows it for a failure) and returned.
fn report(out: &std::process::Output) -> String {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    text
}

fn tail(daemon: &Daemon) -> String {
    let log = daemon.log_text();
    let start = log.len().saturating_sub(20_000);
    log[log.floor_char_boundary(start)..].to_string()
}
