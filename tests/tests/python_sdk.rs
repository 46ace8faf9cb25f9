//! The Python SDK (`sdk/python`, the `brig` package built by maturin into artifacts/venv by
//! scripts/test.sh) against a real brigd: its pytest suite (`sdk/python/tests/`) with
//! BRIG_STATE_DIR pointing at the daemon, and mypy --strict over the examples.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brig_sdk::Pin;
use brig_tests::cluster::{node_of, Cluster};
use brig_tests::registry::{busybox_base, write_image, Registry};
use brig_tests::{artifacts, image, repo_root, Daemon};

fn python() -> PathBuf {
    let path = artifacts().join("venv/bin/python");
    assert!(path.exists(), "{} is missing: run scripts/install-deps.sh", path.display());
    let built = Command::new(&path).args(["-c", "import brig"]).output().expect("python");
    assert!(
        built.status.success(),
        "the brig package is not in artifacts/venv: run scripts/test.sh (maturin develop): {}",
        String::from_utf8_lossy(&built.stderr)
    );
    path
}

fn report(out: &std::process::Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_python_sdk_drives_every_call_against_brigd() {
    let _ = (image("busybox"), image("debian-12"));
    // A registry with one image, for the suite's pull (BRIG_TEST_IMAGE_REF).
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let layer = busybox_base().file("etc/pulled", 0o644, b"from a registry\n");
    write_image(layout.path(), "py", &[layer], &[]).expect("image");
    let reference = registry.push(layout.path(), "py", "brig/python").expect("push");
    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let out = Command::new(python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5"])
        .arg(repo_root().join("sdk/python/tests"))
        .env("BRIG_STATE_DIR", daemon.state_dir())
        .env("BRIG_TEST_IMAGE_REF", &reference)
        .output()
        .expect("running pytest");
    assert!(out.status.success(), "the Python SDK suite failed:\n{}", report(&out));
}

/// The examples run against brigd (smaller batches), and `mypy --strict` passes on them with
/// the package's type stubs.
#[test]
fn the_python_examples_run_and_type_check() {
    let _ = (image("busybox"), image("debian-12"));
    let python = python();
    let examples = repo_root().join("sdk/python/examples");
    let mypy = Command::new(&python)
        .args(["-m", "mypy", "--strict", "--no-incremental"])
        .arg(&examples)
        .output()
        .expect("running mypy");
    assert!(mypy.status.success(), "mypy --strict on the examples:\n{}", report(&mypy));
    let daemon = Daemon::start_with(&[]).expect("brigd");
    for (script, args) in
        [("verl_tool.py", vec![]), ("slime_rollouts.py", vec!["16"]), ("grpo_group.py", vec!["4"])]
    {
        let out = Command::new(&python)
            .arg(examples.join(script))
            .args(args)
            .env("BRIG_STATE_DIR", daemon.state_dir())
            .output()
            .expect("running an example");
        assert!(out.status.success(), "{script}:\n{}", report(&out));
    }
}

/// Through a control-plane replica: a project's quota refuses with `QuotaExceeded`, and a
/// sandbox on a node that dies fails with `SandboxLost` (the script names the sandbox; this
/// test kills its node).
#[test]
fn the_python_sdk_gets_quota_and_lost_node_errors_from_a_cluster() {
    let mut cluster = Cluster::start(1, 2, &[]).expect("cluster");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(cluster.wait_healthy(2)).expect("two healthy nodes");
    let opts = cluster.controls[0].connect_options().expect("control endpoint");
    let Pin::Sha256(cert) = opts.pin else { panic!("control pin is not a fingerprint") };
    let signals = tempfile::tempdir().expect("tmp");
    let mut child = Command::new(python())
        .arg(repo_root().join("sdk/python/tests/cluster_flow.py"))
        .env("BRIG_ADDR", opts.addr.to_string())
        .env("BRIG_CERT", cert)
        .env("BRIG_ADMIN_TOKEN", opts.token)
        .env("BRIG_SIGNAL_DIR", signals.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the script");
    let started = Instant::now();
    let lost = loop {
        if let Ok(id) = std::fs::read_to_string(signals.path().join("lost-id")) {
            break id;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break String::new();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the script named no sandbox");
        std::thread::sleep(Duration::from_millis(100));
    };
    if !lost.is_empty() {
        let node = node_of(&lost) as usize;
        cluster.nodes[node - 1].crash().expect("kill the node");
        std::fs::write(signals.path().join("killed"), "").expect("signal");
    }
    let out = child.wait_with_output().expect("script output");
    assert!(out.status.success(), "cluster flow:\n{}", report(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cluster flow ok"), "{}", report(&out));
}
