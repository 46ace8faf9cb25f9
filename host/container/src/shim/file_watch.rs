//! A directory watch with the container's rights ([`FileRequest::Watch`]): a child of the
//! shim, in the container's namespaces and cgroups, watches the tree with inotify and writes
//! what changes into the node's pipe as frames (`u32` little-endian length, then a postcard
//! [`WatchBatch`]) until the node closes the pipe (or the watched directory goes away).
//!
//! What it costs is the sandbox's: its memory and process count are the container's, its
//! inotify watches are counted against the container root's own user, and it follows at most
//! [`MAX_WATCHED_DIRS`] directories. When the node reads slower than the tree changes, the
//! pipe fills, the child stops reading, the kernel's queue overflows, and the next batch says
//! changes were lost (`lost`): nothing grows without bound anywhere.
//!
//! Changes are named as E2B's envd (Go's fsnotify) names them: made or moved in is
//! [`Change::Create`], written [`Change::Write`], removed [`Change::Remove`], moved away
//! [`Change::Rename`], attributes [`Change::Chmod`]. A recursive watch follows directories
//! made (or moved in) later, and reports what they already hold when it starts following
//! them, so a tree made at once (`mkdir -p a/b && touch a/b/f`) is seen whole. It stays on the
//! sandbox's own disks: kernel file systems (`/proc`, `/sys`) below the root are not followed.
//!
//! [`FileRequest::Watch`]: crate::shim_proto::FileRequest::Watch

use std::collections::HashMap;
use std::io::Write;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use brig_core::files::{Change, Changed, WatchBatch, MAX_WATCHED_DIRS, MAX_WATCH_BATCH};
use rustix::event::{PollFd, PollFlags};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::files::{display, FileError, RootDir};

/// What a watched directory reports.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::DONT_FOLLOW)
    .union(WatchFlags::EXCL_UNLINK);

/// Bytes of inotify events read at once.
const READ_BUFFER: usize = 64 << 10;

/// One watch's state in the child.
struct Tree {
    inotify: OwnedFd,
    /// The container's root directory, where paths are resolved.
    top: OwnedFd,
    /// Watch descriptor → the directory's path in the sandbox.
    dirs: HashMap<i32, String>,
    root: i32,
    recursive: bool,
    batch: WatchBatch,
}

/// Sets the watch up on `path` (then [`Watching::serve`] runs it), or says why not.
pub(super) fn start(dir: RootDir<'_>, path: &str, recursive: bool) -> Result<Watching, FileError> {
    let failed = |e: rustix::io::Errno| FileError::Io { path: path.to_string(), source: e.into() };
    let top = dir.open_dir(path)?;
    let inotify = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .map_err(failed)?;
    let root = add_watch(&inotify, top.as_fd(), dir.root()).map_err(failed)?;
    let shown = display(path);
    let top_of_root = rustix::io::fcntl_dupfd_cloexec(dir.root(), 0).map_err(failed)?;
    let mut tree = Tree {
        inotify,
        top: top_of_root,
        dirs: HashMap::from([(root, shown.clone())]),
        root,
        recursive,
        batch: WatchBatch::default(),
    };
    if recursive && !tree.follow_below(top.as_fd(), &shown, false) {
        return Err(FileError::TooManyDirs { path: path.to_string(), max: MAX_WATCHED_DIRS });
    }
    Ok(Watching { tree })
}

/// A watch in place.
pub(super) struct Watching {
    tree: Tree,
}

impl Watching {
    /// Reports changes into `pipe` until the node closes it or the watched directory goes.
    pub(super) fn serve(mut self, pipe: OwnedFd) {
        let mut out = std::fs::File::from(pipe);
        let mut buf = vec![MaybeUninit::<u8>::uninit(); READ_BUFFER];
        loop {
            let mut fds = [
                PollFd::new(&self.tree.inotify, PollFlags::IN),
                PollFd::new(&out, PollFlags::empty()),
            ];
            if rustix::event::poll(&mut fds, None).is_err() {
                continue;
            }
            // The node closed its end: the watch is over.
            if fds[1].revents().intersects(PollFlags::ERR | PollFlags::HUP) {
                return;
            }
            let ended = self.tree.read_events(&mut buf);
            let WatchBatch { changes, mut lost } = std::mem::take(&mut self.tree.batch);
            // Frames of at most MAX_WATCH_BATCH changes (paths up to 4 KiB each: at most
            // 4 MiB a frame).
            for part in changes.chunks(MAX_WATCH_BATCH) {
                let batch = WatchBatch { changes: part.to_vec(), lost };
                if !send(&mut out, &batch) {
                    return;
                }
                lost = false;
            }
            if lost && !send(&mut out, &WatchBatch { changes: Vec::new(), lost }) {
                return;
            }
            if ended {
                return;
            }
        }
    }
}

/// Writes one frame; false once the node's end is gone.
fn send(out: &mut std::fs::File, batch: &WatchBatch) -> bool {
    let Ok(body) = postcard::to_allocvec(batch) else { return false };
    let Ok(len) = u32::try_from(body.len()) else { return false };
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    out.write_all(&frame).is_ok()
}

/// Watches `dir`, then goes back to `home`.
fn add_watch(
    inotify: &OwnedFd,
    dir: BorrowedFd<'_>,
    home: BorrowedFd<'_>,
) -> rustix::io::Result<i32> {
    // The directory was resolved in the root already: it is watched through the descriptor,
    // as this process's working directory, so no path is resolved again. The working
    // directory goes back at once: it would keep a removed directory (and its parents) in
    // use, and their removal unreported.
    rustix::process::fchdir(dir)?;
    let added = inotify::add_watch(inotify, ".", MASK);
    rustix::process::fchdir(home)?;
    added
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl Tree {
    /// Reads what is queued; true once the watched directory itself went away.
    fn read_events(&mut self, buf: &mut [MaybeUninit<u8>]) -> bool {
        let mut seen = Vec::new();
        {
            // One read's worth (the reader keeps what it read: all of it is taken).
            let mut reader = inotify::Reader::new(&self.inotify, buf);
            while let Ok(event) = reader.next() {
                let name = event.file_name().map(|n| n.to_string_lossy().into_owned());
                seen.push((event.wd(), event.events(), name));
                if reader.is_buffer_empty() {
                    break;
                }
            }
        }
        let mut ended = false;
        for (wd, flags, name) in seen {
            ended |= self.take(wd, flags, name);
        }
        ended
    }

    /// Takes one event; true once the watched directory itself went away.
    fn take(&mut self, wd: i32, flags: ReadFlags, name: Option<String>) -> bool {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            self.batch.lost = true;
            return false;
        }
        if flags.contains(ReadFlags::IGNORED) {
            self.dirs.remove(&wd);
            return wd == self.root;
        }
        if wd == self.root && flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF) {
            return true;
        }
        let (Some(dir), Some(name)) = (self.dirs.get(&wd).cloned(), name) else { return false };
        let path = join(&dir, &name);
        let is_dir = flags.contains(ReadFlags::ISDIR);
        let change = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            Change::Create
        } else if flags.contains(ReadFlags::MODIFY) {
            Change::Write
        } else if flags.contains(ReadFlags::DELETE) {
            Change::Remove
        } else if flags.contains(ReadFlags::MOVED_FROM) {
            Change::Rename
        } else if flags.contains(ReadFlags::ATTRIB) {
            Change::Chmod
        } else {
            return false;
        };
        // A directory moved away takes its watches with it; moved back in, it is new.
        if is_dir && change == Change::Rename {
            self.forget_below(&path);
        }
        self.push(path.clone(), change, is_dir);
        if is_dir && change == Change::Create && self.recursive {
            self.follow_new(&dir, &name, &path);
        }
        false
    }

    fn push(&mut self, path: String, change: Change, is_dir: bool) {
        // Writes of one file in a row are one change.
        if change == Change::Write {
            if let Some(last) = self.batch.changes.last() {
                if last.change == Change::Write && last.path == path {
                    return;
                }
            }
        }
        self.batch.changes.push(Changed { path, change, is_dir });
    }

    /// Starts following directory `name` of `parent` (made or moved in), reporting what it
    /// already holds as made.
    fn follow_new(&mut self, parent: &str, name: &str, path: &str) {
        let Ok(parent_fd) = self.open_watched(parent) else { return };
        let Some(dir) = open_subdir(parent_fd.as_fd(), name) else { return };
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            self.batch.lost = true;
            return;
        }
        match add_watch(&self.inotify, dir.as_fd(), self.top.as_fd()) {
            Ok(wd) => {
                self.dirs.insert(wd, path.to_string());
            }
            Err(_) => return,
        }
        if !self.follow_below(dir.as_fd(), path, true) {
            self.batch.lost = true;
        }
    }

    /// Opens a watched directory again by its path (in the container's root).
    fn open_watched(&self, path: &str) -> Result<OwnedFd, FileError> {
        RootDir::new(self.top.as_fd(), 0).open_dir(path)
    }

    /// Watches every directory below `top` (breadth first, on the sandbox's disks only),
    /// reporting each entry as made if `report`; false if that passed [`MAX_WATCHED_DIRS`].
    fn follow_below(&mut self, top: BorrowedFd<'_>, top_path: &str, report: bool) -> bool {
        let Ok(first) = rustix::io::dup(top) else { return true };
        let mut queue = std::collections::VecDeque::from([(first, top_path.to_string())]);
        while let Some((dir, path)) = queue.pop_front() {
            let Ok(readable) = rustix::fs::openat(
                &dir,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            let Ok(mut entries) = rustix::fs::Dir::read_from(&readable) else { continue };
            while let Some(Ok(item)) = entries.read() {
                let name = item.file_name().to_string_lossy().into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                let Ok(st) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                else {
                    continue;
                };
                let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
                let child = join(&path, &name);
                if report {
                    // What a new tree holds is reported up to a few batches' worth; past that
                    // the watcher is told to look again.
                    if self.batch.changes.len() < MAX_WATCH_BATCH * 4 {
                        self.push(child.clone(), Change::Create, is_dir);
                    } else {
                        self.batch.lost = true;
                    }
                }
                if !is_dir {
                    continue;
                }
                let Some(sub) = open_subdir(dir.as_fd(), &name) else { continue };
                if crate::files::on_disk(sub.as_fd()).is_err() {
                    continue;
                }
                if self.dirs.len() >= MAX_WATCHED_DIRS {
                    return false;
                }
                if let Ok(wd) = add_watch(&self.inotify, sub.as_fd(), self.top.as_fd()) {
                    self.dirs.insert(wd, child.clone());
                    queue.push_back((sub, child));
                }
            }
        }
        true
    }

    /// Stops watching `path` and everything below it.
    fn forget_below(&mut self, path: &str) {
        let prefix = format!("{path}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(wd, p)| **wd != self.root && (p.as_str() == path || p.starts_with(&prefix)))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = inotify::remove_watch(&self.inotify, wd);
        }
    }
}

/// Directory `name` of `parent`, not following a link, for watching.
fn open_subdir(parent: BorrowedFd<'_>, name: &str) -> Option<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(parent, name, flags, Mode::empty()).ok()
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::{Duration, Instant};

    use super::*;

    /// Reads frames from `pipe` until `done` holds of what came, or 10 s pass.
    fn read_until(
        pipe: &mut std::fs::File,
        done: impl Fn(&[Changed]) -> bool,
    ) -> (Vec<Changed>, bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut got, mut lost) = (Vec::new(), false);
        rustix::io::ioctl_fionbio(&*pipe, true).expect("nonblocking");
        let mut pending = Vec::new();
        while Instant::now() < deadline && !done(&got) {
            let mut buf = [0u8; 65536];
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
            while pending.len() >= 4 {
                let len = u32::from_le_bytes(pending[..4].try_into().expect("4")) as usize;
                if pending.len() < 4 + len {
                    break;
                }
                let batch: WatchBatch = postcard::from_bytes(&pending[4..4 + len]).expect("frame");
                pending.drain(..4 + len);
                lost |= batch.lost;
                got.extend(batch.changes);
            }
        }
        (got, lost)
    }

    fn has(got: &[Changed], path: &str, change: Change) -> bool {
        got.iter().any(|c| c.path == path && c.change == change)
    }

    #[test]
    fn a_recursive_watch_sees_every_change_and_trees_made_later() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().to_path_buf();
        std::fs::create_dir_all(base.join("w/old")).expect("mkdir");
        let root =
            rustix::fs::open(&base, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
        let dir = RootDir::new(root.as_fd(), 0);
        let watching = start(dir, "/w", true).expect("watch");
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let server = std::thread::spawn(move || watching.serve(write_end));
        let mut pipe = std::fs::File::from(read_end);

        let w = base.join("w");
        std::fs::write(w.join("f.txt"), b"one").expect("write");
        std::fs::set_permissions(
            w.join("f.txt"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
        std::fs::rename(w.join("f.txt"), w.join("g.txt")).expect("mv");
        std::fs::write(w.join("brief"), b"").expect("brief");
        std::fs::remove_file(w.join("brief")).expect("rm");
        std::fs::write(w.join("old/inner.txt"), b"x").expect("inner");
        std::fs::create_dir_all(w.join("a/b/c")).expect("mkdir -p");
        std::fs::write(w.join("a/b/c/deep.txt"), b"deep").expect("deep");
        let (got, lost) = read_until(&mut pipe, |g| has(g, "/w/a/b/c/deep.txt", Change::Create));
        assert!(!lost, "{got:?}");
        for (path, change) in [
            ("/w/f.txt", Change::Create),
            ("/w/f.txt", Change::Write),
            ("/w/f.txt", Change::Chmod),
            ("/w/f.txt", Change::Rename),
            ("/w/g.txt", Change::Create),
            ("/w/brief", Change::Create),
            ("/w/brief", Change::Remove),
            ("/w/old/inner.txt", Change::Create),
            ("/w/a", Change::Create),
            ("/w/a/b/c/deep.txt", Change::Create),
        ] {
            assert!(has(&got, path, change), "{path} {change:?} missing from {got:?}");
        }
        // A folder made later is followed: a file written there afterwards is seen.
        std::thread::sleep(Duration::from_millis(100));
        std::fs::write(w.join("a/b/c/later.txt"), b"later").expect("later");
        let (got, _) = read_until(&mut pipe, |g| has(g, "/w/a/b/c/later.txt", Change::Write));
        assert!(has(&got, "/w/a/b/c/later.txt", Change::Create), "{got:?}");
        // Removing the watched directory ends the watch: the pipe closes.
        std::fs::remove_dir_all(&w).expect("rm -r");
        let _ = read_until(&mut pipe, |_| false);
        server.join().expect("the watch ended");
    }

    #[test]
    fn closing_the_pipe_ends_the_watch_and_too_large_trees_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = rustix::fs::open(tmp.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .expect("root");
        let watching = start(RootDir::new(root.as_fd(), 0), "/", false).expect("watch");
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let server = std::thread::spawn(move || watching.serve(write_end));
        drop(read_end);
        server.join().expect("the watch ended with its reader");

        assert!(start(RootDir::new(root.as_fd(), 0), "/missing", false).is_err());
        std::fs::write(tmp.path().join("file"), b"").expect("file");
        assert!(start(RootDir::new(root.as_fd(), 0), "/file", false).is_err());
    }
}
