//! The agent protocol, over a vsock stream to [`PORT`] (through the VMM's Unix socket:
//! `CONNECT <port>\n` → `OK <port>\n` first):
//!
//! ```text
//! host → agent   EXEC <shell command>\n
//! agent → host   frames: kind u8 | len u32 LE | bytes
//!                STDOUT / STDERR as produced, then EXIT (i32 LE status), last
//!
//! host → agent   EXECIN <shell command>\n, then IN_STDIN frames for its stdin (an empty one
//!                ends it); answered as EXEC
//!
//! host → agent   SESSION <len> <shell>\n, then <len> bytes: a script `<shell> -c` runs with
//!                fds 3 and 4 wired to the connection; then frames IN_STDIN (to fd 0),
//!                IN_COMMAND (to fd 3), IN_INTERRUPT (SIGINT to its process group)
//! agent → host   frames STDOUT, STDERR, SESSION_DONE (from fd 4), then EXIT when it ends;
//!                a host hang-up kills the script and everything it started
//! ```

use std::io::{Read, Write};

/// The agent's vsock port.
pub const PORT: u32 = 1024;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const EXIT: u8 = 3;
/// A session shell's completion reports (its fd 4).
pub const SESSION_DONE: u8 = 4;
/// In place of EXIT, last: the process died of this signal (i32 LE). Container requests send
/// it (see `crate::container`); plain EXEC reports 128 + signal in EXIT.
pub const SIGNALED: u8 = 5;
/// Host → agent in a session: bytes for the shell's stdin, for its fd 3, and an interrupt.
pub const IN_STDIN: u8 = 16;
pub const IN_COMMAND: u8 = 17;
pub const IN_INTERRUPT: u8 = 18;
/// Largest frame a reader accepts.
pub const MAX_FRAME: usize = 1 << 20;

/// The request line that stirs `seed` (hex) into the guest's random pool and forces the
/// kernel's CRNG to reseed, so VMs resumed from one snapshot stop sharing a random stream.
pub fn seed_line(seed_hex: &str) -> String {
    format!("SEED {seed_hex}\n")
}

/// The seed in a seed request line, if it is one.
pub fn parse_seed_line(line: &str) -> Option<&str> {
    line.trim_end_matches('\n').strip_prefix("SEED ")
}

/// Writes a file: the line, then exactly `len` raw bytes; the agent answers `EXIT` 0 (or
/// `STDERR` and a non-zero `EXIT`). Paths are the guest's, absolute.
pub fn put_line(path: &str, len: u64) -> String {
    format!("PUT {len} {path}\n")
}

/// Reads a file: the agent answers `STDOUT` frames with its bytes, then `EXIT`.
pub fn get_line(path: &str) -> String {
    format!("GET {path}\n")
}

/// Starts a session: the line, then exactly `len` bytes of script for `shell -c`.
pub fn session_line(shell: &str, len: usize) -> String {
    format!("SESSION {len} {}\n", shell.replace('\n', " "))
}

/// A parsed agent request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentRequest<'a> {
    Exec(&'a str),
    /// A command whose stdin follows as IN_STDIN frames.
    ExecInput(&'a str),
    Seed(&'a str),
    Put {
        path: &'a str,
        len: u64,
    },
    Get(&'a str),
    Session {
        shell: &'a str,
        len: usize,
    },
}

/// Parses a request line (without or with its newline).
pub fn parse_request(line: &str) -> Option<AgentRequest<'_>> {
    let line = line.trim_end_matches('\n');
    let (verb, rest) = line.split_once(' ')?;
    match verb {
        "EXEC" => Some(AgentRequest::Exec(rest)),
        "EXECIN" => Some(AgentRequest::ExecInput(rest)),
        "SEED" => Some(AgentRequest::Seed(rest)),
        "GET" if rest.starts_with('/') => Some(AgentRequest::Get(rest)),
        "SESSION" => {
            let (len, shell) = rest.split_once(' ')?;
            shell.starts_with('/').then_some(())?;
            Some(AgentRequest::Session { shell, len: len.parse().ok()? })
        }
        "PUT" => {
            let (len, path) = rest.split_once(' ')?;
            path.starts_with('/').then_some(())?;
            Some(AgentRequest::Put { path, len: len.parse().ok()? })
        }
        _ => None,
    }
}

/// The request line for `command` (newlines become spaces: one line per request).
pub fn exec_line(command: &str) -> String {
    format!("EXEC {}\n", command.replace('\n', " "))
}

/// The request line for `command` with its stdin streamed after it as IN_STDIN frames.
pub fn exec_input_line(command: &str) -> String {
    format!("EXECIN {}\n", command.replace('\n', " "))
}

/// The command in a request line, if it is one.
pub fn parse_exec_line(line: &str) -> Option<&str> {
    line.trim_end_matches('\n').strip_prefix("EXEC ")
}

pub fn frame_header(kind: u8, len: usize) -> [u8; 5] {
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&(len as u32).to_le_bytes());
    head
}

pub fn write_frame(w: &mut impl Write, kind: u8, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&frame_header(kind, data.len()))?;
    w.write_all(data)
}

/// Parses a frame header: kind and length, refusing frames over [`MAX_FRAME`].
pub fn parse_header(head: [u8; 5]) -> Result<(u8, usize), String> {
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(format!("agent frame of {len} bytes"));
    }
    Ok((head[0], len))
}

pub fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let (kind, len) = parse_header(head).map_err(std::io::Error::other)?;
    let mut data = vec![0u8; len];
    r.read_exact(&mut data)?;
    Ok((kind, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, STDOUT, b"hello").expect("write");
        write_frame(&mut buf, EXIT, &7i32.to_le_bytes()).expect("write");
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).expect("1"), (STDOUT, b"hello".to_vec()));
        assert_eq!(read_frame(&mut r).expect("2"), (EXIT, 7i32.to_le_bytes().to_vec()));
        let huge = frame_header(STDOUT, MAX_FRAME + 1);
        assert!(parse_header(huge).is_err());
        assert_eq!(parse_exec_line(&exec_line("echo a\necho b")), Some("echo a echo b"));
        assert_eq!(parse_exec_line("RUN x\n"), None);
        assert_eq!(
            parse_request(&put_line("/a b", 5)),
            Some(AgentRequest::Put { path: "/a b", len: 5 })
        );
        assert_eq!(parse_request(&get_line("/etc/x")), Some(AgentRequest::Get("/etc/x")));
        assert_eq!(parse_request("GET relative\n"), None);
        assert_eq!(parse_request("PUT x /a\n"), None);
        assert_eq!(
            parse_request(&session_line("/bin/sh", 12)),
            Some(AgentRequest::Session { shell: "/bin/sh", len: 12 })
        );
        assert_eq!(parse_request("SESSION 5 sh\n"), None);
        assert_eq!(parse_request(&exec_input_line("cat")), Some(AgentRequest::ExecInput("cat")));
    }
}
