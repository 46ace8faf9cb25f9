//! Configuration of the fncall tier.

use serde::{Deserialize, Serialize};

/// Limits and pool sizes. Per-call limits requested by clients are clamped to the maxima here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct FncallConfig {
    /// Component instances that may be live at once (pool slots); a call beyond it is refused
    /// with a retryable error.
    pub max_concurrent_calls: u32,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub default_memory_mib: u64,
    /// Also the size of each pooled linear-memory slot.
    pub max_memory_mib: u64,
    /// Cap on each of stdout and stderr.
    pub default_output_bytes: u64,
    pub max_output_bytes: u64,
    /// Compile with fuel metering so calls can carry a fuel limit (costs a few percent).
    pub fuel: bool,
    /// Epoch tick; the granularity of deadlines and of yielding to other work.
    pub epoch_tick_ms: u64,
    /// Bytes of each memory slot kept resident (zeroed with memset instead of madvise) between
    /// calls; avoids TLB-shootdown IPIs, which are very expensive inside a VM.
    pub keep_resident_bytes: u64,
}

impl Default for FncallConfig {
    fn default() -> Self {
        FncallConfig {
            max_concurrent_calls: 1000,
            default_timeout_ms: 10_000,
            max_timeout_ms: 300_000,
            default_memory_mib: 64,
            max_memory_mib: 256,
            default_output_bytes: 1 << 20,
            max_output_bytes: 16 << 20,
            fuel: false,
            epoch_tick_ms: 5,
            keep_resident_bytes: 1 << 20,
        }
    }
}
