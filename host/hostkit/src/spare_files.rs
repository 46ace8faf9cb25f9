//! Files given back instead of deleted, and taken back instead of created.
//!
//! On ext4 without a journal (this project's development machines, and any node whose state
//! directory is on such a file system), every inode allocation skips each inode of its group
//! freed in the last 60 seconds (360 while its inode table block is dirty), one buffer-cache
//! lookup each. A node that makes and deletes a file per sandbox therefore pays, per new
//! file, in proportion to how many it freed in the last minutes: on the development VM a file
//! created in the state directory while `brig-bench container` ran took 0.5-0.9 ms (p50),
//! against about 0.1 ms in a quiet directory (docs/density.md). A file that is renamed into a
//! spare directory and renamed out again for the next sandbox keeps its inode (and its blocks:
//! no discard), so the churn stops.
//!
//! ```text
//! give(<dir>/sb-1.json)  rename → <spare>/17        (deleted instead once `max` are spare)
//! take()                 <spare>/17, no longer spare: the caller fills it and renames it
//! ```
//! Spares hold whatever their last user wrote: a caller clears what it must before use.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// A directory of spare files.
#[derive(Debug)]
pub struct SpareFiles {
    dir: PathBuf,
    /// Names (numbers) of the spares in `dir`.
    spare: Mutex<Vec<u64>>,
    /// The next name given to a spare.
    next: AtomicU64,
    max: usize,
}

impl SpareFiles {
    /// Keeps up to `max` spare files in `dir` (made if missing), counting those an earlier
    /// run left there; anything else found there is deleted.
    pub fn open(dir: &Path, max: usize) -> std::io::Result<SpareFiles> {
        std::fs::create_dir_all(dir)?;
        let mut spare = Vec::new();
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name();
            match name.to_str().and_then(|n| n.parse::<u64>().ok()) {
                Some(n) if spare.len() < max && entry.file_type().is_ok_and(|t| t.is_file()) => {
                    spare.push(n)
                }
                _ => {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let next = spare.iter().max().map_or(0, |n| n + 1);
        Ok(SpareFiles { dir: dir.to_owned(), spare: Mutex::new(spare), next: next.into(), max })
    }

    /// A spare file, no longer counted as spare: the caller renames it where it wants it, or
    /// gives it back. `None` when there is none (the caller creates a file).
    pub fn take(&self) -> Option<PathBuf> {
        let n = self.spare.lock().pop()?;
        Some(self.dir.join(n.to_string()))
    }

    /// Renames a spare file to `path` (never over a file there). `Ok(false)`: none was spare;
    /// an error: the spare could not be moved, and was deleted.
    pub fn take_as(&self, path: &Path) -> std::io::Result<bool> {
        let Some(spare) = self.take() else { return Ok(false) };
        let cwd = rustix::fs::CWD;
        match rustix::fs::renameat_with(cwd, &spare, cwd, path, rustix::fs::RenameFlags::NOREPLACE)
        {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = std::fs::remove_file(&spare);
                Err(e.into())
            }
        }
    }

    /// An empty spare renamed to `path` (never over a file there) and opened read-write;
    /// `Ok(None)` when none is spare. One that is not empty (a crash cut its emptying short) is
    /// emptied; one that cannot be opened is deleted.
    pub fn take_empty_as(&self, path: &Path) -> std::io::Result<Option<std::fs::File>> {
        if !self.take_as(path)? {
            return Ok(None);
        }
        let opened = std::fs::OpenOptions::new().read(true).write(true).open(path);
        let file = opened.and_then(|f| {
            if f.metadata()?.len() > 0 {
                f.set_len(0)?;
            }
            Ok(f)
        });
        if file.is_err() {
            let _ = std::fs::remove_file(path);
        }
        file.map(Some)
    }

    /// Empties the file at `path` and makes it a spare (see [`SpareFiles::give`]); deletes it
    /// if it cannot be emptied.
    pub fn give_emptied(&self, path: &Path) -> std::io::Result<()> {
        match std::fs::OpenOptions::new().write(true).open(path).and_then(|f| f.set_len(0)) {
            Ok(()) => self.give(path),
            Err(_) => std::fs::remove_file(path),
        }
    }

    /// Makes the file at `path` (on the spare directory's file system) a spare, or deletes it
    /// if `max` are spare already. A file that is not there is no error.
    pub fn give(&self, path: &Path) -> std::io::Result<()> {
        let gone = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        };
        if self.spare.lock().len() >= self.max {
            return std::fs::remove_file(path).or_else(gone);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match std::fs::rename(path, self.dir.join(n.to_string())) {
            Ok(()) => {
                self.spare.lock().push(n);
                Ok(())
            }
            // The file is not there: nothing to do.
            Err(e) if !path.exists() => gone(e),
            // Another file system (no inode to keep), or the spare directory is gone.
            Err(_) => std::fs::remove_file(path).or_else(gone),
        }
    }

    /// How many files are spare.
    pub fn len(&self) -> usize {
        self.spare.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_file_given_back_is_taken_again_with_its_inode() {
        let dir = tempfile::tempdir().expect("tmp");
        let spares = SpareFiles::open(&dir.path().join("spare"), 2).expect("open");
        assert!(spares.take().is_none());
        let first = dir.path().join("a.json");
        std::fs::write(&first, b"record").expect("write");
        let ino = std::fs::metadata(&first).expect("stat").ino();
        spares.give(&first).expect("give");
        assert!(!first.exists());
        assert_eq!(spares.len(), 1);
        let taken = spares.take().expect("a spare");
        let second = dir.path().join("b.json");
        std::fs::rename(&taken, &second).expect("rename");
        assert_eq!(std::fs::metadata(&second).expect("stat").ino(), ino);
        assert!(spares.is_empty());
        // Taken under a name: never over a file that is there.
        std::fs::write(&first, b"another").expect("write");
        spares.give(&first).expect("give");
        let third = dir.path().join("c.json");
        assert!(spares.take_as(&third).expect("take"));
        assert_eq!(std::fs::read(&third).expect("read"), b"another");
        std::fs::write(&first, b"x").expect("write");
        spares.give(&first).expect("give");
        assert!(spares.take_as(&second).is_err(), "taken over an existing file");
        assert_eq!(std::fs::metadata(&second).expect("stat").ino(), ino, "the file there stays");
        assert!(!spares.take_as(&first).expect("none"));
        // A missing file is no error.
        spares.give(&dir.path().join("missing")).expect("give nothing");
        assert!(spares.is_empty());
    }

    #[test]
    fn past_the_bound_files_are_deleted_and_spares_outlive_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let spare_dir = dir.path().join("spare");
        let spares = SpareFiles::open(&spare_dir, 2).expect("open");
        for name in ["a", "b", "c"] {
            let path = dir.path().join(name);
            std::fs::write(&path, name).expect("write");
            spares.give(&path).expect("give");
            assert!(!path.exists());
        }
        assert_eq!(spares.len(), 2);
        assert_eq!(std::fs::read_dir(&spare_dir).expect("list").count(), 2);
        // A stray name in the directory is not a spare.
        std::fs::write(spare_dir.join("stray.tmp"), b"x").expect("write");
        drop(spares);
        let again = SpareFiles::open(&spare_dir, 2).expect("reopen");
        assert_eq!(again.len(), 2);
        assert!(!spare_dir.join("stray.tmp").exists());
        let path = dir.path().join("d");
        std::fs::write(&path, b"d").expect("write");
        // Names go on after the highest found, so no spare is overwritten.
        let (one, two) = (again.take().expect("one"), again.take().expect("two"));
        again.give(&path).expect("give");
        assert!(one.exists() && two.exists());
        assert_eq!(std::fs::read_dir(&spare_dir).expect("list").count(), 3);
    }
}
