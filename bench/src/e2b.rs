//! `e2b`: the E2B-compatible API against the native SDK, on one release brigd in one run.
//!
//! - E2B: E2B's own Python SDK (`artifacts/venv`, unchanged) runs `bench/scripts/e2b_measure.py`:
//!   create → first command (`true`, as E2B runs it: `bash -l -c`) one at a time, then
//!   commands/s with `--concurrency` sandboxes each running commands back to back.
//! - native: the same through the Rust SDK (create → `exec true`; commands/s the same way).
//!
//! Both use the `base` template's image (Debian 12), so the difference is the API's path: HTTP
//! and Connect through the gateway, which is itself a Brig SDK client, plus the E2B user made at
//! create.

use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, SandboxOptions};
use brig_tests::{artifacts, image, repo_root};
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Sequential create → first command samples (each side).
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Sandboxes running commands at once in the throughput phase.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds of the throughput phase (each side).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let config = format!(
        "[e2b]\nmemory_mib = 256\ndisk_mib = 64\n[e2b.templates]\nbase = {:?}\n",
        image("debian-12")
    );
    crate::build_daemon()?;
    let daemon = brig_tests::Daemon::start_with_config(&config, &[])?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let python = artifacts().join("venv/bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} is missing: run scripts/install-deps.sh",
        python.display()
    );
    let url = daemon.e2b_url()?;
    let out = std::process::Command::new(python)
        .arg(repo_root().join("bench/scripts/e2b_measure.py"))
        .args([opts.samples.to_string(), opts.concurrency.to_string(), opts.seconds.to_string()])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", daemon.access_token()?)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the E2B side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let e2b: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
        .map_err(|e| anyhow::anyhow!("the E2B side printed no result ({e}): {stdout}"))?;
    let mut e2b_lat = Latencies::default();
    for ms in e2b["latencies_ms"].as_array().into_iter().flatten().filter_map(|v| v.as_f64()) {
        e2b_lat.record(Duration::from_secs_f64(ms / 1000.0));
    }
    let e2b_rate =
        e2b["commands"].as_f64().unwrap_or(0.0) / e2b["elapsed_s"].as_f64().unwrap_or(1.0);
    let (mut native_lat, native_rate) = rt.block_on(async {
        let client = daemon.client().await?;
        native(&client, &opts).await
    })?;
    let (e50, e99) = (e2b_lat.quantile_ms(0.5), e2b_lat.quantile_ms(0.99));
    let (n50, n99) = (native_lat.quantile_ms(0.5), native_lat.quantile_ms(0.99));
    println!("E2B-compatible API vs native SDK (release brigd, Debian 12 image, same run)");
    println!("  {:<44} {:>9.2} / {:.2}", "E2B SDK: create → first command p50 / p99 ms", e50, e99);
    println!("  {:<44} {:>9.2} / {:.2}", "Rust SDK: create → first exec p50 / p99 ms", n50, n99);
    println!(
        "  {:<44} {:>9.0}",
        format!("E2B SDK: commands/s ({} sandboxes)", opts.concurrency),
        e2b_rate
    );
    println!(
        "  {:<44} {:>9.0}",
        format!("Rust SDK: commands/s ({} sandboxes)", opts.concurrency),
        native_rate
    );
    Ok(json!({
        "bench": "e2b",
        "e2b_create_to_cmd_p50_ms": round3(e50),
        "e2b_create_to_cmd_p99_ms": round3(e99),
        "native_create_to_cmd_p50_ms": round3(n50),
        "native_create_to_cmd_p99_ms": round3(n99),
        "e2b_cmds_per_sec": round3(e2b_rate),
        "native_cmds_per_sec": round3(native_rate),
        "samples": opts.samples,
        "concurrency": opts.concurrency,
        "seconds": opts.seconds,
    }))
}

async fn native(client: &Client, opts: &Options) -> anyhow::Result<(Latencies, f64)> {
    let options = || SandboxOptions::container("debian-12").memory_mib(256).disk_mib(64);
    for _ in 0..3 {
        let sb = client.create(options()).await?;
        sb.exec(["true"]).await?;
        sb.destroy().await?;
    }
    let mut lat = Latencies::default();
    for _ in 0..opts.samples {
        let started = Instant::now();
        let sb = client.create(options()).await?;
        anyhow::ensure!(sb.exec(["true"]).await?.success(), "true failed");
        lat.record(started.elapsed());
        sb.destroy().await?;
    }
    let mut sandboxes = Vec::new();
    for _ in 0..opts.concurrency {
        sandboxes.push(client.create(options()).await?);
    }
    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let started = Instant::now();
    let counts = futures::future::join_all(sandboxes.iter().map(|sb| async move {
        let mut n = 0u64;
        while Instant::now() < deadline {
            if sb.exec_with(Cmd::new(["true"])).await.is_ok_and(|o| o.success()) {
                n += 1;
            }
        }
        n
    }))
    .await;
    let rate = counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64();
    for sb in sandboxes {
        sb.destroy().await?;
    }
    Ok((lat, rate))
}
