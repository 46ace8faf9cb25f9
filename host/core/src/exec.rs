//! A command in a sandbox, as the node asks a tier to run it and as the tier hands it back:
//! its spec, its events and control, and what a tier keeps of it across a node restart or
//! after it finished ([`ExecArchive`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::sandbox::{BoxFuture, SandboxError, Session};
use crate::stdin::StdinChunk;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

/// A command's standard input.
#[derive(Debug)]
pub enum Stdin {
    Empty,
    Bytes(Vec<u8>),
    /// Chunks as the client sends them; the channel's end is the end of input.
    Stream(mpsc::Receiver<StdinChunk>),
}

/// One command to run. The node has already checked what execve cannot carry
/// (`check_command`) and applied its policy to `timeout` and `output_limit`.
#[derive(Debug)]
pub struct ExecSpec {
    /// The node's id for the command; a tier that keeps commands across node restarts
    /// names them by it.
    pub exec_id: u64,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub user: Option<String>,
    pub stdin: Stdin,
    pub timeout: Duration,
    pub output_limit: u64,
    pub terminal: Option<TerminalSize>,
}

/// How a command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub killed: bool,
    pub truncated: bool,
    pub oom_killed: bool,
    pub duration: Duration,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    /// Sent once, last.
    Exited(ExecExit),
    /// Sent instead of `Exited` when the tier lost sight of a command that goes on where the
    /// sandbox is kept (a VM saved by a pause, its agent's connections ended with the VMM):
    /// [`Sandbox::recover_kept`] serves it again once the sandbox runs. The text says why.
    Detached(String),
}

/// Controls a running command.
pub trait ExecControl: Send + Sync {
    fn kill(&self);
    /// `None`: the command is not on a terminal.
    fn resize(&self, _size: TerminalSize) -> Option<std::io::Result<()>> {
        None
    }
}

/// A command the tier started. The tier enforces its timeout and output cap, sends
/// [`ExecEvent::Exited`] exactly once and last, and keeps the command running while the
/// receiver is slow.
pub struct RunningExec {
    pub events: mpsc::Receiver<ExecEvent>,
    pub control: Arc<dyn ExecControl>,
    /// The command's pid inside the sandbox (its own pid namespace), where the tier knows it.
    pub pid: Option<u32>,
    /// Where the tier keeps its output on disk, if it does: once it has finished, the node
    /// serves later readers from there and keeps none of it in memory.
    pub archive: Option<Arc<dyn ExecArchive>>,
}

/// A finished command's output as a tier keeps it outside the node's memory (a container's
/// spool on the node's disk, freed with the sandbox).
pub trait ExecArchive: Send + Sync {
    /// Its output, in order (`Stdout` and `Stderr` only), read within the tier's own byte
    /// bound. An archive that is gone (its command's output was let go) is an error.
    fn read(&self) -> BoxFuture<'_, Result<ArchivedOutput, SandboxError>>;
}

/// A command's output read back from its [`ExecArchive`].
#[derive(Debug, Clone, Default)]
pub struct ArchivedOutput {
    pub output: Vec<ExecEvent>,
    /// Output past what the archive keeps was not written to it.
    pub gap: bool,
}

/// What a tier kept across a restart of the node, or through a pause that saved it.
#[derive(Default)]
pub struct KeptWork {
    pub execs: Vec<RecoveredExec>,
    /// Open sessions, by the ids they were opened with.
    pub sessions: Vec<(String, Box<dyn Session>)>,
}

/// A command a tier kept across a restart of the node, handed back to be served again.
pub struct RecoveredExec {
    pub exec_id: u64,
    pub argv: Vec<String>,
    /// Its output up to the restart, in order (`Stdout` and `Stderr` only).
    pub output: Vec<ExecEvent>,
    /// Output past what the tier keeps on disk was lost between `output` and what follows.
    pub gap: bool,
    /// Still running: the rest of its events, as from [`Sandbox::exec`].
    pub running: Option<RunningExec>,
    /// It ended (`running` is `None`).
    pub exit: Option<ExecExit>,
    /// Its stdin, still open for writing by id (a client streamed it, or it runs on a
    /// terminal); closing the channel closes it.
    pub stdin: Option<mpsc::Sender<StdinChunk>>,
    /// Where its output is kept on disk ([`RunningExec::archive`]).
    pub archive: Option<Arc<dyn ExecArchive>>,
}
