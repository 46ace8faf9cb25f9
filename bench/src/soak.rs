//! `soak`: a mixed load against one release brigd for `--minutes` windows (60 s each unless
//! `--window-secs` says otherwise). `--clients` clients each keep a container and, in turn,
//! exec a command, write and read a file, run a session command, make a one-shot tool call,
//! pause and resume, fork one child and destroy it, and create and destroy a fresh sandbox.
//!
//! Per window it prints the requests served, their p99 latency and brigd's RSS (sampled at
//! the window's end). Then it destroys everything and counts what is left on the host (the
//! node's `brig doctor` with no minimum age, plus the run directories, cgroups, mounts and
//! state files the test harness checks). JSON: `served`, `unexpected_errors` (goal 0),
//! `leaked_objects` (goal 0), `p99_growth_pct` and `rss_growth_pct` (last window against the
//! first; goal ≤ 10), and the per-window figures. Beside them, the machine's own speed in the
//! same run (`crate::probe`): a fixed CPU loop's median time per window (`probe_ms`) and its
//! change from the first window to the last (`machine_slowdown_pct`), the same for a chase of
//! loads through memory (`memory_probe_ns`, `memory_slowdown_pct`), and the share of all CPU
//! time the machine was busy (`busy_cpu_pct`) and spent in processes that are not Brig's or the
//! benchmark's (`outside_cpu_pct`), so that a p99 that grows with a slower or busier machine
//! can be told from one that grows with Brig; and the CPU time brigd and Brig's other processes
//! spent per request served (`brigd_cpu_us_per_request`, `brig_others_cpu_us_per_request`),
//! which grows if serving a request costs Brig more as the run goes on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, SandboxOptions};
use brig_tests::{image, Daemon};
use parking_lot::Mutex;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Windows measured.
    #[arg(long, default_value_t = 5)]
    minutes: usize,
    /// Length of a window, seconds.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// Clients, each with a container of its own.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Only these operations (comma-separated: exec, file, session, call, pause, fork,
    /// create, status), to find which one a trend comes from; all by default.
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    #[command(flatten)]
    node: crate::ContainerNodeOptions,
}

/// The operations of the mix, in the order each client takes them.
const OPS: [&str; 8] = ["exec", "file", "session", "call", "exec", "pause", "fork", "create"];

/// What the clients record, by window.
struct Record {
    started: Instant,
    window: Duration,
    latencies: Mutex<Vec<Latencies>>,
    /// The same by request kind (`create`, `exec`, …), to see which one a trend comes from.
    by_kind: Mutex<Vec<std::collections::BTreeMap<&'static str, Latencies>>>,
    errors: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl Record {
    fn window_of(&self, at: Instant) -> usize {
        (at.duration_since(self.started).as_secs_f64() / self.window.as_secs_f64()) as usize
    }

    /// Times `op`; an error counts as unexpected (nothing here should fail).
    async fn time<T, F>(&self, what: &'static str, op: F) -> Option<T>
    where
        F: std::future::Future<Output = Result<T, brig_sdk::Error>>,
    {
        let t = Instant::now();
        match op.await {
            Ok(v) => {
                let (window, took) = (self.window_of(t), t.elapsed());
                if let Some(l) = self.latencies.lock().get_mut(window) {
                    l.record(took);
                }
                if let Some(kinds) = self.by_kind.lock().get_mut(window) {
                    kinds.entry(what).or_default().record(took);
                }
                Some(v)
            }
            Err(e) => {
                self.unexpected(&format!("{what}: {e}"));
                None
            }
        }
    }

    fn unexpected(&self, what: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock();
        if first.len() < 10 {
            first.push(what.to_string());
        }
    }
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let (daemon, rt) = crate::start_daemon_with_config(&opts.node.node_config())?;
    let result = rt.block_on(soak(&daemon, &opts));
    drop(rt);
    drop(daemon);
    result
}

/// A process's resident memory (`VmRSS`), in bytes; 0 if it is gone.
pub(crate) fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

async fn client_loop(
    client: Client,
    n: usize,
    record: Arc<Record>,
    until: Instant,
    ops: Vec<&'static str>,
) {
    let opts = || SandboxOptions::container(&image("busybox"));
    let Some(sb) = record.time("create", client.create(opts())).await else { return };
    let Some(session) = record.time("open session", sb.open_session()).await else { return };
    let mut round = 0u64;
    // Turns each kind of request came up, for the rarer ones.
    let mut turns = std::collections::HashMap::<&str, u64>::new();
    while Instant::now() < until {
        round += 1;
        let op = ops[(round % ops.len() as u64) as usize];
        let turn = {
            let n = turns.entry(op).or_default();
            *n += 1;
            *n
        };
        match op {
            "exec" => {
                let cmd = Cmd::shell(&format!("echo {n}-{round}"));
                record.time("exec", sb.exec_with(cmd)).await;
            }
            "file" => {
                let path = format!("/data/f{}", round % 16);
                let text = format!("client {n} round {round}");
                if record.time("write", sb.write_file(&path, text.as_bytes())).await.is_some() {
                    record.time("read", sb.read_file(&path)).await;
                }
            }
            "session" => {
                let cmd = format!("cd /tmp && export ROUND={round} && echo $ROUND");
                record.time("session", session.run(&cmd, Duration::from_secs(30))).await;
            }
            "call" => {
                let call = client.call("jq", r#"{"query":"$.a","json":{"a":1}}"#);
                if let Some(result) = record.time("call", call).await {
                    if !result.is_success() {
                        record.unexpected(&format!("call: {:?}", result.outcome));
                    }
                }
            }
            "pause" => {
                if record.time("pause", sb.pause()).await.is_some() {
                    record.time("resume", sb.resume()).await;
                }
            }
            // Forks and fresh sandboxes are rarer: one turn of theirs in three.
            "fork" if turn.is_multiple_of(3) => {
                if let Some(kids) = record.time("fork", sb.fork(1)).await {
                    for kid in kids {
                        record.time("destroy child", kid.destroy()).await;
                    }
                }
            }
            "create" if turn.is_multiple_of(3) => {
                if let Some(fresh) = record.time("create", client.create(opts())).await {
                    record.time("exec", fresh.exec(["true"])).await;
                    record.time("destroy", fresh.destroy()).await;
                }
            }
            _ => {
                record.time("status", sb.status()).await;
            }
        }
    }
    let _ = session.close().await;
    record.time("destroy", sb.destroy()).await;
}

async fn soak(daemon: &Daemon, opts: &Options) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(opts.minutes >= 1 && opts.clients >= 1, "--minutes and --clients must be ≥ 1");
    let pid = daemon.pid().ok_or_else(|| anyhow::anyhow!("brigd is not running"))?;
    let window = Duration::from_secs(opts.window_secs.max(1));
    let record = Arc::new(Record {
        started: Instant::now(),
        window,
        latencies: Mutex::new(vec![Latencies::default(); opts.minutes]),
        by_kind: Mutex::new(vec![Default::default(); opts.minutes]),
        errors: AtomicU64::new(0),
        first_errors: Mutex::new(Vec::new()),
    });
    let until = record.started + window * opts.minutes as u32;
    let probe = crate::probe::MachineProbe::start(Duration::from_secs(5));
    let mut census = crate::probe::CpuCensus::take(pid);
    let mut clients = Vec::new();
    let ops: Vec<&'static str> = OPS
        .iter()
        .copied()
        .filter(|op| opts.ops.is_empty() || opts.ops.iter().any(|o| o == op))
        .collect();
    anyhow::ensure!(
        !ops.is_empty() || opts.ops.iter().any(|o| o == "status"),
        "no known operation in --ops"
    );
    let ops = if ops.is_empty() { vec!["status"] } else { ops };
    for n in 0..opts.clients {
        let client = daemon.client().await?;
        clients.push(tokio::spawn(client_loop(client, n, record.clone(), until, ops.clone())));
    }
    println!(
        "soak: {} clients, {} windows of {} s against one release brigd",
        opts.clients,
        opts.minutes,
        window.as_secs()
    );
    println!(
        "{:>6} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10}",
        "window",
        "served",
        "p99 ms",
        "rss MiB",
        "probe ms",
        "mem ns",
        "busy %",
        "outside %",
        "brigd us/r"
    );
    let mut windows = Vec::new();
    for w in 0..opts.minutes {
        tokio::time::sleep_until((record.started + window * (w as u32 + 1)).into()).await;
        let rss = rss_bytes(pid);
        let now = crate::probe::CpuCensus::take(pid);
        let (busy_pct, outside_pct) = now.shares_since(&census);
        let (brigd_ms, brig_others_ms) = now.brig_ms_since(&census);
        census = now;
        // Requests still in flight at the boundary land in the window they started in; a
        // moment's grace lets most of them finish before the window is read.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut lat = record.latencies.lock()[w].clone();
        let (served, p99) = (lat.len(), lat.quantile_ms(0.99));
        let from = record.started + window * w as u32;
        let probe_ms = probe.median_ms(from, from + window).unwrap_or(0.0);
        let memory_ns = probe.median_memory_ns(from, from + window).unwrap_or(0.0);
        println!(
            "{:>6} {:>9} {:>10.2} {:>10.1} {:>10.2} {:>8.1} {:>8.1} {:>10.1} {:>10.0}",
            w + 1,
            served,
            p99,
            rss as f64 / 1048576.0,
            probe_ms,
            memory_ns,
            busy_pct,
            outside_pct,
            brigd_ms * 1000.0 / served.max(1) as f64
        );
        if served == 0 {
            let first = record.first_errors.lock().clone();
            anyhow::bail!("nothing was served in window {}: {first:?}", w + 1);
        }
        let by_kind: serde_json::Map<String, serde_json::Value> = record.by_kind.lock()[w]
            .iter_mut()
            .map(|(kind, l)| (kind.to_string(), json!(round3(l.quantile_ms(0.99)))))
            .collect();
        windows.push(json!({
            "window": w + 1,
            "served": served,
            "p99_ms": round3(p99),
            "rss_bytes": rss,
            "probe_ms": round3(probe_ms),
            "memory_probe_ns": round3(memory_ns),
            "busy_cpu_pct": round3(busy_pct),
            "outside_cpu_pct": round3(outside_pct),
            "brigd_cpu_us_per_request": round3(brigd_ms * 1000.0 / served.max(1) as f64),
            "brig_others_cpu_us_per_request": round3(brig_others_ms * 1000.0 / served.max(1) as f64),
            "p99_ms_by_kind": by_kind,
        }));
    }
    for c in clients {
        c.await?;
    }
    let client = daemon.client().await?;
    for sb in client.list(&[]).await? {
        let _ = client.sandbox(&sb.id).destroy().await;
    }
    // Give the node a moment to finish removing what the destroys started.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut harness_leaks = daemon.leaks();
    while !harness_leaks.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        harness_leaks = daemon.leaks();
    }
    let strays = client.doctor(false, Duration::ZERO).await?;
    for leak in &harness_leaks {
        println!("left on the host: {leak}");
    }
    for s in &strays {
        println!("stray {} {}: {}", s.kind, s.name, s.parts.join(", "));
    }
    let errors = record.errors.load(Ordering::Relaxed);
    for e in record.first_errors.lock().iter() {
        println!("unexpected error: {e}");
    }
    let first = &windows[0];
    let last = &windows[windows.len() - 1];
    if let Some(kinds) = first["p99_ms_by_kind"].as_object() {
        println!("{:>14} {:>12} {:>12}", "p99 ms of", "window 1", "last window");
        for (kind, p99) in kinds {
            let later = &last["p99_ms_by_kind"][kind];
            println!(
                "{kind:>14} {:>12.2} {:>12.2}",
                p99.as_f64().unwrap_or(0.0),
                later.as_f64().unwrap_or(0.0)
            );
        }
    }
    let growth = |key: &str| {
        let (a, b) = (first[key].as_f64().unwrap_or(0.0), last[key].as_f64().unwrap_or(0.0));
        if a > 0.0 {
            round3((b - a) / a * 100.0)
        } else {
            0.0
        }
    };
    let served: u64 = windows.iter().filter_map(|w| w["served"].as_u64()).sum();
    Ok(json!({
        "bench": "soak",
        "host_free_page_reporting": crate::free_page_reporting(daemon),
        "clients": opts.clients,
        "ops": ops,
        "windows": opts.minutes,
        "window_secs": window.as_secs(),
        "served": served,
        "unexpected_errors": errors,
        "leaked_objects": harness_leaks.len().max(strays.len()),
        "harness_leaks": harness_leaks,
        "doctor_strays": strays.len(),
        "p99_growth_pct": growth("p99_ms"),
        "rss_growth_pct": growth("rss_bytes"),
        "machine_slowdown_pct": growth("probe_ms"),
        "memory_slowdown_pct": growth("memory_probe_ns"),
        "probe_realtime": probe.realtime,
        "per_window": windows,
    }))
}
