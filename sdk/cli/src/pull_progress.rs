//! How a pull's progress shows in the CLI: one bar per layer on a terminal (`indicatif`), and
//! a plain line per layer each time its state changes otherwise (logs, CI). Both on stderr,
//! so stdout keeps only the result.

use std::collections::HashMap;
use std::io::IsTerminal;

use brig_sdk::{PullLayerState, PullProgress};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shows the states of one pull as they arrive.
pub struct PullView {
    bars: Option<(MultiProgress, Vec<ProgressBar>)>,
    /// Plain output: the state last printed for each layer.
    printed: HashMap<String, PullLayerState>,
    terminal: bool,
    /// Shows nothing (`--json`: output is for programs).
    quiet: bool,
}

fn state_word(state: PullLayerState) -> &'static str {
    match state {
        PullLayerState::Waiting => "waiting",
        PullLayerState::Downloading => "downloading",
        PullLayerState::Converting => "converting",
        PullLayerState::Reused => "already here",
        PullLayerState::Done => "done",
    }
}

/// `sha256:0123456789ab` of a digest.
fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

impl PullView {
    /// A view for stderr: bars when it is a terminal, lines otherwise, nothing when `quiet`.
    pub fn new(quiet: bool) -> PullView {
        PullView {
            bars: None,
            printed: HashMap::new(),
            terminal: std::io::stderr().is_terminal(),
            quiet,
        }
    }

    pub fn show(&mut self, progress: &PullProgress) {
        if self.quiet {
            return;
        }
        if self.terminal {
            self.draw(progress);
        } else {
            self.print(progress);
        }
    }

    fn draw(&mut self, progress: &PullProgress) {
        let (_, bars) = self.bars.get_or_insert_with(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {bytes:>10}/{total_bytes:<10} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            let bars = progress
                .layers
                .iter()
                .map(|l| {
                    let bar = multi.add(ProgressBar::new(l.size));
                    bar.set_style(style.clone());
                    bar.set_prefix(short(&l.digest).to_string());
                    bar
                })
                .collect();
            (multi, bars)
        });
        for (bar, layer) in bars.iter().zip(&progress.layers) {
            let done = matches!(layer.state, PullLayerState::Reused | PullLayerState::Done);
            bar.set_position(if done { layer.size } else { layer.downloaded });
            bar.set_message(state_word(layer.state));
            if done && !bar.is_finished() {
                bar.finish();
            }
        }
    }

    fn print(&mut self, progress: &PullProgress) {
        let count = progress.layers.len();
        for (i, layer) in progress.layers.iter().enumerate() {
            if self.printed.get(&layer.digest) == Some(&layer.state) {
                continue;
            }
            self.printed.insert(layer.digest.clone(), layer.state);
            eprintln!(
                "layer {}/{count} {} ({}): {}",
                i + 1,
                short(&layer.digest),
                mib(layer.size),
                state_word(layer.state)
            );
        }
    }

    /// Leaves the bars as they are (finished), above the result.
    pub fn finish(self) {
        if let Some((_, bars)) = self.bars {
            for bar in bars {
                bar.finish();
            }
        }
    }
}
