//! `brig pause|resume|fork|ttl|attach|execs`: sandbox lifecycles.

use std::time::Duration;

use anyhow::bail;
use brig_sdk::{Client, IdleAction, Lifetimes};
use clap::Subcommand;

use crate::output;

#[derive(Subcommand, Debug)]
pub enum LifecycleCommand {
    /// Pause sandboxes (freeze their processes, push out their memory); the next request to
    /// one resumes it. With --files-only, end every process instead and give all the memory
    /// back: the resume starts it with nothing running.
    Pause(Selection),
    /// Resume paused sandboxes.
    Resume(Selection),
    /// Clone a sandbox's files into N new sandboxes and print their ids.
    Fork {
        id: String,
        #[arg(short = 'n', long, default_value_t = 1)]
        count: u32,
        /// Extra label for the children, key=value (repeatable).
        #[arg(long = "label", value_parser = crate::parse_pair)]
        labels: Vec<(String, String)>,
    },
    /// Change a sandbox's lifetimes.
    Ttl {
        id: String,
        /// Seconds without a request before the idle action.
        #[arg(long)]
        idle_s: Option<u64>,
        /// What the idle TTL does: pause, pause-files-only or destroy.
        #[arg(long, value_parser = parse_action)]
        idle_action: Option<IdleAction>,
        /// Destroy after being paused this many seconds (0 removes the limit).
        #[arg(long)]
        paused_s: Option<u64>,
        /// Destroy this many seconds after creation (0 removes the limit).
        #[arg(long)]
        max_lifetime_s: Option<u64>,
    },
    /// Follow a command started earlier: all its kept output, then the rest, then its status.
    Attach { id: String, exec_id: u64 },
    /// Write this program's stdin to a running command's streamed stdin, by exec id (also
    /// after a brigd restart); with --close, then end the command's input.
    Input {
        id: String,
        exec_id: u64,
        #[arg(long)]
        close: bool,
    },
    /// List a sandbox's running and recently finished commands.
    Execs { id: String },
}

/// One sandbox by id, or every sandbox with the given labels.
#[derive(clap::Args, Debug)]
pub struct Selection {
    ids: Vec<String>,
    /// Every sandbox with this label, key=value (repeatable; all must match).
    #[arg(long = "label", value_parser = crate::parse_pair)]
    labels: Vec<(String, String)>,
    /// (pause) Keep the files only: every process ends.
    #[arg(long)]
    files_only: bool,
}

fn parse_action(s: &str) -> Result<IdleAction, String> {
    match s {
        "pause" => Ok(IdleAction::Pause),
        "pause-files-only" => Ok(IdleAction::PauseFilesOnly),
        "destroy" => Ok(IdleAction::Destroy),
        other => Err(format!("expected pause, pause-files-only or destroy, got {other:?}")),
    }
}

fn optional_secs(s: u64) -> Option<Duration> {
    (s > 0).then(|| Duration::from_secs(s))
}

pub async fn run(client: &Client, cmd: LifecycleCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        LifecycleCommand::Pause(sel) => select(client, sel, true, json).await,
        LifecycleCommand::Resume(sel) => select(client, sel, false, json).await,
        LifecycleCommand::Fork { id, count, labels } => {
            let refs: Vec<(&str, &str)> =
                labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let children = client.sandbox(&id).fork_labeled(count, &refs).await?;
            let ids: Vec<&str> = children.iter().map(|c| c.id()).collect();
            output::line(json, &serde_json::json!({ "forked": ids }), &ids.join("\n"));
            Ok(0)
        }
        LifecycleCommand::Ttl { id, idle_s, idle_action, paused_s, max_lifetime_s } => {
            let mut lifetimes = Lifetimes::new();
            if let Some(s) = idle_s {
                lifetimes = lifetimes.idle_ttl(Duration::from_secs(s));
            }
            if let Some(a) = idle_action {
                lifetimes = lifetimes.idle_action(a);
            }
            if let Some(s) = paused_s {
                lifetimes = lifetimes.paused_ttl(optional_secs(s));
            }
            if let Some(s) = max_lifetime_s {
                lifetimes = lifetimes.max_lifetime(optional_secs(s));
            }
            output::sandbox(&client.sandbox(&id).set_lifetimes(lifetimes).await?, json, false);
            Ok(0)
        }
        LifecycleCommand::Attach { id, exec_id } => {
            let stream = client.sandbox(&id).attach(exec_id).await?;
            crate::shell::follow(stream, false, json).await
        }
        LifecycleCommand::Input { id, exec_id, close } => {
            use tokio::io::AsyncReadExt;
            let sandbox = client.sandbox(&id);
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = stdin.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                sandbox.write_stdin(exec_id, &buf[..n]).await?;
            }
            if close {
                sandbox.close_stdin(exec_id).await?;
            }
            Ok(0)
        }
        LifecycleCommand::Execs { id } => {
            output::execs(&client.sandbox(&id).execs().await?, json);
            Ok(0)
        }
    }
}

async fn select(client: &Client, sel: Selection, pause: bool, json: bool) -> anyhow::Result<i32> {
    if sel.files_only && !pause {
        bail!("--files-only is for pause");
    }
    let ids = match (sel.ids.is_empty(), sel.labels.is_empty()) {
        (false, true) => {
            for id in &sel.ids {
                let sandbox = client.sandbox(id);
                if pause && sel.files_only {
                    sandbox.pause_files_only().await?;
                } else if pause {
                    sandbox.pause().await?;
                } else {
                    sandbox.resume().await?;
                }
            }
            sel.ids
        }
        (true, false) => {
            let refs: Vec<(&str, &str)> =
                sel.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            if pause && sel.files_only {
                client.pause_files_only_matching(&refs).await?
            } else if pause {
                client.pause_matching(&refs).await?
            } else {
                client.resume_matching(&refs).await?
            }
        }
        _ => bail!("give sandbox ids or --label selectors (not both)"),
    };
    let key = if pause { "paused" } else { "resumed" };
    output::line(json, &serde_json::json!({ key: ids }), &ids.join("\n"));
    Ok(0)
}
