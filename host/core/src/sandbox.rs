//! The sandbox interface every tier implements, and the data it speaks.
//!
//! ```text
//! node ──▶ Arc<dyn Sandbox> ──▶ fncall workspace (brig-fncall)
//!                           ├─▶ container on the node's kernel (brig-container)
//!                           ├─▶ microVM / full VM (brig-vmtier)
//!                           └─▶ container in a container-host VM (brig-vmtier)
//! ```
//! A tier answers only what it serves: every other method has a default that says
//! [`SandboxError::Unsupported`], and [`Capabilities`] lets the node refuse before it asks.
//! Nothing here knows the wire, the audit trail or the exec hub: those are the node's.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::call::{CallReport, ToolCall};
use crate::files::Entry;
pub use crate::records::{RecordError, TierRecord};
use crate::spec::{QosClass, Tier};
pub use crate::stdin::StdinChunk;
use crate::SandboxId;

/// A boxed future: what a `dyn Sandbox` method returns (one allocation per call, next to a
/// shim or vsock round trip).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A future that is ready at once.
pub fn ready<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

/// What the node may ask of a sandbox; named once, for capability checks and refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Exec,
    ExecAsUser,
    Terminal,
    Sessions,
    SessionAsUser,
    ToolCalls,
    Files,
    FileAppend,
    /// User metadata kept with files ([`crate::files::FileMetadata`]).
    FileMetadata,
    /// Watching a directory tree for changes as they happen.
    FileWatch,
    Pause,
    /// A pause that ends every process and keeps the files only.
    PauseFilesOnly,
    Fork,
    Egress,
    Qos,
    ProtectedPaths,
    Checkpoint,
}

impl Op {
    const ALL: [Op; 17] = [
        Op::Exec,
        Op::ExecAsUser,
        Op::Terminal,
        Op::Sessions,
        Op::SessionAsUser,
        Op::ToolCalls,
        Op::Files,
        Op::FileAppend,
        Op::FileMetadata,
        Op::FileWatch,
        Op::Pause,
        Op::PauseFilesOnly,
        Op::Fork,
        Op::Egress,
        Op::Qos,
        Op::ProtectedPaths,
        Op::Checkpoint,
    ];

    /// The operation as a refusal names it ("… needs another tier").
    pub fn describe(self) -> &'static str {
        match self {
            Op::Exec => "exec",
            Op::ExecAsUser => "a command as another user",
            Op::Terminal => "an exec on a terminal (served for containers on the node's kernel)",
            Op::Sessions => "sessions",
            Op::SessionAsUser => "a session as another user",
            Op::ToolCalls => "tool calls",
            Op::Files => "file access",
            Op::FileAppend => "appending to a file",
            Op::FileMetadata => "file metadata",
            Op::FileWatch => "watching files",
            Op::Pause => "pause",
            Op::PauseFilesOnly => "a filesystem-only pause",
            Op::Fork => "fork",
            Op::Egress => "egress rules",
            Op::Qos => "QoS classes",
            Op::ProtectedPaths => "protected paths",
            Op::Checkpoint => "checkpoint",
        }
    }

    const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// How a tier reaches a sandbox's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAccess {
    /// Through the node's own file system (streamed, any size).
    Local,
    /// Through the guest's agent, a whole file at a time (bounded).
    Guest,
}

/// What a pause does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseKind {
    /// Nothing runs between requests anyway.
    Nothing,
    /// Processes freeze in place; sessions survive.
    Freeze,
    /// The machine is saved to disk and its VMM stops; sessions end.
    Snapshot,
}

/// What a fork copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkKind {
    No,
    /// Files; children start with no process running.
    Files,
    /// The whole machine, processes included.
    Machine,
}

/// What a restarted node can take back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing: it dies with the daemon.
    Ephemeral,
    /// Its spec is enough.
    Spec,
    /// Its spec and its [`TierRecord`] (a container's).
    Record,
    /// Its spec and its [`TierRecord`]: a VM whose VMM outlives the daemon.
    Machine,
    /// Its spec and its [`TierRecord`]: a container in a container-host VM that outlives the
    /// daemon.
    Hosted,
}

/// What one sandbox serves, as data: "this tier cannot" is one typed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    ops: u32,
    pub files: FileAccess,
    pub pause: PauseKind,
    pub fork: ForkKind,
    pub persistence: Persistence,
}

impl Capabilities {
    /// `ops` served, with the given kinds.
    pub const fn new(
        ops: &[Op],
        files: FileAccess,
        pause: PauseKind,
        fork: ForkKind,
        persistence: Persistence,
    ) -> Capabilities {
        let mut bits = 0;
        let mut i = 0;
        while i < ops.len() {
            bits |= ops[i].bit();
            i += 1;
        }
        Capabilities { ops: bits, files, pause, fork, persistence }
    }

    pub fn supports(&self, op: Op) -> bool {
        self.ops & op.bit() != 0
    }

    /// `Ok` if `op` is served, else the typed refusal.
    pub fn require(&self, op: Op) -> Result<(), SandboxError> {
        if self.supports(op) {
            Ok(())
        } else {
            Err(SandboxError::Unsupported { op, note: None })
        }
    }

    /// The operations served.
    pub fn ops(&self) -> Vec<Op> {
        Op::ALL.into_iter().filter(|op| self.supports(*op)).collect()
    }
}

/// A sandbox operation that failed, typed by what the client should make of it.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// This sandbox's tier does not serve the operation (`note` says more, e.g. "not yet").
    #[error("{}{}", .op.describe(), .note.map(|n| format!(" ({n})")).unwrap_or_default())]
    Unsupported { op: Op, note: Option<&'static str> },
    #[error("{0}")]
    BadRequest(String),
    /// A file operation failed; `kind` says how (not found, exists, permission…).
    #[error("{message}")]
    Io { kind: std::io::ErrorKind, message: String },
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    /// Busy with something else (a session running another command).
    #[error("{0}")]
    Conflict(String),
    /// Out of something the sandbox has a bounded amount of (pids, VM slots).
    #[error("{0}")]
    Exhausted(String),
    /// The tier cannot serve now (not offered, guest timed out).
    #[error("{0}")]
    Unavailable(String),
    /// A guest's answer ran past what the node takes in for it.
    #[error("{0}")]
    TooLarge(String),
    /// What the sandbox ran in is gone (its VM died); the text says why.
    #[error("{0}")]
    Lost(String),
    #[error("{0}")]
    Internal(String),
}

impl SandboxError {
    /// An unsupported operation with a note ("not yet for …").
    pub fn unsupported(op: Op, note: &'static str) -> SandboxError {
        SandboxError::Unsupported { op, note: Some(note) }
    }

    /// An I/O failure on `what`, keeping its kind.
    pub fn io(what: &str, e: &std::io::Error) -> SandboxError {
        SandboxError::Io { kind: e.kind(), message: format!("{what}: {e}") }
    }

    /// An internal failure, with the error's whole source chain in the text.
    pub fn internal(what: &str, e: &(dyn std::error::Error + 'static)) -> SandboxError {
        SandboxError::Internal(format!("{what}: {}", chain(e)))
    }
}

/// An error and its sources, joined by ": ".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

pub use crate::exec::{
    ArchivedOutput, ExecArchive, ExecControl, ExecEvent, ExecExit, ExecSpec, KeptWork,
    RecoveredExec, RunningExec, Stdin, TerminalSize,
};

// ---- sessions -----------------------------------------------------------------------------

/// A shell session to open.
#[derive(Debug, Clone, Default)]
pub struct SessionSpec {
    /// The node's id for the session; a tier that keeps sessions across node restarts names
    /// them by it.
    pub id: String,
    /// `None`: the sandbox's default shell.
    pub shell: Option<String>,
    pub env: Vec<(String, String)>,
    /// Empty: `/`.
    pub cwd: String,
    pub user: Option<String>,
}

impl SessionSpec {
    /// The directory the shell starts in.
    pub fn start_dir(&self) -> String {
        if self.cwd.is_empty() {
            "/".to_string()
        } else {
            self.cwd.clone()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The command finished.
    Done {
        exit_code: i32,
        cwd: String,
    },
    /// The wait ended before the command did; it keeps running.
    Pending,
    /// Output past the backlog bound was dropped while nobody waited.
    Dropped {
        bytes: u64,
    },
}

/// An open shell session: one command at a time, state (directory, environment) kept between.
pub trait Session: Send + Sync {
    fn run<'a>(
        &'a self,
        command: &'a str,
        timeout: Duration,
        sink: mpsc::Sender<SessionEvent>,
    ) -> BoxFuture<'a, Result<(), SandboxError>>;
    fn wait(
        &self,
        timeout: Duration,
        sink: mpsc::Sender<SessionEvent>,
    ) -> BoxFuture<'_, Result<(), SandboxError>>;
    fn input<'a>(&'a self, data: &'a [u8]) -> BoxFuture<'a, Result<(), SandboxError>>;
    fn interrupt(&self) -> BoxFuture<'_, Result<(), SandboxError>>;
    fn close(&self) -> BoxFuture<'_, ()>;
}

// ---- files --------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOptions {
    pub append: bool,
    pub parents: bool,
    pub mode: Option<u32>,
}

/// Where an upload's bytes go ([`FileAccess::Local`]): they are written to `file`; once it is
/// closed, `landed` (when there is one) answers whether all of them reached the sandbox's file
/// (a tier whose writer runs inside the sandbox reports its disk filling up there).
pub struct UploadTarget {
    pub file: std::fs::File,
    pub landed: Option<BoxFuture<'static, Result<u64, SandboxError>>>,
}

impl From<std::fs::File> for UploadTarget {
    fn from(file: std::fs::File) -> Self {
        UploadTarget { file, landed: None }
    }
}

impl std::fmt::Debug for UploadTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadTarget").field("file", &self.file).finish_non_exhaustive()
    }
}

/// What a read gives: a local file to stream, or a guest's bytes.
#[derive(Debug)]
pub enum ReadSource {
    File(std::fs::File),
    Bytes(Vec<u8>),
}

// ---- lifecycle ----------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Running,
    /// It stopped on its own (its init or VMM died), or what it ran in is gone.
    Failed,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ns: u64,
    pub memory_bytes: u64,
}

/// What a sandbox asked for, for admission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested {
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

/// A network namespace and tap the node made for a VM (its link and egress rules are the
/// node's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetAttachment {
    pub netns: PathBuf,
    pub tap: String,
}

/// One child of a fork.
#[derive(Debug, Clone)]
pub struct ForkChild {
    pub id: SandboxId,
    /// Its own network, for a networked VM's child.
    pub network: Option<NetAttachment>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ForkOptions {
    /// The parent is paused (frozen already, or saved).
    pub parent_paused: bool,
    /// Children see protected paths (an evaluation fork).
    pub reveal_protected: bool,
}

/// The children a fork made, each made or not.
pub type Forked = Vec<Result<Arc<dyn Sandbox>, SandboxError>>;

fn unsupported<'a, T: Send + 'a>(op: Op) -> BoxFuture<'a, Result<T, SandboxError>> {
    ready(Err(SandboxError::Unsupported { op, note: None }))
}

/// A watch on a directory tree ([`Sandbox::watch`]); dropping it ends the watch.
pub trait FileWatch: Send {
    /// The next changes, waiting for them; `None` once the watch ended (its directory went
    /// away, or the sandbox did).
    fn next(&mut self) -> BoxFuture<'_, Result<Option<crate::files::WatchBatch>, SandboxError>>;
}

/// One sandbox of any tier. A method a tier does not serve answers
/// [`SandboxError::Unsupported`] by default.
pub trait Sandbox: Send + Sync + 'static {
    fn tier(&self) -> Tier;
    fn capabilities(&self) -> Capabilities;
    fn condition(&self) -> Condition {
        Condition::Running
    }
    /// Why what it ran in is gone, if it is (a container-host VM that died): requests to it
    /// fail with this reason. Cheap: checked before every request.
    fn lost(&self) -> Option<String> {
        None
    }
    /// Where it runs, when the tier has a choice (`host-kernel`, `vm:NAME`).
    fn placement(&self) -> Option<String> {
        None
    }
    /// What a command request with no arguments runs: its image's `Entrypoint` + `Cmd`, as
    /// `docker run IMAGE` would. Empty when its image names none.
    fn image_command(&self) -> Vec<String> {
        Vec::new()
    }

    fn exec(&self, _spec: ExecSpec) -> BoxFuture<'_, Result<RunningExec, SandboxError>> {
        unsupported(Op::Exec)
    }
    fn open_session(
        &self,
        _spec: SessionSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Session>, SandboxError>> {
        unsupported(Op::Sessions)
    }
    fn call(&self, _call: ToolCall) -> BoxFuture<'_, Result<CallReport, SandboxError>> {
        unsupported(Op::ToolCalls)
    }

    /// A file to stream out ([`FileAccess::Local`]) or at most `max_bytes` of it
    /// ([`FileAccess::Guest`]).
    fn read<'a>(
        &'a self,
        _path: &'a str,
        _max_bytes: u64,
    ) -> BoxFuture<'a, Result<ReadSource, SandboxError>> {
        unsupported(Op::Files)
    }
    /// Where to stream an upload ([`FileAccess::Local`] only).
    fn open_write<'a>(
        &'a self,
        _path: &'a str,
        _options: WriteOptions,
    ) -> BoxFuture<'a, Result<UploadTarget, SandboxError>> {
        unsupported(Op::Files)
    }
    /// Writes a whole file ([`FileAccess::Guest`]).
    fn put<'a>(
        &'a self,
        _path: &'a str,
        _options: WriteOptions,
        _data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        unsupported(Op::Files)
    }
    fn stat<'a>(&'a self, _path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        unsupported(Op::Files)
    }
    fn list<'a>(&'a self, _path: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        unsupported(Op::Files)
    }
    /// Makes `metadata` (checked already) the metadata of a file or directory (an empty map
    /// clears it); its entry after.
    fn set_metadata<'a>(
        &'a self,
        _path: &'a str,
        _metadata: crate::files::FileMetadata,
    ) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        unsupported(Op::FileMetadata)
    }
    /// Watches directory `path` (and, with `recursive`, every directory below it, those made
    /// later too) for changes; the watch is in place when this returns.
    fn watch<'a>(
        &'a self,
        _path: &'a str,
        _recursive: bool,
    ) -> BoxFuture<'a, Result<Box<dyn FileWatch>, SandboxError>> {
        unsupported(Op::FileWatch)
    }
    fn mkdir<'a>(
        &'a self,
        _path: &'a str,
        _parents: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        unsupported(Op::Files)
    }
    fn remove<'a>(
        &'a self,
        _path: &'a str,
        _recursive: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        unsupported(Op::Files)
    }

    /// Pauses keeping the files only: every process ends and memory is given back; a later
    /// [`Sandbox::resume`] starts it with none running. Returns the bytes of memory freed.
    fn pause_files_only(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        unsupported(Op::PauseFilesOnly)
    }

    /// Pauses; returns the bytes of memory freed.
    fn pause(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        ready(Ok(0))
    }
    fn resume(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        ready(Ok(()))
    }
    /// Freezes (`true`) or thaws every process, for a consistent copy.
    fn freeze(&self, _frozen: bool) -> BoxFuture<'_, Result<(), SandboxError>> {
        ready(Ok(()))
    }
    /// Children that start from this sandbox as it is now.
    fn fork(
        &self,
        _children: Vec<ForkChild>,
        _options: ForkOptions,
    ) -> BoxFuture<'_, Result<Forked, SandboxError>> {
        unsupported(Op::Fork)
    }
    /// Removes it and everything it holds.
    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>>;

    fn usage(&self) -> BoxFuture<'_, Option<Usage>> {
        ready(None)
    }
    /// What it asked for (admission and capacity count it).
    fn requested(&self) -> Option<Requested> {
        None
    }
    /// Memory charged to it now, where a cheap read says (containers on the node's kernel).
    fn working_set_bytes(&self) -> Option<u64> {
        None
    }
    fn set_qos(&self, _class: QosClass) -> Result<(), SandboxError> {
        Ok(())
    }
    /// The process whose network namespace an egress link attaches to, for sandboxes that
    /// get their link after they are made.
    fn net_pid(&self) -> Option<i32> {
        None
    }
    /// Commands and sessions it kept across a restart of the node (asked when the node takes
    /// the sandbox back) or through a pause that saved it (asked after the resume, and after
    /// a save that failed); tiers that keep none have none.
    fn recover_kept(&self) -> BoxFuture<'_, KeptWork> {
        Box::pin(async { KeptWork::default() })
    }
    /// Layer-store digests it holds (released by the node when it goes).
    fn held_layers(&self) -> Vec<String> {
        Vec::new()
    }
    /// The directory of its writable layer (checkpoints copy it, frozen).
    fn writable_layer(&self) -> Result<PathBuf, SandboxError> {
        Err(SandboxError::Unsupported { op: Op::Checkpoint, note: None })
    }
    /// What a restarted node needs to take it back, as its tier keeps it (a tier whose
    /// persistence is [`Persistence::Record`], [`Persistence::Machine`] or
    /// [`Persistence::Hosted`]): tagged and versioned, its body the tier's own type.
    fn record(&self) -> Result<Option<TierRecord>, RecordError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Capabilities = Capabilities::new(
        &[Op::Exec, Op::Files],
        FileAccess::Guest,
        PauseKind::Snapshot,
        ForkKind::Machine,
        Persistence::Ephemeral,
    );

    #[test]
    fn capabilities_hold_exactly_the_ops_given() {
        assert!(CAPS.supports(Op::Exec));
        assert!(CAPS.supports(Op::Files));
        assert!(!CAPS.supports(Op::Terminal));
        assert_eq!(CAPS.ops(), vec![Op::Exec, Op::Files]);
        assert!(CAPS.require(Op::Exec).is_ok());
        let refused = CAPS.require(Op::Sessions).expect_err("no sessions");
        assert!(matches!(refused, SandboxError::Unsupported { op: Op::Sessions, note: None }));
        assert_eq!(refused.to_string(), "sessions");
    }

    #[test]
    fn every_op_has_its_own_bit_and_text() {
        let all = Capabilities::new(
            &Op::ALL,
            FileAccess::Local,
            PauseKind::Freeze,
            ForkKind::Files,
            Persistence::Record,
        );
        assert_eq!(all.ops(), Op::ALL.to_vec());
        let texts: std::collections::HashSet<_> = Op::ALL.iter().map(|o| o.describe()).collect();
        assert_eq!(texts.len(), Op::ALL.len());
    }

    #[test]
    fn a_note_follows_the_operation() {
        let e = SandboxError::unsupported(Op::Fork, "not yet for containers in a VM");
        assert_eq!(e.to_string(), "fork (not yet for containers in a VM)");
    }

    #[test]
    fn chain_joins_sources_once() {
        let inner = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        #[derive(Debug, thiserror::Error)]
        #[error("opening /x")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(chain(&Outer(inner)), "opening /x: no such file");
    }

    struct Minimal;
    impl Sandbox for Minimal {
        fn tier(&self) -> Tier {
            Tier::Fncall
        }
        fn capabilities(&self) -> Capabilities {
            CAPS
        }
        fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
            ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn what_a_tier_does_not_write_is_unsupported() {
        let s: Arc<dyn Sandbox> = Arc::new(Minimal);
        let e = s.call(ToolCall::default()).await.expect_err("no calls");
        assert!(matches!(e, SandboxError::Unsupported { op: Op::ToolCalls, .. }));
        assert!(matches!(
            s.open_session(SessionSpec::default()).await,
            Err(SandboxError::Unsupported { op: Op::Sessions, .. })
        ));
        assert!(matches!(s.stat("/").await, Err(SandboxError::Unsupported { op: Op::Files, .. })));
        assert_eq!(s.pause().await.expect("pause"), 0);
        assert_eq!(s.record(), Ok(None));
        assert_eq!(s.condition(), Condition::Running);
    }
}
