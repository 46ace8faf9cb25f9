//! `python`: the Python SDK (`sdk/python`, release wheel built by maturin) against the Rust
//! SDK, same daemon, same run: one-shot `jq` calls per second from N asyncio tasks on one
//! event loop vs N tokio tasks on one connection (the `fncall` bench's loop), and create→first exec latency of a busybox
//! container from each.

use std::time::{Duration, Instant};

use brig_sdk::{Client, SandboxOptions};
use brig_tests::{artifacts, image, repo_root, Daemon};
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Calls in flight at once (asyncio tasks; tokio tasks on the Rust side).
    #[arg(long, default_value_t = 128)]
    concurrency: usize,
    /// Measured seconds of calls (each side), after the warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Sequential create → first exec samples (each side).
    #[arg(long, default_value_t = 30)]
    samples: usize,
}

/// Builds the release wheel and installs it into a directory of its own (on PYTHONPATH for the
/// measurement), leaving the venv's development install alone.
fn release_package(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let venv = artifacts().join("venv/bin");
    anyhow::ensure!(
        venv.join("maturin").exists(),
        "maturin is missing: run scripts/install-deps.sh"
    );
    let wheels = dir.join("wheels");
    let status = std::process::Command::new(venv.join("maturin"))
        .args(["build", "--release", "--quiet", "-m"])
        .arg(repo_root().join("sdk/python/Cargo.toml"))
        .arg("-o")
        .arg(&wheels)
        .status()?;
    anyhow::ensure!(status.success(), "maturin build failed");
    let wheel = std::fs::read_dir(&wheels)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| anyhow::anyhow!("maturin built no wheel"))?;
    let site = dir.join("site");
    let status = std::process::Command::new(venv.join("pip"))
        .args(["install", "--quiet", "--no-deps", "--disable-pip-version-check", "--target"])
        .arg(&site)
        .arg(&wheel)
        .status()?;
    anyhow::ensure!(status.success(), "installing the wheel failed");
    Ok(site)
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    crate::build_daemon()?;
    let scratch = tempfile::tempdir()?;
    let site = release_package(scratch.path())?;
    let _ = image("busybox");
    let daemon = Daemon::start()?;
    let out = std::process::Command::new(artifacts().join("venv/bin/python"))
        .arg(repo_root().join("bench/scripts/python_measure.py"))
        .args([
            opts.concurrency.to_string(),
            opts.seconds.to_string(),
            opts.warmup.to_string(),
            opts.samples.to_string(),
        ])
        .env("PYTHONPATH", &site)
        .env("BRIG_STATE_DIR", daemon.state_dir())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the Python side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let py: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
        .map_err(|e| anyhow::anyhow!("the Python side printed no result ({e}): {stdout}"))?;
    let py_rate = py["calls"].as_f64().unwrap_or(0.0) / py["elapsed_s"].as_f64().unwrap_or(1.0);
    let mut py_lat = Latencies::default();
    for ms in py["create_to_exec_ms"].as_array().into_iter().flatten().filter_map(|v| v.as_f64()) {
        py_lat.record(Duration::from_secs_f64(ms / 1000.0));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let (rust_rate, rust_errors, mut rust_lat) = rt.block_on(async {
        let client = daemon.client().await?;
        let calls = crate::fncall::Options::calls(opts.concurrency, opts.seconds, opts.warmup);
        let (rate, _, errors) =
            crate::fncall::end_to_end(std::slice::from_ref(&client), &calls).await?;
        anyhow::Ok((rate, errors, create_to_exec(&client, opts.samples).await?))
    })?;
    let (p50, r50) = (py_lat.quantile_ms(0.5), rust_lat.quantile_ms(0.5));
    println!("Python SDK vs Rust SDK (release brigd and release module, same run)");
    println!(
        "  one-shot jq calls/s, {} in flight   Python {:>9.0}   Rust {:>9.0}   ({:.0}%)",
        opts.concurrency,
        py_rate,
        rust_rate,
        100.0 * py_rate / rust_rate.max(1.0)
    );
    println!("  create → first exec p50 ms (busybox)   Python {p50:>9.2}   Rust {r50:>9.2}");
    Ok(json!({
        "bench": "python",
        "concurrency": opts.concurrency,
        "seconds": opts.seconds,
        "py_calls_per_sec": round3(py_rate),
        "rust_calls_per_sec": round3(rust_rate),
        "py_share_of_rust": round3(py_rate / rust_rate.max(1.0)),
        "py_errors": py["errors"],
        "rust_errors": rust_errors,
        "py_create_to_exec_p50_ms": round3(p50),
        "rust_create_to_exec_p50_ms": round3(r50),
    }))
}

async fn create_to_exec(client: &Client, samples: usize) -> anyhow::Result<Latencies> {
    let options = || SandboxOptions::container("busybox");
    for _ in 0..3 {
        let sb = client.create(options()).await?;
        sb.exec(["true"]).await?;
        sb.destroy().await?;
    }
    let mut lat = Latencies::default();
    for _ in 0..samples {
        let started = Instant::now();
        let sb = client.create(options()).await?;
        anyhow::ensure!(sb.exec(["true"]).await?.success(), "true failed");
        lat.record(started.elapsed());
        sb.destroy().await?;
    }
    Ok(lat)
}
