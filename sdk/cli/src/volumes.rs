//! `brig volume`: volumes, and their files with no sandbox (`brig create --volume` mounts one).

use std::path::PathBuf;

use anyhow::Context;
use brig_sdk::{Client, VolumeAttrs, VolumeEntry, VolumeInfo};
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Make a volume.
    Create {
        name: String,
        /// Its quota (default: the node's).
        #[arg(long)]
        quota_mib: Option<u64>,
    },
    /// List volumes.
    Ls,
    /// Show one volume: quota, use, and the sandboxes that mount it.
    Inspect { volume: String },
    /// Delete a volume and its files (refused while a sandbox mounts it).
    Rm { volume: String },
    /// Copy a local file into a volume.
    Put {
        volume: String,
        local: PathBuf,
        remote: String,
        /// Mode of a new file, octal (e.g. 640).
        #[arg(long, value_parser = parse_octal)]
        mode: Option<u32>,
    },
    /// Print a volume's file (or copy it to --out).
    Get {
        volume: String,
        remote: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List a volume's directory.
    Files {
        volume: String,
        #[arg(default_value = "/")]
        path: String,
        #[arg(long, default_value_t = 1)]
        depth: u32,
    },
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).map_err(|e| format!("expected octal mode, got {s:?}: {e}"))
}

/// `NAME:PATH[:ro]` of `brig create --volume`.
pub fn parse_mount(s: &str) -> Result<(String, String, bool), String> {
    let mut parts = s.splitn(3, ':');
    let (Some(name), Some(path)) = (parts.next(), parts.next()) else {
        return Err(format!("expected NAME:PATH[:ro], got {s:?}"));
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(other) => return Err(format!("expected ro or rw after the path, got {other:?}")),
    };
    Ok((name.to_string(), path.to_string(), read_only))
}

fn info_json(v: &VolumeInfo) -> serde_json::Value {
    json!({
        "id": v.id, "name": v.name, "project": v.project, "quota_bytes": v.quota_bytes,
        "used_bytes": v.used_bytes, "created_unix_ms": v.created_unix_ms, "mounted_by": v.mounted_by,
    })
}

fn entry_line(e: &VolumeEntry) -> String {
    let target = e.target.as_deref().map(|t| format!(" -> {t}")).unwrap_or_default();
    format!("{:o}\t{}:{}\t{}\t{}{target}", e.mode, e.uid, e.gid, e.size, e.path)
}

pub async fn run(client: &Client, cmd: VolumeCommand, json: bool) -> anyhow::Result<String> {
    Ok(match cmd {
        VolumeCommand::Create { name, quota_mib } => {
            let v = client.create_volume(&name, quota_mib).await?;
            if json {
                info_json(&v).to_string()
            } else {
                v.id
            }
        }
        VolumeCommand::Ls => {
            let list = client.volumes().await?;
            if json {
                serde_json::Value::Array(list.iter().map(info_json).collect()).to_string()
            } else {
                let lines: Vec<String> = list
                    .iter()
                    .map(|v| {
                        let (used, quota) = (v.used_bytes >> 20, v.quota_bytes >> 20);
                        let users = v.mounted_by.len();
                        format!("{}\t{}\t{used}/{quota} MiB\t{users} mounted", v.id, v.name)
                    })
                    .collect();
                lines.join("\n")
            }
        }
        VolumeCommand::Inspect { volume } => {
            let v = client.volume_info(&volume).await?;
            serde_json::to_string_pretty(&info_json(&v))?
        }
        VolumeCommand::Rm { volume } => {
            client.delete_volume(&volume).await?;
            String::new()
        }
        VolumeCommand::Put { volume, local, remote, mode } => {
            let file = tokio::fs::File::open(&local)
                .await
                .with_context(|| format!("opening {}", local.display()))?;
            let attrs = VolumeAttrs { mode, ..Default::default() };
            let e = client.volume(&volume).upload(&remote, file, attrs).await?;
            entry_line(&e)
        }
        VolumeCommand::Get { volume, remote, out } => {
            let vol = client.volume(&volume);
            match out {
                Some(path) => {
                    let file = tokio::fs::File::create(&path)
                        .await
                        .with_context(|| format!("creating {}", path.display()))?;
                    vol.download(&remote, file).await?;
                    String::new()
                }
                None => String::from_utf8_lossy(&vol.read_file(&remote).await?).into_owned(),
            }
        }
        VolumeCommand::Files { volume, path, depth } => {
            let entries = client.volume(&volume).list(&path, depth).await?;
            entries.iter().map(entry_line).collect::<Vec<_>>().join("\n")
        }
    })
}
