//! Human and JSON output of the CLI.

use std::io::Write;

use brig_sdk::{
    CallOutcome, CallResult, FileKind, FileStat, SandboxInfo, Tier, ToolInfo, ToolWorld,
};
use serde_json::{json, Value};

pub fn parse_tier(s: &str) -> anyhow::Result<Tier> {
    Ok(match s {
        "fncall" => Tier::Fncall,
        "container" => Tier::Container,
        "microvm" => Tier::Microvm,
        "fullvm" => Tier::Fullvm,
        other => anyhow::bail!("unknown tier {other:?} (fncall, container, microvm, fullvm)"),
    })
}

pub fn parse_placement(s: &str) -> Result<brig_sdk::Placement, String> {
    match s {
        "host" | "host-kernel" => Ok(brig_sdk::Placement::HostKernel),
        "vm" => Ok(brig_sdk::Placement::Vm),
        other => Err(format!("unknown placement {other:?} (host, vm)")),
    }
}

fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::Fncall => "fncall",
        Tier::Container => "container",
        Tier::Microvm => "microvm",
        Tier::Fullvm => "fullvm",
    }
}

/// Prints a JSON value or a human line.
pub fn line(json: bool, value: &Value, human: &str) {
    if json {
        println!("{value}");
    } else {
        println!("{human}");
    }
}

/// Prints a call result; returns the process exit status.
pub fn call_result(r: &CallResult, json: bool) -> i32 {
    let status = match &r.outcome {
        CallOutcome::Ok => 0,
        CallOutcome::Exit(code) => *code,
        _ => 1,
    };
    if json {
        let detail = match &r.outcome {
            CallOutcome::ToolError(m) | CallOutcome::Trap(m) => Value::String(m.clone()),
            CallOutcome::Exit(c) => json!(c),
            _ => Value::Null,
        };
        println!(
            "{}",
            json!({
                "outcome": r.outcome_name(),
                "detail": detail,
                "output": r.output,
                "stdout": r.stdout_text(),
                "stderr": r.stderr_text(),
                "duration_us": r.duration_us,
            })
        );
        return status;
    }
    let _ = std::io::stdout().write_all(&r.stdout);
    let _ = std::io::stderr().write_all(&r.stderr);
    if !r.output.is_empty() {
        println!("{}", r.output);
    }
    match &r.outcome {
        CallOutcome::Ok | CallOutcome::Exit(0) => {}
        CallOutcome::ToolError(m) => eprintln!("brig: tool error: {m}"),
        CallOutcome::Trap(m) => eprintln!("brig: guest trapped: {m}"),
        _ => eprintln!("brig: call ended: {}", r.outcome_name()),
    }
    status
}

fn sandbox_json(s: &SandboxInfo) -> Value {
    json!({
        "id": s.id,
        "tier": tier_name(s.tier),
        "state": format!("{:?}", s.state).to_lowercase(),
        "labels": s.labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
        "created_unix_ms": s.created_unix_ms,
        "last_used_unix_ms": s.last_used_unix_ms,
        "idle_ttl_ms": s.idle_ttl_ms,
        "idle_action": format!("{:?}", s.idle_action).to_lowercase(),
        "paused_ttl_ms": s.paused_ttl_ms,
        "max_lifetime_ms": s.max_lifetime_ms,
        "paused_unix_ms": s.paused_unix_ms,
        "image": s.image,
        "placement": s.placement,
        "cpu_ns": s.usage.map(|u| u.cpu_ns),
        "memory_bytes": s.usage.map(|u| u.memory_bytes),
    })
}

fn labels_text(s: &SandboxInfo) -> String {
    s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

pub fn sandbox(s: &SandboxInfo, json: bool, id_only: bool) {
    if json {
        println!("{}", sandbox_json(s));
    } else if id_only {
        println!("{}", s.id);
    } else {
        println!("id:        {}", s.id);
        println!("tier:      {}", tier_name(s.tier));
        println!("state:     {:?}", s.state);
        println!("labels:    {}", labels_text(s));
        if let Some(image) = &s.image {
            println!("image:     {image}");
        }
        if let Some(placement) = &s.placement {
            println!("runs on:   {placement}");
        }
        let action = format!("{:?}", s.idle_action).to_lowercase();
        println!("idle ttl:  {} s, then {action}", s.idle_ttl_ms / 1000);
        if let Some(ms) = s.paused_ttl_ms {
            println!("paused ttl: {} s", ms / 1000);
        }
        if let Some(ms) = s.max_lifetime_ms {
            println!("lifetime:  {} s at most", ms / 1000);
        }
        if let Some(u) = &s.usage {
            println!("cpu used:  {:.3} s", u.cpu_ns as f64 / 1e9);
            println!("memory:    {:.1} MiB", u.memory_bytes as f64 / f64::from(1 << 20));
        }
    }
}

pub fn sandboxes(list: &[SandboxInfo], json: bool) {
    if json {
        println!("{}", Value::Array(list.iter().map(sandbox_json).collect()));
        return;
    }
    println!("{:<30} {:<10} {:<8} {:<12} LABELS", "ID", "TIER", "STATE", "RUNS ON");
    for s in list {
        println!(
            "{:<30} {:<10} {:<8} {:<12} {}",
            s.id,
            tier_name(s.tier),
            format!("{:?}", s.state),
            s.placement.as_deref().unwrap_or("-"),
            labels_text(s)
        );
    }
}

pub fn execs(list: &[brig_sdk::ExecInfo], json: bool) {
    if json {
        let items: Vec<Value> = list
            .iter()
            .map(|e| json!({ "exec_id": e.exec_id, "argv": e.argv, "running": e.result.is_none(), "exit_code": e.result.as_ref().and_then(|r| r.exit_code), "buffered_bytes": e.buffered_bytes }))
            .collect();
        println!("{}", Value::Array(items));
        return;
    }
    println!("{:<8} {:<12} COMMAND", "EXEC", "STATUS");
    for e in list {
        let status = match &e.result {
            None => "running".to_string(),
            Some(r) => match (r.exit_code, r.signal) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(sig)) => format!("signal {sig}"),
                (None, None) => "ended".to_string(),
            },
        };
        println!("{:<8} {:<12} {}", e.exec_id, status, e.argv.join(" "));
    }
}

pub fn tools(list: &[ToolInfo], json: bool) {
    let world = |w: &ToolWorld| match w {
        ToolWorld::Tool => "tool",
        ToolWorld::Command => "command",
    };
    if json {
        let items: Vec<Value> = list
            .iter()
            .map(|t| json!({ "name": t.name, "digest": t.digest, "world": world(&t.world), "description": t.description, "size_bytes": t.size_bytes }))
            .collect();
        println!("{}", Value::Array(items));
        return;
    }
    println!("{:<12} {:<8} {:>9}  {:<20} DESCRIPTION", "NAME", "WORLD", "SIZE", "DIGEST");
    for t in list {
        let short = t.digest.get(..19).unwrap_or(&t.digest);
        println!(
            "{:<12} {:<8} {:>9}  {:<20} {}",
            t.name,
            world(&t.world),
            t.size_bytes,
            short,
            t.description
        );
    }
}

pub fn entries(list: &[FileStat], json: bool) {
    let kind = |k: FileKind| match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    };
    if json {
        let items: Vec<Value> = list
            .iter()
            .map(|e| json!({ "path": e.path, "kind": kind(e.kind), "size": e.size, "mode": format!("{:o}", e.mode), "modified_unix_ms": e.modified_unix_ms, "metadata": e.metadata }))
            .collect();
        println!("{}", Value::Array(items));
        return;
    }
    for e in list {
        let meta: Vec<String> = e.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let meta = if meta.is_empty() { String::new() } else { format!("  [{}]", meta.join(" ")) };
        println!("{:<8} {:>5o} {:>12}  {}{meta}", kind(e.kind), e.mode, e.size, e.path);
    }
}

/// Changes under a watched directory: a JSON object per change, or a line each.
pub fn file_events(batch: &brig_sdk::FileEvents, json: bool) {
    if batch.lost {
        eprintln!("brig: changes were lost (the directory changed faster than they were read)");
    }
    for e in &batch.events {
        let change = format!("{:?}", e.change).to_lowercase();
        if json {
            println!("{}", json!({ "path": e.path, "change": change, "dir": e.is_dir }));
        } else {
            println!("{change:<7} {}{}", e.path, if e.is_dir { "/" } else { "" });
        }
    }
}

/// What `brig doctor` found: one JSON object per stray, or a block per stray and a summary.
pub fn strays(found: &[brig_sdk::StrayObject], json: bool) {
    if json {
        for s in found {
            println!(
                "{}",
                json!({ "kind": s.kind, "name": s.name, "parts": s.parts, "removed": s.removed })
            );
        }
        return;
    }
    for s in found {
        let state = if s.removed { "removed" } else { "stray" };
        println!("{state} {} {}", s.kind, s.name);
        for part in &s.parts {
            println!("  {part}");
        }
    }
    match found.len() {
        0 => println!("nothing stray on the node's host"),
        n if found.iter().all(|s| s.removed) => println!("{n} stray objects removed"),
        n => println!("{n} stray objects (brig doctor --remove removes them)"),
    }
}
