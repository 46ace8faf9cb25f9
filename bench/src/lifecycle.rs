//! `lifecycle`: pause, resume and fork against a real release brigd.
//!
//! - container pause / resume: `--sandboxes` busybox containers, each running a workload that
//!   holds anonymous memory, a /dev/shm file and a file on its writable layer (tmpfs); the wall time of `pause` and of an
//!   explicit `resume` per sandbox (p50/p99), and of an exec that resumes implicitly next to an
//!   exec on a running sandbox;
//! - memory freed: the container's memory cgroup charge (from sandbox status) before and after
//!   pause. Without swap only page cache and reclaimable slab can leave RAM (the writable layer
//!   is tmpfs, /dev/shm is tmpfs); `--swap-mib` adds a
//!   swap file for the run (removed afterwards) so anonymous memory can go too; `--zram-mib`
//!   gives the node a zram swap device of its own (its RAM cost reported beside what is freed);
//! - fork of 16: wall time of `fork(16)` of a container whose writable layer holds a modified
//!   workspace (`--files` files, `--workspace-mib` MiB in all), median over `--rounds`;
//! - fncall: pause/resume of a stateful workspace and fork of 16.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, Sandbox, SandboxOptions};
use brig_tests::Daemon;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Container sandboxes paused and resumed.
    #[arg(long, default_value_t = 50)]
    sandboxes: usize,
    /// Anonymous memory each workload holds, MiB.
    #[arg(long, default_value_t = 16)]
    anon_mib: u64,
    /// File each workload writes to its writable layer, MiB.
    #[arg(long, default_value_t = 16)]
    cache_mib: u64,
    /// Fork rounds (each forks 16 children and destroys them).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Files in the forked workspace.
    #[arg(long, default_value_t = 200)]
    files: usize,
    /// Size of the forked workspace, MiB.
    #[arg(long, default_value_t = 10)]
    workspace_mib: u64,
    /// Add a swap file of this many MiB for the run (0: none), so pause can swap anonymous
    /// memory out.
    #[arg(long, default_value_t = 0)]
    swap_mib: u64,
    /// Start the node with a zram swap device of this many MiB of its own (`[swap] zram_mib`),
    /// removed after the run; the RAM it takes is reported next to what pause frees.
    #[arg(long, default_value_t = 0)]
    zram_mib: u64,
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let _swap = if opts.swap_mib > 0 { Some(SwapFile::add(opts.swap_mib)?) } else { None };
    let config = brig_tests::artifacts().join("bench-lifecycle-node.toml");
    std::fs::write(&config, format!("[swap]\nzram_mib = {}\n", opts.zram_mib))?;
    let config = config.to_string_lossy().into_owned();
    let (daemon, rt) = crate::start_daemon(&["--config", &config])?;
    let result = rt.block_on(measure(&daemon, &opts));
    let zram = rt.block_on(async {
        let status = daemon.client().await?.node_status().await?;
        anyhow::Ok(status.swap)
    });
    drop(daemon);
    if let Ok(Some(swap)) = zram {
        // The node keeps its device across restarts; the benchmark gives it back.
        let dev = format!("/dev/{}", swap.device);
        let _ = std::process::Command::new("swapoff").arg(&dev).status();
        let _ = std::fs::write(format!("/sys/block/{}/reset", swap.device), "1");
    }
    result
}

/// The workload: a background process holding `anon` MiB in a shell variable, an `anon` MiB
/// file in /dev/shm and a `cache` MiB file on the writable layer; the exec returns once all are in place.
fn workload(opts: &Options) -> Cmd {
    Cmd::shell(&format!(
        "dd if=/dev/zero of=/dev/shm/blob bs=1M count={anon} 2>/dev/null; \
         dd if=/dev/urandom of=/cache bs=1M count={cache} 2>/dev/null; \
         (x=$(dd if=/dev/zero bs=1M count={anon} 2>/dev/null | tr '\\0' a); \
          echo ready > /tmp/ready; while :; do sleep 1; done) > /dev/null 2>&1 & \
         while [ ! -e /tmp/ready ]; do sleep 0.05; done",
        anon = opts.anon_mib,
        cache = opts.cache_mib,
    ))
}

async fn charged_bytes(sb: &Sandbox) -> anyhow::Result<u64> {
    let info = sb.status().await?;
    Ok(info.usage.map(|u| u.memory_bytes).unwrap_or(0))
}

struct ContainerNumbers {
    pause: Latencies,
    resume: Latencies,
    implicit: Latencies,
    running: Latencies,
    freed_mib: f64,
    charged_mib: f64,
    /// RAM the node's zram device took for what the pauses pushed into it, per sandbox.
    zram_ram_mib: f64,
}

async fn container_pause_resume(
    client: &Client,
    opts: &Options,
) -> anyhow::Result<ContainerNumbers> {
    let options = SandboxOptions::container("busybox")
        .memory_mib(512)
        .disk_mib(256)
        .label("bench", "lifecycle");
    let mut sandboxes = Vec::new();
    for _ in 0..opts.sandboxes {
        let sb = client.create(options.clone()).await?;
        let out = sb.exec_with(workload(opts)).await?;
        anyhow::ensure!(out.success(), "workload failed: {}", out.stderr_text());
        sandboxes.push(sb);
    }
    let mut n = ContainerNumbers {
        pause: Latencies::default(),
        resume: Latencies::default(),
        implicit: Latencies::default(),
        running: Latencies::default(),
        freed_mib: 0.0,
        charged_mib: 0.0,
        zram_ram_mib: 0.0,
    };
    let zram_ram = || async {
        let status = client.node_status().await?;
        anyhow::Ok(status.swap.map_or(0, |s| s.ram_used_bytes))
    };
    let zram_before = zram_ram().await?;
    let (mut before_sum, mut freed_sum) = (0u64, 0u64);
    for sb in &sandboxes {
        let before = charged_bytes(sb).await?;
        let started = Instant::now();
        sb.pause().await?;
        n.pause.record(started.elapsed());
        let after = charged_bytes(sb).await?;
        before_sum += before;
        freed_sum += before.saturating_sub(after);
    }
    n.charged_mib = before_sum as f64 / (1 << 20) as f64 / sandboxes.len().max(1) as f64;
    n.freed_mib = freed_sum as f64 / (1 << 20) as f64 / sandboxes.len().max(1) as f64;
    let zram_used = zram_ram().await?.saturating_sub(zram_before);
    n.zram_ram_mib = zram_used as f64 / (1 << 20) as f64 / sandboxes.len().max(1) as f64;
    for sb in &sandboxes {
        let started = Instant::now();
        sb.resume().await?;
        n.resume.record(started.elapsed());
        let out = sb.exec(["cat", "/tmp/ready"]).await?;
        anyhow::ensure!(out.stdout_text() == "ready\n", "state lost across pause");
    }
    // Implicit resume: the exec itself resumes the sandbox.
    for sb in &sandboxes {
        sb.pause().await?;
        let started = Instant::now();
        let out = sb.exec(["true"]).await?;
        n.implicit.record(started.elapsed());
        anyhow::ensure!(out.success(), "exec after pause failed");
        let started = Instant::now();
        sb.exec(["true"]).await?;
        n.running.record(started.elapsed());
    }
    client.destroy_matching(&[("bench", "lifecycle")]).await?;
    Ok(n)
}

/// Median wall time of `fork(16)` of a sandbox, over `rounds` rounds; checks the children.
async fn fork16(parent: &Sandbox, rounds: usize, check: &str) -> anyhow::Result<Latencies> {
    let mut times = Latencies::default();
    for _ in 0..rounds {
        let started = Instant::now();
        let kids = parent.fork(16).await?;
        times.record(started.elapsed());
        anyhow::ensure!(kids.len() == 16, "fork returned {} children", kids.len());
        anyhow::ensure!(!kids[15].read_file(check).await?.is_empty(), "child lacks the workspace");
        futures::future::try_join_all(kids.iter().map(|k| k.destroy())).await?;
    }
    Ok(times)
}

async fn container_fork(client: &Client, opts: &Options) -> anyhow::Result<Latencies> {
    let parent =
        client.create(SandboxOptions::container("busybox").memory_mib(256).disk_mib(256)).await?;
    let per_file_kib = (opts.workspace_mib * 1024 / opts.files.max(1) as u64).max(1);
    let out = parent
        .exec_with(Cmd::shell(&format!(
            "mkdir -p /work && i=0; while [ $i -lt {files} ]; do \
             head -c {per_file_kib}K /dev/urandom > /work/f$i; i=$((i+1)); done; echo x > /work/f0",
            files = opts.files,
        )))
        .await?;
    anyhow::ensure!(out.success(), "workspace setup failed: {}", out.stderr_text());
    let times = fork16(&parent, opts.rounds, "/work/f0").await;
    parent.destroy().await?;
    times
}

async fn fncall_numbers(
    client: &Client,
    opts: &Options,
) -> anyhow::Result<(Latencies, Latencies, Latencies)> {
    let (mut pause, mut resume) = (Latencies::default(), Latencies::default());
    let ws = client.create(SandboxOptions::fncall()).await?;
    for i in 0..opts.files.min(200) {
        ws.write_file(&format!("f{i}"), &vec![7u8; 50 * 1024]).await?;
    }
    for _ in 0..20 {
        let started = Instant::now();
        ws.pause().await?;
        pause.record(started.elapsed());
        let started = Instant::now();
        ws.resume().await?;
        resume.record(started.elapsed());
    }
    let fork = fork16(&ws, opts.rounds, "f0").await;
    ws.destroy().await?;
    Ok((pause, resume, fork?))
}

async fn measure(daemon: &Daemon, opts: &Options) -> anyhow::Result<serde_json::Value> {
    let client = daemon.client().await?;
    // Warm up: layer mount, page cache, shim binary.
    let sb = client.create(SandboxOptions::container("busybox")).await?;
    sb.exec(["true"]).await?;
    sb.destroy().await?;

    let mut c = container_pause_resume(&client, opts).await?;
    let mut cfork = container_fork(&client, opts).await?;
    let (mut fpause, mut fresume, mut ffork) = fncall_numbers(&client, opts).await?;

    let row = |name: &str, l: &mut Latencies| {
        println!("  {:<44} {:>9.3} / {:.3}", name, l.quantile_ms(0.5), l.quantile_ms(0.99));
    };
    println!(
        "lifecycle (release brigd; {} busybox containers, {} MiB anon + {} MiB /dev/shm + {} MiB on the writable layer each{})",
        opts.sandboxes,
        opts.anon_mib,
        opts.anon_mib,
        opts.cache_mib,
        match (opts.swap_mib, opts.zram_mib) {
            (0, 0) => ", no swap".to_string(),
            (0, z) => format!(", the node's {z} MiB zram swap"),
            (f, 0) => format!(", {f} MiB swap file"),
            (f, z) => format!(", {f} MiB swap file and the node's {z} MiB zram swap"),
        }
    );
    row("container pause p50 / p99 ms", &mut c.pause);
    row("container resume p50 / p99 ms", &mut c.resume);
    row("exec on paused (implicit resume) p50 / p99 ms", &mut c.implicit);
    row("exec on running p50 / p99 ms", &mut c.running);
    row("container fork(16) median / max ms", &mut cfork);
    println!(
        "  {:<44} {:>9.2} of {:.2}",
        "memory freed per paused sandbox MiB", c.freed_mib, c.charged_mib
    );
    println!("  {:<44} {:>9.2}", "zram RAM taken per paused sandbox MiB", c.zram_ram_mib);
    row("fncall pause p50 / p99 ms", &mut fpause);
    row("fncall resume p50 / p99 ms", &mut fresume);
    row("fncall fork(16) median / max ms", &mut ffork);
    Ok(json!({
        "bench": "lifecycle",
        "container_pause_p50_ms": round3(c.pause.quantile_ms(0.5)),
        "container_pause_p99_ms": round3(c.pause.quantile_ms(0.99)),
        "container_resume_p50_ms": round3(c.resume.quantile_ms(0.5)),
        "container_resume_p99_ms": round3(c.resume.quantile_ms(0.99)),
        "container_implicit_resume_exec_p50_ms": round3(c.implicit.quantile_ms(0.5)),
        "container_running_exec_p50_ms": round3(c.running.quantile_ms(0.5)),
        "fork16_ms": round3(cfork.quantile_ms(0.5)),
        "freed_mib_per_sandbox": round3(c.freed_mib),
        "charged_mib_per_sandbox_before_pause": round3(c.charged_mib),
        "freed_fraction": round3(c.freed_mib / c.charged_mib.max(f64::MIN_POSITIVE)),
        "zram_ram_mib_per_sandbox": round3(c.zram_ram_mib),
        "net_freed_mib_per_sandbox": round3(c.freed_mib - c.zram_ram_mib),
        "fncall_pause_p50_ms": round3(fpause.quantile_ms(0.5)),
        "fncall_resume_p50_ms": round3(fresume.quantile_ms(0.5)),
        "fncall_fork16_ms": round3(ffork.quantile_ms(0.5)),
        "sandboxes": opts.sandboxes,
        "swap_mib": opts.swap_mib,
        "zram_mib": opts.zram_mib,
        "rounds": opts.rounds,
    }))
}

/// A swap file enabled for the run and removed on drop.
struct SwapFile {
    path: PathBuf,
}

impl SwapFile {
    fn add(mib: u64) -> anyhow::Result<SwapFile> {
        let path = brig_tests::artifacts().join("bench-swapfile");
        let sh = |args: &[&str]| -> anyhow::Result<()> {
            let status = std::process::Command::new(args[0]).args(&args[1..]).status()?;
            anyhow::ensure!(status.success(), "{} failed", args.join(" "));
            Ok(())
        };
        let _ = std::process::Command::new("swapoff").arg(&path).status();
        let p = path.to_string_lossy().to_string();
        sh(&[
            "dd",
            "if=/dev/zero",
            &format!("of={p}"),
            "bs=1M",
            &format!("count={mib}"),
            "status=none",
        ])?;
        sh(&["chmod", "600", &p])?;
        sh(&["mkswap", "-q", &p])?;
        sh(&["swapon", &p])?;
        std::thread::sleep(Duration::from_millis(100));
        Ok(SwapFile { path })
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff").arg(&self.path).status();
        let _ = std::fs::remove_file(&self.path);
    }
}
