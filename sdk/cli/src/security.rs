//! `brig egress|audit`: egress rules and the audit trail.

use brig_sdk::{AuditEvent, AuditKind, Client, QosClass};
use clap::Subcommand;

use crate::output;

#[derive(Subcommand, Debug)]
pub enum SecurityCommand {
    /// Replace a sandbox's egress rules (none: deny everything); gives it a link if needed.
    Egress {
        id: String,
        /// Service names (`pypi`) and destinations (`10.1.2.3:8080`, `10.0.0.0/8`).
        rules: Vec<String>,
    },
    /// Move a sandbox to another CPU QoS class: `latency-sensitive` or `best-effort`.
    Qos {
        id: String,
        #[arg(value_parser = parse_qos)]
        class: QosClass,
    },
    /// Show a sandbox's audit trail: commands, files, egress, policy and lifecycle events.
    Audit {
        id: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Keep following new events until the sandbox is gone.
        #[arg(short, long)]
        follow: bool,
    },
}

pub async fn run(client: &Client, cmd: SecurityCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        SecurityCommand::Egress { id, rules } => {
            let info = client.sandbox(&id).set_egress(&rules).await?;
            let rules = info.egress.unwrap_or_default();
            let human = format!(
                "{id}: address {}, egress {}",
                info.address.as_deref().unwrap_or("-"),
                if rules.is_empty() { "deny all".to_string() } else { rules.join(" ") }
            );
            output::line(
                json,
                &serde_json::json!({ "id": id, "egress": rules, "address": info.address }),
                &human,
            );
        }
        SecurityCommand::Qos { id, class } => {
            let info = client.sandbox(&id).set_qos(class).await?;
            let qos = format!("{:?}", info.qos);
            output::line(
                json,
                &serde_json::json!({ "id": id, "qos": qos }),
                &format!("{id}: {qos}"),
            );
        }
        SecurityCommand::Audit { id, after, follow } => {
            let mut stream = client.sandbox(&id).audit_stream(after, follow).await?;
            while let Some(batch) = stream.next_batch().await? {
                for event in batch {
                    if json {
                        println!("{}", serde_json::to_string(&event)?);
                    } else {
                        println!("{}", describe(&event));
                    }
                }
            }
        }
    }
    Ok(0)
}

pub fn parse_qos(s: &str) -> Result<QosClass, String> {
    match s {
        "latency-sensitive" | "latency_sensitive" => Ok(QosClass::LatencySensitive),
        "best-effort" | "best_effort" => Ok(QosClass::BestEffort),
        other => Err(format!("expected latency-sensitive or best-effort, got {other:?}")),
    }
}

/// One line per event for people.
pub fn describe(e: &AuditEvent) -> String {
    let what = match &e.kind {
        AuditKind::ExecStart { exec_id, argv, user, cwd } => format!(
            "exec {exec_id} start: {}{}{}",
            argv.join(" "),
            user.as_deref().map(|u| format!(" (user {u})")).unwrap_or_default(),
            cwd.as_deref().map(|c| format!(" (cwd {c})")).unwrap_or_default()
        ),
        AuditKind::ExecEnd { exec_id, exit_code, outcome, duration_ms, stdout_bytes, stderr_bytes, truncated, .. } => format!(
            "exec {exec_id} end: {outcome} {} in {duration_ms} ms, {stdout_bytes} B out, {stderr_bytes} B err{}",
            exit_code.map(|c| format!("code {c}")).unwrap_or_default(),
            if *truncated { ", truncated" } else { "" }
        ),
        AuditKind::SessionCommand { session, command } => format!("session {session}: {command}"),
        AuditKind::Call { tool, outcome } => format!("call {tool}: {outcome}"),
        AuditKind::File { op, path, bytes, ok } => {
            format!("file {op} {path} ({bytes} B){}", if *ok { "" } else { " failed" })
        }
        AuditKind::Egress { allowed, proto, dst, port } => format!(
            "egress {} {proto} {dst}{}",
            if *allowed { "allowed" } else { "DENIED" },
            port.map(|p| format!(":{p}")).unwrap_or_default()
        ),
        AuditKind::Policy { rules } => format!("egress rules: [{}]", rules.join(", ")),
        AuditKind::Lifecycle { event, detail } => format!("{event} {detail}"),
    };
    format!("{:>5} {} {what}", e.seq, e.unix_ms)
}
