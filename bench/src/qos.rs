//! `qos`: step latency of a latency-sensitive sandbox while best-effort sandboxes burn CPU.
//!
//! A rollout step is an exec of a small CPU loop in a latency-sensitive container. It is timed
//! `--steps` times on an idle node, then with background sandboxes spinning on 50% and 100% of
//! the node's cores, once with them in the same (latency-sensitive) class (QoS off) and once
//! as best-effort (QoS on: smallest weight, idle policy), in the same run. Reported: the p99
//! increase over the idle node, in percent.

use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, QosClass, Sandbox, SandboxOptions};
use brig_tests::Daemon;
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Timed steps per phase.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Iterations of the shell loop in one step (a few milliseconds of CPU).
    #[arg(long, default_value_t = 3000)]
    step_loop: u32,
}

async fn steps(sb: &Sandbox, opts: &Options) -> anyhow::Result<Latencies> {
    let script = format!("i=0; while [ $i -lt {} ]; do i=$((i+1)); done", opts.step_loop);
    let mut l = Latencies::default();
    for _ in 0..opts.steps {
        let t = Instant::now();
        let out = sb.exec_with(Cmd::shell(&script)).await?;
        anyhow::ensure!(out.success(), "step failed");
        l.record(t.elapsed());
    }
    Ok(l)
}

/// Background sandboxes spinning on `cores` cores, in `class`.
async fn burners(client: &Client, cores: usize, class: QosClass) -> anyhow::Result<Vec<Sandbox>> {
    let mut out = Vec::new();
    for _ in 0..cores {
        let sb =
            client.create(SandboxOptions::container("busybox").cpu_millis(1000).qos(class)).await?;
        sb.exec_with(Cmd::shell("(while :; do :; done) > /dev/null 2>&1 &")).await?;
        out.push(sb);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(out)
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let (daemon, rt) = crate::start_daemon(&["--log", "warn"])?;
    rt.block_on(measure(&daemon, &opts))
}

async fn measure(daemon: &Daemon, opts: &Options) -> anyhow::Result<serde_json::Value> {
    let client = daemon.client().await?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let step = client.create(SandboxOptions::container("busybox").cpu_millis(1000)).await?;
    steps(&step, &Options { steps: 20, step_loop: opts.step_loop }).await?;
    let mut idle = steps(&step, opts).await?;
    let (idle50, idle99) = (idle.quantile_ms(0.5), idle.quantile_ms(0.99));
    let mut results = Vec::new();
    for (pct, n) in [(50, cores.div_ceil(2)), (100, cores)] {
        for class in [QosClass::LatencySensitive, QosClass::BestEffort] {
            let load = burners(&client, n, class).await?;
            let mut l = steps(&step, opts).await?;
            for sb in load {
                sb.destroy().await?;
            }
            let (p50, p99) = (l.quantile_ms(0.5), l.quantile_ms(0.99));
            let increase = (p99 / idle99 - 1.0) * 100.0;
            let qos = if class == QosClass::BestEffort { "on" } else { "off" };
            println!(
                "  load {pct:>3}% QoS {qos:<3}  step p50 {p50:>7.2} ms  p99 {p99:>7.2} ms  (+{increase:.1}% p99)"
            );
            results.push((format!("qos_{qos}_{pct}_pct"), increase, p50, p99));
        }
    }
    step.destroy().await?;
    println!("qos: idle node step p50 {idle50:.2} ms, p99 {idle99:.2} ms ({cores} cores)");
    let mut value = json!({
        "bench": "qos",
        "idle_p50_ms": round3(idle50),
        "idle_p99_ms": round3(idle99),
        "steps": opts.steps,
        "cores": cores,
    });
    for (key, increase, p50, p99) in results {
        value[&key] = json!(round3(increase));
        value[format!("{key}_p50_ms")] = json!(round3(p50));
        value[format!("{key}_p99_ms")] = json!(round3(p99));
    }
    Ok(value)
}
