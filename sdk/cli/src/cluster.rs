//! `brig cluster|project|token`: a cluster's nodes, its projects and their limits, and access
//! tokens for projects. These talk to a control-plane replica.

use brig_sdk::{Client, ProjectLimits};
use clap::Subcommand;

use crate::output;

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The control plane's nodes: health, tiers, sandboxes, load.
    Cluster,
    /// Projects and their limits (`set` needs an admin token).
    #[command(subcommand)]
    Project(ProjectCommand),
    /// Print this CLI's access token, or with a project make one for it (admin: its holder
    /// sees only that project). Tokens are E2B API keys (`e2b_<hex>`), for `E2B_API_KEY`.
    Token { project: Option<String> },
}

#[derive(Subcommand, Debug)]
pub enum ProjectCommand {
    /// Create or change a project (`team/a` is also held to `team`'s limits).
    Set {
        name: String,
        /// Most live sandboxes at once.
        #[arg(long)]
        max_live: Option<u64>,
        /// Most creates per second.
        #[arg(long)]
        max_creates_per_sec: Option<u32>,
    },
    /// Projects with their limits and live sandboxes.
    List,
}

pub async fn run(client: &Client, cmd: ClusterCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        ClusterCommand::Cluster => {
            let nodes = client.cluster_status().await?;
            if json {
                println!("{}", serde_json::to_string(&nodes_json(&nodes))?);
                return Ok(0);
            }
            println!(
                "{:<10} {:<22} {:<6} {:>9} {:>6}  tiers",
                "node", "addr", "health", "sandboxes", "load"
            );
            for n in &nodes {
                let tiers: Vec<String> =
                    n.tiers.iter().map(|t| format!("{t:?}").to_lowercase()).collect();
                println!(
                    "{:08x}   {:<22} {:<6} {:>9} {:>5.1}%  {}",
                    n.node,
                    n.addr,
                    if n.healthy { "up" } else { "down" },
                    n.sandboxes,
                    f64::from(n.load_permille) / 10.0,
                    tiers.join(",")
                );
            }
        }
        ClusterCommand::Project(ProjectCommand::Set { name, max_live, max_creates_per_sec }) => {
            client.set_project(&name, ProjectLimits { max_live, max_creates_per_sec }).await?;
            output::line(json, &serde_json::json!({ "project": name }), &format!("{name}: set"));
        }
        ClusterCommand::Project(ProjectCommand::List) => {
            for p in client.projects().await? {
                let limit = |v: Option<String>| v.unwrap_or_else(|| "-".into());
                let human = format!(
                    "{:<24} live {:>6}  max_live {:>6}  max_creates_per_sec {:>6}",
                    p.name,
                    p.live,
                    limit(p.limits.max_live.map(|v| v.to_string())),
                    limit(p.limits.max_creates_per_sec.map(|v| v.to_string()))
                );
                let value = serde_json::json!({
                    "name": p.name, "live": p.live,
                    "max_live": p.limits.max_live,
                    "max_creates_per_sec": p.limits.max_creates_per_sec,
                });
                output::line(json, &value, &human);
            }
        }
        // Answered before connecting (see `main`).
        ClusterCommand::Token { project: None } => {}
        ClusterCommand::Token { project: Some(project) } => {
            let token = client.create_token(&project).await?;
            output::line(json, &serde_json::json!({ "project": project, "token": token }), &token);
        }
    }
    Ok(0)
}

fn nodes_json(nodes: &[brig_sdk::NodeSummary]) -> serde_json::Value {
    serde_json::Value::Array(
        nodes
            .iter()
            .map(|n| {
                serde_json::json!({
                    "node": n.node, "addr": n.addr, "healthy": n.healthy,
                    "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago,
                    "sandboxes": n.sandboxes, "load_permille": n.load_permille,
                })
            })
            .collect(),
    )
}
