//! `images`: the layer store with a Debian + Python base of 500+ MiB.
//!
//! - fetched fraction: with an empty chunk cache, bytes fetched from the backend to run
//!   `python3 -c 'import json'` in a fresh sandbox, over the layer's size;
//! - cold vs warm create: create + that first exec with empty caches (chunk cache and the
//!   kernel's page cache) and again with them warm;
//! - disk bytes written by brigd to create 100 sandboxes from one environment.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, ImageFormat, ImageSource, SandboxOptions};
use brig_tests::Daemon;
use serde_json::json;

use crate::stats::round3;

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Packages added to Debian minbase for the base layer.
    #[arg(
        long,
        default_value = "bash,coreutils,python3,python3-pip,python3-venv,git,build-essential,ca-certificates,procps"
    )]
    include: String,
    /// Sandboxes created for the disk-write measurement.
    #[arg(long, default_value_t = 100)]
    sandboxes: usize,
}

fn base_image(opts: &Options) -> anyhow::Result<PathBuf> {
    let dir = brig_tests::artifacts().join("bench");
    std::fs::create_dir_all(&dir)?;
    let image = dir.join("debian-python-base.erofs");
    let stamp = dir.join("debian-python-base.recipe");
    if image.exists() && std::fs::read_to_string(&stamp).unwrap_or_default() == opts.include {
        return Ok(image);
    }
    println!("building the Debian + Python base with debootstrap (once; a few minutes)");
    let status = std::process::Command::new(brig_tests::binary("brig-mkimage"))
        .args(["debian", "--include", &opts.include])
        .arg(&image)
        .status()?;
    anyhow::ensure!(status.success(), "brig-mkimage debian failed");
    std::fs::write(&stamp, &opts.include)?;
    Ok(image)
}

fn drop_page_cache() {
    let _ = std::process::Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

fn process_write_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    crate::build_daemon()?;
    let image = base_image(&opts)?;
    let (daemon, rt) = crate::start_daemon(&[])?;
    rt.block_on(measure(&daemon, &opts, &image))
}

async fn first_exec(client: &Client, image: &str) -> anyhow::Result<(Duration, brig_sdk::Sandbox)> {
    let started = Instant::now();
    let sb = client.create(SandboxOptions::container(image)).await?;
    let out =
        sb.exec_with(Cmd::new(["python3", "-c", "import json; print(json.dumps([1]))"])).await?;
    anyhow::ensure!(out.stdout_text() == "[1]\n", "python failed: {}", out.stderr_text());
    Ok((started.elapsed(), sb))
}

async fn measure(
    daemon: &Daemon,
    opts: &Options,
    image: &std::path::Path,
) -> anyhow::Result<serde_json::Value> {
    let client = daemon.client().await?;
    let started = Instant::now();
    let base = client
        .import_image(
            "base/debian-python",
            None,
            ImageSource::OnNode { path: image.display().to_string(), format: ImageFormat::Erofs },
        )
        .await?;
    let import_s = started.elapsed().as_secs_f64();
    let reference = format!("{}@{}", base.name, base.version);
    client.create_env("bench", &[&reference]).await?;

    // Cold: empty chunk cache, empty page cache, no layer mount yet.
    client.drop_image_cache().await?;
    drop_page_cache();
    let fetched_before = client.node_status().await?.images.map_or(0, |i| i.fetched_bytes);
    let (cold, sb) = first_exec(&client, "env:bench").await?;
    let fetched =
        client.node_status().await?.images.map_or(0, |i| i.fetched_bytes) - fetched_before;
    sb.destroy().await?;
    let fraction = fetched as f64 / base.data_bytes.max(1) as f64;

    // Warm: the same again with caches full.
    let mut warm = Vec::new();
    for _ in 0..5 {
        let (t, sb) = first_exec(&client, "env:bench").await?;
        warm.push(t);
        sb.destroy().await?;
    }
    warm.sort();
    let warm_ms = warm[warm.len() / 2].as_secs_f64() * 1000.0;

    // 100 sandboxes: what brigd writes to disk.
    let pid = daemon.pid().ok_or_else(|| anyhow::anyhow!("brigd not running"))?;
    let _ = std::process::Command::new("sync").status();
    let before = process_write_bytes(pid);
    let mut sandboxes = Vec::new();
    for _ in 0..opts.sandboxes {
        sandboxes.push(client.create(SandboxOptions::container("env:bench")).await?);
    }
    let _ = std::process::Command::new("sync").status();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = process_write_bytes(pid) - before;
    for sb in sandboxes {
        sb.destroy().await?;
    }

    let cold_ms = cold.as_secs_f64() * 1000.0;
    println!("layer store (Debian + Python base: {} MiB of data in {} chunks, {} files; import {import_s:.1} s)", base.data_bytes >> 20, base.chunks, base.files);
    println!(
        "  {:<52} {:>10}",
        "fetched for python3 -c 'import json' (cold)",
        format!("{} KiB", fetched >> 10)
    );
    println!("  {:<52} {:>10.2}%", "  … as a fraction of the layer", fraction * 100.0);
    println!("  {:<52} {:>10.1}", "create + first exec, cold caches (ms)", cold_ms);
    println!("  {:<52} {:>10.1}", "create + first exec, warm caches (ms, median of 5)", warm_ms);
    println!(
        "  {:<52} {:>10}",
        format!("bytes brigd wrote to disk creating {} sandboxes", opts.sandboxes),
        written
    );
    Ok(json!({
        "bench": "images",
        "fetched_fraction": round3(fraction),
        "fetched_bytes": fetched,
        "layer_bytes": base.data_bytes,
        "cold_create_ms": round3(cold_ms),
        "warm_create_ms": round3(warm_ms),
        "bytes_written_100": written,
        "sandboxes": opts.sandboxes,
    }))
}
