//! Tool calls of the fncall tier.

use serde::{Deserialize, Serialize};

/// A tool call, one-shot or inside a sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CallRequest {
    /// Registered tool name (`brig tool ls`) or a component digest `sha256:<hex>`.
    pub tool: String,
    /// Input string for `brig:tool` components; ignored by `wasi:cli/run` commands.
    pub input: String,
    /// Arguments after argv[0] for `wasi:cli/run` commands.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    pub limits: CallLimits,
}

impl CallRequest {
    pub fn new(tool: impl Into<String>, input: impl Into<String>) -> Self {
        CallRequest { tool: tool.into(), input: input.into(), ..Default::default() }
    }
}

/// Per-call limits; `None` takes the node's default.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallLimits {
    pub timeout_ms: Option<u32>,
    pub memory_mib: Option<u32>,
    /// Cap on each of stdout and stderr.
    pub output_bytes: Option<u32>,
    pub fuel: Option<u64>,
}

/// How a call ended. A guest failure is an outcome, not an error.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// A `brig:tool` call returned `ok`.
    Ok,
    /// A `brig:tool` call returned `err` with this message.
    ToolError(String),
    /// A `wasi:cli/run` command exited with this code.
    Exit(i32),
    /// The wall-clock deadline passed.
    Timeout,
    /// The guest hit its memory cap.
    OutOfMemory,
    /// The guest wrote more than the output cap; output is truncated at the cap.
    OutputOverflow,
    /// The guest ran out of fuel.
    FuelExhausted,
    /// The guest trapped (panic, unreachable, stack overflow, …).
    Trap(String),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CallResult {
    pub outcome: CallOutcome,
    /// The `ok` string of a `brig:tool` call; empty otherwise.
    pub output: String,
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    pub duration_us: u64,
}

impl CallResult {
    /// Whether the tool returned `ok` or the command exited 0.
    pub fn is_success(&self) -> bool {
        matches!(self.outcome, CallOutcome::Ok | CallOutcome::Exit(0))
    }

    /// Stdout as text (lossy).
    pub fn stdout_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.stdout)
    }

    /// Stderr as text (lossy).
    pub fn stderr_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.stderr)
    }
}

impl CallResult {
    /// Short name of the outcome (`ok`, `exit 1`, `timeout`, …) for logs and CLIs.
    pub fn outcome_name(&self) -> String {
        match &self.outcome {
            CallOutcome::Ok => "ok".into(),
            CallOutcome::ToolError(_) => "tool error".into(),
            CallOutcome::Exit(code) => format!("exit {code}"),
            CallOutcome::Timeout => "timeout".into(),
            CallOutcome::OutOfMemory => "out of memory".into(),
            CallOutcome::OutputOverflow => "output overflow".into(),
            CallOutcome::FuelExhausted => "fuel exhausted".into(),
            CallOutcome::Trap(_) => "trap".into(),
        }
    }
}
