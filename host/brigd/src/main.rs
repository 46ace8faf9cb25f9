//! `brigd`: the Brig daemon binary. See `brigd --help`.
// Only `allocator` calls an unsafe API (glibc's `mallopt`).
#![deny(unsafe_code)]

mod allocator;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Brig daemon: runs sandboxes for LLM agents (fncall on Wasmtime, Linux containers) behind a
/// QUIC API.
///
/// With no arguments it runs the all-in-one role (control plane and node in one process) on
/// 127.0.0.1:7070 with its state under the user's data directory.
#[derive(Parser, Debug)]
#[command(name = "brigd", version)]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,

    /// Address to listen on (UDP, QUIC). Port 0 picks a free port (see endpoint.json).
    #[arg(long, default_value = "127.0.0.1:7070", env = "BRIG_LISTEN", global = true)]
    listen: SocketAddr,

    /// State directory: token, TLS identity, tools, sandboxes. Default: $BRIG_STATE_DIR or
    /// <data dir>/brig.
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,

    /// Directory of `*.wasm` tool components to register at start (repeatable).
    #[arg(long = "tools-dir", env = "BRIG_TOOLS_DIR", global = true, value_delimiter = ':')]
    tools_dirs: Vec<PathBuf>,

    /// Directory of container layer images (`<name>.erofs`); default <state>/images.
    #[arg(long, env = "BRIG_IMAGES_DIR", global = true)]
    images_dir: Option<PathBuf>,

    /// What happens to running containers when brigd exits: `keep` (they keep running and the
    /// next brigd takes them back) or `destroy`. Overrides `on_exit` in the config file.
    #[arg(long, env = "BRIG_ON_EXIT", global = true)]
    on_exit: Option<brig_node::OnExit>,

    /// Node configuration file (TOML; fields of NodeConfig, unknown fields are errors).
    #[arg(long, global = true)]
    config: Option<PathBuf>,

    /// Prometheus metrics endpoint (plain HTTP, `GET /metrics`); `off` serves none.
    #[arg(long, default_value = "127.0.0.1:9464", env = "BRIG_METRICS", global = true)]
    metrics: String,

    /// An egress service sandboxes may name in their rules: `NAME=DEST[,DEST…]` where DEST is
    /// `10.1.2.3`, `10.0.0.0/8`, `10.1.2.3:443` (repeatable).
    #[arg(long = "egress-service", global = true, value_parser = parse_service)]
    egress_services: Vec<(String, Vec<brig_core::Destination>)>,

    /// The E2B-compatible API (HTTP; E2B's control API and envd): an address, or `off`.
    /// Overrides `[e2b] listen` in the config file (default 127.0.0.1:3000).
    #[arg(long, env = "BRIG_E2B_LISTEN", global = true)]
    e2b_listen: Option<String>,

    /// Log filter, e.g. `info`, `brig_node=debug` (RUST_LOG syntax).
    #[arg(long, default_value = "info", env = "BRIG_LOG", global = true)]
    log: String,
}

#[derive(Subcommand, Debug, Clone)]
enum Role {
    /// Control plane and node in one process (the default).
    All,
    /// A node of a cluster: serves sandboxes, reports to control-plane replicas.
    Node {
        /// A control-plane replica as `ADDR=CERT_SHA256` (repeatable; report to each).
        #[arg(long = "control", required = true)]
        controls: Vec<brigd::cluster::ControlAddr>,
        /// File holding the admin access token that admits this node at the control plane.
        #[arg(long)]
        join_token_file: PathBuf,
        /// This node's id (unique in the cluster; sandbox ids carry it).
        #[arg(long)]
        node_id: Option<u32>,
        /// Address clients reach this node at; default: the bound address.
        #[arg(long)]
        advertise: Option<SocketAddr>,
    },
    /// A control-plane replica: placement, routes, projects and quotas.
    Control {
        /// etcd endpoints (comma-separated), where replicas keep the cluster state; default:
        /// a local file (one replica).
        #[arg(long, value_delimiter = ',')]
        etcd: Vec<String>,
        /// Choices sampled per placement.
        #[arg(long, default_value_t = 2)]
        k: usize,
        /// A node silent this long (milliseconds) is down and its sandboxes are lost.
        #[arg(long, default_value_t = 3000)]
        down_after_ms: u64,
    },
}

fn main() -> anyhow::Result<()> {
    allocator::one_arena_per_core();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&args.log)?)
        .with_writer(std::io::stderr)
        // A log write that fails (its file's disk is full) is dropped: by default the
        // subscriber reports it with `eprintln!`, which panics the logging task on the same
        // full disk (an exec on a full state disk lost its reply that way).
        .log_internal_errors(false)
        .init();
    let (mut node, mut e2b) = match &args.config {
        Some(path) => brigd::load_config(path)?,
        None => (brig_node::NodeConfig::default(), brig_e2b::E2bConfig::default()),
    };
    if let Some(listen) = &args.e2b_listen {
        e2b.listen = listen.clone();
    }
    if let Some(dir) = &args.images_dir {
        node.container.images_dir = Some(dir.clone());
    }
    if let Some(on_exit) = args.on_exit {
        node.on_exit = on_exit;
    }
    node.egress_services.extend(args.egress_services.iter().cloned());
    let metrics = match args.metrics.as_str() {
        "off" | "" => None,
        addr => {
            Some(addr.parse::<SocketAddr>().map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?)
        }
    };
    let role = match args.role.clone().unwrap_or(Role::All) {
        Role::All => brigd::RoleOptions::All,
        Role::Node { controls, join_token_file, node_id, advertise } => {
            if let Some(id) = node_id {
                node.node_id = id;
            }
            let join_token = read_join_token(&join_token_file)?;
            brigd::RoleOptions::Node { controls, join_token, advertise }
        }
        Role::Control { etcd, k, down_after_ms } => {
            brigd::RoleOptions::Control(brigd::cluster::ControlOptions {
                etcd,
                config: brig_control::ControlConfig {
                    k,
                    down_after: std::time::Duration::from_millis(down_after_ms),
                    ..Default::default()
                },
            })
        }
    };
    let opts = brigd::DaemonOptions {
        listen: args.listen,
        state_dir: args.state_dir.clone().unwrap_or_else(brigd::default_state_dir),
        tools_dirs: args.tools_dirs.clone(),
        node,
        metrics,
        role,
        e2b,
    };
    brig_transport::tls::install_default_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(brigd::run(opts, shutdown_signal()))
}

/// The first token line of a token file.
fn read_join_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--join-token-file {}: {e}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("{} holds no token", path.display()))
}

fn parse_service(s: &str) -> Result<(String, Vec<brig_core::Destination>), String> {
    let (name, dests) = s.split_once('=').ok_or("expected NAME=DEST[,DEST…]")?;
    let dests = dests
        .split(',')
        .map(|d| d.trim().parse::<brig_core::Destination>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.trim().to_string(), dests))
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
    }
}
