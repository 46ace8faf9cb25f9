//! `brig image build`: a Dockerfile and its context built by the node, its steps and their
//! output shown as they go (on stderr; the result on stdout).

use std::path::PathBuf;

use brig_sdk::{BuildEvent, BuildEventKind, BuildOptions, Client};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::io::IsTerminal;

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

/// How a build shows on stderr: on a terminal, a spinner per step (its time; `cached` or
/// `done` when it ends) with the step's output printed above; otherwise plain lines:
/// `Step 2/9 : RUN make` (` (cached)`), the output as it comes, the step's time.
struct BuildView {
    terminal: Option<(MultiProgress, Option<ProgressBar>)>,
}

impl BuildView {
    fn new() -> BuildView {
        let terminal = std::io::stderr()
            .is_terminal()
            .then(|| (MultiProgress::with_draw_target(ProgressDrawTarget::stderr()), None));
        BuildView { terminal }
    }

    fn show(&mut self, event: &BuildEvent) {
        let Some((multi, current)) = &mut self.terminal else {
            return plain(event);
        };
        match &event.kind {
            BuildEventKind::Started { text, cached } => {
                let bar = multi.add(ProgressBar::new_spinner());
                let style =
                    ProgressStyle::with_template("{spinner} {prefix} {wide_msg} {elapsed:>4}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner());
                bar.set_style(style);
                bar.set_prefix(format!("[{}/{}]", event.step, event.steps));
                bar.set_message(text.clone());
                if *cached {
                    bar.finish_with_message(format!("{text} (cached)"));
                } else {
                    bar.enable_steady_tick(std::time::Duration::from_millis(100));
                    *current = Some(bar);
                }
            }
            BuildEventKind::Log { text, .. } => {
                for line in text.lines() {
                    let _ = multi.println(format!("    {line}"));
                }
            }
            BuildEventKind::Finished { millis } => {
                if let Some(bar) = current.take() {
                    let text = bar.message();
                    bar.finish_with_message(format!("{text} ({:.1} s)", *millis as f64 / 1000.0));
                }
            }
        }
    }
}

fn plain(event: &BuildEvent) {
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
    let mut view = BuildView::new();
    let built = client
        .build_image(options, |e| {
            if !json {
                view.show(e)
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
