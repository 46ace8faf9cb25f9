//! `container`: the container tier through the SDK against a real release brigd.
//!
//! - create-to-first-exec: create a busybox container and run `true` in it, one at a time;
//! - creates per second: `--parallel` creators for `--seconds`, each create followed by destroy;
//! - exec round trip: `true` in one container, one at a time, and the CPU time each one is
//!   charged in the container's cgroup (the shim's fork or clone, the child's setup, `true`);
//! - idle memory: host MemAvailable before and after `--idle` idle containers, per container.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_sdk::{Client, SandboxOptions};
use brig_tests::Daemon;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Image to create containers from.
    #[arg(long, default_value = "busybox")]
    image: String,
    /// Sequential create-to-first-exec samples.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// Concurrent creators for the throughput phase.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Seconds of the throughput phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Exec round trips measured.
    #[arg(long, default_value_t = 1000)]
    execs: usize,
    /// Idle containers for the memory measurement.
    #[arg(long, default_value_t = 100)]
    idle: usize,
    #[command(flatten)]
    node: crate::ContainerNodeOptions,
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let (daemon, rt) = crate::start_daemon_with_config(&opts.node.node_config())?;
    rt.block_on(measure(&daemon, &opts))
}

async fn measure(daemon: &Daemon, opts: &Options) -> anyhow::Result<serde_json::Value> {
    let client = daemon.client().await?;
    let options = || SandboxOptions::container(&opts.image).memory_mib(256).disk_mib(64);
    // Warm up: layer mount, page cache, shim binary.
    for _ in 0..3 {
        let sb = client.create(options()).await?;
        sb.exec(["true"]).await?;
        sb.destroy().await?;
    }

    let mut first_exec = Latencies::default();
    for _ in 0..opts.samples {
        let started = Instant::now();
        let sb = client.create(options()).await?;
        let out = sb.exec(["true"]).await?;
        anyhow::ensure!(out.success(), "true failed: {:?}", out.result);
        first_exec.record(started.elapsed());
        sb.destroy().await?;
    }

    let creates = throughput(&client, opts, options).await?;

    let sb = client.create(options()).await?;
    sb.exec(["true"]).await?;
    let cpu_before = cgroup_cpu_ns(sb.id());
    let mut rtt = Latencies::default();
    for _ in 0..opts.execs {
        let started = Instant::now();
        let out = sb.exec(["true"]).await?;
        anyhow::ensure!(out.success(), "true failed");
        rtt.record(started.elapsed());
    }
    let cpu_after = cgroup_cpu_ns(sb.id());
    // File operations run in a process of the container (forked by its shim, with its rights):
    // a small write and read each, and a 32 MiB upload streamed through it.
    let small = vec![7u8; 4096];
    let (mut writes, mut reads) = (Latencies::default(), Latencies::default());
    for i in 0..opts.execs {
        let path = format!("/tmp/f{}", i % 8);
        let started = Instant::now();
        sb.write_file(&path, &small).await?;
        writes.record(started.elapsed());
        let started = Instant::now();
        anyhow::ensure!(sb.read_file(&path).await?.len() == small.len(), "short read");
        reads.record(started.elapsed());
    }
    let big = vec![9u8; 32 << 20];
    let started = Instant::now();
    sb.write_file("/tmp/big", &big).await?;
    let upload_mib_s = 32.0 / started.elapsed().as_secs_f64();
    sb.remove("/tmp/big", false).await?;
    sb.destroy().await?;
    let (Some(cpu_before), Some(cpu_after)) = (cpu_before, cpu_after) else {
        anyhow::bail!("no cpu accounting cgroup found for {}", sb.id());
    };
    let exec_cpu_us = cpu_after.saturating_sub(cpu_before) as f64 / 1e3 / opts.execs.max(1) as f64;

    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = crate::meminfo_kib("MemAvailable:");
    let mut idle = Vec::new();
    for _ in 0..opts.idle {
        idle.push(client.create(options()).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = crate::meminfo_kib("MemAvailable:");
    let host_delta_mib = before.saturating_sub(after) as f64 / 1024.0 / opts.idle.max(1) as f64;
    // What each idle container is charged in its memory cgroup: shim, init, kernel objects.
    let mut charged = Vec::new();
    for sb in &idle {
        if let Some(bytes) = cgroup_memory(sb.id()) {
            charged.push(bytes as f64 / (1 << 20) as f64);
        }
    }
    anyhow::ensure!(!charged.is_empty(), "no container memory cgroups found");
    let idle_mib = charged.iter().sum::<f64>() / charged.len() as f64;
    for sb in idle {
        sb.destroy().await?;
    }

    let (c50, c99) = (first_exec.quantile_ms(0.5), first_exec.quantile_ms(0.99));
    let (r50, r99) = (rtt.quantile_ms(0.5), rtt.quantile_ms(0.99));
    println!("container tier ({} image, release brigd, real namespaces and cgroups)", opts.image);
    println!("  {:<40} {:>10.3} / {:.3}", "create → first exec p50 / p99 ms", c50, c99);
    println!(
        "  {:<40} {:>10.1}",
        format!("creates/s ({} parallel, create+destroy)", opts.parallel),
        creates
    );
    println!("  {:<40} {:>10.3} / {:.3}", "exec `true` round trip p50 / p99 ms", r50, r99);
    println!("  {:<40} {:>10.1}", "container CPU per exec `true` µs", exec_cpu_us);
    let (w50, rd50) = (writes.quantile_ms(0.5), reads.quantile_ms(0.5));
    println!("  {:<40} {:>10.3} / {:.3}", "4 KiB file write / read p50 ms", w50, rd50);
    println!("  {:<40} {:>10.1}", "32 MiB upload MiB/s", upload_mib_s);
    println!(
        "  {:<40} {:>10.2}",
        format!("memory per idle container MiB ({} idle)", opts.idle),
        idle_mib
    );
    Ok(json!({
        "bench": "container",
        "host_free_page_reporting": crate::free_page_reporting(daemon),
        "create_to_exec_p50_ms": round3(c50),
        "create_to_exec_p99_ms": round3(c99),
        "creates_per_sec": round3(creates),
        "exec_rtt_p50_ms": round3(r50),
        "exec_rtt_p99_ms": round3(r99),
        "exec_cpu_us": round3(exec_cpu_us),
        "file_write_4k_p50_ms": round3(w50),
        "file_read_4k_p50_ms": round3(rd50),
        "upload_mib_per_sec": round3(upload_mib_s),
        "idle_mem_mib": round3(idle_mib),
        "host_mem_drop_per_container_mib": round3(host_delta_mib),
        "samples": opts.samples,
        "execs": opts.execs,
        "idle": opts.idle,
        "parallel": opts.parallel,
    }))
}

/// Bytes charged to a container's memory cgroup (v1 or v2), found by sandbox id.
fn cgroup_memory(id: &str) -> Option<u64> {
    cgroup_file("/sys/fs/cgroup/memory", id, "memory.usage_in_bytes")
        .or_else(|| cgroup_file("/sys/fs/cgroup", id, "memory.current"))?
        .trim()
        .parse()
        .ok()
}

/// A file of a container's cgroup under the first `brig-*` node directory in `root` that has it.
fn cgroup_file(root: &str, id: &str, file: &str) -> Option<String> {
    let parents = std::fs::read_dir(root).ok()?;
    parents
        .flatten()
        .filter(|p| p.file_name().to_string_lossy().starts_with("brig-"))
        .find_map(|p| std::fs::read_to_string(p.path().join(id).join(file)).ok())
}

/// The processes in a container's cgroup (v1 pids controller or v2), for diagnostics.
pub(crate) fn cgroup_procs(id: &str) -> Vec<i32> {
    let text = cgroup_file("/sys/fs/cgroup/pids", id, "cgroup.procs")
        .or_else(|| cgroup_file("/sys/fs/cgroup", id, "cgroup.procs"))
        .unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// CPU time charged to a container's cgroup so far, in nanoseconds (v1 cpuacct or v2 cpu.stat).
pub(crate) fn cgroup_cpu_ns(id: &str) -> Option<u64> {
    if let Some(text) = cgroup_file("/sys/fs/cgroup/cpuacct", id, "cpuacct.usage") {
        return text.trim().parse().ok();
    }
    let stat = cgroup_file("/sys/fs/cgroup", id, "cpu.stat")?;
    let usec = stat.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
    usec.trim().parse::<u64>().ok().map(|u| u * 1000)
}

/// How many CFS periods a container's cgroup has been throttled in so far (v1 or v2).
pub(crate) fn cgroup_throttled_periods(id: &str) -> Option<u64> {
    let stat = cgroup_file("/sys/fs/cgroup/cpu", id, "cpu.stat")
        .or_else(|| cgroup_file("/sys/fs/cgroup", id, "cpu.stat"))?;
    let n = stat.lines().find_map(|l| l.strip_prefix("nr_throttled "))?;
    n.trim().parse().ok()
}

async fn throughput(
    client: &Client,
    opts: &Options,
    options: impl Fn() -> SandboxOptions,
) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..opts.parallel {
        let (client, stop, count, o) = (client.clone(), stop.clone(), count.clone(), options());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let sb = client.create(o.clone()).await?;
                count.fetch_add(1, Ordering::Relaxed);
                sb.destroy().await?;
            }
            Ok::<_, brig_sdk::Error>(())
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(opts.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let created = count.load(Ordering::Relaxed) as f64;
    let elapsed = started.elapsed().as_secs_f64();
    for t in tasks {
        t.await??;
    }
    Ok(created / elapsed)
}
