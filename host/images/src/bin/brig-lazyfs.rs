//! `brig-lazyfs`: serves the node's lazy blob file system in a process of its own, so that a
//! brigd crash or restart does not take the data devices of running containers' layers with it
//! (see `brig_images::lazy_server`). brigd starts it; it is not meant to be run by hand.
//!
//! ```text
//! brig-lazyfs --config '<ServerConfig as JSON>'
//! brig-lazyfs --keep-device <pid>:<fd>     # the device keeper (`brig_images::device_keeper`)
//! ```
#![forbid(unsafe_code)]

use anyhow::Context;
use brig_images::device_keeper::keep_device;
use brig_images::lazy_server::{serve, ServerConfig};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "brig-lazyfs", version, about = "Brig's lazy blob file system server")]
struct Cli {
    /// The server's configuration, as JSON.
    #[arg(long, required_unless_present = "keep_device", conflicts_with = "keep_device")]
    config: Option<String>,
    /// Hold a copy of process PID's descriptor FD (the mount's `/dev/fuse`) until killed.
    #[arg(long, value_name = "PID:FD")]
    keep_device: Option<String>,
    /// Log filter.
    #[arg(long, default_value = "info")]
    log: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        // A log write that fails (its file's disk is full) is dropped: by default the
        // subscriber reports it with `eprintln!`, which panics the logging task on the same
        // full disk (an exec on a full state disk lost its reply that way).
        .log_internal_errors(false)
        .with_ansi(false)
        .init();
    if let Some(device) = &cli.keep_device {
        let (pid, fd) = device.split_once(':').context("--keep-device takes PID:FD")?;
        keep_device(pid.parse()?, fd.parse()?)?;
        return Ok(());
    }
    let config: ServerConfig = serde_json::from_str(cli.config.as_deref().unwrap_or_default())?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(serve(config))?;
    Ok(())
}
