//! Request and reply messages. Postcard encodes enum variants by index: append new variants and
//! fields only together with a [`crate::PROTOCOL_VERSION`] bump.

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::*;

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
    /// Replies `Affected` with the ids paused.
    Pause(Target),
    /// Replies `Affected` with the ids resumed.
    Resume(Target),
    /// Replies `Affected` with the ids destroyed.
    DestroyMatching {
        labels: Vec<(String, String)>,
    },
    SetTtl(TtlUpdate),
    /// Clones a sandbox into `count` children; replies `Sandboxes`. An `evaluation` fork
    /// shows hidden protected paths (read-only) and carries no process of the parent.
    Fork {
        sandbox: String,
        count: u32,
        labels: Vec<(String, String)>,
        evaluation: bool,
    },
    /// Streams a running or recently finished exec again: everything kept, then what follows.
    ExecAttach {
        sandbox: String,
        exec_id: u64,
    },
    ExecList {
        sandbox: String,
    },
    SessionList {
        sandbox: String,
    },
    /// Replaces a sandbox's egress rules (giving it a link first if it has none); replies
    /// `Sandbox`.
    SetEgress {
        sandbox: String,
        rules: Vec<String>,
    },
    /// Replies `Audit` batches; with `follow`, goes on until the sandbox is gone, then `Done`.
    Audit(AuditRequest),
    /// Moves a sandbox to another CPU QoS class; replies `Sandbox`.
    SetQos {
        sandbox: String,
        class: QosClass,
    },
    /// Node → control plane, once a second; replies `ClusterKey`.
    NodeHeartbeat(NodeReport),
    /// Where the sandbox lives; replies `Route` (or an error if its node is down).
    Route {
        sandbox: String,
    },
    /// Healthy nodes offering `tier`, with tokens, for direct one-shot calls; replies `Routes`.
    Routes {
        tier: Tier,
    },
    /// The control plane's view of its nodes; replies `Cluster`.
    ClusterStatus,
    /// Creates or changes a project (admin); replies `Done`.
    ProjectPut {
        name: String,
        limits: ProjectLimits,
    },
    ProjectList,
    /// A new access token for `project` (admin); replies `Token`.
    TokenCreate {
        project: String,
    },
    /// Sets the window size of an exec that runs on a terminal; replies `Done`.
    ExecResize {
        sandbox: String,
        exec_id: u64,
        size: TerminalSize,
    },
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
            Request::Pause(_) => "pause",
            Request::Resume(_) => "resume",
            Request::DestroyMatching { .. } => "destroy_matching",
            Request::SetTtl(_) => "set_ttl",
            Request::Fork { .. } => "fork",
            Request::ExecAttach { .. } => "exec_attach",
            Request::ExecList { .. } => "exec_list",
            Request::SessionList { .. } => "session_list",
            Request::SetEgress { .. } => "set_egress",
            Request::Audit(_) => "audit",
            Request::SetQos { .. } => "set_qos",
            Request::NodeHeartbeat(_) => "node_heartbeat",
            Request::Route { .. } => "route",
            Request::Routes { .. } => "routes",
            Request::ClusterStatus => "cluster_status",
            Request::ProjectPut { .. } => "project_put",
            Request::ProjectList => "project_list",
            Request::TokenCreate { .. } => "token_create",
            Request::ExecResize { .. } => "exec_resize",
        }
    }

    /// The sandbox the request is about, if it names one (routing by the id's node).
    pub fn sandbox(&self) -> Option<&str> {
        use Request as R;
        match self {
            R::CallIn { sandbox, .. }
            | R::Status { sandbox }
            | R::Destroy { sandbox }
            | R::FileList { sandbox, .. }
            | R::FileStat { sandbox, .. }
            | R::FileMkdir { sandbox, .. }
            | R::FileRemove { sandbox, .. }
            | R::ExecKill { sandbox, .. }
            | R::ExecResize { sandbox, .. }
            | R::SessionRun { sandbox, .. }
            | R::SessionWait { sandbox, .. }
            | R::SessionInput { sandbox, .. }
            | R::SessionInterrupt { sandbox, .. }
            | R::SessionClose { sandbox, .. }
            | R::Fork { sandbox, .. }
            | R::ExecAttach { sandbox, .. }
            | R::ExecList { sandbox }
            | R::SessionList { sandbox }
            | R::SetEgress { sandbox, .. }
            | R::SetQos { sandbox, .. }
            | R::Route { sandbox } => Some(sandbox),
            R::FileWrite(r) => Some(&r.sandbox),
            R::FileRead(r) => Some(&r.sandbox),
            R::Exec(r) => Some(&r.sandbox),
            R::SessionOpen(r) => Some(&r.sandbox),
            R::Checkpoint(r) => Some(&r.sandbox),
            R::SetTtl(r) => Some(&r.sandbox),
            R::Audit(r) => Some(&r.sandbox),
            R::Pause(Target::Sandbox(s)) | R::Resume(Target::Sandbox(s)) => Some(s),
            _ => None,
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
    /// Sandboxes an operation acted on.
    Affected(Vec<String>),
    Execs(Vec<ExecInfo>),
    Sessions(Vec<String>),
    Audit(Vec<AuditEvent>),
    ClusterKey(ClusterKey),
    /// A create the control plane placed: the sandbox and how to reach its node.
    Placed {
        sandbox: SandboxInfo,
        route: NodeRoute,
    },
    Route(NodeRoute),
    Routes(Vec<NodeRoute>),
    Cluster(Vec<NodeSummary>),
    Projects(Vec<ProjectInfo>),
    Token {
        token: String,
    },
}
