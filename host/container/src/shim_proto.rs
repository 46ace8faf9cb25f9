//! What the node and `brig-shim` say to each other.
//!
//! ```text
//! node                                    brig-shim (one per container)
//!   ← Configure(ShimConfig)
//!                                         join cgroups, unshare(user)
//!   → UserNamespace
//! write uid_map/gid_map
//!   ← IdsMapped
//!                                         unshare(mnt, uts, ipc, net, cgroup, pid), fork
//!                                         the shim's pid 1, exit; pid 1 builds the rootfs
//!                                         and chroots into it
//!   → Ready { init_pid, upper_fd }        (from pid 1: the shim, as the host sees it)
//!   ← Spawn + SCM_RIGHTS fds              clone → setsid, cgroup, fds, user, exec (host pids)
//!   → Spawned / Exited
//! … node gone: the shim keeps the container and waits on its socket …
//! node connects to ShimConfig::socket
//!   → ReattachedKeeping { init_pid, running, next_exec_id, upper_fd, kept }
//!   → KeptFds { exec_id } + SCM_RIGHTS fds   (one per kept process: its output read ends,
//!     or KeptFdsInput with its stdin's write end last)
//! ```
//! All of it travels on the shim's stdin, a `SOCK_SEQPACKET` socket: one message per packet,
//! postcard-encoded, at most [`MAX_MESSAGE_BYTES`]. Using stdin (not an extra descriptor) lets
//! the node start the shim with posix_spawn instead of forking its own large address space.
//! The shim is the container's pid 1: processes in the container see it, but cannot signal,
//! trace or open it (`crate::shim`), and nothing listens inside the sandbox (its socket is
//! bound on the host, in the node's run directory).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Largest control message in either direction.
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;
/// Most file descriptors attached to one message.
pub const MAX_FDS: usize = 16;
/// The control socket's descriptor number in the shim (its stdin).
pub const CONTROL_FD: i32 = 0;

/// How the shim builds the container. Sent once, first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShimConfig {
    /// The assembled root filesystem (an overlay mount on the host).
    pub rootfs: PathBuf,
    pub hostname: String,
    /// `cgroup.procs` files to join before creating namespaces.
    pub join_cgroups: Vec<PathBuf>,
    /// Host uid and gid that container root maps to; 65536 ids are mapped from there.
    pub id_base: u32,
    /// Paths hidden from the container (a file gets /dev/null bound over it, a dir
    /// `empty_dir`).
    pub masked_paths: Vec<String>,
    /// A directory on the container's upper tmpfs, owned by container root, that becomes
    /// /dev (a tmpfs of its own would cost a superblock per container; see docs/density.md).
    pub dev_dir: PathBuf,
    /// An empty directory, bound read-only over masked directories.
    pub empty_dir: PathBuf,
    /// A read-only sysfs the node's containers share (mounted from an empty network
    /// namespace), bound at /sys; `None`: the container mounts a sysfs of its own.
    pub shared_sys: Option<PathBuf>,
    /// Paths made read-only.
    pub readonly_paths: Vec<String>,
    /// Where the shim listens (a host path, bound before it leaves the host's mount namespace)
    /// so a restarted node can reconnect. Only root on the host can reach it.
    pub socket: PathBuf,
    /// The writable upper directory; the shim holds it open and hands it to a reconnecting
    /// node (for checkpoints).
    pub upper: PathBuf,
    /// Whether the container outlives a node that hangs up (it waits on `socket`), or dies.
    pub survive_node: bool,
}

/// Node → shim.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToShim {
    /// First message: what to build.
    Configure(ShimConfig),
    /// The node has written the shim's uid and gid maps.
    IdsMapped,
    /// Start a process. Attached descriptors, in order: stdin, stdout, stderr, then
    /// `extra_fds` descriptors that become fds 3, 4, … in the child, then `cgroup_fds`
    /// `cgroup.procs` files the child joins before anything else.
    Spawn(SpawnSpec),
    /// As `Spawn`, with `keep_fds` more descriptors attached last: the node's read ends of the
    /// process's output (stdout and stderr pipes, or its terminal). The shim holds them, so
    /// the process does not die of SIGPIPE when the node does, and hands them to a node that
    /// reconnects ([`FromShim::ReattachedKeeping`]) until the node releases them
    /// ([`ToShim::ReleaseKept`]): a node that dies after hearing of the exit but before reading
    /// the rest of the output gets them again. Last, so older variants keep their tags.
    SpawnKeeping { spec: SpawnSpec, keep_fds: u8 },
    /// The node has everything of process `exec_id`'s output (its spool holds the exit): the
    /// shim closes the descriptors it kept. Sent only to shims that keep (they reported
    /// `ReattachedKeeping` or were started by a node that knows it).
    ReleaseKept { exec_id: u64 },
    /// As `SpawnKeeping`, where the last kept descriptor is the node's write end of the
    /// process's stdin (streamed by a client): the shim holds it too, so a node that restarts
    /// can go on writing, and hands it back with [`FromShim::KeptFdsInput`]. Last, so older
    /// variants keep their tags.
    SpawnKeepingInput { spec: SpawnSpec, keep_fds: u8 },
    /// The node has closed process `exec_id`'s stdin: the shim closes its copy of the write
    /// end, so the process reads end of file.
    ReleaseKeptInput { exec_id: u64 },
    /// A file operation done with the container's rights (`crate::shim::file_op`): a child of
    /// the shim, in the container's namespaces, cgroups, root and confinement, runs as
    /// container root. Attached: the reply socket (a `SOCK_SEQPACKET` end the child answers
    /// [`FileReply`]s on), then, for [`FileRequest::Write`], the read end of a pipe with the
    /// bytes, and for [`FileRequest::List`], the write end of a pipe the entries go into.
    /// Last, so older variants keep their tags.
    FileOp(FileRequest),
}

/// What one file operation is; paths are as the container sees them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum FileRequest {
    /// Open a regular file for reading: the reply is [`FileReply::Opened`] with it attached.
    Read {
        path: String,
    },
    /// Open (create, truncate or append to) a file, answer [`FileReply::Ready`], copy the
    /// pipe's bytes into it until the pipe ends, then answer [`FileReply::Written`].
    Write {
        path: String,
        append: bool,
        parents: bool,
        mode: Option<u32>,
    },
    Stat {
        path: String,
    },
    /// The entries go into the pipe (postcard `Vec<WireEntry>`, then their metadata in the
    /// same order, a postcard `Vec<WireMetadata>`, which a shim from before metadata leaves
    /// out), then [`FileReply::Done`].
    List {
        path: String,
    },
    Mkdir {
        path: String,
        parents: bool,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    /// Make this the metadata of a file or directory: [`FileReply::EntryWithMetadata`].
    /// Last, so older variants keep their tags.
    SetMetadata {
        path: String,
        metadata: WireMetadata,
    },
    /// Watch a directory (`crate::shim::file_watch`): [`FileReply::Ready`] once the watch is
    /// in place, then frames of changes into the pipe until the node closes it.
    Watch {
        path: String,
        recursive: bool,
    },
}

/// A file's metadata ([`brig_core::files::FileMetadata`]) on the wire.
pub type WireMetadata = Vec<(String, String)>;

/// The file child's answers, on the request's reply socket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum FileReply {
    /// The file, opened for reading, is attached.
    Opened,
    /// The file is open: send the bytes.
    Ready,
    /// Every byte of the pipe is in the file.
    Written {
        bytes: u64,
    },
    /// An entry from a shim from before metadata.
    Entry(WireEntry),
    Done,
    Failed(WireFileError),
    /// An entry and its metadata. Last, so older variants keep their tags.
    EntryWithMetadata(WireEntry, WireMetadata),
}

/// [`brig_core::files::Entry`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireEntry {
    pub path: String,
    /// 0 file, 1 directory, 2 symlink, 3 other.
    pub kind: u8,
    pub size: u64,
    pub mode: u32,
    pub modified_unix_ms: u64,
    pub uid: u32,
    pub gid: u32,
}

/// [`crate::files::FileError`] on the wire (I/O errors as their errno).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum WireFileError {
    Io {
        path: String,
        errno: i32,
    },
    /// Not an errno: the operation failed in the shim or the child (text says how).
    Other {
        path: String,
        message: String,
    },
    BadPath(String),
    NotRegular(String),
    KernelFile {
        path: String,
        magic: u32,
    },
    /// Last, so older variants keep their tags.
    TooManyDirs {
        path: String,
        max: u64,
    },
}

/// A process whose output descriptors the shim holds for a reconnecting node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeptSpawn {
    pub exec_id: u64,
    /// Host pid.
    pub pid: i32,
    /// How it ended while no node was connected; `None`: it still runs.
    pub exit: Option<ExitInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpawnSpec {
    pub exec_id: u64,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory inside the container.
    pub cwd: String,
    /// User name, or `uid[:gid]`; `None` is root.
    pub user: Option<String>,
    /// Stdin is a terminal: make it the process's controlling terminal (after `setsid`).
    pub terminal: bool,
    pub extra_fds: u8,
    pub cgroup_fds: u8,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ExitInfo {
    Code(i32),
    Signal(i32),
}

/// Shim → node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum FromShim {
    /// The shim is in its new user namespace and waits for its id maps.
    UserNamespace,
    /// Sent to a node that reconnected, by shims from before `ReattachedAt` (kept so a
    /// newer node re-attaches their containers), with the upper directory's descriptor
    /// attached. `running` are processes started for an earlier connection; `next_exec_id` is
    /// above every exec id the shim has seen.
    Reattached {
        init_pid: i32,
        running: Vec<(u64, i32)>,
        next_exec_id: u64,
    },
    /// The container is built; `init_pid` is its pid 1 as the host sees it (the shim itself,
    /// which sends this; shims of earlier builds forked a separate init). `upper_fd` is the
    /// shim's descriptor of the writable upper directory, which the node reaches as
    /// `/proc/<shim>/fd/<upper_fd>` (after the host-side mounts are detached).
    Ready {
        init_pid: i32,
        upper_fd: i32,
    },
    /// A spawn request failed before a process existed.
    SpawnFailed {
        exec_id: u64,
        error: String,
    },
    /// `pid` (host view) runs the request.
    Spawned {
        exec_id: u64,
        pid: i32,
    },
    Exited {
        exec_id: u64,
        status: ExitInfo,
    },
    /// The container's init died (the container is gone); the shim exits next. Only from
    /// shims of earlier builds, whose init was a process of its own.
    InitDied {
        status: ExitInfo,
    },
    /// As `Reattached`, with the upper directory as the shim's descriptor number (as in
    /// `Ready`) instead of an attached descriptor. Last, so older variants keep their tags.
    ReattachedAt {
        init_pid: i32,
        running: Vec<(u64, i32)>,
        next_exec_id: u64,
        upper_fd: i32,
    },
    /// As `ReattachedAt`, from a shim that keeps output descriptors (`SpawnKeeping`): `kept`
    /// lists them, and one [`FromShim::KeptFds`] per entry follows, in order. The descriptors
    /// stay kept until the node releases them.
    ReattachedKeeping {
        init_pid: i32,
        running: Vec<(u64, i32)>,
        next_exec_id: u64,
        upper_fd: i32,
        kept: Vec<KeptSpawn>,
    },
    /// The kept output descriptors of process `exec_id`, attached.
    KeptFds {
        exec_id: u64,
    },
    /// As `KeptFds`, with the write end of the process's stdin attached last
    /// ([`ToShim::SpawnKeepingInput`]).
    KeptFdsInput {
        exec_id: u64,
    },
}

/// Node → the node's shim spawner (`brig-shim --spawner`, one per node).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum ToSpawner {
    /// Start a shim. Attached descriptors: its control socket (its stdin), then its stderr.
    Spawn,
    /// Start a typist. Attached descriptors: a command's terminal (its master), then a file
    /// to type into it (the command's stdin given whole). The typist writes all of it and
    /// exits, or exits once the terminal has closed; it outlives the node, so a node that dies
    /// meanwhile cannot cut the input short.
    Type,
}

/// Spawner → node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum FromSpawner {
    /// The shim runs as host pid `pid`.
    Spawned {
        pid: i32,
    },
    Failed {
        error: String,
    },
}

/// Exit status a child uses when the command could not be started.
pub const EXIT_CANNOT_EXEC: i32 = 127;
/// Exit status a child uses when its user or working directory is unusable.
pub const EXIT_BAD_SETUP: i32 = 126;
