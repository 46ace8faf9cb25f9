//! Commands and sessions in container-like sandboxes.

use serde::{Deserialize, Serialize};

/// Where a command's stdin comes from.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub enum StdinMode {
    /// Nothing (end of file at once).
    #[default]
    Empty,
    /// These bytes, then end of file.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Raw bytes the client sends on the request stream after the frame, until it finishes.
    Stream,
}

/// Run a command in a container-like sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecRequest {
    pub sandbox: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory; empty is the image's default (`/`).
    pub cwd: String,
    /// User name or `uid[:gid]`; `None` is root.
    pub user: Option<String>,
    pub stdin: StdinMode,
    pub timeout_ms: Option<u64>,
    /// Cap on stdout + stderr bytes returned; `None` takes the node default.
    pub output_limit_bytes: Option<u64>,
    /// Run on a terminal of this size (an interactive shell): output comes as stdout only,
    /// streamed stdin is typed into it, `ExecResize` changes its size.
    pub terminal: Option<TerminalSize>,
}

/// A terminal's window size in character cells.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// How a command ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecResult {
    /// Exit code, if it exited.
    pub exit_code: Option<i32>,
    /// Signal number, if a signal ended it.
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Killed by request.
    pub killed: bool,
    /// Output passed the cap; what was returned stops at it.
    pub truncated: bool,
    /// The kernel's OOM killer ended it (memory limit).
    pub oom_killed: bool,
    pub duration_us: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

impl ExecResult {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Start a persistent shell session.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionOpenRequest {
    pub sandbox: String,
    /// Shell to run; `None` is /bin/bash if the image has it, else /bin/sh.
    pub shell: Option<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub user: Option<String>,
}

/// A command a container sandbox ran or runs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ExecInfo {
    pub exec_id: u64,
    /// Its pid inside the sandbox, where the tier knows it.
    pub pid: Option<u32>,
    pub argv: Vec<String>,
    /// `None` while it runs.
    pub result: Option<ExecResult>,
    /// Output bytes kept for a client that reattaches.
    pub buffered_bytes: u64,
}
