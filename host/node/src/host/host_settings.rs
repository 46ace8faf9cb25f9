//! Host-wide settings the container tier changes while it runs (the CFS bandwidth slice, the
//! cgroup2 `favordynmods` flag, free page reporting to a hypervisor): what the host had
//! before, and which brigd processes rely on them, kept in one file for every brigd of the
//! host (`<run root>/host-settings.json`, beside the run directories, under a lock). The
//! host's values go back when the last brigd using them leaves cleanly, not when the first
//! one does (others may still run containers that need them), and a brigd killed with them
//! changed neither loses them nor holds them forever: a dead user (pid and start time no
//! longer match) is dropped by the next brigd that comes or goes. The run root is a tmpfs, so
//! a reboot, which puts the settings back itself, also forgets the file.

use std::path::{Path, PathBuf};

use brig_hostkit::cgroup_favor::FavoredMount;
use serde::{Deserialize, Serialize};

/// What the host had before a brigd changed it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostOriginals {
    /// `kernel.sched_cfs_bandwidth_slice_us` before it was lowered.
    pub bandwidth_slice_us: Option<u64>,
    /// The cgroup2 mount `favordynmods` was set on, and its options before.
    pub favored: Option<FavoredMount>,
    /// The free page reporting order before reporting was held (`free_page_reporting`).
    #[serde(default)]
    pub page_reporting_order: Option<u32>,
}

/// A brigd process that relies on the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct User {
    pid: i32,
    start_time: u64,
}

impl User {
    fn me() -> Option<User> {
        let pid = i32::try_from(std::process::id()).ok()?;
        Some(User { pid, start_time: brig_container::runtime::process_start_time(pid)? })
    }

    fn alive(&self) -> bool {
        brig_container::runtime::process_start_time(self.pid) == Some(self.start_time)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    originals: HostOriginals,
    users: Vec<User>,
}

/// The host's record, in the parent of a run directory.
pub(crate) struct HostSettingsRecord {
    path: PathBuf,
}

impl HostSettingsRecord {
    pub fn beside(run_dir: &Path) -> HostSettingsRecord {
        let root = run_dir.parent().unwrap_or(run_dir);
        HostSettingsRecord { path: root.join("host-settings.json") }
    }

    /// Joins the users; `change` changes what it can and returns the host's values it
    /// replaced. A value already recorded (another brigd, or a killed one, changed it) is kept:
    /// what this brigd finds then is that brigd's change, not the host's.
    pub fn join(&self, change: impl FnOnce() -> HostOriginals) -> HostOriginals {
        let Some(_lock) = self.lock() else { return change() };
        let mut record = self.read();
        record.users.retain(User::alive);
        let changed = change();
        let originals = &mut record.originals;
        originals.bandwidth_slice_us = originals.bandwidth_slice_us.or(changed.bandwidth_slice_us);
        originals.favored = originals.favored.take().or(changed.favored);
        originals.page_reporting_order =
            originals.page_reporting_order.or(changed.page_reporting_order);
        if let Some(me) = User::me() {
            if !record.users.contains(&me) {
                record.users.push(me);
            }
        }
        self.write(&record);
        record.originals
    }

    /// Leaves the users; returns the host's values to put back if no live brigd is left.
    pub fn leave(&self) -> Option<HostOriginals> {
        let _lock = self.lock()?;
        let mut record = self.read();
        let me = User::me();
        record.users.retain(|u| Some(*u) != me && u.alive());
        if record.users.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            return Some(record.originals);
        }
        self.write(&record);
        None
    }

    fn lock(&self) -> Option<nix::fcntl::Flock<std::fs::File>> {
        let path = self.path.with_extension("lock");
        crate::host::host_files::lock_exclusive(&path)
            .inspect_err(|e| {
                tracing::warn!(path = %path.display(), error = %e, "cannot lock the host settings record");
            })
            .ok()
    }

    /// The record (an unreadable one counts as empty, with a warning).
    fn read(&self) -> Record {
        let Ok(bytes) = std::fs::read(&self.path) else { return Record::default() };
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %self.path.display(), error = %e, "unreadable host settings record");
            Record::default()
        })
    }

    fn write(&self, record: &Record) {
        let tmp = self.path.with_extension("json.tmp");
        let saved = serde_json::to_vec(record)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = saved {
            tracing::warn!(
                path = %self.path.display(),
                error = %e,
                "cannot record the host settings to restore (a kill of brigd would leave them changed)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn favored(options: &str) -> FavoredMount {
        FavoredMount { mount_point: "/sys/fs/cgroup/unified".into(), options: options.into() }
    }

    fn changed_all() -> HostOriginals {
        HostOriginals {
            bandwidth_slice_us: Some(5000),
            favored: Some(favored("rw,nsdelegate")),
            page_reporting_order: Some(9),
        }
    }

    #[test]
    fn the_first_originals_are_kept_and_put_back_when_the_last_user_leaves() {
        let dir = tempfile::tempdir().expect("tmp");
        let record = HostSettingsRecord::beside(&dir.path().join("tag-a"));
        // This process changes both; a second join (another brigd, or this one restarted after
        // a kill) finds them changed already and changes nothing, yet knows the originals.
        assert_eq!(record.join(changed_all), changed_all());
        assert_eq!(record.join(HostOriginals::default), changed_all());
        // A later change of a value already recorded does not replace the host's value.
        let later = || HostOriginals {
            bandwidth_slice_us: Some(9000),
            favored: None,
            page_reporting_order: Some(11),
        };
        assert_eq!(record.join(later), changed_all());

        // Another live brigd relies on them: leaving puts nothing back.
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = i32::try_from(sleeper.id()).expect("pid");
        let other = User {
            pid,
            start_time: brig_container::runtime::process_start_time(pid).expect("start time"),
        };
        let mut on_disk = record.read();
        on_disk.users.push(other);
        record.write(&on_disk);
        assert_eq!(record.leave(), None, "restored while another brigd runs");
        assert_eq!(record.read().users, vec![other]);

        // The other one dies without leaving: the next one to leave puts the originals back.
        sleeper.kill().expect("kill");
        sleeper.wait().expect("reap");
        assert_eq!(record.leave(), Some(changed_all()));
        assert!(!dir.path().join("host-settings.json").exists());
    }

    #[test]
    fn nothing_recorded_puts_nothing_back_and_garbage_counts_as_empty() {
        let dir = tempfile::tempdir().expect("tmp");
        let record = HostSettingsRecord::beside(&dir.path().join("tag-b"));
        assert_eq!(record.join(HostOriginals::default), HostOriginals::default());
        assert_eq!(record.leave(), Some(HostOriginals::default()));
        std::fs::write(dir.path().join("host-settings.json"), b"{not json").expect("write");
        assert_eq!(record.join(HostOriginals::default), HostOriginals::default());
    }

    #[test]
    fn a_record_from_a_build_without_page_reporting_keeps_its_originals() {
        let dir = tempfile::tempdir().expect("tmp");
        let record = HostSettingsRecord::beside(&dir.path().join("tag-c"));
        let earlier = br#"{"originals":{"bandwidth_slice_us":5000,"favored":null},"users":[]}"#;
        std::fs::write(dir.path().join("host-settings.json"), earlier).expect("write");
        let held = || HostOriginals { page_reporting_order: Some(9), ..HostOriginals::default() };
        let expected = HostOriginals {
            bandwidth_slice_us: Some(5000),
            favored: None,
            page_reporting_order: Some(9),
        };
        assert_eq!(record.join(held), expected);
        assert_eq!(record.leave(), Some(expected));
    }
}
