//! Each sandbox's use over its life, for metrics over a time range (E2B's `get_metrics(start,
//! end)`): a sample every [`SAMPLE_EVERY`] (CPU time so far, memory then) while it runs. The
//! last [`RECENT_SAMPLES`] are kept at that rate; older ones move to an archive of at most
//! [`ARCHIVE_SAMPLES`] spread evenly over the rest of the life (when it fills, every other
//! one goes and its spacing doubles), so the whole life stays covered in bounded memory.

use std::collections::VecDeque;
use std::time::Duration;

use brig_proto::UsageSample;

use crate::Node;

/// How often each running sandbox's use is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept at the full rate (the last half hour).
pub const RECENT_SAMPLES: usize = 360;
/// Most older samples kept (24 bytes each, as the recent ones).
pub const ARCHIVE_SAMPLES: usize = 360;

/// One sandbox's samples, oldest first.
#[derive(Debug)]
pub(crate) struct UsageHistory {
    recent: VecDeque<UsageSample>,
    archive: Vec<UsageSample>,
    /// The least time between two archived samples.
    archive_every_ms: u64,
}

impl Default for UsageHistory {
    fn default() -> Self {
        UsageHistory {
            recent: VecDeque::new(),
            archive: Vec::new(),
            archive_every_ms: SAMPLE_EVERY.as_millis() as u64,
        }
    }
}

impl UsageHistory {
    pub(crate) fn push(&mut self, sample: UsageSample) {
        self.recent.push_back(sample);
        if self.recent.len() > RECENT_SAMPLES {
            if let Some(old) = self.recent.pop_front() {
                self.archive(old);
            }
        }
    }

    fn archive(&mut self, sample: UsageSample) {
        let due = self.archive.last().is_none_or(|last| {
            sample.unix_ms >= last.unix_ms.saturating_add(self.archive_every_ms)
        });
        if !due {
            return;
        }
        self.archive.push(sample);
        if self.archive.len() > ARCHIVE_SAMPLES {
            self.archive = std::mem::take(&mut self.archive).into_iter().step_by(2).collect();
            self.archive_every_ms = self.archive_every_ms.saturating_mul(2);
        }
    }

    /// The samples taken in `from..=to` (Unix milliseconds), oldest first.
    pub(crate) fn between(&self, from: u64, to: u64) -> Vec<UsageSample> {
        let within = |s: &&UsageSample| (from..=to).contains(&s.unix_ms);
        self.archive.iter().chain(&self.recent).filter(within).copied().collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.archive.len() + self.recent.len()
    }
}

impl Node {
    /// Samples every running sandbox's use each [`SAMPLE_EVERY`], until aborted.
    pub fn spawn_usage_sampler(&self) -> tokio::task::JoinHandle<()> {
        let node = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                for entry in node.inner.sandboxes.list(&[]) {
                    if entry.paused_unix_ms().is_some() {
                        continue;
                    }
                    if let Some(used) = entry.sandbox.usage().await {
                        entry.usage_history.lock().push(UsageSample {
                            unix_ms: crate::host::clock::now_unix_ms(),
                            cpu_ns: used.cpu_ns,
                            memory_bytes: used.memory_bytes,
                        });
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> UsageSample {
        UsageSample { unix_ms: ms, cpu_ns: ms * 10, memory_bytes: 1 }
    }

    #[test]
    fn a_long_life_stays_covered_within_the_bound() {
        let mut history = UsageHistory::default();
        let samples = 20 * (RECENT_SAMPLES + ARCHIVE_SAMPLES) as u64;
        for i in 0..samples {
            history.push(at(i * 5000));
        }
        assert!(history.len() <= RECENT_SAMPLES + ARCHIVE_SAMPLES);
        let all = history.between(0, u64::MAX);
        assert_eq!(all.first().map(|s| s.unix_ms), Some(0), "the first sample stays");
        assert_eq!(all.last().map(|s| s.unix_ms), Some((samples - 1) * 5000));
        assert!(all.windows(2).all(|w| w[0].unix_ms < w[1].unix_ms), "in order");
        // The last half hour is at the full rate; older times are covered evenly.
        let recent = &all[all.len() - RECENT_SAMPLES..];
        assert!(recent.windows(2).all(|w| w[1].unix_ms - w[0].unix_ms == 5000));
        let life = (samples - 1) * 5000;
        let widest = all.windows(2).map(|w| w[1].unix_ms - w[0].unix_ms).max().unwrap_or(0);
        assert!(widest <= 4 * life / ARCHIVE_SAMPLES as u64, "a gap of {widest} ms");
        let range = history.between(1_000_000, 2_000_000);
        assert!(range.iter().all(|s| (1_000_000..=2_000_000).contains(&s.unix_ms)));
        assert!(!range.is_empty());
    }
}
