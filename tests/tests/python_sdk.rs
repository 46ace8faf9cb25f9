//! The Python SDK (`sdk/python`, the `brig` package built by maturin into artifacts/venv by
//! scripts/test.sh) against a real brigd: its pytest suite (`sdk/python/tests/`) with
//! BRIG_STATE_DIR pointing at the daemon, and mypy --strict over the examples.

use std::path::PathBuf;
use std::process::Command;

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
    let daemon = Daemon::start_with(&[]).expect("brigd");
    let out = Command::new(python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5"])
        .arg(repo_root().join("sdk/python/tests"))
        .env("BRIG_STATE_DIR", daemon.state_dir())
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
