//! Latency statistics.

use std::time::Duration;

/// Collected latencies in microseconds.
#[derive(Debug, Default, Clone)]
pub struct Latencies {
    micros: Vec<u32>,
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        self.micros.push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
    }

    pub fn merge(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
    }

    pub fn len(&self) -> usize {
        self.micros.len()
    }

    /// The `q` quantile (0..=1) in milliseconds; 0 when empty.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.micros.is_empty() {
            return 0.0;
        }
        self.micros.sort_unstable();
        let idx = ((self.micros.len() - 1) as f64 * q).round() as usize;
        f64::from(self.micros[idx]) / 1000.0
    }
}

/// Rounds to three decimals for JSON output.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
