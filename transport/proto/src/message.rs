//! Request and reply messages. Postcard encodes enum variants by index: append new variants and
//! fields only together with a [`crate::PROTOCOL_VERSION`] bump.

use serde::{Deserialize, Serialize};

use crate::error::WireError;

/// Isolation tier of a sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Fncall,
    Container,
    Microvm,
    Fullvm,
}

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

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateRequest {
    pub tier: Option<Tier>,
    /// Image for the container and VM tiers: a layer name, or layers bottom first joined by
    /// `+` (`debian-12+flask-ws+harness`); unused by fncall.
    pub image: Option<String>,
    pub labels: Vec<(String, String)>,
    /// Destroy the sandbox after this long without a request; `None` takes the node default.
    pub idle_ttl_ms: Option<u64>,
    pub limits: SandboxLimits,
    /// Environment every command in the sandbox starts with.
    pub env: Vec<(String, String)>,
}

/// Resource limits of a sandbox; `None` takes the node default.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SandboxLimits {
    pub memory_mib: Option<u64>,
    /// CPU in thousandths of a core (1000 = one core).
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
    /// Writable-disk quota.
    pub disk_mib: Option<u64>,
}

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

/// Lifecycle state as clients see it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Running,
    Paused,
    Stopped,
    Failed,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: String,
    pub tier: Tier,
    pub state: SandboxState,
    pub labels: Vec<(String, String)>,
    pub created_unix_ms: u64,
    pub last_used_unix_ms: u64,
    pub idle_ttl_ms: u64,
}

/// Label selector: every pair must match. Empty matches everything.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ListRequest {
    pub labels: Vec<(String, String)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileWriteRequest {
    pub sandbox: String,
    pub path: String,
    /// Unix permission bits for a new file; `None` is 0644.
    pub mode: Option<u32>,
    pub append: bool,
    /// Create missing parent directories.
    pub parents: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileReadRequest {
    pub sandbox: String,
    pub path: String,
    pub offset: u64,
    /// Bytes to read; `None` reads to the end.
    pub len: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub modified_unix_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ToolWorld {
    /// Exports `brig:tool/tool`.
    Tool,
    /// Exports `wasi:cli/run`.
    Command,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ToolInfo {
    pub name: String,
    pub digest: String,
    pub world: ToolWorld,
    pub description: String,
    pub size_bytes: u64,
}

/// Format of an imported layer.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// A directory tree (only with `node_path`; clients upload directories as tar).
    Dir,
    /// A tarball, plain or compressed.
    Tar,
    /// An OCI image layout or a `docker save` archive (directory or tarball).
    Oci,
    /// A self-contained EROFS image.
    Erofs,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ImageImportRequest {
    /// `kind/name`, e.g. `toolkit/harness`.
    pub name: String,
    /// `None` takes the next version.
    pub version: Option<u32>,
    pub format: ImageFormat,
    /// Import from this path on the node instead of an upload (operators).
    pub node_path: Option<String>,
}

/// A layer in the store.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct LayerInfo {
    pub name: String,
    pub version: u32,
    pub digest: String,
    pub data_bytes: u64,
    pub meta_bytes: u64,
    pub chunks: u64,
    pub files: u64,
    pub created_unix_ms: u64,
    pub source: String,
    /// Chunks the import added to the backend (the rest were already stored).
    pub new_chunks: u64,
}

/// Turn a sandbox's writable layer into a new layer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointRequest {
    pub sandbox: String,
    pub name: String,
    pub version: Option<u32>,
    /// Paths removed before packing (answers, secrets, caches).
    pub scrub: Vec<String>,
}

/// What a node reports about itself.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStatus {
    pub node_id: u32,
    pub tiers: Vec<Tier>,
    pub sandboxes: u64,
    pub images: Option<ImageStats>,
}

/// Layer store counters.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageStats {
    pub backend: String,
    pub fetched_bytes: u64,
    pub fetched_chunks: u64,
    pub cache_bytes: u64,
    pub corrupt_chunks: u64,
}

/// Every request a client can send. One per stream.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// One-shot call: instantiate, run, destroy. The throughput path.
    Call(CallRequest),
    Create(CreateRequest),
    CallIn {
        sandbox: String,
        call: CallRequest,
    },
    Status {
        sandbox: String,
    },
    Destroy {
        sandbox: String,
    },
    List(ListRequest),
    /// Raw file bytes follow the frame until the stream ends.
    FileWrite(FileWriteRequest),
    /// The reply is [`Reply::FileData`], then raw bytes until the stream ends.
    FileRead(FileReadRequest),
    FileList {
        sandbox: String,
        path: String,
    },
    FileStat {
        sandbox: String,
        path: String,
    },
    FileMkdir {
        sandbox: String,
        path: String,
        parents: bool,
    },
    FileRemove {
        sandbox: String,
        path: String,
        recursive: bool,
    },
    /// Raw component bytes follow the frame until the stream ends.
    ToolAdd {
        name: String,
    },
    ToolList,
    ToolRemove {
        name: String,
    },
    /// Replies `ExecStarted`, then `Output` frames, then `Exited`.
    Exec(ExecRequest),
    /// Kills a running exec and everything it started.
    ExecKill {
        sandbox: String,
        exec_id: u64,
    },
    SessionOpen(SessionOpenRequest),
    /// Replies `Output` frames, then `SessionDone` or (timeout) `SessionPending`.
    SessionRun {
        sandbox: String,
        session: String,
        command: String,
        timeout_ms: u64,
    },
    /// Waits on a command that outlived its `SessionRun`; replies as `SessionRun`.
    SessionWait {
        sandbox: String,
        session: String,
        timeout_ms: u64,
    },
    SessionInput {
        sandbox: String,
        session: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    SessionInterrupt {
        sandbox: String,
        session: String,
    },
    SessionClose {
        sandbox: String,
        session: String,
    },
    /// Raw archive bytes follow unless `node_path` is set.
    ImageImport(ImageImportRequest),
    ImageList,
    ImageInspect {
        reference: String,
    },
    ImageTag {
        reference: String,
        name: String,
        version: Option<u32>,
    },
    ImageRemove {
        reference: String,
    },
    /// Fetches and checks every chunk of a layer.
    ImageVerify {
        reference: String,
    },
    ImageGc,
    /// Empties the node's chunk cache (the next reads are cold).
    ImageCacheDrop,
    EnvCreate {
        name: String,
        layers: Vec<String>,
    },
    EnvList,
    Checkpoint(CheckpointRequest),
    NodeStatus,
}

impl Request {
    /// Closed-set name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Call(_) => "call",
            Request::Create(_) => "create",
            Request::CallIn { .. } => "call_in",
            Request::Status { .. } => "status",
            Request::Destroy { .. } => "destroy",
            Request::List(_) => "list",
            Request::FileWrite(_) => "file_write",
            Request::FileRead(_) => "file_read",
            Request::FileList { .. } => "file_list",
            Request::FileStat { .. } => "file_stat",
            Request::FileMkdir { .. } => "file_mkdir",
            Request::FileRemove { .. } => "file_remove",
            Request::ToolAdd { .. } => "tool_add",
            Request::ToolList => "tool_list",
            Request::ToolRemove { .. } => "tool_remove",
            Request::Exec(_) => "exec",
            Request::ExecKill { .. } => "exec_kill",
            Request::SessionOpen(_) => "session_open",
            Request::SessionRun { .. } => "session_run",
            Request::SessionWait { .. } => "session_wait",
            Request::SessionInput { .. } => "session_input",
            Request::SessionInterrupt { .. } => "session_interrupt",
            Request::SessionClose { .. } => "session_close",
            Request::ImageImport(_) => "image_import",
            Request::ImageList => "image_list",
            Request::ImageInspect { .. } => "image_inspect",
            Request::ImageTag { .. } => "image_tag",
            Request::ImageRemove { .. } => "image_remove",
            Request::ImageVerify { .. } => "image_verify",
            Request::ImageGc => "image_gc",
            Request::ImageCacheDrop => "image_cache_drop",
            Request::EnvCreate { .. } => "env_create",
            Request::EnvList => "env_list",
            Request::Checkpoint(_) => "checkpoint",
            Request::NodeStatus => "node_status",
        }
    }

    /// Whether raw bytes follow the request frame on the stream.
    pub fn has_upload(&self) -> bool {
        matches!(self, Request::FileWrite(_) | Request::ToolAdd { .. })
            || matches!(self, Request::Exec(e) if e.stdin == StdinMode::Stream)
            || matches!(self, Request::ImageImport(i) if i.node_path.is_none())
    }
}

/// Every reply a server can send. Exactly one per request, except where noted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Called(CallResult),
    Sandbox(SandboxInfo),
    Sandboxes(Vec<SandboxInfo>),
    /// Precedes the raw bytes of a download: how many will follow.
    FileData {
        size: u64,
    },
    Written {
        bytes: u64,
    },
    Entries(Vec<FileStat>),
    Stat(FileStat),
    Tool(ToolInfo),
    Tools(Vec<ToolInfo>),
    Done,
    Error(WireError),
    ExecStarted {
        exec_id: u64,
    },
    /// A piece of a command's output, in the order produced per stream.
    Output {
        stream: OutputStream,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Exited(ExecResult),
    Session {
        session: String,
    },
    SessionDone {
        exit_code: i32,
        cwd: String,
    },
    /// The wait ended; the command is still running.
    SessionPending,
    Layer(LayerInfo),
    Layers(Vec<LayerInfo>),
    LayerDetails {
        layer: LayerInfo,
        paths: Vec<String>,
    },
    Gc {
        removed_layers: u64,
        removed_chunks: u64,
        freed_bytes: u64,
    },
    Envs(Vec<(String, Vec<String>)>),
    NodeStatus(NodeStatus),
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
