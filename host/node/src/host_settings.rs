//! Host-wide settings the container tier changes while it runs (the CFS bandwidth slice, the
//! cgroup2 `favordynmods` flag), and what they were before, kept in `<run>/host-settings.json`
//! so that a brigd killed with them changed still puts them back: the restarted brigd finds
//! them changed already (its predecessor's values), restores what the file says the host had,
//! and only a clean shutdown removes the file. `<run>` is on a tmpfs, so a reboot, which puts
//! the settings back itself, also forgets the file.

use std::path::{Path, PathBuf};

use brig_container::cgroup_favor::FavoredMount;
use serde::{Deserialize, Serialize};

/// What the host had before the first brigd of this run directory changed it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostOriginals {
    /// `kernel.sched_cfs_bandwidth_slice_us` before it was lowered.
    pub bandwidth_slice_us: Option<u64>,
    /// The cgroup2 mount `favordynmods` was set on, and its options before.
    pub favored: Option<FavoredMount>,
}

impl HostOriginals {
    fn is_empty(&self) -> bool {
        self.bandwidth_slice_us.is_none() && self.favored.is_none()
    }
}

/// The record file of one run directory.
pub(crate) struct HostSettingsRecord {
    path: PathBuf,
}

impl HostSettingsRecord {
    pub fn at(run_dir: &Path) -> HostSettingsRecord {
        HostSettingsRecord { path: run_dir.join("host-settings.json") }
    }

    /// What an earlier brigd of this run directory recorded and did not put back (it was
    /// killed); empty if nothing (an unreadable file counts as nothing, with a warning).
    pub fn left_by_earlier(&self) -> HostOriginals {
        let Ok(bytes) = std::fs::read(&self.path) else { return HostOriginals::default() };
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %self.path.display(), error = %e, "unreadable host settings record");
            HostOriginals::default()
        })
    }

    /// The originals to put back at shutdown: an earlier brigd's where it recorded one (the
    /// host's value then; what this brigd found is the earlier one's change), else what this
    /// brigd changed now. Recorded at once, so a kill from here on still knows them.
    pub fn merge_and_save(&self, earlier: HostOriginals, now: HostOriginals) -> HostOriginals {
        let merged = HostOriginals {
            bandwidth_slice_us: earlier.bandwidth_slice_us.or(now.bandwidth_slice_us),
            favored: earlier.favored.or(now.favored),
        };
        if merged.is_empty() {
            self.forget();
            return merged;
        }
        let tmp = self.path.with_extension("json.tmp");
        let saved = serde_json::to_vec(&merged)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&tmp, bytes)
            })
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = saved {
            tracing::warn!(
                path = %self.path.display(),
                error = %e,
                "cannot record the host settings to restore (a kill of brigd would leave them changed)"
            );
        }
        merged
    }

    /// After a clean shutdown put the settings back.
    pub fn forget(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn favored(options: &str) -> FavoredMount {
        FavoredMount { mount_point: "/sys/fs/cgroup/unified".into(), options: options.into() }
    }

    #[test]
    fn a_killed_brigds_originals_win_over_what_its_successor_finds() {
        let dir = tempfile::tempdir().expect("tmp");
        let record = HostSettingsRecord::at(dir.path());
        assert_eq!(record.left_by_earlier(), HostOriginals::default());

        // First brigd: it lowered the slice from 5,000 and set the flag; then it is killed.
        let first = HostOriginals {
            bandwidth_slice_us: Some(5000),
            favored: Some(favored("rw,nsdelegate")),
        };
        let kept = record.merge_and_save(record.left_by_earlier(), first.clone());
        assert_eq!(kept, first);

        // Second brigd: it finds both changed already (so changed nothing itself), yet knows
        // what to put back.
        let second = record.merge_and_save(record.left_by_earlier(), HostOriginals::default());
        assert_eq!(second, first);

        // A third brigd that changes the slice itself (someone raised it meanwhile) still puts
        // back the host's first value; a clean shutdown forgets the record.
        let third = HostOriginals { bandwidth_slice_us: Some(9000), favored: None };
        let merged = record.merge_and_save(record.left_by_earlier(), third);
        assert_eq!(merged, first);
        record.forget();
        assert_eq!(record.left_by_earlier(), HostOriginals::default());
    }

    #[test]
    fn nothing_changed_leaves_no_record_and_garbage_counts_as_nothing() {
        let dir = tempfile::tempdir().expect("tmp");
        let record = HostSettingsRecord::at(dir.path());
        let merged = record.merge_and_save(HostOriginals::default(), HostOriginals::default());
        assert!(merged.is_empty());
        assert!(!dir.path().join("host-settings.json").exists());
        std::fs::write(dir.path().join("host-settings.json"), b"{not json").expect("write");
        assert_eq!(record.left_by_earlier(), HostOriginals::default());
    }
}
