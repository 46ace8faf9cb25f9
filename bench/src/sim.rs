//! `sim`: placement for a 160-node unit with DSec's workload shape, against the real brig-sched
//! code, power-of-k versus random placement on the same workload in the same run.
//!
//! Workload (seeded): jobs arrive at random; each is a burst of thousands of creates at 5,000/s;
//! a sandbox asks for 0.5–4 GiB and 1–2 cores, but 90% of them use under 5% of that CPU; its
//! lifetime is log-normal with a 17-minute median, capped at 3 hours. Two control replicas place
//! alternately, each with its own in-flight overlay over heartbeats that arrive once a second per
//! node. A node refuses a placement that would not fit (admission has the final say) and the
//! replica places again elsewhere.
//!
//! Reported: placement decisions per second per replica (wall time inside `Placer::place`), and
//! the load spread (max/mean node load, sampled each simulated minute after the first hour)
//! for power-of-k and for random placement.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use brig_core::{NodeId, Tier};
use brig_sched::{load_ratio, Demand, ImageAccess, NodeView, Placer, Resources, Strategy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::stats::round3;

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    #[arg(long, default_value_t = 160)]
    nodes: u32,
    /// Simulated hours.
    #[arg(long, default_value_t = 4.0)]
    hours: f64,
    /// Mean creates per second over the whole unit (DSec: 3M a day ≈ 35/s mean, 380k live).
    #[arg(long, default_value_t = 180.0)]
    rate: f64,
    /// Choices sampled per placement.
    #[arg(long, default_value_t = 2)]
    k: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// One simulated node's truth; the replicas see it only through heartbeats.
#[derive(Clone, Default)]
struct SimNode {
    used: Resources,
    cpu_actual_millis: u64,
}

struct Outcome {
    decisions: u64,
    place_time: Duration,
    refusals: u64,
    failed: u64,
    spread: f64,
    cpu_spread: f64,
    peak_live: u64,
}

const NODE_CAPACITY: Resources =
    Resources { memory_mib: 4 << 20, cpu_millis: 192 * 20 * 1000, sandboxes: 4000 };
/// (time, node index, memory MiB, CPU millis requested, CPU millis used).
type Departure = (u64, usize, u64, u64, u64);

const HEARTBEAT_MS: u64 = 1000;
const BURST_PER_SEC: f64 = 5000.0;

/// Sandbox shapes: (memory MiB, CPU millis requested), weighted equally.
const SHAPES: [(u64, u64); 4] = [(512, 1000), (1024, 1000), (2048, 2000), (4096, 2000)];

struct Arrival {
    at_ms: u64,
    demand: Demand,
    cpu_actual: u64,
    lifetime_ms: u64,
}

/// The seeded workload: every create with its time, shape, real CPU use and lifetime.
fn workload(opts: &Options) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let end_ms = (opts.hours * 3_600_000.0) as u64;
    let mean_job = 4500.0;
    let job_gap_ms = mean_job / opts.rate * 1000.0;
    let mut out = Vec::new();
    let mut t = 0.0f64;
    loop {
        t += -job_gap_ms * (1.0 - rng.random::<f64>()).ln();
        if t as u64 >= end_ms {
            break;
        }
        let size = rng.random_range(1000..8000u32);
        for i in 0..size {
            let (memory_mib, cpu_millis) = SHAPES[rng.random_range(0..SHAPES.len())];
            let busy = rng.random::<f64>() < 0.1;
            let share = if busy { rng.random_range(0.2..1.0) } else { rng.random_range(0.0..0.05) };
            // Log-normal, median 17 min, sigma 1 (p99 ≈ 3 h), capped at 3 h.
            let normal = gaussian(&mut rng);
            let minutes = (17.0f64.ln() + normal).exp().min(180.0);
            out.push(Arrival {
                at_ms: (t + f64::from(i) * 1000.0 / BURST_PER_SEC) as u64,
                demand: Demand { tier: Tier::Container, image: None, memory_mib, cpu_millis },
                cpu_actual: (cpu_millis as f64 * share) as u64,
                lifetime_ms: (minutes * 60_000.0) as u64,
            });
        }
    }
    out.sort_by_key(|a| a.at_ms);
    out
}

/// A standard normal sample (Box-Muller).
fn gaussian(rng: &mut StdRng) -> f64 {
    let (u1, u2) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn simulate(opts: &Options, arrivals: &[Arrival], strategy: Strategy) -> Outcome {
    let n = opts.nodes as usize;
    let mut truth = vec![SimNode::default(); n];
    let mut views: Vec<NodeView> = (0..opts.nodes)
        .map(|i| NodeView {
            id: NodeId(i),
            healthy: true,
            tiers: vec![Tier::Container],
            images: ImageAccess::Store,
            capacity: NODE_CAPACITY,
            used: Resources::default(),
        })
        .collect();
    let mut replicas = [Placer::new(strategy, opts.seed ^ 1), Placer::new(strategy, opts.seed ^ 2)];
    let mut departures: BinaryHeap<Reverse<Departure>> = BinaryHeap::new();
    let mut next_heartbeat = 0u64;
    let mut next_sample = 3_600_000u64;
    let (mut decisions, mut refusals, mut failed, mut live, mut peak_live) = (0u64, 0, 0, 0u64, 0);
    let mut place_time = Duration::ZERO;
    let (mut spreads, mut cpu_spreads) = (Vec::new(), Vec::new());
    for (seq, a) in arrivals.iter().enumerate() {
        while let Some(Reverse((at, node, mem, cpu, actual))) = departures.peek().copied() {
            if at > a.at_ms {
                break;
            }
            departures.pop();
            let s = &mut truth[node];
            s.used.memory_mib -= mem;
            s.used.cpu_millis -= cpu;
            s.used.sandboxes -= 1;
            s.cpu_actual_millis -= actual;
            live -= 1;
        }
        // Heartbeats: every node once per interval, received by both replicas.
        while next_heartbeat <= a.at_ms {
            for (view, node) in views.iter_mut().zip(&truth) {
                view.used = node.used;
                for r in &mut replicas {
                    r.heartbeat(view.id, next_heartbeat, 30_000);
                }
            }
            next_heartbeat += HEARTBEAT_MS;
        }
        if a.at_ms >= next_sample {
            let loads: Vec<f64> = truth.iter().map(|s| load_ratio(NODE_CAPACITY, s.used)).collect();
            spreads.push(max_over_mean(&loads));
            let cpu: Vec<f64> = truth.iter().map(|s| s.cpu_actual_millis as f64).collect();
            cpu_spreads.push(max_over_mean(&cpu));
            next_sample += 60_000;
        }
        let replica = &mut replicas[seq % 2];
        let mut exclude = Vec::new();
        loop {
            let started = Instant::now();
            let placed = replica.place(&views, &a.demand, &exclude, a.at_ms);
            place_time += started.elapsed();
            decisions += 1;
            let Ok(placed) = placed else {
                failed += 1;
                break;
            };
            let idx = placed.node.0 as usize;
            let s = &mut truth[idx];
            let after = Resources {
                memory_mib: s.used.memory_mib + a.demand.memory_mib,
                cpu_millis: s.used.cpu_millis + a.demand.cpu_millis,
                sandboxes: s.used.sandboxes + 1,
            };
            if load_ratio(NODE_CAPACITY, after) > 1.0 {
                // Node admission refuses; place again elsewhere.
                replica.refused(placed);
                refusals += 1;
                exclude.push(placed.node);
                continue;
            }
            replica.confirmed(placed, a.at_ms);
            s.used = after;
            s.cpu_actual_millis += a.cpu_actual;
            live += 1;
            peak_live = peak_live.max(live);
            let (mem, cpu) = (a.demand.memory_mib, a.demand.cpu_millis);
            departures.push(Reverse((a.at_ms + a.lifetime_ms, idx, mem, cpu, a.cpu_actual)));
            break;
        }
    }
    Outcome {
        decisions,
        place_time,
        refusals,
        failed,
        spread: mean(&spreads),
        cpu_spread: mean(&cpu_spreads),
        peak_live,
    }
}

fn max_over_mean(values: &[f64]) -> f64 {
    let m = mean(values);
    if m == 0.0 {
        return 1.0;
    }
    values.iter().copied().fold(0.0, f64::max) / m
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let arrivals = workload(&opts);
    println!(
        "sim: {} nodes, {:.1} h, {} creates ({:.0}/s mean, bursts at {BURST_PER_SEC}/s)",
        opts.nodes,
        opts.hours,
        arrivals.len(),
        opts.rate
    );
    let pok = simulate(&opts, &arrivals, Strategy::PowerOfK(opts.k));
    let random = simulate(&opts, &arrivals, Strategy::Random);
    // Two replicas share the decisions; each placed half of them in its share of the time.
    let per_sec = pok.decisions as f64 / pok.place_time.as_secs_f64().max(1e-9);
    for (name, o) in [(format!("power-of-{}", opts.k), &pok), ("random".to_string(), &random)] {
        println!(
            "  {name:<12} max/mean load {:.3}  max/mean real CPU {:.3}  refusals {}  unplaced {}  peak live {}",
            o.spread, o.cpu_spread, o.refusals, o.failed, o.peak_live
        );
    }
    println!("  placement: {per_sec:.0} decisions/s per replica ({} decisions)", pok.decisions);
    Ok(json!({
        "bench": "sim",
        "nodes": opts.nodes,
        "creates": arrivals.len(),
        "k": opts.k,
        "decisions_per_sec": per_sec.round(),
        "max_over_mean_load": round3(pok.spread),
        "random_max_over_mean_load": round3(random.spread),
        "max_over_mean_cpu_used": round3(pok.cpu_spread),
        "random_max_over_mean_cpu_used": round3(random.cpu_spread),
        "refusals": pok.refusals,
        "random_refusals": random.refusals,
        "unplaced": pok.failed,
        "random_unplaced": random.failed,
        "peak_live": pok.peak_live,
    }))
}
