//! Request and reply messages. Postcard encodes enum variants by index: append new variants and
//! fields only together with a [`crate::PROTOCOL_VERSION`] bump.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::*;

/// Every request a client can send, grouped by what it is about. One per stream.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Creating, finding, pausing, forking and destroying sandboxes, and their policies.
    Sandbox(SandboxOp),
    /// Commands run in a sandbox.
    Exec(ExecOp),
    /// Shell sessions in a sandbox.
    Session(SessionOp),
    /// A sandbox's files.
    File(FileOp),
    /// One-shot tool calls and the tool registry.
    Tool(ToolOp),
    /// The layer store, environments and checkpoints.
    Image(ImageOp),
    /// The node itself.
    Node(NodeOp),
    /// For the control plane (node heartbeats, routing, projects).
    Control(ControlOp),
    /// Volumes and their files.
    Volume(VolumeOp),
}

/// Requests about sandboxes as a whole.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum SandboxOp {
    Create(Box<CreateRequest>),
    Status {
        sandbox: String,
    },
    Destroy {
        sandbox: String,
    },
    List(ListRequest),
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
    /// Replaces a sandbox's egress rules (giving it a link first if it has none); replies
    /// `Sandbox`.
    SetEgress {
        sandbox: String,
        rules: Vec<String>,
    },
    /// Moves a sandbox to another CPU QoS class; replies `Sandbox`.
    SetQos {
        sandbox: String,
        class: QosClass,
    },
    /// Replies `Audit` batches; with `follow`, goes on until the sandbox is gone, then `Done`.
    Audit(AuditRequest),
    /// A TCP connection to `port` inside the sandbox (its own loopback, never the host's):
    /// replies `PortOpen`, then the stream carries the connection's bytes both ways (the
    /// upload to the sandbox, raw replies from it). Last, so older variants keep their tags.
    ConnectPort {
        sandbox: String,
        port: u16,
    },
    /// Its use over its life, sampled every few seconds (older samples thinned), with
    /// `unix_ms` in `from..=to`; replies `UsageHistory`, with a sample of now when `to` is
    /// not past.
    UsageHistory {
        sandbox: String,
        from_unix_ms: u64,
        to_unix_ms: u64,
    },
    /// The node's lifecycle journal; replies [`Reply::Events`] (with `follow`, one per batch
    /// until the client goes).
    Events(EventsRequest),
    /// Pauses keeping the files only: every process ends and the sandbox's memory is given
    /// back; the resume starts it with nothing running (E2B's filesystem-only pause, a cold
    /// boot). Replies `Affected`.
    PauseFilesOnly(Target),
}

/// Requests about commands in a sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ExecOp {
    /// Replies `ExecStarted`, then `Output` frames, then `Exited`.
    Start(ExecRequest),
    /// Kills a running exec and everything it started.
    Kill {
        sandbox: String,
        exec_id: u64,
    },
    /// Streams a running or recently finished exec again: everything kept, then what follows.
    Attach {
        sandbox: String,
        exec_id: u64,
    },
    List {
        sandbox: String,
    },
    /// Sets the window size of an exec that runs on a terminal; replies `Done`.
    Resize {
        sandbox: String,
        exec_id: u64,
        size: TerminalSize,
    },
    /// Writes `data` to the stdin of an exec started with streamed stdin (or on a terminal,
    /// where it is typed), from any client and across node restarts; with `close`, then ends
    /// its input. Replies `Done`. Last, so older variants keep their tags.
    Input {
        sandbox: String,
        exec_id: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        close: bool,
    },
}

/// Requests about shell sessions in a sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum SessionOp {
    Open(SessionOpenRequest),
    /// Replies `Output` frames, then `SessionDone` or (timeout) `SessionPending`.
    Run {
        sandbox: String,
        session: String,
        command: String,
        timeout_ms: u64,
    },
    /// Waits on a command that outlived its `Run`; replies as `Run`.
    Wait {
        sandbox: String,
        session: String,
        timeout_ms: u64,
    },
    Input {
        sandbox: String,
        session: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Interrupt {
        sandbox: String,
        session: String,
    },
    Close {
        sandbox: String,
        session: String,
    },
    List {
        sandbox: String,
    },
}

/// Requests about a sandbox's files.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// Raw file bytes follow the frame until the stream ends.
    Write(FileWriteRequest),
    /// The reply is [`Reply::FileData`], then raw bytes until the stream ends.
    Read(FileReadRequest),
    List {
        sandbox: String,
        path: String,
    },
    Stat {
        sandbox: String,
        path: String,
    },
    Mkdir {
        sandbox: String,
        path: String,
        parents: bool,
    },
    Remove {
        sandbox: String,
        path: String,
        recursive: bool,
    },
    /// Makes this the metadata of a file or directory (keys lowercased; an empty map clears
    /// it): [`Reply::Stat`].
    SetMetadata {
        sandbox: String,
        path: String,
        metadata: BTreeMap<String, String>,
    },
    /// The reply is a stream of [`Reply::FileEvents`].
    Watch(FileWatchRequest),
}

/// One-shot tool calls and the node's tool registry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ToolOp {
    /// One-shot call: instantiate, run, destroy. The throughput path.
    Call(CallRequest),
    /// A call in a live fncall sandbox (its workspace kept between calls).
    CallIn {
        sandbox: String,
        call: CallRequest,
    },
    /// Raw component bytes follow the frame until the stream ends.
    Add {
        name: String,
    },
    List,
    Remove {
        name: String,
    },
}

/// The layer store, environments and checkpoints.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ImageOp {
    /// Raw archive bytes follow unless `node_path` is set.
    Import(ImageImportRequest),
    List,
    Inspect {
        reference: String,
    },
    Tag {
        reference: String,
        name: String,
        version: Option<u32>,
    },
    Remove {
        reference: String,
    },
    /// Fetches and checks every chunk of a layer.
    Verify {
        reference: String,
    },
    Gc,
    /// Empties the node's chunk cache (the next reads are cold).
    CacheDrop,
    EnvCreate {
        name: String,
        layers: Vec<String>,
    },
    EnvList,
    /// Saves a sandbox's filesystem changes as a new layer.
    Checkpoint(CheckpointRequest),
    /// Pulls an image from an OCI registry into the layer store (`Reply::Pulled`).
    Pull(ImagePullRequest),
    /// Builds an environment from a Dockerfile or steps (`BuildEvent`s, then `Built`). Last,
    /// so older variants keep their tags.
    Build(ImageBuildRequest),
}

/// Requests about the node itself.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum NodeOp {
    Status,
    /// Lists what the node left on the host that belongs to no sandbox it has (processes,
    /// cgroups, mounts, links, files), leaving out anything touched in the last
    /// `min_age_secs`; removes it too when `remove`. Admin only. Replies `Strays`.
    Doctor {
        remove: bool,
        min_age_secs: u32,
    },
    /// Who the connection's token speaks for; replies `Caller`. Last, so older variants keep
    /// their tags.
    Whoami,
}

/// Requests only the control plane serves.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ControlOp {
    /// Node → control plane, once a second; replies `ClusterKey`.
    NodeHeartbeat(Box<NodeReport>),
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
}

impl Request {
    /// Closed-set name for logs and metrics (the same names as before families existed).
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Sandbox(op) => op.kind(),
            Request::Exec(op) => op.kind(),
            Request::Session(op) => op.kind(),
            Request::File(op) => op.kind(),
            Request::Tool(op) => op.kind(),
            Request::Image(op) => op.kind(),
            Request::Node(NodeOp::Status) => "node_status",
            Request::Node(NodeOp::Doctor { .. }) => "node_doctor",
            Request::Node(NodeOp::Whoami) => "whoami",
            Request::Control(op) => op.kind(),
            Request::Volume(op) => op.kind(),
        }
    }

    /// The sandbox the request is about, if it names one (routing by the id's node).
    pub fn sandbox(&self) -> Option<&str> {
        match self {
            Request::Sandbox(op) => op.sandbox(),
            Request::Exec(op) => Some(op.sandbox()),
            Request::Session(op) => Some(op.sandbox()),
            Request::File(op) => Some(op.sandbox()),
            Request::Tool(ToolOp::CallIn { sandbox, .. }) => Some(sandbox),
            Request::Image(ImageOp::Checkpoint(r)) => Some(&r.sandbox),
            Request::Control(ControlOp::Route { sandbox }) => Some(sandbox),
            Request::Tool(_)
            | Request::Image(_)
            | Request::Node(_)
            | Request::Control(_)
            | Request::Volume(_) => None,
        }
    }

    /// Whether raw bytes follow the request frame on the stream.
    pub fn has_upload(&self) -> bool {
        match self {
            Request::File(FileOp::Write(_))
            | Request::Tool(ToolOp::Add { .. })
            | Request::Volume(VolumeOp::Write(_)) => true,
            Request::Exec(ExecOp::Start(e)) => e.stdin == StdinMode::Stream,
            Request::Image(ImageOp::Import(i)) => i.node_path.is_none(),
            Request::Image(ImageOp::Build(b)) => b.context,
            Request::Sandbox(SandboxOp::ConnectPort { .. }) => true,
            _ => false,
        }
    }
}

impl SandboxOp {
    pub fn kind(&self) -> &'static str {
        match self {
            SandboxOp::Create(_) => "create",
            SandboxOp::Status { .. } => "status",
            SandboxOp::Destroy { .. } => "destroy",
            SandboxOp::List(_) => "list",
            SandboxOp::Pause(_) => "pause",
            SandboxOp::PauseFilesOnly(_) => "pause_files_only",
            SandboxOp::Resume(_) => "resume",
            SandboxOp::DestroyMatching { .. } => "destroy_matching",
            SandboxOp::SetTtl(_) => "set_ttl",
            SandboxOp::Fork { .. } => "fork",
            SandboxOp::SetEgress { .. } => "set_egress",
            SandboxOp::SetQos { .. } => "set_qos",
            SandboxOp::Audit(_) => "audit",
            SandboxOp::ConnectPort { .. } => "connect_port",
            SandboxOp::UsageHistory { .. } => "usage_history",
            SandboxOp::Events(_) => "events",
        }
    }

    /// The one sandbox the operation is about; `None` for create, list and label-wide ones.
    pub fn sandbox(&self) -> Option<&str> {
        match self {
            SandboxOp::Status { sandbox }
            | SandboxOp::Destroy { sandbox }
            | SandboxOp::Fork { sandbox, .. }
            | SandboxOp::SetEgress { sandbox, .. }
            | SandboxOp::SetQos { sandbox, .. }
            | SandboxOp::ConnectPort { sandbox, .. }
            | SandboxOp::UsageHistory { sandbox, .. } => Some(sandbox),
            SandboxOp::SetTtl(r) => Some(&r.sandbox),
            SandboxOp::Audit(r) => Some(&r.sandbox),
            SandboxOp::Events(r) => r.sandbox.as_deref(),
            SandboxOp::Pause(Target::Sandbox(s))
            | SandboxOp::PauseFilesOnly(Target::Sandbox(s))
            | SandboxOp::Resume(Target::Sandbox(s)) => Some(s),
            SandboxOp::Create(_)
            | SandboxOp::List(_)
            | SandboxOp::Pause(Target::Labels(_))
            | SandboxOp::PauseFilesOnly(Target::Labels(_))
            | SandboxOp::Resume(Target::Labels(_))
            | SandboxOp::DestroyMatching { .. } => None,
        }
    }
}

impl ExecOp {
    pub fn kind(&self) -> &'static str {
        match self {
            ExecOp::Start(_) => "exec",
            ExecOp::Kill { .. } => "exec_kill",
            ExecOp::Attach { .. } => "exec_attach",
            ExecOp::List { .. } => "exec_list",
            ExecOp::Resize { .. } => "exec_resize",
            ExecOp::Input { .. } => "exec_input",
        }
    }

    pub fn sandbox(&self) -> &str {
        match self {
            ExecOp::Start(r) => &r.sandbox,
            ExecOp::Kill { sandbox, .. }
            | ExecOp::Attach { sandbox, .. }
            | ExecOp::List { sandbox }
            | ExecOp::Resize { sandbox, .. }
            | ExecOp::Input { sandbox, .. } => sandbox,
        }
    }
}

impl SessionOp {
    pub fn kind(&self) -> &'static str {
        match self {
            SessionOp::Open(_) => "session_open",
            SessionOp::Run { .. } => "session_run",
            SessionOp::Wait { .. } => "session_wait",
            SessionOp::Input { .. } => "session_input",
            SessionOp::Interrupt { .. } => "session_interrupt",
            SessionOp::Close { .. } => "session_close",
            SessionOp::List { .. } => "session_list",
        }
    }

    pub fn sandbox(&self) -> &str {
        match self {
            SessionOp::Open(r) => &r.sandbox,
            SessionOp::Run { sandbox, .. }
            | SessionOp::Wait { sandbox, .. }
            | SessionOp::Input { sandbox, .. }
            | SessionOp::Interrupt { sandbox, .. }
            | SessionOp::Close { sandbox, .. }
            | SessionOp::List { sandbox } => sandbox,
        }
    }
}

impl FileOp {
    pub fn kind(&self) -> &'static str {
        match self {
            FileOp::Write(_) => "file_write",
            FileOp::Read(_) => "file_read",
            FileOp::List { .. } => "file_list",
            FileOp::Stat { .. } => "file_stat",
            FileOp::Mkdir { .. } => "file_mkdir",
            FileOp::Remove { .. } => "file_remove",
            FileOp::SetMetadata { .. } => "file_set_metadata",
            FileOp::Watch(_) => "file_watch",
        }
    }

    pub fn sandbox(&self) -> &str {
        match self {
            FileOp::Write(r) => &r.sandbox,
            FileOp::Read(r) => &r.sandbox,
            FileOp::List { sandbox, .. }
            | FileOp::Stat { sandbox, .. }
            | FileOp::Mkdir { sandbox, .. }
            | FileOp::Remove { sandbox, .. }
            | FileOp::SetMetadata { sandbox, .. } => sandbox,
            FileOp::Watch(w) => &w.sandbox,
        }
    }
}

impl ToolOp {
    pub fn kind(&self) -> &'static str {
        match self {
            ToolOp::Call(_) => "call",
            ToolOp::CallIn { .. } => "call_in",
            ToolOp::Add { .. } => "tool_add",
            ToolOp::List => "tool_list",
            ToolOp::Remove { .. } => "tool_remove",
        }
    }
}

impl ImageOp {
    pub fn kind(&self) -> &'static str {
        match self {
            ImageOp::Import(_) => "image_import",
            ImageOp::List => "image_list",
            ImageOp::Inspect { .. } => "image_inspect",
            ImageOp::Tag { .. } => "image_tag",
            ImageOp::Remove { .. } => "image_remove",
            ImageOp::Verify { .. } => "image_verify",
            ImageOp::Gc => "image_gc",
            ImageOp::CacheDrop => "image_cache_drop",
            ImageOp::EnvCreate { .. } => "env_create",
            ImageOp::EnvList => "env_list",
            ImageOp::Checkpoint(_) => "checkpoint",
            ImageOp::Pull(_) => "image_pull",
            ImageOp::Build(_) => "image_build",
        }
    }
}

impl ControlOp {
    pub fn kind(&self) -> &'static str {
        match self {
            ControlOp::NodeHeartbeat(_) => "node_heartbeat",
            ControlOp::Route { .. } => "route",
            ControlOp::Routes { .. } => "routes",
            ControlOp::ClusterStatus => "cluster_status",
            ControlOp::ProjectPut { .. } => "project_put",
            ControlOp::ProjectList => "project_list",
            ControlOp::TokenCreate { .. } => "token_create",
        }
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
        /// The command's pid inside the sandbox (its pid namespace), where the tier knows it.
        pid: Option<u32>,
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
    /// What `NodeOp::Doctor` found (and removed, if asked).
    Strays(Vec<StrayObject>),
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
    /// An image pulled from a registry. Last, so older variants keep their tags.
    Pulled(PulledImage),
    /// How far a pull is (before `Pulled`, or a create's `Sandbox`, when asked for).
    PullProgress(PullProgress),
    /// How a build goes (before `Built`).
    BuildEvent(BuildEvent),
    Built(BuiltImage),
    /// A `ConnectPort` reached its port: the connection's bytes follow, raw.
    PortOpen,
    /// Who the connection's token speaks for.
    Caller(CallerInfo),
    /// A sandbox's use over a time range, oldest first.
    UsageHistory(Vec<UsageSample>),
    Volume(VolumeInfo),
    Volumes(Vec<VolumeInfo>),
    /// Entries of a volume (one for a write, a stat, a mkdir or a change of attributes).
    VolumeEntries(Vec<VolumeEntry>),
    /// Lifecycle events, oldest first.
    Events(Vec<LifecycleEvent>),
    /// Changes under a watched directory.
    FileEvents(FileEvents),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    fn exec(stdin: StdinMode) -> ExecRequest {
        ExecRequest {
            sandbox: "sb-1".into(),
            argv: vec!["true".into()],
            stdin,
            ..Default::default()
        }
    }

    /// One request of each family: its kind (the pre-v6 metric name), the sandbox it routes by
    /// and whether an upload follows, and that it survives the wire.
    #[test]
    fn each_family_keeps_its_kind_sandbox_and_upload_and_round_trips() {
        let s = || "sb-1".to_string();
        let cases: Vec<(Request, &str, Option<&str>, bool)> = vec![
            (Request::Sandbox(SandboxOp::Status { sandbox: s() }), "status", Some("sb-1"), false),
            (
                Request::Sandbox(SandboxOp::DestroyMatching { labels: vec![] }),
                "destroy_matching",
                None,
                false,
            ),
            (Request::Exec(ExecOp::Start(exec(StdinMode::Stream))), "exec", Some("sb-1"), true),
            (Request::Exec(ExecOp::Start(exec(StdinMode::Empty))), "exec", Some("sb-1"), false),
            (
                Request::Exec(ExecOp::Kill { sandbox: s(), exec_id: 3 }),
                "exec_kill",
                Some("sb-1"),
                false,
            ),
            (
                Request::Session(SessionOp::List { sandbox: s() }),
                "session_list",
                Some("sb-1"),
                false,
            ),
            (
                Request::File(FileOp::Stat { sandbox: s(), path: "/".into() }),
                "file_stat",
                Some("sb-1"),
                false,
            ),
            (Request::Tool(ToolOp::Add { name: "jq".into() }), "tool_add", None, true),
            (
                Request::Tool(ToolOp::CallIn { sandbox: s(), call: CallRequest::new("jq", "{}") }),
                "call_in",
                Some("sb-1"),
                false,
            ),
            (Request::Image(ImageOp::CacheDrop), "image_cache_drop", None, false),
            (Request::Node(NodeOp::Status), "node_status", None, false),
            (Request::Node(NodeOp::Whoami), "whoami", None, false),
            (
                Request::Node(NodeOp::Doctor { remove: true, min_age_secs: 60 }),
                "node_doctor",
                None,
                false,
            ),
            (Request::Control(ControlOp::Route { sandbox: s() }), "route", Some("sb-1"), false),
            (Request::Control(ControlOp::ProjectList), "project_list", None, false),
            (
                Request::Volume(VolumeOp::Write(VolumeWriteRequest::default())),
                "volume_write",
                None,
                true,
            ),
            (Request::Volume(VolumeOp::List { project: None }), "volume_list", None, false),
        ];
        for (request, kind, sandbox, upload) in cases {
            assert_eq!(request.kind(), kind);
            assert_eq!(request.sandbox(), sandbox, "{kind}");
            assert_eq!(request.has_upload(), upload, "{kind}");
            let frame = encode(&request).expect("encode");
            let back: Request = decode(&frame[4..]).expect("decode");
            assert_eq!(back, request);
        }
    }
}
