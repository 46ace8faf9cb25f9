//! `brig-bench`: Brig's benchmarks. `cargo run --release -p brig-bench -- <bench> [options]`.
//!
//! Every benchmark prints a human table and, as its last line, one JSON object, so scripts can
//! take `tail -n1`. Benchmarks start real daemons (release build) on loopback; they build brigd
//! first if needed.
#![forbid(unsafe_code)]

mod build;
mod cluster;
mod container;
mod density;
mod e2b;
mod fncall;
mod fullvm;
mod hostile;
mod images;
mod ksm;
mod lifecycle;
mod microvm;
mod probe;
mod pull;
mod python;
mod qos;
mod sim;
mod soak;
mod stats;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "brig-bench", version, about = "Brig benchmarks (JSON result on the last line)")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// One-shot fncall throughput end to end (SDK → QUIC → brigd → Wasmtime) and in-process.
    Fncall(fncall::Options),
    /// Container tier: create-to-first-exec, creates/s, exec round trip, idle memory.
    Container(container::Options),
    /// Layer store: fetched fraction for a Python import, cold/warm create, disk writes.
    Images(images::Options),
    /// Image builds (first, unchanged, last step changed), run_code and the port route.
    Build(build::Options),
    /// `brig image pull` of a five-layer image from a loopback registry against skopeo + umoci.
    Pull(pull::Options),
    /// Idle sandboxes one node holds at once, memory per sandbox, what stopped it.
    Density(density::Options),
    /// Step latency of a latency-sensitive sandbox under background CPU load, QoS off and on.
    Qos(qos::Options),
    /// Pause/resume latency, memory freed by pause, fork of 16 (container and fncall).
    Lifecycle(lifecycle::Options),
    /// One-shot calls through the control plane with three nodes; share of extra hops.
    Cluster(cluster::Options),
    /// microVM snapshot restore (fresh process, pre-created VM), VMM RSS, PSS per VM.
    Microvm(microvm::Options),
    /// Full VMs: boot-to-agent time and memory per VM, stating the virtualization it ran on.
    Fullvm(fullvm::Options),
    /// KSM on microVM memory: memory merged, PSS per VM off and on, ksmd's CPU cost.
    Ksm(ksm::Options),
    /// E2B's Python SDK through the E2B-compatible API against the native SDK, same run.
    E2b(e2b::Options),
    /// The Python SDK (release module) against the Rust SDK: calls/s and create→exec, same run.
    Python(python::Options),
    /// A mixed load for `--minutes`: served, p99 and brigd RSS per minute, leaks at the end.
    Soak(soak::Options),
    /// Placement for a simulated 160-node unit: decisions/s and load spread, power-of-k vs random.
    Sim(sim::Options),
    /// The hostile suites' attacks on one node: brigd's RSS growth and a bystander's worst answer.
    Hostile(hostile::Options),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let result = match cli.bench {
        Bench::Fncall(opts) => fncall::run(opts)?,
        Bench::Container(opts) => container::run(opts)?,
        Bench::Images(opts) => images::run(opts)?,
        Bench::Pull(opts) => pull::run(opts)?,
        Bench::Build(opts) => build::run(opts)?,
        Bench::Lifecycle(opts) => lifecycle::run(opts)?,
        Bench::Density(opts) => density::run(opts)?,
        Bench::Qos(opts) => qos::run(opts)?,
        Bench::Hostile(opts) => hostile::run(opts)?,
        Bench::Sim(opts) => sim::run(opts)?,
        Bench::Soak(opts) => soak::run(opts)?,
        Bench::Microvm(opts) => microvm::run(opts)?,
        Bench::Ksm(opts) => ksm::run(opts)?,
        Bench::Fullvm(opts) => fullvm::run(opts)?,
        Bench::Cluster(opts) => cluster::run(opts)?,
        Bench::E2b(opts) => e2b::run(opts)?,
        Bench::Python(opts) => python::run(opts)?,
    };
    println!("{result}");
    Ok(())
}

/// Builds the daemon binaries in release mode next to this benchmark, so a stale brigd is never
/// measured.
pub fn build_daemon() -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = std::process::Command::new(cargo)
        .args(["build", "--release", "--quiet", "--workspace", "--bins"])
        .current_dir(brig_tests::repo_root())
        .status()?;
    anyhow::ensure!(status.success(), "building brigd failed");
    Ok(())
}

/// Builds the daemon, starts it with extra `args` and a two-thread runtime to drive it. Bind
/// the runtime after the daemon so it is dropped first.
pub fn start_daemon(
    args: &[&str],
) -> anyhow::Result<(brig_tests::Daemon, tokio::runtime::Runtime)> {
    build_daemon()?;
    let daemon = brig_tests::Daemon::start_with(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    Ok((daemon, rt))
}

/// As [`start_daemon`], with a node configuration (TOML text).
pub fn start_daemon_with_config(
    config: &str,
) -> anyhow::Result<(brig_tests::Daemon, tokio::runtime::Runtime)> {
    build_daemon()?;
    let daemon = brig_tests::Daemon::start_with_config(config, &[])?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    Ok((daemon, rt))
}

/// Container-tier node settings a bench can set: what the node does with memory its
/// sandboxes free (`[container] hold_freed_memory`) and how many destroyed containers'
/// cgroups it keeps for the next creates (`[container] spare_cgroups`).
#[derive(clap::Args, Debug)]
pub struct ContainerNodeOptions {
    /// Baseline for `hold_freed_memory`: the node leaves the host's free page reporting to a
    /// hypervisor on (`[container] hold_freed_memory = false`).
    #[arg(long)]
    report_freed_memory: bool,
    /// `[container] spare_cgroups` (the node's default unless given; 0 is the baseline that
    /// makes and removes every container's cgroups).
    #[arg(long)]
    spare_cgroups: Option<usize>,
    /// `[container] writable_layer`: `auto` (the default), `disk` (on the node's disk, an
    /// image per layer where the kernel has no XFS quotas)
    /// or `memory` (a tmpfs charged to the container's memory).
    #[arg(long)]
    writable_layer: Option<String>,
}

impl ContainerNodeOptions {
    /// The node configuration that says it.
    pub fn node_config(&self) -> String {
        let mut text = format!("[container]\nhold_freed_memory = {}\n", !self.report_freed_memory);
        if let Some(n) = self.spare_cgroups {
            text.push_str(&format!("spare_cgroups = {n}\n"));
        }
        if let Some(layer) = &self.writable_layer {
            text.push_str(&format!("writable_layer = {layer:?}\n"));
        }
        text
    }

    /// `spare_cgroups` as given (`None`: the node's default), for a bench's JSON.
    pub fn spare_cgroups(&self) -> Option<usize> {
        self.spare_cgroups
    }
}

/// Whether the node's host reports free memory to a hypervisor, from brigd's metrics:
/// `absent`, `reporting` or `held` (a page reported costs far more to touch again; see
/// docs/density.md).
pub fn free_page_reporting(daemon: &brig_tests::Daemon) -> &'static str {
    let metrics = brig_tests::net::metrics_text(daemon.state_dir()).unwrap_or_default();
    ["absent", "reporting", "held"]
        .into_iter()
        .find(|s| {
            let series = format!("brig_host_free_page_reporting{{state=\"{s}\"}} ");
            brig_tests::net::metric(&metrics, &series) == 1.0
        })
        .unwrap_or("unknown")
}

/// The memory cgroup shrinker ids the host reserved this boot, from brigd's metrics (0 if
/// none; docs/density.md).
pub fn shrinker_ids_reserved(daemon: &brig_tests::Daemon) -> u64 {
    let metrics = brig_tests::net::metrics_text(daemon.state_dir()).unwrap_or_default();
    brig_tests::net::metric(&metrics, "brig_host_shrinker_ids_reserved ") as u64
}

/// A `/proc/meminfo` field (`key` with its colon, e.g. `MemAvailable:`), in KiB.
pub fn meminfo_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key).and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        })
        .unwrap_or(0)
}
