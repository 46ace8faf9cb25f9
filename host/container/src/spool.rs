//! A command's output on disk, so a node that restarts can serve it again: the exec engine
//! appends each chunk right after reading it from the command's pipe (before anyone else sees
//! it) and the exit last. A restarted node replays the spool, then goes on reading the pipes
//! the shim kept (`crate::kept`). Written with plain `write`: it survives the node process
//! dying, not the machine.
//!
//! ```text
//! <run>/c/<container>/spool/<exec id>.spool
//!   frame = tag u8 | len u32 LE | payload
//!   tag 0 header (JSON SpoolHeader), 1 stdout, 2 stderr, 3 gap (output past the cap),
//!   4 exit (JSON SpoolExit)
//! ```

use std::io::{ErrorKind, Read, Write};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use brig_core::SandboxError;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::exec::{code_and_signal, ExecEvent, ExecExit};
use crate::shim_proto::ExitInfo;
use brig_hostkit::spare_files::SpareFiles;

/// Output kept on disk per command; past it a gap is marked and the rest is not written.
pub const MAX_SPOOL_OUTPUT: u64 = 8 << 20;
/// Largest frame read back.
const MAX_FRAME: usize = 1 << 20;
/// Finished spools are kept this long (as the node keeps finished commands attachable).
pub const FINISHED_KEEP: Duration = Duration::from_secs(600);

const TAG_HEADER: u8 = 0;
const TAG_STDOUT: u8 = 1;
const TAG_STDERR: u8 = 2;
const TAG_GAP: u8 = 3;
const TAG_EXIT: u8 = 4;

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spool {path} is damaged: {why}")]
    Damaged { path: PathBuf, why: String },
}

/// What a spool says about its command.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpoolHeader {
    /// The node's id of the exec.
    pub exec_id: u64,
    /// The shim's id of the process.
    pub spawn_id: u64,
    /// Its exec cgroup (`e<n>`).
    pub cgroup: String,
    pub argv: Vec<String>,
    pub started_unix_ms: u64,
    pub timeout_ms: Option<u64>,
    pub output_limit: u64,
    /// Runs on a terminal (one output stream).
    pub terminal: bool,
}

/// Where a new command's spool goes, and the node's id for it.
#[derive(Debug, Clone)]
pub struct SpoolTarget {
    pub dir: PathBuf,
    pub exec_id: u64,
}

/// An open spool being written. Write failures (a full disk) are logged once and the spool
/// stops: the command is never failed for it. Written at explicit offsets (not `O_APPEND`, with
/// which Linux ignores `pwrite`'s offset), so a frame's length can be filled in after its
/// payload was spliced in.
pub struct Spool {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Where the next frame goes.
    end: u64,
    output: u64,
    gap: bool,
}

/// A frame length not yet filled in: the payload runs to the end of the file.
const UNFINISHED: u32 = u32::MAX;

fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(tag);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

impl Spool {
    /// The spool file of exec `exec_id` in `dir`.
    pub fn path_in(dir: &Path, exec_id: u64) -> PathBuf {
        dir.join(format!("{exec_id}.spool"))
    }

    /// Starts the spool of a new command: in a spare file (emptied when it was given back),
    /// else a new one (see [`brig_hostkit::spare_files`]).
    pub fn create(
        dir: &Path,
        header: &SpoolHeader,
        spares: Option<&SpareFiles>,
    ) -> Result<Spool, SpoolError> {
        let path = Self::path_in(dir, header.exec_id);
        let io = |source| SpoolError::Io { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = match spares.and_then(|s| take_spare(s, &path)) {
            Some(file) => file,
            None => {
                let options =
                    std::fs::OpenOptions::new().create_new(true).read(true).write(true).clone();
                options.open(&path).map_err(io)?
            }
        };
        let json = serde_json::to_vec(header).map_err(|e| io(std::io::Error::other(e)))?;
        let head = frame(TAG_HEADER, &json);
        file.write_all(&head).map_err(io)?;
        Ok(Spool { path, file: Some(file), end: head.len() as u64, output: 0, gap: false })
    }

    /// Goes on writing the spool `recovered` was read from (filling in the length of a frame
    /// a crash left unfinished).
    pub fn reopen(path: &Path, recovered: &Recovered) -> Spool {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path);
        let file = file.and_then(|f| {
            if let Some((at, len)) = recovered.unfinished {
                f.write_all_at(&len.to_le_bytes(), at)?;
            }
            // A frame cut short (not spliced) is dropped, to be written over.
            f.set_len(recovered.end)?;
            Ok(f)
        });
        if let Err(e) = &file {
            tracing::warn!(path = %path.display(), error = %e, "cannot reopen a spool");
        }
        Spool {
            path: path.to_path_buf(),
            file: file.ok(),
            end: recovered.end,
            output: recovered.spooled_output,
            gap: recovered.gap,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.file else { return };
        match file.write_all_at(bytes, self.end) {
            Ok(()) => self.end += bytes.len() as u64,
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        tracing::warn!(path = %self.path.display(), error = %e, "spool write failed; not spooling this command further");
        self.file = None;
    }

    /// Output it can still take whole before its cap (0 once stopped).
    pub fn room(&self) -> u64 {
        match (&self.file, self.gap) {
            (Some(_), false) => MAX_SPOOL_OUTPUT.saturating_sub(self.output),
            _ => 0,
        }
    }

    /// Appends output as it was delivered.
    pub fn output(&mut self, stdout: bool, chunk: &[u8]) {
        if self.gap {
            return;
        }
        if self.output + chunk.len() as u64 > MAX_SPOOL_OUTPUT {
            self.gap = true;
            self.write(&frame(TAG_GAP, &[]));
            return;
        }
        self.output += chunk.len() as u64;
        self.write(&frame(if stdout { TAG_STDOUT } else { TAG_STDERR }, chunk));
    }

    /// Moves up to `max` bytes waiting in `pipe` into the spool inside the kernel (`splice`),
    /// then reads them back: no byte taken from the pipe exists only in this process, so a
    /// node killed at any instant loses none. `Ok(None)` at the end of the pipe;
    /// `WouldBlock` when nothing waits. Call only while [`Spool::room`] covers `max`.
    pub fn splice_from(
        &mut self,
        pipe: BorrowedFd<'_>,
        stdout: bool,
        max: usize,
    ) -> std::io::Result<Option<Bytes>> {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.file else { return Err(std::io::ErrorKind::BrokenPipe.into()) };
        let at = self.end;
        let tag = if stdout { TAG_STDOUT } else { TAG_STDERR };
        let mut head = [tag, 0, 0, 0, 0];
        head[1..].copy_from_slice(&UNFINISHED.to_le_bytes());
        file.write_all_at(&head, at)?;
        let mut to = (at + 5) as libc::loff_t;
        let flags = nix::fcntl::SpliceFFlags::SPLICE_F_NONBLOCK;
        let moved = match nix::fcntl::splice(pipe, None, file, Some(&mut to), max, flags) {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(e) => {
                file.set_len(at)?;
                return Err(e.into());
            }
        };
        let Some(n) = moved else {
            file.set_len(at)?;
            return Ok(None);
        };
        file.write_all_at(&(n as u32).to_le_bytes(), at + 1)?;
        let mut chunk = vec![0u8; n];
        file.read_exact_at(&mut chunk, at + 5)?;
        self.end = at + 5 + n as u64;
        self.output += n as u64;
        Ok(Some(Bytes::from(chunk)))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the exit, last.
    pub fn exit(&mut self, exit: &ExecExit) {
        match serde_json::to_vec(&SpoolExit::from(exit)) {
            Ok(json) => self.write(&frame(TAG_EXIT, &json)),
            Err(e) => tracing::warn!(error = %e, "cannot encode an exit for the spool"),
        }
        self.file = None;
    }
}

/// An exit as the spool keeps it on disk: its own type, so the interface's `ExecExit` can
/// change without making the spools of a node from before unreadable.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SpoolExit {
    /// `None` if the process could not be waited for (the container died).
    status: Option<ExitInfo>,
    timed_out: bool,
    killed: bool,
    truncated: bool,
    oom_killed: bool,
    duration: Duration,
    stdout_bytes: u64,
    stderr_bytes: u64,
}

impl From<&ExecExit> for SpoolExit {
    fn from(e: &ExecExit) -> SpoolExit {
        let status = match (e.exit_code, e.signal) {
            (Some(c), _) => Some(ExitInfo::Code(c)),
            (None, Some(s)) => Some(ExitInfo::Signal(s)),
            (None, None) => None,
        };
        SpoolExit {
            status,
            timed_out: e.timed_out,
            killed: e.killed,
            truncated: e.truncated,
            oom_killed: e.oom_killed,
            duration: e.duration,
            stdout_bytes: e.stdout_bytes,
            stderr_bytes: e.stderr_bytes,
        }
    }
}

impl From<SpoolExit> for ExecExit {
    fn from(e: SpoolExit) -> ExecExit {
        let (exit_code, signal) = code_and_signal(e.status);
        ExecExit {
            exit_code,
            signal,
            timed_out: e.timed_out,
            killed: e.killed,
            truncated: e.truncated,
            oom_killed: e.oom_killed,
            duration: e.duration,
            stdout_bytes: e.stdout_bytes,
            stderr_bytes: e.stderr_bytes,
        }
    }
}

/// A spool read back.
#[derive(Debug, Clone)]
pub struct Recovered {
    pub header: SpoolHeader,
    /// Output in order (`Stdout`/`Stderr` events only).
    pub events: Vec<ExecEvent>,
    /// Output past [`MAX_SPOOL_OUTPUT`] was not written.
    pub gap: bool,
    /// Output bytes the spool holds.
    pub spooled_output: u64,
    pub exit: Option<ExecExit>,
    /// When the spool was last written.
    pub modified: SystemTime,
    /// Where writing goes on.
    pub end: u64,
    /// A last frame a crash left with its length unfilled: where its length field is, and
    /// the length its payload has.
    pub unfinished: Option<(u64, u32)>,
}

/// Reads a spool (at most its cap plus framing). A spool cut short in its last frame (the node
/// died while writing it) reads as far as it is whole.
pub fn read(path: &Path) -> Result<Recovered, SpoolError> {
    let io = |source| SpoolError::Io { path: path.to_path_buf(), source };
    let damaged = |why: &str| SpoolError::Damaged { path: path.to_path_buf(), why: why.into() };
    let file = std::fs::File::open(path).map_err(io)?;
    let modified = file.metadata().and_then(|m| m.modified()).map_err(io)?;
    let cap = MAX_SPOOL_OUTPUT + 2 * MAX_FRAME as u64;
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(damaged("larger than a spool can be"));
    }
    let mut at = 0usize;
    let mut unfinished = None;
    let mut next = || -> Option<(u8, &[u8])> {
        let head = bytes.get(at..at + 5)?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if len == UNFINISHED {
            // Spliced in, length not yet filled in: the payload runs to the end.
            let payload = bytes.get(at + 5..)?;
            unfinished = Some(((at + 1) as u64, payload.len() as u32));
            at = bytes.len();
            return Some((head[0], payload));
        }
        let len = len as usize;
        if len > MAX_FRAME {
            return None;
        }
        let payload = bytes.get(at + 5..at + 5 + len)?;
        at += 5 + len;
        Some((head[0], payload))
    };
    let header = match next() {
        Some((TAG_HEADER, json)) => {
            serde_json::from_slice(json).map_err(|e| damaged(&format!("header: {e}")))?
        }
        _ => return Err(damaged("no header")),
    };
    let mut out = Recovered {
        header,
        events: Vec::new(),
        gap: false,
        spooled_output: 0,
        exit: None,
        modified,
        end: 0,
        unfinished: None,
    };
    while let Some((tag, payload)) = next() {
        match tag {
            TAG_STDOUT | TAG_STDERR => {
                out.spooled_output += payload.len() as u64;
                let chunk = Bytes::copy_from_slice(payload);
                out.events.push(match tag {
                    TAG_STDOUT => ExecEvent::Stdout(chunk),
                    _ => ExecEvent::Stderr(chunk),
                });
            }
            TAG_GAP => out.gap = true,
            TAG_EXIT => {
                let exit: SpoolExit =
                    serde_json::from_slice(payload).map_err(|e| damaged(&e.to_string()))?;
                out.exit = Some(exit.into());
                break;
            }
            other => return Err(damaged(&format!("unknown frame {other}"))),
        }
    }
    // Writing goes on after the last whole frame (a frame cut short is overwritten).
    out.end = at as u64;
    out.unfinished = unfinished;
    Ok(out)
}

/// A finished command's spool as the node reads it back for a client that attaches later
/// ([`brig_core::exec::ExecArchive`]): the node keeps none of the command's output in memory.
pub struct SpoolArchive {
    pub path: PathBuf,
    /// The exec the spool must be of (its file may have been retired and its name reused).
    pub exec_id: u64,
}

impl brig_core::exec::ExecArchive for SpoolArchive {
    fn read(
        &self,
    ) -> brig_core::sandbox::BoxFuture<'_, Result<brig_core::exec::ArchivedOutput, SandboxError>>
    {
        Box::pin(async move {
            let path = self.path.clone();
            let recovered = tokio::task::spawn_blocking(move || read(&path))
                .await
                .map_err(|e| SandboxError::Internal(format!("spool reader: {e}")))?;
            let recovered = match recovered {
                Err(SpoolError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                    return Err(SandboxError::NotFound("the command's output was let go".into()))
                }
                Err(e) => return Err(SandboxError::Internal(e.to_string())),
                Ok(r) if r.header.exec_id != self.exec_id => {
                    return Err(SandboxError::NotFound("the command's output was let go".into()))
                }
                Ok(r) => r,
            };
            Ok(brig_core::exec::ArchivedOutput { output: recovered.events, gap: recovered.gap })
        })
    }
}

/// A spare file renamed to `path` and opened, emptied, if there is one.
fn take_spare(spares: &SpareFiles, path: &Path) -> Option<std::fs::File> {
    spares
        .take_empty_as(path)
        .inspect_err(
            |e| tracing::warn!(path = %path.display(), error = %e, "spare spool file dropped"),
        )
        .ok()
        .flatten()
}

/// Removes the spool at `path`: emptied and given to `spares` (its inode kept for the next
/// command), or deleted.
pub fn retire(path: &Path, spares: Option<&SpareFiles>) -> std::io::Result<()> {
    match spares {
        Some(spares) => spares.give_emptied(path),
        None => std::fs::remove_file(path),
    }
}

/// Every spool in `dir`, oldest exec first; damaged ones are reported and removed.
pub fn read_all(dir: &Path) -> Vec<(PathBuf, Recovered)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "spool") {
            continue;
        }
        match read(&path) {
            Ok(recovered) => out.push((path, recovered)),
            Err(e) => {
                tracing::warn!(error = %e, "removing a spool that cannot be read");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out.sort_by_key(|(_, r)| r.header.exec_id);
    out
}

/// Spools of finished commands a container keeps at most (as many as the node keeps
/// attachable execs per sandbox by default): past it the oldest is removed when another
/// command ends, so a busy sandbox's spool directory, and the node's inode count, stay bounded
/// instead of growing with every command of the last [`FINISHED_KEEP`].
pub const FINISHED_KEPT: usize = 256;

/// The spools of a container's finished commands, oldest first, bounded by [`FINISHED_KEPT`].
pub struct FinishedSpools {
    paths: parking_lot::Mutex<std::collections::VecDeque<PathBuf>>,
    /// The node's spare spool files, which removed spools go to.
    spares: Option<Arc<SpareFiles>>,
}

impl FinishedSpools {
    pub fn new(spares: Option<Arc<SpareFiles>>) -> FinishedSpools {
        FinishedSpools { paths: Default::default(), spares }
    }

    /// The node's spare spool files.
    pub fn spares(&self) -> Option<&SpareFiles> {
        self.spares.as_deref()
    }

    /// Notes that `path`'s command finished; removes the oldest spools past the bound (on a
    /// blocking thread, inside a runtime: an unlink on a file system mounted with `discard`
    /// frees the blocks synchronously).
    pub fn push(&self, path: PathBuf) {
        let over: Vec<PathBuf> = {
            let mut paths = self.paths.lock();
            paths.push_back(path);
            let n = paths.len().saturating_sub(FINISHED_KEPT);
            paths.drain(..n).collect()
        };
        if over.is_empty() {
            return;
        }
        let spares = self.spares.clone();
        let remove = move || {
            for old in over {
                match retire(&old, spares.as_deref()) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(path = %old.display(), error = %e, "cannot remove a spool");
                    }
                    _ => {}
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }

    /// Removes a container's spool directory (its sessions' journals too). The spools of
    /// finished commands go to the spares; any other is deleted, since a command still being
    /// spooled (its container destroyed under it) may write to its file a moment longer.
    pub fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        let finished: std::collections::HashSet<PathBuf> =
            self.paths.lock().iter().cloned().collect();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for path in entries.flatten().map(|e| e.path()) {
                if finished.contains(&path) {
                    let _ = retire(&path, self.spares());
                }
            }
        }
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// How many it holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.paths.lock().len()
    }
}

/// Removes the spools in `dir` of commands that finished more than [`FINISHED_KEEP`] ago
/// (written last that long ago, with their exit recorded), giving them to `spares`.
pub fn sweep(dir: &Path, spares: Option<&SpareFiles>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.path().extension().is_none_or(|e| e != "spool") {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > FINISHED_KEEP);
        if old && read(&entry.path()).map(|r| r.exit.is_some()).unwrap_or(true) {
            let _ = retire(&entry.path(), spares);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(exec_id: u64) -> SpoolHeader {
        SpoolHeader {
            exec_id,
            spawn_id: 9,
            cgroup: "e9".into(),
            argv: vec!["sh".into()],
            started_unix_ms: 1,
            timeout_ms: Some(1000),
            output_limit: 100,
            terminal: false,
        }
    }

    #[test]
    fn a_spool_reads_back_in_order_even_cut_short() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spool = Spool::create(dir.path(), &header(3), None).expect("create");
        spool.output(true, b"one");
        spool.output(false, b"two");
        let path = Spool::path_in(dir.path(), 3);
        // A frame cut short, as a crash mid-write leaves it.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&[TAG_STDOUT, 10, 0, 0, 0, b'x']).expect("partial");
        let r = read(&path).expect("read");
        assert_eq!(r.header, header(3));
        assert_eq!(
            r.events,
            vec![
                ExecEvent::Stdout(Bytes::from_static(b"one")),
                ExecEvent::Stderr(Bytes::from_static(b"two"))
            ]
        );
        assert_eq!(r.spooled_output, 6);
        assert!(r.exit.is_none() && !r.gap);
    }

    #[test]
    fn spliced_output_survives_a_crash_between_the_splice_and_its_length() {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spool = Spool::create(dir.path(), &header(5), None).expect("create");
        let (r, w) = nix::unistd::pipe().expect("pipe");
        nix::unistd::write(&w, b"first").expect("write");
        let got = spool.splice_from(r.as_fd(), true, 64).expect("splice");
        assert_eq!(got.as_deref(), Some(&b"first"[..]));
        let nothing = spool.splice_from(r.as_fd(), true, 64);
        assert_eq!(nothing.err().map(|e| e.kind()), Some(std::io::ErrorKind::WouldBlock));
        // As a crash leaves it: the payload is in, its length not yet filled in.
        let path = Spool::path_in(dir.path(), 5);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&[TAG_STDERR, 0xff, 0xff, 0xff, 0xff, b'a', b'b']).expect("unfinished");
        let r1 = read(&path).expect("read");
        assert_eq!(
            r1.events,
            vec![
                ExecEvent::Stdout(Bytes::from_static(b"first")),
                ExecEvent::Stderr(Bytes::from_static(b"ab"))
            ]
        );
        let mut again = Spool::reopen(&path, &r1);
        again.output(true, b"after");
        drop(w);
        assert!(again.splice_from(r.as_fd(), true, 64).expect("end").is_none());
        let r2 = read(&path).expect("read again");
        assert_eq!(r2.events.len(), 3);
        assert_eq!(r2.events[2], ExecEvent::Stdout(Bytes::from_static(b"after")));
        assert!(r2.unfinished.is_none());
    }

    #[test]
    fn past_the_cap_a_gap_is_marked_and_the_exit_still_recorded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spool = Spool::create(dir.path(), &header(4), None).expect("create");
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..9 {
            spool.output(true, &chunk);
        }
        let exit = ExecExit {
            exit_code: Some(0),
            duration: Duration::from_millis(5),
            stdout_bytes: 9 << 20,
            ..ExecExit::default()
        };
        spool.exit(&exit);
        let r = read(&Spool::path_in(dir.path(), 4)).expect("read");
        assert!(r.gap);
        assert_eq!(r.spooled_output, MAX_SPOOL_OUTPUT);
        assert_eq!(r.exit, Some(exit));
        assert!(read_all(dir.path()).len() == 1);
    }

    #[test]
    fn a_removed_spool_is_emptied_and_taken_by_the_next_command() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let spares = Arc::new(SpareFiles::open(&dir.path().join(".spare"), 1024).expect("spares"));
        let spools = dir.path().join("sb-1");
        let finished = FinishedSpools::new(Some(spares.clone()));
        let mut inodes = Vec::new();
        for id in 0..=FINISHED_KEPT as u64 {
            let mut spool = Spool::create(&spools, &header(id), finished.spares()).expect("create");
            spool.output(true, format!("output of {id}").as_bytes());
            spool.exit(&exit_ok());
            inodes.push(std::fs::metadata(spool.path()).expect("stat").ino());
            finished.push(spool.path().to_path_buf());
        }
        // The oldest went past the bound: emptied and kept, not deleted.
        assert!(!Spool::path_in(&spools, 0).exists());
        assert_eq!(spares.len(), 1);
        let id = FINISHED_KEPT as u64 + 1;
        let mut spool = Spool::create(&spools, &header(id), finished.spares()).expect("create");
        spool.output(true, b"new");
        spool.exit(&exit_ok());
        assert_eq!(std::fs::metadata(spool.path()).expect("stat").ino(), inodes[0]);
        let r = read(spool.path()).expect("read");
        assert_eq!(r.header.exec_id, id);
        assert_eq!(r.events, vec![ExecEvent::Stdout(Bytes::from_static(b"new"))]);
        assert!(spares.is_empty());
        // A container's directory goes whole: its finished spools become spares, one still
        // being written is deleted.
        let running = Spool::create(&spools, &header(id + 1), finished.spares()).expect("create");
        let running_inode = std::fs::metadata(running.path()).expect("stat").ino();
        finished.remove_dir(&spools).expect("remove");
        assert!(!spools.exists());
        assert_eq!(spares.len(), FINISHED_KEPT);
        let reused: Vec<u64> = (0..FINISHED_KEPT)
            .map(|_| {
                let spare = spares.take().expect("spare");
                std::fs::metadata(spare).expect("stat").ino()
            })
            .collect();
        assert!(!reused.contains(&running_inode), "a running command's spool was kept");
    }

    #[test]
    fn an_exit_as_spools_from_before_keep_it_reads_and_is_written_the_same() {
        // The exit frame's JSON as a node wrote it before its exec engine spoke core's types.
        let before = br#"{"status":{"Signal":9},"timed_out":true,"killed":false,"truncated":false,"oom_killed":true,"duration":{"secs":1,"nanos":5000000},"stdout_bytes":3,"stderr_bytes":4}"#;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spool = Spool::create(dir.path(), &header(7), None).expect("create");
        spool.output(true, b"abc");
        spool.write(&frame(TAG_EXIT, before));
        let r = read(&Spool::path_in(dir.path(), 7)).expect("read");
        let exit = ExecExit {
            exit_code: None,
            signal: Some(9),
            timed_out: true,
            oom_killed: true,
            duration: Duration::from_millis(1005),
            stdout_bytes: 3,
            stderr_bytes: 4,
            ..ExecExit::default()
        };
        assert_eq!(r.exit, Some(exit.clone()));
        let again = serde_json::to_vec(&SpoolExit::from(&exit)).expect("json");
        assert_eq!(again, before.to_vec(), "{}", String::from_utf8_lossy(&again));
    }

    fn exit_ok() -> ExecExit {
        ExecExit { exit_code: Some(0), ..ExecExit::default() }
    }

    #[test]
    fn finished_spools_past_the_bound_are_removed_oldest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let finished = FinishedSpools::new(None);
        let total = FINISHED_KEPT + 44;
        for id in 0..total as u64 {
            let mut spool = Spool::create(dir.path(), &header(id), None).expect("create");
            spool.exit(&exit_ok());
            finished.push(spool.path().to_path_buf());
        }
        assert_eq!(finished.len(), FINISHED_KEPT);
        let left = std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(left, FINISHED_KEPT);
        assert!(!Spool::path_in(dir.path(), 43).exists(), "the oldest are gone");
        assert!(Spool::path_in(dir.path(), 44).exists(), "the newest are kept");
        assert!(Spool::path_in(dir.path(), total as u64 - 1).exists());
    }
}
