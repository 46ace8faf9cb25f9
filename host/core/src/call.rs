//! Tool calls and how they end. A guest failure (trap, timeout, out of memory, output flood) is
//! a [`CallOutcome`], never an error: errors mean the platform failed.

use std::time::Duration;

/// One invocation of a tool component.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    pub tool: String,
    pub input: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub limits: CallLimits,
}

/// Per-call limits requested by the client; `None` takes the backend's default, and the backend
/// clamps every value to its configured maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallLimits {
    pub timeout: Option<Duration>,
    pub memory_bytes: Option<u64>,
    pub output_bytes: Option<u64>,
    pub fuel: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// A `brig:tool` call returned `ok`.
    Ok,
    /// A `brig:tool` call returned `err`.
    ToolError(String),
    /// A `wasi:cli/run` command exited with a code.
    Exit(i32),
    Timeout,
    OutOfMemory,
    OutputOverflow,
    FuelExhausted,
    Trap(String),
}

impl CallOutcome {
    /// Closed-set name for metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::ToolError(_) => "tool_error",
            CallOutcome::Exit(_) => "exit",
            CallOutcome::Timeout => "timeout",
            CallOutcome::OutOfMemory => "out_of_memory",
            CallOutcome::OutputOverflow => "output_overflow",
            CallOutcome::FuelExhausted => "fuel_exhausted",
            CallOutcome::Trap(_) => "trap",
        }
    }
}

/// What a finished call produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallReport {
    pub outcome: CallOutcome,
    pub output: String,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub duration: Duration,
}

impl ToolCall {
    /// A call of a `brig:tool` component with `input` and default limits.
    pub fn new_tool(tool: impl Into<String>, input: impl Into<String>) -> ToolCall {
        ToolCall { tool: tool.into(), input: input.into(), ..Default::default() }
    }
}
