//! Containers in a container-host VM: what the node asks the agent's container service.
//!
//! A container-host VM is a Linux guest whose agent runs the node's own container runtime
//! (`brig-container`, with `brig-shim`) on the guest's kernel, so a kernel bug an agent
//! triggers takes down that VM, not the node. Every request is one connection, an
//! `AgentRequest::Container` (see `crate::agent`):
//!
//! ```text
//! host → agent   REQUEST frame {"op":"container","request":{…a ContainerRequest…}}
//! agent → host   frames, as for an exec: STDOUT / STDERR, then EXIT (i32 LE), last
//!
//! Exec { stdin: true }   then IN_STDIN frames for the process's stdin (an empty one ends it)
//! Session                then IN_STDIN / IN_COMMAND / IN_INTERRUPT frames, as SESSION;
//!                        SESSION_DONE frames come back
//! Put { len }            then exactly <len> bytes of the file
//! Get                    STDOUT frames carry the file
//! Stat / List / Usage    one STDOUT frame of JSON (FileEntry, [FileEntry], ContainerUsage)
//! ```
//! A request that fails before anything ran answers a STDERR line and an EXIT from
//! [`Failure`], so the node can tell "no such file" from "no such container". An Exec ends
//! with EXIT and the process's exit code, SIGNALED and the signal that ended it, or EXIT -1
//! when the container went away first. Exec and session processes end with the connection: a
//! host hang-up kills the process tree.

use serde::{Deserialize, Serialize};

/// A new container in the VM.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateSpec {
    /// Unique in the VM (the node uses the sandbox id).
    pub name: String,
    pub hostname: String,
    /// The layers' EROFS images as the guest sees them (its block devices), base first.
    pub layers: Vec<String>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_millis: Option<u64>,
    /// The writable layer's quota.
    pub disk_bytes: u64,
}

/// A process to start in a container.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Working directory in the container; empty is `/`.
    pub cwd: String,
    /// A user name, or `uid[:gid]`; none is root.
    pub user: Option<String>,
}

/// One request; the container is named in every one.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContainerRequest {
    Create(CreateSpec),
    Destroy {
        name: String,
    },
    /// Starts a process; `stdin`: IN_STDIN frames follow (otherwise its stdin is empty);
    /// `keep`: it outlives the connection, kept under the container's name and `keep.id` (the
    /// agent's KEPT, ATTACH and KILL with `container`).
    Exec {
        process: ProcessSpec,
        stdin: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep: Option<crate::agent::KeepExec>,
    },
    /// Starts a session shell (`process.argv` is `[shell, "-c", driver]`) with fds 3 and 4
    /// carried as frames, as the agent's SESSION request does; with `keep` (the host's session
    /// id), it outlives the connection, kept under the container's name.
    Session {
        process: ProcessSpec,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep: Option<String>,
    },
    Put {
        name: String,
        path: String,
        len: u64,
        append: bool,
        mode: Option<u32>,
    },
    Get {
        name: String,
        path: String,
    },
    Stat {
        name: String,
        path: String,
    },
    List {
        name: String,
        path: String,
    },
    Mkdir {
        name: String,
        path: String,
        parents: bool,
    },
    Remove {
        name: String,
        path: String,
        recursive: bool,
    },
    /// Freezes (pause) or thaws (resume) every process of the container.
    Freeze {
        name: String,
        frozen: bool,
    },
    Usage {
        name: String,
    },
    /// The names of the containers the service runs: one STDOUT frame, a JSON list (a
    /// restarted node removes those no record claims).
    Names {},
}

/// Most containers one container-host VM runs (what `names` lists at most).
pub const MAX_CONTAINERS: usize = 4096;

impl ContainerRequest {
    /// The container the request is about (none for `names`).
    pub fn container(&self) -> Option<&str> {
        Some(match self {
            ContainerRequest::Names {} => return None,
            ContainerRequest::Create(spec) => &spec.name,
            ContainerRequest::Exec { process, .. } | ContainerRequest::Session { process, .. } => {
                &process.name
            }
            ContainerRequest::Destroy { name }
            | ContainerRequest::Put { name, .. }
            | ContainerRequest::Get { name, .. }
            | ContainerRequest::Stat { name, .. }
            | ContainerRequest::List { name, .. }
            | ContainerRequest::Mkdir { name, .. }
            | ContainerRequest::Remove { name, .. }
            | ContainerRequest::Freeze { name, .. }
            | ContainerRequest::Usage { name } => name,
        })
    }
}

/// Why a request failed, as its EXIT status (the STDERR line says more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Malformed or refused request.
    BadRequest,
    NoSuchContainer,
    NotFound,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    PermissionDenied,
    DirectoryNotEmpty,
    /// The container runtime failed (mounts, cgroups, the shim).
    Runtime,
    Other,
}

const FAILURES: [(Failure, i32); 10] = [
    (Failure::BadRequest, 64),
    (Failure::NoSuchContainer, 65),
    (Failure::NotFound, 66),
    (Failure::AlreadyExists, 67),
    (Failure::NotADirectory, 68),
    (Failure::IsADirectory, 69),
    (Failure::PermissionDenied, 70),
    (Failure::DirectoryNotEmpty, 71),
    (Failure::Runtime, 72),
    (Failure::Other, 73),
];

impl Failure {
    pub fn code(self) -> i32 {
        FAILURES.iter().find(|(f, _)| *f == self).map_or(73, |(_, c)| *c)
    }

    /// The failure an EXIT status names (anything else is `Other`).
    pub fn from_code(code: i32) -> Failure {
        FAILURES.iter().find(|(_, c)| *c == code).map_or(Failure::Other, |(f, _)| *f)
    }

    /// The failure of an I/O error.
    pub fn of_io(kind: std::io::ErrorKind) -> Failure {
        use std::io::ErrorKind as K;
        match kind {
            K::NotFound => Failure::NotFound,
            K::AlreadyExists => Failure::AlreadyExists,
            K::NotADirectory => Failure::NotADirectory,
            K::IsADirectory => Failure::IsADirectory,
            K::PermissionDenied => Failure::PermissionDenied,
            K::DirectoryNotEmpty => Failure::DirectoryNotEmpty,
            K::InvalidInput => Failure::BadRequest,
            _ => Failure::Other,
        }
    }

    /// The I/O error kind a file failure stands for, if it is one.
    pub fn io_kind(self) -> Option<std::io::ErrorKind> {
        use std::io::ErrorKind as K;
        Some(match self {
            Failure::NotFound => K::NotFound,
            Failure::AlreadyExists => K::AlreadyExists,
            Failure::NotADirectory => K::NotADirectory,
            Failure::IsADirectory => K::IsADirectory,
            Failure::PermissionDenied => K::PermissionDenied,
            Failure::DirectoryNotEmpty => K::DirectoryNotEmpty,
            Failure::BadRequest => K::InvalidInput,
            Failure::NoSuchContainer | Failure::Runtime | Failure::Other => return None,
        })
    }
}

/// A file's metadata, as a host-kernel container's file API reports it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub modified_unix_ms: u64,
}

/// What a container has used.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ContainerUsage {
    pub cpu_ns: u64,
    pub memory_bytes: u64,
    /// Whether its init still runs.
    pub alive: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_failures_keep_their_kind() {
        let req = ContainerRequest::Exec {
            process: ProcessSpec {
                name: "sb-1".into(),
                argv: vec!["sh".into(), "-c".into(), "echo a\necho b".into()],
                env: vec![("A".into(), "1".into())],
                cwd: "/tmp".into(),
                user: None,
            },
            stdin: true,
            keep: Some(crate::agent::KeepExec {
                id: 4,
                timeout_ms: 1000,
                output_limit: 64,
                stdin: crate::agent::KeptStdin::Whole,
                started: true,
            }),
        };
        let body = serde_json::to_vec(&req).expect("encode");
        let back: ContainerRequest = serde_json::from_slice(&body).expect("decode");
        assert_eq!(back, req);
        assert_eq!(back.container(), Some("sb-1"));
        let names = serde_json::to_vec(&ContainerRequest::Names {}).expect("encode");
        let back: ContainerRequest = serde_json::from_slice(&names).expect("decode");
        assert_eq!(back, ContainerRequest::Names {});
        assert_eq!(back.container(), None);
        assert!(serde_json::from_slice::<ContainerRequest>(br#"{"op":"nuke","name":"x"}"#).is_err());
        for (f, _) in FAILURES {
            assert_eq!(Failure::from_code(f.code()), f);
        }
        assert_eq!(Failure::from_code(1), Failure::Other);
        assert_eq!(Failure::of_io(std::io::ErrorKind::NotFound), Failure::NotFound);
        assert_eq!(Failure::NotFound.io_kind(), Some(std::io::ErrorKind::NotFound));
    }
}
