//! `hostile`: the attacks of the hostile suites (`tests/tests/hostile*.rs`), each against one
//! release brigd, measured as a node operator sees them: brigd's peak RSS growth over the
//! attack (sampled every 20 ms against the RSS just before it), the slowest answer a
//! bystander got meanwhile (the node's status and a bystander container's `echo ok`, one after
//! the other every 50 ms, and the E2B API's `/health`), and whether every one of those answered
//! within 1 s. The attacks run one after the other on one node, so a leak of one shows in the
//! next one's baseline, and the last line says what the node holds after all of them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, ExecEvent, Sandbox, SandboxOptions};
use brig_tests::hostile_http::{self, Api as E2bApi};
use brig_tests::{image, Daemon};
use serde_json::{json, Value};

use crate::soak::rss_bytes;

/// A probe answer slower than this counts as the node not answering.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Run only the attacks whose names contain this.
    #[arg(long)]
    only: Option<String>,
}

/// What one attack did to the node.
struct Measured {
    name: &'static str,
    rss_growth_mib: f64,
    bystander_worst_ms: f64,
    /// The slowest of each probe: the node's status with the bystander's `echo ok` over QUIC,
    /// and the E2B API's `/health` over HTTP.
    worst_native_ms: f64,
    worst_health_ms: f64,
    /// The native probe's parts: the node's status, the bystander's `echo ok`.
    worst_status_ms: f64,
    worst_exec_ms: f64,
    probes: u64,
    late_or_failed: u64,
    /// What the attack itself saw (refusals, bytes delivered), for the reader.
    outcome: String,
}

/// Runs `attack` while sampling brigd's RSS and probing the bystanders.
async fn measure<F: std::future::Future<Output = String>>(
    name: &'static str,
    daemon: &Daemon,
    bystander: &Sandbox,
    api: &E2bApi,
    attack: F,
) -> Measured {
    let pid = daemon.pid().expect("brigd runs");
    let baseline = rss_bytes(pid);
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(baseline));
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let prober = {
        let (done, opts, id, api) =
            (done.clone(), daemon.connect_options(), bystander.id().to_string(), api.clone());
        std::thread::spawn(move || probe_until(&done, opts, &id, &api))
    };
    let outcome = attack.await;
    done.store(true, Ordering::Relaxed);
    let Probed { worst, probes, late } =
        prober.join().unwrap_or(Probed { worst: [ANSWER_WITHIN; 4], probes: 1, late: 1 });
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let _ = sampler.join();
    let growth = peak.load(Ordering::Relaxed).saturating_sub(baseline);
    let m = Measured {
        name,
        rss_growth_mib: growth as f64 / (1 << 20) as f64,
        bystander_worst_ms: ms(worst[0].max(worst[1])),
        worst_native_ms: ms(worst[0]),
        worst_health_ms: ms(worst[1]),
        worst_status_ms: ms(worst[2]),
        worst_exec_ms: ms(worst[3]),
        probes,
        late_or_failed: late,
        outcome,
    };
    println!(
        "  {:<28} rss +{:>7.1} MiB  bystander worst {:>7.1} ms (native {:.1}: status {:.1}, exec {:.1}; /health {:.1})  answered {}/{}  {}",
        m.name,
        m.rss_growth_mib,
        m.bystander_worst_ms,
        m.worst_native_ms,
        m.worst_status_ms,
        m.worst_exec_ms,
        m.worst_health_ms,
        m.probes - m.late_or_failed,
        m.probes,
        m.outcome
    );
    m
}

/// What the prober saw: the slowest native probe and `/health`, how many probes, how many late
/// or failed.
struct Probed {
    /// Native (status + exec), `/health`, the status alone, the exec alone.
    worst: [Duration; 4],
    probes: u64,
    late: u64,
}

/// Probes the bystanders every 50 ms until `done`, on a thread and runtime of its own with a
/// client of its own, so the attack's load on the bench's runtime is not in the figure: the
/// slowest answer, how many probes, how many were late or failed. A probe client that cannot
/// connect counts as one failed probe.
fn probe_until(
    done: &AtomicBool,
    opts: anyhow::Result<brig_sdk::ConnectOptions>,
    bystander: &str,
    api: &E2bApi,
) -> Probed {
    let failed = || Probed { worst: [ANSWER_WITHIN; 4], probes: 1, late: 1 };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return failed();
    };
    rt.block_on(async {
        let Ok(client) = Client::connect(opts?).await else { return Ok(failed()) };
        let bystander = client.sandbox(bystander);
        let mut seen = Probed { worst: [Duration::ZERO; 4], probes: 0, late: 0 };
        loop {
            let [native, status, exec] = probe_native(&client, &bystander).await;
            let took = [native, probe_health(api), status, exec];
            for (i, (worst, took)) in seen.worst.iter_mut().zip(took).enumerate() {
                let took = took.unwrap_or(ANSWER_WITHIN);
                *worst = (*worst).max(took);
                // The parts of a native probe are not probes of their own.
                if i < 2 {
                    seen.probes += 1;
                    seen.late += u64::from(took >= ANSWER_WITHIN);
                }
            }
            if done.load(Ordering::Relaxed) {
                client.close().await;
                return anyhow::Ok(seen);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .unwrap_or_else(|_| failed())
}

/// The node's status, then the bystander's `echo ok`: the time both took, the status alone and
/// the exec alone; `None`s on failure.
async fn probe_native(client: &Client, bystander: &Sandbox) -> [Option<Duration>; 3] {
    let started = Instant::now();
    let probe = async {
        client.node_status().await.ok()?;
        let status = started.elapsed();
        let out = bystander.exec(["echo", "ok"]).await.ok()?;
        (out.stdout_text() == "ok\n").then_some(status)
    };
    match tokio::time::timeout(Duration::from_secs(10), probe).await {
        Ok(Some(status)) => {
            let total = started.elapsed();
            [Some(total), Some(status), Some(total - status)]
        }
        _ => [None; 3],
    }
}

/// The E2B API's `/health` over a fresh HTTP connection (blocking: the prober's thread is its own).
fn probe_health(api: &E2bApi) -> Option<Duration> {
    let started = Instant::now();
    api.health(Duration::from_secs(10)).then(|| started.elapsed())
}

/// `n` futures of one kind at once; how many ended in an error, and the first error's text.
async fn refusals<T, E: std::fmt::Display>(
    all: Vec<impl std::future::Future<Output = Result<T, E>>>,
) -> (usize, usize, String) {
    let n = all.len();
    let results = futures::future::join_all(all).await;
    let first = results.iter().find_map(|r| r.as_ref().err().map(|e| e.to_string()));
    let refused = results.iter().filter(|r| r.is_err()).count();
    (refused, n, first.unwrap_or_default().chars().take(80).collect())
}

pub fn run(opts: Options) -> anyhow::Result<Value> {
    let config = format!(
        "[e2b]\ndisk_mib = 64\nmemory_mib = 256\n[e2b.templates]\nbase = {:?}\n",
        image("debian-12")
    );
    let (daemon, rt) = crate::start_daemon_with_config(&config)?;
    let api = E2bApi { url: daemon.e2b_url()?, key: daemon.access_token()? };
    let measured = rt.block_on(async {
        let client = daemon.client().await?;
        let bystander = client.create(SandboxOptions::container(&image("busybox"))).await?;
        let sb = client.create(SandboxOptions::container(&image("busybox"))).await?;
        sb.exec(["sh", "-c", "mkdir -p /workspace && mkfifo /workspace/in /workspace/out"]).await?;
        let wanted = |name: &str| opts.only.as_deref().is_none_or(|o| name.contains(o));
        let mut all = Vec::new();
        macro_rules! attack {
            ($name:literal, $body:expr) => {
                if wanted($name) {
                    all.push(measure($name, &daemon, &bystander, &api, $body).await);
                }
            };
        }
        attack!("fifo_uploads", async {
            let writes = (0..64).map(|_| sb.write_file("/workspace/in", b"answer")).collect();
            let (refused, n, first) = refusals(writes).await;
            format!("{refused}/{n} refused ({first})")
        });
        attack!("fifo_downloads", async {
            let reads = (0..64).map(|_| sb.read_file("/workspace/out")).collect();
            let (refused, n, first) = refusals(reads).await;
            format!("{refused}/{n} refused ({first})")
        });
        attack!("kernel_files", async {
            let paths = ["/proc/1/timerslack_ns", "/proc/self/autogroup", "/proc/1/mem"];
            let writes =
                (0..120).map(|i| sb.write_file(paths[i % paths.len()], b"1")).collect::<Vec<_>>();
            let (refused, n, first) = refusals(writes).await;
            format!("{refused}/{n} refused ({first})")
        });
        attack!("slow_stdout_reader", async {
            let cmd = Cmd::shell("dd if=/dev/zero bs=1048576 count=40 2>/dev/null")
                .output_limit(64 << 20)
                .timeout(Duration::from_secs(120));
            let Ok(mut stream) = sb.exec_stream(cmd).await else { return "exec failed".into() };
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut bytes = 0u64;
            while let Some(Ok(event)) = stream.next().await {
                if let ExecEvent::Stdout(b) = event {
                    bytes += b.len() as u64;
                }
            }
            format!("{} of 40 MiB delivered", bytes >> 20)
        });
        attack!("finished_output", async {
            // Commands whose output nobody attaches to again: kept on disk, not in brigd.
            let cmd = || Cmd::shell("head -c 4194304 /dev/zero").output_limit(8 << 20);
            let mut first = None;
            for _ in 0..48 {
                let Ok(mut stream) = sb.exec_stream(cmd()).await else {
                    return "exec failed".into();
                };
                first.get_or_insert(stream.exec_id());
                while let Some(Ok(event)) = stream.next().await {
                    if matches!(event, ExecEvent::Exited(_)) {
                        break;
                    }
                }
            }
            let again = match first {
                Some(id) => match sb.attach(id).await {
                    Ok(stream) => stream.collect().await.map_or(0, |o| o.stdout.len() >> 20),
                    Err(_) => 0,
                },
                None => 0,
            };
            format!("48 x 4 MiB finished; the first attached again: {again} MiB")
        });
        attack!("label_flood", async {
            let creates = (0..20)
                .map(|_| {
                    let mut o = SandboxOptions::container(&image("busybox"));
                    for i in 0..10_000 {
                        o = o.label(&format!("k{i}"), "v");
                    }
                    client.create(o)
                })
                .collect();
            let (refused, n, first) = refusals(creates).await;
            format!("{refused}/{n} refused ({first})")
        });
        for (name, attack) in hostile_http::ATTACKS {
            if wanted(name) {
                let attacker = api.clone();
                let run = async move {
                    tokio::task::spawn_blocking(move || attack(&attacker))
                        .await
                        .unwrap_or_else(|e| format!("the attack panicked: {e}"))
                };
                all.push(measure(name, &daemon, &bystander, &api, run).await);
            }
        }
        anyhow::Ok(all)
    })?;
    let max_rss = measured.iter().map(|m| m.rss_growth_mib).fold(0.0, f64::max);
    let max_ms = measured.iter().map(|m| m.bystander_worst_ms).fold(0.0, f64::max);
    let answered = measured.iter().filter(|m| m.late_or_failed == 0).count();
    let fraction = answered as f64 / measured.len().max(1) as f64;
    let rss_after = daemon.pid().map_or(0, rss_bytes) >> 20;
    Ok(json!({
        "bench": "hostile",
        "attacks": measured.iter().map(|m| json!({
            "name": m.name,
            "rss_growth_mib": crate::stats::round3(m.rss_growth_mib),
            "bystander_worst_ms": crate::stats::round3(m.bystander_worst_ms),
            "worst_native_ms": crate::stats::round3(m.worst_native_ms),
            "worst_health_ms": crate::stats::round3(m.worst_health_ms),
            "worst_status_ms": crate::stats::round3(m.worst_status_ms),
            "worst_exec_ms": crate::stats::round3(m.worst_exec_ms),
            "node_answered": m.late_or_failed == 0,
            "probes": m.probes,
            "outcome": m.outcome,
        })).collect::<Vec<_>>(),
        "max_rss_growth_mib": crate::stats::round3(max_rss),
        "max_bystander_ms": crate::stats::round3(max_ms),
        "node_answered_fraction": crate::stats::round3(fraction),
        "brigd_rss_after_mib": rss_after,
        "goals": {"max_rss_growth_mib": 64, "max_bystander_ms": 100, "node_answered_fraction": 1.0},
    }))
}
