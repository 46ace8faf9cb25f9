//! `density`: how many idle sandboxes one node holds at once.
//!
//! Creates idle sandboxes of one tier until the node's admission refuses, a create fails, or
//! `--max` is reached; every `--check-every` creates, a random sample of live sandboxes must
//! answer (container: exec `true`; fncall: a file stat) within `--deadline-ms`. Prints how
//! many were live at once, memory per sandbox (PSS of the processes they add, and the drop
//! of the host's available memory), and what stopped it.

use std::time::{Duration, Instant};

use brig_sdk::{Client, Sandbox, SandboxOptions};
use brig_tests::Daemon;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// `container`, `fncall` or `microvm` (brig-vmm processes from one snapshot, started
    /// directly).
    #[arg(long, default_value = "container")]
    tier: String,
    /// Stop after this many live sandboxes (default: 4,000 containers, 100,000 fncall, 2,000
    /// microVMs).
    #[arg(long)]
    max: Option<usize>,
    /// Memory limit each container asks for, MiB (admission bounds the sum).
    #[arg(long, default_value_t = 16)]
    memory_mib: u64,
    /// CPU each container asks for, millicores (admission bounds the sum).
    #[arg(long, default_value_t = 10)]
    cpu_millis: u64,
    /// Concurrent creators.
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    #[arg(long, default_value_t = 500)]
    check_every: usize,
    /// Sandboxes sampled per check.
    #[arg(long, default_value_t = 20)]
    sample: usize,
    #[arg(long, default_value_t = 100)]
    deadline_ms: u64,
    /// Sandboxes sampled once more when the fill is done (`final_sample_*` keys).
    #[arg(long, default_value_t = 200)]
    final_sample: usize,
    /// Diagnostics: record the scheduler's switches (with kernel stacks) and wake-ups on every
    /// CPU (`perf record -a -g -k mono`) into this file while the final samples run, and print each of the slowest
    /// samples' start on CLOCK_MONOTONIC (seconds, as `perf script` shows them) and its
    /// container's processes.
    #[arg(long)]
    perf_final: Option<std::path::PathBuf>,
    /// Fill the node this many times with one brigd, destroying every sandbox in between: a
    /// later fill reuses the memory an earlier one freed. The keys are the last fill's;
    /// `fills` has each fill's rates.
    #[arg(long, default_value_t = 1)]
    fills: usize,
    /// Containers only: once full, replace this many live containers (destroy one, create
    /// one; `--parallel` at a time), as an RL job's steps do on a full node (`churn_*` keys).
    #[arg(long, default_value_t = 0)]
    churn: usize,
    #[command(flatten)]
    node: crate::ContainerNodeOptions,
}

/// CLOCK_MONOTONIC now, in seconds (the clock `perf record -k mono` stamps events with), with
/// the `Instant` it was read at: the kernel's `now at` line of `/proc/timer_list` (root only).
fn monotonic_now() -> Option<(Instant, f64)> {
    use std::io::Read;
    let mut head = [0u8; 160];
    let n = std::fs::File::open("/proc/timer_list").ok()?.read(&mut head).ok()?;
    let at = Instant::now();
    let text = String::from_utf8_lossy(&head[..n]).into_owned();
    let ns: u64 = text.split("now at ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some((at, ns as f64 / 1e9))
}

/// `perf record` of scheduler events on every CPU until stopped.
struct SchedRecording(std::process::Child);

impl SchedRecording {
    fn start(out: &std::path::Path) -> anyhow::Result<SchedRecording> {
        let child = std::process::Command::new("perf")
            .args(["record", "-a", "-k", "mono", "-e", "sched:sched_switch", "-e"])
            .args(["sched:sched_wakeup", "-e", "sched:sched_wakeup_new", "-q"])
            // Not the comm and mmap records of every process on the node (tens of thousands
            // at 10,000 containers: seconds of CPU that would slow the samples down); the
            // events carry the task names themselves.
            .args(["--synth=no", "--mmap-pages", "2048", "-g", "-o"])
            .arg(out)
            .stdout(std::process::Stdio::null())
            .spawn()?;
        // perf needs a moment to open its events on every CPU.
        std::thread::sleep(Duration::from_millis(500));
        Ok(SchedRecording(child))
    }

    fn stop(mut self) {
        let pid = self.0.id().to_string();
        let _ = std::process::Command::new("kill").args(["-INT", &pid]).status();
        let _ = self.0.wait();
    }
}

/// Creates per second over the first (`from_end` false) or last batches that add up to at
/// least `n` creates; `batches` holds (creates, seconds) of each batch in order.
fn rate_over(batches: &[(usize, f64)], n: usize, from_end: bool) -> f64 {
    let (mut count, mut secs) = (0usize, 0f64);
    let mut take = |b: &(usize, f64)| {
        count += b.0;
        secs += b.1;
        count >= n
    };
    if from_end {
        batches.iter().rev().any(&mut take);
    } else {
        batches.iter().any(&mut take);
    }
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// Proportional set size of a process, KiB.
fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Pss:").and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        })
        .unwrap_or(0)
}

/// PSS of brigd plus every process of the node's containers (shims and what they run), KiB.
fn node_pss_kib(brigd: u32) -> u64 {
    let mut total = pss_kib(brigd);
    let Ok(procs) = std::fs::read_dir("/proc") else { return total };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if cgroup.contains("/brig-") || exe.ends_with("brig-shim") {
            total += pss_kib(pid);
        }
    }
    total
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    if opts.tier == "microvm" {
        let max = opts.max.unwrap_or(2_000);
        return crate::microvm::density(max, opts.sample, opts.deadline_ms, 1024);
    }
    // Idle containers ask for little CPU, but 10,000 of them ask for more than the default
    // overcommit (200 times the cores): let the CPU they ask for fit, so what stops the fill
    // is memory or the node, not this bound.
    let max = opts.max.unwrap_or(4_000) as u64 + 1;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let cpu_pct = (max * opts.cpu_millis * 100).div_ceil(cores * 1000).max(20_000);
    let config =
        format!("[admission]\ncpu_overcommit_pct = {cpu_pct}\n{}", opts.node.node_config());
    crate::build_daemon()?;
    // Tearing thousands of containers down takes a while; the daemon does it on drop.
    let daemon = brig_tests::Daemon::start_with_config(&config, &["--log", "warn"])?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut fills = Vec::new();
    let mut last = serde_json::Value::Null;
    for _ in 0..opts.fills.max(1) {
        last = rt.block_on(measure(&daemon, &opts))?;
        let keys = [
            "fill_seconds",
            "creates_per_sec_first_500",
            "creates_per_sec_last_500",
            "last_to_first_rate_pct",
        ];
        let summary: serde_json::Map<String, serde_json::Value> =
            keys.iter().map(|k| (k.to_string(), last[*k].clone())).collect();
        fills.push(serde_json::Value::Object(summary));
    }
    last["fills"] = serde_json::Value::Array(fills);
    Ok(last)
}

async fn probe(sb: &Sandbox, container: bool) -> Result<(), brig_sdk::Error> {
    if container {
        sb.exec(["true"]).await.map(|_| ())
    } else {
        sb.stat("/").await.map(|_| ())
    }
}

async fn measure(daemon: &Daemon, opts: &Options) -> anyhow::Result<serde_json::Value> {
    let client = daemon.client().await?;
    let container = match opts.tier.as_str() {
        "container" => true,
        "fncall" => false,
        other => anyhow::bail!("--tier container or fncall, not {other}"),
    };
    let max = opts.max.unwrap_or(if container { 4_000 } else { 100_000 });
    let options = || {
        if container {
            SandboxOptions::container("busybox")
                .memory_mib(opts.memory_mib)
                .cpu_millis(opts.cpu_millis)
                .idle_ttl(Duration::from_secs(3600))
        } else {
            SandboxOptions::fncall().idle_ttl(Duration::from_secs(3600))
        }
    };
    // Warm up, then take the baseline.
    let warm = client.create(options()).await?;
    probe(&warm, container).await?;
    warm.destroy().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let brigd = daemon.pid().unwrap_or(0);
    let (avail0, pss0) = (crate::meminfo_kib("MemAvailable:"), node_pss_kib(brigd));

    let started = Instant::now();
    let mut live: Vec<Sandbox> = Vec::with_capacity(max);
    let mut samples = Latencies::default();
    let mut batches: Vec<(usize, f64)> = Vec::new();
    let (mut slow, mut stopped_by) = (0usize, format!("limit of {max}"));
    'outer: while live.len() < max {
        let batch = opts.check_every.min(max - live.len());
        let batch_started = Instant::now();
        let made = create_batch(&client, batch, opts.parallel, &options).await;
        let made_ok = made.iter().filter(|r| r.is_ok()).count();
        batches.push((made_ok, batch_started.elapsed().as_secs_f64()));
        for r in made {
            match r {
                Ok(sb) => live.push(sb),
                Err(e) => {
                    stopped_by = format!("create refused: {e}");
                    break 'outer;
                }
            }
        }
        for i in 0..opts.sample.min(live.len()) {
            let sb = &live[(i * 7919 + live.len() * 31) % live.len()];
            let t = Instant::now();
            if let Err(e) = probe(sb, container).await {
                stopped_by = format!("a sampled sandbox failed: {e}");
                break 'outer;
            }
            let took = t.elapsed();
            samples.record(took);
            slow += usize::from(took > Duration::from_millis(opts.deadline_ms));
        }
        println!(
            "  {} live after {:.1} s; sample p99 {:.2} ms",
            live.len(),
            started.elapsed().as_secs_f64(),
            samples.quantile_ms(0.99)
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    let count = live.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // How the last-filled node answers: a larger sample, spread over every sandbox.
    let mut last_samples = Latencies::default();
    // For containers, also what each sampled exec cost the container's CPU quota and whether
    // the kernel throttled it (an exec that needs more than the quota waits for a period).
    let (mut sample_cpu, mut throttled_samples) = (Latencies::default(), 0usize);
    // Each final sample as (ms, CPU µs charged, throttled), to tell a slow answer that used
    // the container's CPU from one that waited elsewhere.
    let mut each_sample: Vec<(f64, f64, bool)> = Vec::new();
    // With --perf-final: (ms, CLOCK_MONOTONIC start in seconds, sandbox id, its processes).
    let mut located: Vec<(f64, f64, String, Vec<i32>)> = Vec::new();
    let recording = match &opts.perf_final {
        Some(out) if !live.is_empty() => Some(SchedRecording::start(out)?),
        _ => None,
    };
    let clock = monotonic_now();
    let mut final_failed = 0usize;
    for i in 0..if live.is_empty() { 0 } else { opts.final_sample } {
        let sb = &live[(i * 7919 + 13) % live.len()];
        let before = container
            .then(|| {
                crate::container::cgroup_cpu_ns(sb.id())
                    .zip(crate::container::cgroup_throttled_periods(sb.id()))
            })
            .flatten();
        let t = Instant::now();
        match probe(sb, container).await {
            Ok(()) => {
                let took = t.elapsed();
                last_samples.record(took);
                if recording.is_some() && took > Duration::from_millis(20) {
                    let procs = crate::container::cgroup_procs(sb.id());
                    let mono = clock.map_or(0.0, |(at, secs)| secs + (t - at).as_secs_f64());
                    located.push((took.as_secs_f64() * 1e3, mono, sb.id().to_string(), procs));
                }
                let after = crate::container::cgroup_cpu_ns(sb.id())
                    .zip(crate::container::cgroup_throttled_periods(sb.id()));
                if let (Some((cpu0, thr0)), Some((cpu1, thr1))) = (before, after) {
                    let cpu = Duration::from_nanos(cpu1.saturating_sub(cpu0));
                    sample_cpu.record(cpu);
                    throttled_samples += usize::from(thr1 > thr0);
                    each_sample.push((
                        took.as_secs_f64() * 1e3,
                        cpu.as_secs_f64() * 1e6,
                        thr1 > thr0,
                    ));
                }
            }
            // Counted, not fatal: what was created must still be destroyed below.
            Err(e) => {
                final_failed += 1;
                eprintln!("  a sampled sandbox failed: {e}");
            }
        }
    }
    if let Some(recording) = recording {
        recording.stop();
        located.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (ms, mono, id, procs) in located.iter().take(10) {
            println!(
                "  slow sample {ms:.1} ms from monotonic {mono:.6} s: {id}, processes {procs:?}"
            );
        }
    }
    let n = count.max(1) as f64;
    let pss_mib = node_pss_kib(brigd).saturating_sub(pss0) as f64 / 1024.0 / n;
    let host_mib = avail0.saturating_sub(crate::meminfo_kib("MemAvailable:")) as f64 / 1024.0 / n;
    let (p50, p99) = (samples.quantile_ms(0.5), samples.quantile_ms(0.99));
    // Where the node is a VM that reports free memory to its hypervisor, the fill's kernel
    // objects fault twice (docs/density.md): say which case this run was.
    let reporting = crate::free_page_reporting(daemon);
    let shrinker_ids = crate::shrinker_ids_reserved(daemon);
    println!("density ({} tier, release brigd)", opts.tier);
    println!("  {:<44} {:>10}", "free page reporting to a hypervisor", reporting);
    println!("  {:<44} {:>10}", "shrinker ids reserved this boot", shrinker_ids);
    println!("  {:<44} {:>10}", "live at once", count);
    println!("  {:<44} {:>10.3}", "PSS per sandbox MiB (brigd + shims + guests)", pss_mib);
    println!("  {:<44} {:>10.3}", "host available memory per sandbox MiB", host_mib);
    println!("  {:<44} {:>10.1}", "creates/s while filling", count as f64 / elapsed);
    println!(
        "  {:<44} {:>6.2} / {:.2} ({} over {} ms)",
        "sampled answer p50 / p99 ms", p50, p99, slow, opts.deadline_ms
    );
    let churned = if container && opts.churn > 0 && !live.is_empty() {
        Some(churn(&client, &mut live, opts.churn, opts.parallel, &options).await?)
    } else {
        None
    };
    // Destroyed here, in parallel, not by the daemon's shutdown (which would be cut short
    // after 20 s and leave thousands of cgroups behind to slow the next run).
    let destroy_started = Instant::now();
    let failed = destroy_all(live, opts.parallel).await;
    let destroy_rate = count as f64 / destroy_started.elapsed().as_secs_f64().max(1e-9);
    println!("  {:<44} {:>10.1} ({failed} failed)", "destroys/s", destroy_rate);
    let (first_rate, last_rate) = (rate_over(&batches, 500, false), rate_over(&batches, 500, true));
    let (final_p50, final_p99) = (last_samples.quantile_ms(0.5), last_samples.quantile_ms(0.99));
    println!("  {:<44} {:>6.1} / {:.1}", "creates/s, first 500 / last 500", first_rate, last_rate);
    println!(
        "  {:<44} {:>6.2} / {:.2} ({} samples)",
        "sampled answer when full, p50 / p99 ms",
        final_p50,
        final_p99,
        last_samples.len()
    );
    let (cpu_p50_us, cpu_p99_us) =
        (sample_cpu.quantile_ms(0.5) * 1e3, sample_cpu.quantile_ms(0.99) * 1e3);
    if sample_cpu.len() > 0 {
        println!(
            "  {:<44} {:>6.0} / {:.0} ({} of {} throttled)",
            "CPU charged per sampled exec p50 / p99 µs",
            cpu_p50_us,
            cpu_p99_us,
            throttled_samples,
            sample_cpu.len()
        );
    }
    each_sample.sort_by(|a, b| b.0.total_cmp(&a.0));
    each_sample.truncate(5);
    if !each_sample.is_empty() {
        let text: Vec<String> = each_sample
            .iter()
            .map(|(ms, cpu, thr)| {
                format!("{ms:.1} ms ({cpu:.0} µs CPU{})", if *thr { ", throttled" } else { "" })
            })
            .collect();
        println!("  slowest when full: {}", text.join(", "));
    }
    println!("  stopped by: {stopped_by}");
    let mut result = json!({
        "bench": "density",
        "tier": opts.tier,
        "live": count,
        "pss_per_sandbox_mib": round3(pss_mib),
        "host_mem_per_sandbox_mib": round3(host_mib),
        "host_free_page_reporting": reporting,
        "host_shrinker_ids_reserved": shrinker_ids,
        "stopped_by": stopped_by,
        "sample_p50_ms": round3(p50),
        "sample_p99_ms": round3(p99),
        "slow_samples": slow,
        "samples": samples.len(),
        "fill_seconds": round3(elapsed),
        "destroys_per_sec": round3(destroy_rate),
        "creates_per_sec_first_500": round3(first_rate),
        "creates_per_sec_last_500": round3(last_rate),
        "last_to_first_rate_pct": round3(if first_rate > 0.0 { 100.0 * last_rate / first_rate } else { 0.0 }),
        "final_sample_p50_ms": round3(final_p50),
        "final_sample_p99_ms": round3(final_p99),
        "final_sample_failed": final_failed,
        "final_sample_cpu_p50_us": round3(cpu_p50_us),
        "final_sample_cpu_p99_us": round3(cpu_p99_us),
        "final_sample_throttled": throttled_samples,
        "final_sample_slowest": each_sample
            .iter()
            .map(|(ms, cpu, thr)| json!({"ms": round3(*ms), "cpu_us": round3(*cpu), "throttled": thr}))
            .collect::<Vec<_>>(),
        "spare_cgroups": opts.node.spare_cgroups(),
    });
    if let Some(mut c) = churned {
        println!(
            "  {:<44} {:>6.1} ({} replaced; create p50 / p99 {:.2} / {:.2} ms)",
            "replacements/s when full",
            c.per_sec,
            c.replaced,
            c.creates.quantile_ms(0.5),
            c.creates.quantile_ms(0.99)
        );
        result["churn_replaced"] = json!(c.replaced);
        result["churn_per_sec"] = json!(round3(c.per_sec));
        result["churn_create_p50_ms"] = json!(round3(c.creates.quantile_ms(0.5)));
        result["churn_create_p99_ms"] = json!(round3(c.creates.quantile_ms(0.99)));
    }
    Ok(result)
}

/// What replacing containers on a full node took.
struct Churned {
    replaced: usize,
    per_sec: f64,
    /// Each replacement's create (its destroy not counted).
    creates: Latencies,
}

/// Replaces `n` of `live` (spread over the fill), `parallel` at a time: each destroys one
/// container and then creates one; the new ones join `live`.
async fn churn(
    client: &Client,
    live: &mut Vec<Sandbox>,
    n: usize,
    parallel: usize,
    options: &impl Fn() -> SandboxOptions,
) -> anyhow::Result<Churned> {
    use futures::stream::{self, StreamExt};
    let n = n.min(live.len());
    let step = (live.len() / n.max(1)).max(1);
    let mut old = Vec::with_capacity(n);
    for i in (0..n).rev() {
        old.push(live.swap_remove((i * step).min(live.len() - 1)));
    }
    let started = Instant::now();
    let replaced: Vec<anyhow::Result<(Duration, Sandbox)>> =
        stream::iter(old.into_iter().map(|sb| async move {
            sb.destroy().await?;
            let t = Instant::now();
            let made = client.create(options()).await?;
            Ok((t.elapsed(), made))
        }))
        .buffer_unordered(parallel.max(1))
        .collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    let mut creates = Latencies::default();
    let mut failed = None;
    for r in replaced {
        match r {
            Ok((took, sb)) => {
                creates.record(took);
                live.push(sb);
            }
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        eprintln!("  a replacement failed: {e:#}");
    }
    Ok(Churned { replaced: creates.len(), per_sec: creates.len() as f64 / secs.max(1e-9), creates })
}

async fn create_batch(
    client: &Client,
    count: usize,
    parallel: usize,
    options: &impl Fn() -> SandboxOptions,
) -> Vec<Result<Sandbox, brig_sdk::Error>> {
    use futures::stream::{self, StreamExt};
    stream::iter((0..count).map(|_| client.create(options())))
        .buffer_unordered(parallel.max(1))
        .collect()
        .await
}

/// Destroys every sandbox, `parallel` × 2 at a time; returns how many failed.
async fn destroy_all(live: Vec<Sandbox>, parallel: usize) -> usize {
    use futures::stream::{self, StreamExt};
    stream::iter(live.into_iter().map(|sb| async move { sb.destroy().await.is_err() }))
        .buffer_unordered(parallel.max(1) * 2)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await
}
