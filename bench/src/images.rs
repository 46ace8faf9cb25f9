//! `images`: the layer store with a Debian + Python base of 500+ MiB.
//!
//! - fetched fraction: with an empty chunk cache, bytes fetched from the backend to run
//!   `python3 -c 'import json'` in a fresh sandbox, over the layer's size;
//! - cold vs warm create: create + that first exec with empty caches (chunk cache and the
//!   kernel's page cache) and again with them warm;
//! - disk bytes written by brigd to create 100 sandboxes from one environment;
//! - a killed lazy file system server taken over: a running container's cold read of a 64 MiB
//!   file served by the first server and, after `kill -9`, by the one that took its mount over
//!   (through the relay of `brig_images::fuse_takeover`), and how long from the kill to the
//!   first read answered.

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
    /// Cold reads of the 64 MiB file before and after the takeover (median of each).
    #[arg(long, default_value_t = 3)]
    takeover_reads: usize,
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

    let takeover = measure_takeover(daemon, &client, opts.takeover_reads.max(1)).await?;

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
    println!(
        "  {:<52} {:>10.1}",
        "cold read of 64 MiB, first server (MiB/s, median)", takeover.before_mib_s
    );
    println!(
        "  {:<52} {:>10.1}",
        "cold read of 64 MiB, after a takeover (MiB/s, median)", takeover.after_mib_s
    );
    println!("  {:<52} {:>10.1}", "kill -9 of the server to a read answered (ms)", takeover.gap_ms);
    Ok(json!({
        "bench": "images",
        "fetched_fraction": round3(fraction),
        "fetched_bytes": fetched,
        "layer_bytes": base.data_bytes,
        "cold_create_ms": round3(cold_ms),
        "warm_create_ms": round3(warm_ms),
        "bytes_written_100": written,
        "sandboxes": opts.sandboxes,
        "lazy_read_mib_s_first_server": round3(takeover.before_mib_s),
        "lazy_read_mib_s_taken_over": round3(takeover.after_mib_s),
        "takeover_read_gap_ms": round3(takeover.gap_ms),
    }))
}

struct Takeover {
    before_mib_s: f64,
    after_mib_s: f64,
    gap_ms: f64,
}

/// One container with a 64 MiB file in a store layer reads it cold (`reads` times) from the
/// first server, then the server is killed and the same container reads a page it never read
/// (timed from the kill) and the file cold again from the server that took over.
async fn measure_takeover(
    daemon: &Daemon,
    client: &Client,
    reads: usize,
) -> anyhow::Result<Takeover> {
    const MIB: usize = 64;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("data"))?;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..MIB << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(dir.path().join("data/big.bin"), &bytes)?;
    std::fs::write(dir.path().join("data/unread.bin"), &bytes[..1 << 20])?;
    drop(bytes);
    client.import_image("workspace/takeover", None, ImageSource::Dir(dir.path().into())).await?;
    let image = format!("{}+workspace/takeover", brig_tests::image("busybox"));
    let sb = client.create(SandboxOptions::container(&image)).await?;
    let cold_read = || async {
        client.drop_image_cache().await?;
        drop_page_cache();
        let started = Instant::now();
        let out = sb.exec(["sh", "-c", "cat /data/big.bin | wc -c"]).await?;
        anyhow::ensure!(out.stdout_text().trim() == (MIB << 20).to_string(), "{out:?}");
        Ok::<f64, anyhow::Error>(MIB as f64 / started.elapsed().as_secs_f64())
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut before = Vec::new();
    for _ in 0..reads {
        before.push(cold_read().await?);
    }
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(daemon.run_dir().join("lazyfs.pid"))?)?;
    let pid = record["pid"].as_i64().ok_or_else(|| anyhow::anyhow!("no lazy server pid"))?;
    client.drop_image_cache().await?;
    drop_page_cache();
    let killed = Instant::now();
    anyhow::ensure!(
        std::process::Command::new("kill").args(["-9", &pid.to_string()]).status()?.success(),
        "kill brig-lazyfs"
    );
    let out = sb.exec(["sh", "-c", "tail -c 4096 /data/unread.bin | wc -c"]).await?;
    anyhow::ensure!(out.stdout_text().trim() == "4096", "a read after the kill: {out:?}");
    let gap_ms = killed.elapsed().as_secs_f64() * 1000.0;
    let mut after = Vec::new();
    for _ in 0..reads {
        after.push(cold_read().await?);
    }
    sb.destroy().await?;
    Ok(Takeover { before_mib_s: median(before), after_mib_s: median(after), gap_ms })
}
