//! `brig image build`: a Dockerfile and its context built by the node, its steps and their
//! output shown as they go (on stderr; the result on stdout).

use std::path::PathBuf;

use brig_sdk::{BuildEvent, BuildEventKind, BuildOptions, Client};
use clap::Args;
use serde_json::json;

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The build context: the directory COPY and ADD read from.
    context: PathBuf,
    /// The Dockerfile (default: CONTEXT/Dockerfile).
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// The environment it makes (`--image env:NAME` creates from it).
    #[arg(long)]
    name: String,
    /// A value for an ARG: NAME=VALUE (repeatable).
    #[arg(long = "build-arg", value_parser = crate::parse_pair)]
    build_args: Vec<(String, String)>,
    /// Run every step, taking nothing from the step cache.
    #[arg(long)]
    no_cache: bool,
}

/// How one event shows: `Step 2/9 : RUN make` (` (cached)`), the step's output as it comes,
/// the step's time.
fn show(event: &BuildEvent) {
    match &event.kind {
        BuildEventKind::Started { text, cached } => {
            let cached = if *cached { " (cached)" } else { "" };
            eprintln!("Step {}/{} : {text}{cached}", event.step, event.steps);
        }
        BuildEventKind::Log { text, .. } => eprint!("{text}"),
        BuildEventKind::Finished { millis } => {
            eprintln!(" ---> step {} done in {:.1} s", event.step, *millis as f64 / 1000.0)
        }
    }
}

pub async fn build(client: &Client, args: BuildArgs, json: bool) -> anyhow::Result<i32> {
    let file = args.file.unwrap_or_else(|| args.context.join("Dockerfile"));
    let text = std::fs::read_to_string(&file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let mut options = BuildOptions::dockerfile(&args.name, &text).context(&args.context);
    for (k, v) in &args.build_args {
        options = options.build_arg(k, v);
    }
    if args.no_cache {
        options = options.no_cache();
    }
    let built = client
        .build_image(options, |e| {
            if !json {
                show(e)
            }
        })
        .await?;
    if json {
        println!(
            "{}",
            json!({"name": built.name, "layers": built.layers, "steps_run": built.steps_run, "steps_cached": built.steps_cached})
        );
    } else {
        println!(
            "env:{} ({} layers; {} steps run, {} from the cache)",
            built.name,
            built.layers.len(),
            built.steps_run,
            built.steps_cached
        );
    }
    Ok(0)
}
