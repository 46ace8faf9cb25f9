//! `cluster`: one-shot fncall throughput through the control plane, with three node processes
//! and one control-plane replica on this machine (all on its two cores), and the share of calls
//! that paid the extra hop through the control plane (the SDK calls nodes directly on routes the
//! control plane leases, and goes through it while it has none). In the same run, the same
//! load against one all-in-one brigd, as the baseline.

use brig_sdk::Client;
use brig_tests::cluster::Cluster;
use brig_tests::Daemon;
use serde_json::json;

use crate::fncall::{end_to_end, Options as CallOptions};
use crate::stats::round3;

#[derive(clap::Args, Debug)]
pub struct Options {
    #[command(flatten)]
    calls: CallOptions,
    /// Node processes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    crate::build_daemon()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.calls.client_threads_or_one())
        .enable_all()
        .build()?;
    let (rate, mut lat, errors, direct, via_control, proxied_rate) = rt.block_on(async {
        let cluster = Cluster::start(1, opts.nodes, &[])?;
        cluster.wait_healthy(opts.nodes).await?;
        let mut clients = Vec::new();
        for _ in 0..opts.calls.connections.max(1) {
            clients.push(cluster.admin().await?);
        }
        let (rate, lat, errors) = end_to_end(&clients, &opts.calls).await?;
        let (direct, via) = clients
            .iter()
            .map(Client::call_hops)
            .fold((0, 0), |(d, v), h| (d + h.direct, v + h.via_control));
        // The same load with every call placed and forwarded by the control plane.
        let mut proxied = Vec::new();
        for _ in 0..opts.calls.connections.max(1) {
            let mut o = cluster.connect_options()?;
            o.direct_calls = false;
            proxied.push(Client::connect(o).await?);
        }
        let (proxied_rate, _, _) = end_to_end(&proxied, &opts.calls).await?;
        anyhow::Ok((rate, lat, errors, direct, via, proxied_rate))
    })?;
    let (base_rate, mut base_lat, _) = rt.block_on(async {
        let daemon = Daemon::start()?;
        let mut clients = Vec::new();
        for _ in 0..opts.calls.connections.max(1) {
            clients.push(daemon.client().await?);
        }
        end_to_end(&clients, &opts.calls).await
    })?;
    let share = via_control as f64 / (direct + via_control).max(1) as f64;
    println!(
        "cluster: {} nodes + 1 control replica on this machine, {} calls in flight",
        opts.nodes, opts.calls.concurrency
    );
    let (p50, p99) = (lat.quantile_ms(0.5), lat.quantile_ms(0.99));
    println!("  cluster, leased routes      {rate:>8.0} calls/s  p50 {p50:.3} ms  p99 {p99:.3} ms");
    println!("  cluster, all via control    {proxied_rate:>8.0} calls/s  (errors {errors})");
    println!(
        "  one all-in-one brigd        {base_rate:>8.0} calls/s  p50 {:.3} ms  p99 {:.3} ms",
        base_lat.quantile_ms(0.5),
        base_lat.quantile_ms(0.99)
    );
    println!(
        "  calls via the control plane {via_control} of {} ({:.6})",
        direct + via_control,
        share
    );
    Ok(json!({
        "bench": "cluster",
        "nodes": opts.nodes,
        "e2e_per_sec": rate.round(),
        "p50_ms": round3(p50),
        "p99_ms": round3(p99),
        "errors": errors,
        "extra_hop_share": (share * 1e6).round() / 1e6,
        "all_via_control_e2e_per_sec": proxied_rate.round(),
        "calls_direct": direct,
        "calls_via_control": via_control,
        "single_node_e2e_per_sec": base_rate.round(),
    }))
}
