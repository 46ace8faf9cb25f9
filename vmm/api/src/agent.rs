//! The agent protocol, over a vsock stream to [`PORT`] (through the VMM's Unix socket:
//! `CONNECT <port>\n` → `OK <port>\n` first, the VMM's hybrid-vsock handshake). After that,
//! everything both ways is a frame, in the one codec host, VMM and agent share:
//!
//! ```text
//! frame          kind u8 | len u32 LE | len bytes          (len ≤ MAX_FRAME)
//!
//! host → agent   REQUEST frame: one AgentRequest as JSON, first
//!   hello          nothing more: the agent answers its protocol (an older one, EXIT 2)
//!   exec           then, with stdin_frames, IN_STDIN frames (an empty one ends the input)
//!   attach         then, with input, IN_STDIN frames for the kept command's stdin
//!   put            then exactly `len` raw bytes of the file (not framed)
//!   session        then IN_STDIN (to fd 0), IN_COMMAND (to fd 3), IN_INTERRUPT, IN_CLOSE
//!   session_attach the same, for a kept session
//!   container      as `crate::container` says for the request inside
//! agent → host   STDOUT / STDERR as produced (a session adds SESSION_DONE from its fd 4),
//!                then EXIT (i32 LE status) or SIGNALED (i32 LE signal), last
//! ```
//!
//! A command's argv, environment and working directory travel as data and reach `execve` as
//! they are: nothing is spliced into a shell line. A host hang-up kills what the request
//! started, except a command started with `keep`: the agent keeps it running and keeps its
//! output (up to [`MAX_KEPT_OUTPUT`]) and status under the host's id, so a restarted host
//! lists them (`kept`), reads each again from its first byte (`attach`) and stops one
//! (`kill`). A session started with `keep` outlives the connection too: its shell blocks on
//! full pipes while no host is attached, and a restarted host takes it back by id
//! (`session_attach`), asks whether its shell waits for a command (`session_probe`), lists the
//! kept sessions (`sessions`) and ends one (`session_close`, or IN_CLOSE on its connection).
//! The host reads every reply with a byte cap and a deadline (`brig_vmtier`).

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::container::ContainerRequest;
use crate::guest_files::GuestFileRequest;

/// The agent's vsock port.
pub const PORT: u32 = 1024;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const EXIT: u8 = 3;
/// A session shell's completion reports (its fd 4).
pub const SESSION_DONE: u8 = 4;
/// In place of EXIT, last: the process died of this signal (i32 LE). An exec of the agent's
/// own reports 128 + signal in EXIT instead, as a shell would.
pub const SIGNALED: u8 = 5;
/// Agent → host, first, for a command whose stdin is given whole ([`KeptStdin::Whole`]) or that
/// was asked to say so ([`KeepExec::started`]): all of its given stdin arrived and the command
/// started (and is kept). A command that cannot start answers STDERR and EXIT instead.
pub const STARTED: u8 = 6;
/// Host → agent: bytes for a process's stdin, for a session's fd 3, and an interrupt.
pub const IN_STDIN: u8 = 16;
pub const IN_COMMAND: u8 = 17;
pub const IN_INTERRUPT: u8 = 18;
/// Host → agent, on a kept session's connection: end the shell and all it started (a hang-up
/// does not).
pub const IN_CLOSE: u8 = 19;
/// Host → agent, first on every connection: the request.
pub const REQUEST: u8 = 32;
/// Largest frame a reader accepts.
pub const MAX_FRAME: usize = 1 << 20;
/// The EXIT status of a command whose program could not be started (as a shell says 127).
pub const EXIT_CANNOT_START: i32 = 127;
/// The EXIT status of a file transfer (`Put`, `Get`) whose path is no regular file (a FIFO, a
/// device, a socket): refused before anything waits on it.
pub const EXIT_NOT_REGULAR: i32 = 3;
/// The EXIT status of an agent that cannot read a request (an agent older than the request's
/// kind or fields says it too).
pub const EXIT_BAD_REQUEST: i32 = 2;

/// What this agent speaks, as `hello` answers it. 1 is an agent older than `hello` (it
/// answers [`EXIT_BAD_REQUEST`]); 2 adds [`KeepExec::started`]; 3 adds
/// [`AgentRequest::Files`] and answers a failed file request (and any other request that ran no
/// process) with a [`crate::container::Failure`] status instead of 1.
pub const PROTOCOL: u32 = 3;

/// The agent's answer to `hello`: one STDOUT frame, then EXIT 0.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentHello {
    /// Its [`PROTOCOL`].
    pub protocol: u32,
}

/// A process for the agent to start: exactly this argv, this environment on top of the
/// agent's own, in this directory.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProcessRun {
    /// The program (looked up in `PATH` when it has no `/`) and its arguments.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Absolute, in the sandbox; none is `/`.
    pub cwd: Option<String>,
}

impl ProcessRun {
    /// `argv` as it is, with no environment of its own, in `/`.
    pub fn argv(argv: Vec<String>) -> ProcessRun {
        ProcessRun { argv, env: Vec::new(), cwd: None }
    }

    /// A shell command line of the host's own (`/bin/sh -c command`).
    pub fn shell(command: &str) -> ProcessRun {
        ProcessRun::argv(vec!["/bin/sh".into(), "-c".into(), command.into()])
    }
}

/// What the host asks the agent, one per connection.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentRequest {
    /// What the agent speaks: one STDOUT frame, an [`AgentHello`], then EXIT 0.
    Hello,
    /// Starts a process; `stdin_frames`: its stdin comes as IN_STDIN frames (otherwise it is
    /// empty); `keep`: it outlives the connection (see the module's text).
    Exec {
        process: ProcessRun,
        stdin_frames: bool,
        /// Left out when none, so an agent older than `keep` still runs plain commands.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep: Option<KeepExec>,
    },
    /// Commands kept (started with `keep`) and not yet read to their end: one STDOUT frame,
    /// a JSON list of [`KeptInfo`], then EXIT 0.
    ///
    /// This request and the other kept-command and kept-session requests name a `container`
    /// of a container-host VM's service (kept with the container's EXEC or SESSION and `keep`)
    /// or, left out, the VM's own: each container's ids are its own.
    Kept {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// A kept command's output from its first byte, then what it writes next, then its
    /// EXIT; EXIT 1 with a message when the agent keeps no such command. With `input`, the
    /// connection's IN_STDIN frames go to the command's kept stdin (an empty one ends it).
    Attach {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        input: bool,
    },
    /// Kills a kept command's process group.
    Kill {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// Stirs `seed_hex` into the guest's random pool and makes the CRNG reseed, so VMs resumed
    /// from one snapshot stop sharing a random stream.
    Seed { seed_hex: String },
    /// Writes the `len` raw bytes that follow the request to `path` (parents created).
    Put { path: String, len: u64 },
    /// Sends `path`'s bytes as STDOUT frames.
    Get { path: String },
    /// Starts a session shell (`process.argv` is `[shell, "-c", driver]`) with fds 3 and 4
    /// carried as frames; with `keep` (the host's session id), it outlives the connection.
    Session {
        process: ProcessRun,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep: Option<String>,
    },
    /// Carries a kept session's descriptors over this connection (replacing the connection
    /// that had them); EXIT 1 with a message when the agent keeps no such session.
    SessionAttach {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// Whether a kept session's shell waits for its next command: one STDOUT frame, a JSON
    /// [`SessionProbe`], then EXIT 0.
    SessionProbe {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// The kept sessions' ids: one STDOUT frame, a JSON list, then EXIT 0.
    Sessions {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// Ends a kept session: its shell and everything it started.
    SessionClose {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// A request for the container service of a container-host VM.
    Container { request: ContainerRequest },
    /// The VM's own files: stat, list, mkdir, remove (protocol 3; see
    /// [`crate::guest_files`]).
    Files { request: GuestFileRequest },
}

/// What `session_probe` tells of a kept session's shell.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SessionProbe {
    /// Blocked reading its next command (between commands).
    pub idle: bool,
}

/// Longest session id the agent keeps a session under.
pub const MAX_SESSION_ID: usize = 128;
/// Sessions the agent keeps at once for the VM, or for one container of a container-host VM;
/// past it, a session is refused.
pub const MAX_KEPT_SESSIONS: usize = 256;

/// Output the agent keeps per kept command; past it, output still goes to a connected host
/// but is not kept (a later attach reports the gap).
pub const MAX_KEPT_OUTPUT: usize = 8 << 20;
/// Commands the agent keeps at once; past it, a command runs as if not kept.
pub const MAX_KEPT: usize = 1024;

/// Asks the agent to keep a command across the host's restarts, under the host's `id`, with
/// its deadline and output cap (a restarted host enforces them again).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeepExec {
    pub id: u64,
    pub timeout_ms: u64,
    pub output_limit: u64,
    /// What becomes of its stdin (with `stdin_frames`) when the connection ends first. Left
    /// out when it ends with the connection, so an agent older than this field still keeps
    /// commands whose stdin is empty or ends that way.
    #[serde(default, skip_serializing_if = "KeptStdin::ends_with_connection")]
    pub stdin: KeptStdin,
    /// Say [`STARTED`] once the command runs and is kept, whatever its stdin (protocol 2; left
    /// out when false, so an older agent still keeps commands). A node that acknowledges the
    /// command only then acknowledges what a pause or a crash a moment later still finds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started: bool,
}

/// A kept command's stdin, streamed as IN_STDIN frames, when the connection that started the
/// command ends before an empty frame ended the input.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum KeptStdin {
    /// It ends: the command reads end of file.
    #[default]
    EndsWithConnection,
    /// The host gives it whole: the agent reads it to its empty frame (at most
    /// [`MAX_WHOLE_STDIN`] bytes) before it starts the command, which reads it from a file,
    /// and says [`STARTED`]. A host that goes away cannot cut it short then; a hang-up before
    /// its end starts nothing (and the host never saw STARTED).
    Whole,
    /// It stays open: a host that attaches again with `input` writes on, until an empty
    /// frame ends it or the command does.
    Kept,
}

impl KeptStdin {
    fn ends_with_connection(&self) -> bool {
        *self == KeptStdin::EndsWithConnection
    }
}

/// The most stdin a host may give whole ([`KeptStdin::Whole`]).
pub const MAX_WHOLE_STDIN: usize = 16 << 20;

/// One kept command, as `kept` lists it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeptInfo {
    pub keep: KeepExec,
    /// Its argv, at most 16 arguments of at most 256 bytes each (enough to name it).
    pub argv: Vec<String>,
    /// Since it started.
    pub elapsed_ms: u64,
    pub ended: bool,
    /// Output past [`MAX_KEPT_OUTPUT`] was not kept.
    pub gap: bool,
    /// Its stdin is open and kept ([`KeptStdin::Kept`]): `attach` with `input` writes to it.
    #[serde(default)]
    pub input_open: bool,
}

/// A request or frame the other side cannot take.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("agent frame of {len} bytes (at most {MAX_FRAME})")]
    TooLarge { len: usize },
    #[error("expected a request frame, got kind {0}")]
    NotARequest(u8),
    #[error("malformed agent request")]
    Malformed(#[source] serde_json::Error),
    #[error("agent connection")]
    Io(#[from] std::io::Error),
}

/// A frame's 5-byte header.
pub fn frame_header(kind: u8, len: usize) -> [u8; 5] {
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    head
}

/// A whole frame (header and data), for writers that send it in one piece.
pub fn encode_frame(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(5 + data.len());
    frame.extend_from_slice(&frame_header(kind, data.len()));
    frame.extend_from_slice(data);
    frame
}

/// Parses a frame header: kind and length, refusing frames over [`MAX_FRAME`].
pub fn parse_header(head: [u8; 5]) -> Result<(u8, usize), FrameError> {
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge { len });
    }
    Ok((head[0], len))
}

pub fn write_frame(w: &mut impl Write, kind: u8, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&encode_frame(kind, data))
}

pub fn read_frame(r: &mut impl Read) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let (kind, len) = parse_header(head)?;
    let mut data = vec![0u8; len];
    r.read_exact(&mut data)?;
    Ok((kind, data))
}

impl AgentRequest {
    /// The request as its REQUEST frame.
    pub fn to_frame(&self) -> Vec<u8> {
        // Strings, numbers and lists with string keys: serializing cannot fail.
        encode_frame(REQUEST, &serde_json::to_vec(self).unwrap_or_default())
    }

    /// Reads the request frame a connection starts with.
    pub fn read(r: &mut impl Read) -> Result<AgentRequest, FrameError> {
        let (kind, data) = read_frame(r)?;
        if kind != REQUEST {
            return Err(FrameError::NotARequest(kind));
        }
        serde_json::from_slice(&data).map_err(FrameError::Malformed)
    }
}

/// The i32 an EXIT or SIGNALED frame carries (-1 when the frame is short).
pub fn status_of(data: &[u8]) -> i32 {
    data.get(..4).and_then(|b| b.try_into().ok()).map_or(-1, i32::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec() -> AgentRequest {
        AgentRequest::Exec {
            process: ProcessRun {
                argv: vec!["printf".into(), "%s".into(), "a\nb 'c'".into()],
                env: vec![("A B\nC".into(), "x\ny".into())],
                cwd: Some("/tmp/a b".into()),
            },
            stdin_frames: true,
            keep: Some(KeepExec {
                id: 3,
                timeout_ms: 60_000,
                output_limit: 1 << 20,
                stdin: KeptStdin::Kept,
                started: true,
            }),
        }
    }

    #[test]
    fn requests_and_frames_round_trip_unchanged() {
        let mut buf = exec().to_frame();
        write_frame(&mut buf, IN_STDIN, b"hello").expect("write");
        write_frame(&mut buf, EXIT, &7i32.to_le_bytes()).expect("write");
        let mut r = &buf[..];
        assert_eq!(AgentRequest::read(&mut r).expect("request"), exec());
        assert_eq!(read_frame(&mut r).expect("1"), (IN_STDIN, b"hello".to_vec()));
        let (kind, data) = read_frame(&mut r).expect("2");
        assert_eq!((kind, status_of(&data)), (EXIT, 7));
        assert_eq!(status_of(b"\x01"), -1);
        for request in [
            AgentRequest::Hello,
            AgentRequest::Seed { seed_hex: "00ff".into() },
            AgentRequest::Put { path: "/a b".into(), len: 5 },
            AgentRequest::Get { path: "/etc/x".into() },
            AgentRequest::Files {
                request: GuestFileRequest::Mkdir { path: "/w/a".into(), parents: true },
            },
            AgentRequest::Kept { container: None },
            AgentRequest::Kept { container: Some("sb-1".into()) },
            AgentRequest::Attach { id: 9, container: None, input: false },
            AgentRequest::Attach { id: 9, container: Some("sb-1".into()), input: true },
            AgentRequest::Kill { id: 9, container: Some("sb-1".into()) },
            AgentRequest::Session { process: ProcessRun::shell("true"), keep: Some("s-1".into()) },
            AgentRequest::SessionAttach { id: "s-1".into(), container: None },
            AgentRequest::SessionProbe { id: "s-1".into(), container: Some("sb-1".into()) },
            AgentRequest::Sessions { container: None },
            AgentRequest::SessionClose { id: "s-1".into(), container: Some("sb-1".into()) },
            AgentRequest::Container { request: ContainerRequest::Destroy { name: "sb-1".into() } },
        ] {
            assert_eq!(AgentRequest::read(&mut &request.to_frame()[..]).expect("r"), request);
        }
    }

    /// Agents and hosts of before kept stdin read each other's plain requests and listings:
    /// the new fields are left out when they say what the old protocol did.
    #[test]
    fn kept_stdin_fields_are_left_out_unless_used() {
        let keep = KeepExec {
            id: 1,
            timeout_ms: 5,
            output_limit: 6,
            stdin: KeptStdin::EndsWithConnection,
            started: false,
        };
        let json = serde_json::to_string(&keep).expect("json");
        assert_eq!(json, r#"{"id":1,"timeout_ms":5,"output_limit":6}"#);
        let kept: KeepExec = serde_json::from_str(&json).expect("old keep");
        assert_eq!(kept, keep);
        let attach = AgentRequest::Attach { id: 2, container: None, input: false };
        let json = serde_json::to_string(&attach).expect("json");
        assert_eq!(json, r#"{"op":"attach","id":2}"#);
        let old = r#"{"keep":{"id":1,"timeout_ms":5,"output_limit":6},"argv":["cat"],"elapsed_ms":9,"ended":false,"gap":false}"#;
        let info: KeptInfo = serde_json::from_str(old).expect("an older agent's listing");
        assert!(!info.input_open);
        let whole = KeepExec { stdin: KeptStdin::Whole, ..keep };
        assert!(serde_json::to_string(&whole).expect("json").contains(r#""stdin":"whole""#));
        let started = KeepExec { started: true, ..keep };
        assert!(serde_json::to_string(&started).expect("json").contains(r#""started":true"#));
    }

    /// `hello` is a request an older agent cannot read: it answers EXIT 2 (the host then knows
    /// it speaks protocol 1); a newer agent's answer may carry more than the protocol.
    #[test]
    fn hello_is_its_own_request_and_its_answer_takes_more_fields() {
        assert_eq!(serde_json::to_string(&AgentRequest::Hello).expect("json"), r#"{"op":"hello"}"#);
        let hello: AgentHello =
            serde_json::from_str(r#"{"protocol":3,"later":1}"#).expect("a newer agent's hello");
        assert_eq!(hello.protocol, 3);
    }

    #[test]
    fn bad_frames_and_requests_are_typed_errors() {
        let huge = frame_header(STDOUT, MAX_FRAME + 1);
        assert!(matches!(parse_header(huge), Err(FrameError::TooLarge { .. })));
        let stdout = encode_frame(STDOUT, b"{}");
        assert!(matches!(AgentRequest::read(&mut &stdout[..]), Err(FrameError::NotARequest(1))));
        for bad in [
            &br#"{"op":"nuke"}"#[..],
            br#"{"op":"get"}"#,
            br#"{"op":"get","path":"/a","x":1}"#,
            b"EXEC ls",
        ] {
            let frame = encode_frame(REQUEST, bad);
            assert!(matches!(AgentRequest::read(&mut &frame[..]), Err(FrameError::Malformed(_))));
        }
        let cut = &exec().to_frame()[..8];
        assert!(matches!(AgentRequest::read(&mut &cut[..]), Err(FrameError::Io(_))));
    }
}
