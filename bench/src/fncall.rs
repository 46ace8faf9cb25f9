//! `fncall`: one-shot tool-call throughput.
//!
//! End to end: a real release brigd on loopback, `--concurrency` tasks sharing `--connections`
//! SDK clients, each calling the `jq` tool in a loop for `--seconds` after a warm-up. In the same
//! run, the in-process rate of brig-fncall alone (instantiate + call + drop, no network) is
//! measured for comparison.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_core::ToolCall;
use brig_fncall::{FncallBackend, FncallConfig};
use brig_sdk::Client;
use brig_tests::Daemon;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Calls in flight at once.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// Measured seconds (after warm-up).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// QUIC connections the tasks share.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Warm-up seconds, not measured.
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// Seconds for the in-process measurement.
    #[arg(long, default_value_t = 5)]
    inproc_seconds: u64,
    /// Client runtime worker threads.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
}

impl Options {
    /// Options for [`end_to_end`] alone: `concurrency` tasks on one connection.
    pub fn calls(concurrency: usize, seconds: u64, warmup: u64) -> Options {
        Options {
            concurrency,
            seconds,
            connections: 1,
            warmup,
            inproc_seconds: 0,
            client_threads: 1,
        }
    }

    pub fn client_threads_or_one(&self) -> usize {
        self.client_threads.max(1)
    }
}

const INPUT: &str = r#"{"query":"$.items[?@.ok == true].id","json":{"items":[{"id":1,"ok":true},{"id":2,"ok":false},{"id":3,"ok":true}]}}"#;
const EXPECTED: &str = r#"{"results":[1,3]}"#;

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    crate::build_daemon()?;
    let daemon = Daemon::start()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.client_threads)
        .enable_all()
        .build()?;
    let (e2e_rate, mut lat, errors) = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..opts.connections.max(1) {
            clients.push(daemon.client().await?);
        }
        end_to_end(&clients, &opts).await
    })?;
    drop(daemon);
    let inproc_rate = rt.block_on(in_process(&opts))?;
    let p50 = lat.quantile_ms(0.50);
    let p99 = lat.quantile_ms(0.99);
    println!("fncall one-shot calls (tool jq), {} s measured", opts.seconds);
    println!("  {:<34} {:>12}", "end-to-end calls/s (SDK→QUIC→brigd)", format!("{e2e_rate:.0}"));
    println!("  {:<34} {:>12}", "in-process calls/s (brig-fncall)", format!("{inproc_rate:.0}"));
    println!("  {:<34} {:>12}", "p50 latency ms", format!("{p50:.3}"));
    println!("  {:<34} {:>12}", "p99 latency ms", format!("{p99:.3}"));
    println!("  {:<34} {:>12}", "errors", errors);
    println!(
        "  {:<34} {:>12}",
        "concurrency / connections",
        format!("{} / {}", opts.concurrency, opts.connections)
    );
    Ok(json!({
        "bench": "fncall",
        "e2e_per_sec": e2e_rate.round(),
        "inproc_per_sec": inproc_rate.round(),
        "p50_ms": round3(p50),
        "p99_ms": round3(p99),
        "errors": errors,
        "calls": lat.len(),
        "concurrency": opts.concurrency,
        "connections": opts.connections,
        "seconds": opts.seconds,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
    }))
}

/// `opts.concurrency` tasks calling `jq` through `clients`: calls per second measured after the
/// warm-up, their latencies, and failed calls.
pub(crate) async fn end_to_end(
    clients: &[Client],
    opts: &Options,
) -> anyhow::Result<(f64, Latencies, u64)> {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..opts.concurrency {
        let client: Client = clients[i % clients.len()].clone();
        let (measuring, stop, errors) = (measuring.clone(), stop.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::default();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let ok = matches!(client.call("jq", INPUT).await, Ok(r) if r.output == EXPECTED);
                if measuring.load(Ordering::Relaxed) {
                    if ok {
                        lat.record(started.elapsed());
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs(opts.warmup)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(opts.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut all = Latencies::default();
    for task in tasks {
        all.merge(task.await?);
    }
    Ok((all.len() as f64 / elapsed, all, errors.load(Ordering::Relaxed)))
}

async fn in_process(opts: &Options) -> anyhow::Result<f64> {
    let state = tempfile::tempdir()?;
    let backend = FncallBackend::open(FncallConfig::default(), state.path())?;
    backend.add_tools_from_dir(&brig_tests::artifacts().join("guests/tools")).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut threads = Vec::new();
    let started = Instant::now();
    for _ in 0..workers {
        let (backend, stop, count) = (backend.clone(), stop.clone(), count.clone());
        threads.push(std::thread::spawn(move || -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                while !stop.load(Ordering::Relaxed) {
                    let r = backend.call(ToolCall::new_tool("jq", INPUT), None).await?;
                    anyhow::ensure!(r.output == EXPECTED, "unexpected output {:?}", r.output);
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        }));
    }
    tokio::time::sleep(Duration::from_secs(opts.inproc_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("in-process worker panicked"))??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / elapsed)
}
