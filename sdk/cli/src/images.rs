//! `brig image …`, `brig env …`, `brig checkpoint`, `brig node status`.

use std::path::PathBuf;

use brig_sdk::{Client, ImageFormat, ImageSource, LayerInfo};
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Import a layer from a directory, tarball, OCI archive or EROFS image.
    Import {
        path: PathBuf,
        /// `kind/name`, e.g. `toolkit/harness`.
        #[arg(long)]
        name: String,
        /// Version (default: the next one).
        #[arg(long)]
        version: Option<u32>,
        /// dir, tar, oci or erofs (default: dir for directories, else tar).
        #[arg(long)]
        format: Option<String>,
        /// The path is on the node: import without uploading.
        #[arg(long)]
        on_node: bool,
    },
    /// Pull an image from an OCI registry (`python:3.12-slim`, `localhost:5000/x:tag`): one
    /// layer per image layer, the image an environment (`--image env:NAME` creates from it).
    Pull {
        reference: String,
        /// The environment's name (default `pulled/<reference>`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Build an environment from a Dockerfile (one stage) and its context, each step a
    /// layer kept in a step cache: an unchanged rebuild runs nothing.
    Build(crate::build::BuildArgs),
    /// List layers.
    Ls,
    /// Show a layer (and its files with --files).
    Inspect {
        reference: String,
        #[arg(long)]
        files: bool,
    },
    /// Give a layer another name@version.
    Tag {
        reference: String,
        name: String,
        #[arg(long)]
        version: Option<u32>,
    },
    /// Remove a layer tag (refused while a sandbox uses it).
    Rm { reference: String },
    /// Fetch and check every chunk of a layer.
    Verify { reference: String },
    /// Delete layer data nothing references.
    Gc,
}

#[derive(Subcommand, Debug)]
pub enum EnvCommand {
    /// Define an environment from layers, base first.
    Create {
        name: String,
        #[arg(required = true)]
        layers: Vec<String>,
    },
    /// List environments.
    Ls,
}

fn layer_json(l: &LayerInfo) -> serde_json::Value {
    json!({
        "name": l.name, "version": l.version, "digest": l.digest, "data_bytes": l.data_bytes,
        "meta_bytes": l.meta_bytes, "chunks": l.chunks, "files": l.files, "source": l.source,
        "created_unix_ms": l.created_unix_ms, "new_chunks": l.new_chunks,
    })
}

fn print_layers(layers: &[LayerInfo], json: bool) {
    if json {
        println!("{}", serde_json::Value::Array(layers.iter().map(layer_json).collect()));
        return;
    }
    println!(
        "{:<32} {:>4} {:>10} {:>7} {:>7}  {:<20} SOURCE",
        "NAME", "VER", "DATA", "CHUNKS", "FILES", "DIGEST"
    );
    for l in layers {
        let short = l.digest.get(..19).unwrap_or(&l.digest);
        println!(
            "{:<32} {:>4} {:>9}M {:>7} {:>7}  {:<20} {}",
            l.name,
            l.version,
            l.data_bytes >> 20,
            l.chunks,
            l.files,
            short,
            l.source
        );
    }
}

fn format_of(text: &str) -> anyhow::Result<ImageFormat> {
    Ok(match text {
        "dir" => ImageFormat::Dir,
        "tar" => ImageFormat::Tar,
        "oci" => ImageFormat::Oci,
        "erofs" => ImageFormat::Erofs,
        other => anyhow::bail!("unknown format {other:?} (dir, tar, oci, erofs)"),
    })
}

pub async fn image(client: &Client, cmd: ImageCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        ImageCommand::Import { path, name, version, format, on_node } => {
            let format = match format {
                Some(f) => format_of(&f)?,
                None if path.is_dir() => ImageFormat::Dir,
                None => ImageFormat::Tar,
            };
            let source = match (on_node, format) {
                (true, format) => ImageSource::OnNode { path: path.display().to_string(), format },
                (false, ImageFormat::Dir) => ImageSource::Dir(path),
                (false, ImageFormat::Tar) => ImageSource::Tar(path),
                (false, ImageFormat::Oci) => ImageSource::Oci(path),
                (false, ImageFormat::Erofs) => ImageSource::Erofs(path),
            };
            let layer = client.import_image(&name, version, source).await?;
            if json {
                println!("{}", layer_json(&layer));
            } else {
                println!(
                    "{}@{} {} ({} chunks, {} new)",
                    layer.name, layer.version, layer.digest, layer.chunks, layer.new_chunks
                );
            }
        }
        ImageCommand::Pull { reference, name } => {
            let mut view = crate::pull_progress::PullView::new(json);
            let pulled = client
                .pull_image_with_progress(&reference, name.as_deref(), |p| view.show(p))
                .await?;
            view.finish();
            if json {
                let layers: Vec<_> = pulled
                    .layers
                    .iter()
                    .map(|l| json!({"layer": l.layer, "diff_id": l.diff_id, "reused": l.reused, "downloaded_bytes": l.downloaded_bytes}))
                    .collect();
                println!(
                    "{}",
                    json!({"name": pulled.name, "manifest_digest": pulled.manifest_digest, "layers": layers, "downloaded_bytes": pulled.downloaded_bytes})
                );
            } else {
                for l in &pulled.layers {
                    let how = if l.reused {
                        "already here".to_string()
                    } else {
                        format!("{} bytes", l.downloaded_bytes)
                    };
                    println!("  {} ({how})", l.layer);
                }
                println!(
                    "env:{} {} ({} bytes downloaded)",
                    pulled.name, pulled.manifest_digest, pulled.downloaded_bytes
                );
            }
        }
        ImageCommand::Build(args) => return crate::build::build(client, args, json).await,
        ImageCommand::Ls => print_layers(&client.images().await?, json),
        ImageCommand::Inspect { reference, files } => {
            let (layer, paths) = client.inspect_image(&reference).await?;
            if json {
                let mut v = layer_json(&layer);
                v["paths"] = json!(paths);
                println!("{v}");
            } else {
                print_layers(&[layer], false);
                if files {
                    for p in paths {
                        println!("{p}");
                    }
                }
            }
        }
        ImageCommand::Tag { reference, name, version } => {
            print_layers(&[client.tag_image(&reference, &name, version).await?], json)
        }
        ImageCommand::Rm { reference } => {
            client.remove_image(&reference).await?;
            crate::output::line(json, &json!({ "removed": reference }), &reference);
        }
        ImageCommand::Verify { reference } => {
            let layer = client.verify_image(&reference).await?;
            crate::output::line(
                json,
                &layer_json(&layer),
                &format!("{reference}: all {} chunks present and intact", layer.chunks),
            );
        }
        ImageCommand::Gc => {
            let r = client.gc_images().await?;
            let text = format!(
                "removed {} layers, {} chunks, {} bytes",
                r.removed_layers, r.removed_chunks, r.freed_bytes
            );
            crate::output::line(
                json,
                &json!({ "removed_layers": r.removed_layers, "removed_chunks": r.removed_chunks, "freed_bytes": r.freed_bytes }),
                &text,
            );
        }
    }
    Ok(0)
}

pub async fn env(client: &Client, cmd: EnvCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        EnvCommand::Create { name, layers } => {
            let refs: Vec<&str> = layers.iter().map(String::as_str).collect();
            client.create_env(&name, &refs).await?;
            crate::output::line(
                json,
                &json!({ "env": name, "layers": layers }),
                &format!("env:{name} = {}", layers.join(" + ")),
            );
        }
        EnvCommand::Ls => {
            let envs = client.envs().await?;
            if json {
                println!(
                    "{}",
                    json!(envs
                        .iter()
                        .map(|(n, l)| json!({ "name": n, "layers": l }))
                        .collect::<Vec<_>>())
                );
            } else {
                for (name, layers) in envs {
                    println!("env:{name} = {}", layers.join(" + "));
                }
            }
        }
    }
    Ok(0)
}
