//! Volumes: named directory trees that outlive the sandboxes that mount them (E2B's volumes).
//!
//! ```text
//! <state>/volumes/<id>.json   its record (name, project, quota, when made)
//! <state>/volumes/<id>.ext4   its file system: a sparse image of its quota, ext4
//! <run>/volumes/<id>/         its mount while the node runs (loop, nodev, nosuid, private),
//!                             bound into the containers that mount it (see
//!                             `brig_container::protect::bind`) and read by the file
//!                             operations that need no sandbox (`crate::serve::volume_files`)
//! ```
//! An image per volume makes its quota the kernel's: a writer in any sandbox, or an upload,
//! gets ENOSPC at the quota, and the node's disk holds only what the volume holds. A volume
//! is mounted at its first use and stays mounted; a stopping node unmounts the ones no kept
//! container mounts (a kept one still holds the same mount, so a restarted node finds it
//! mounted and never mounts one image twice). A volume a sandbox mounts, or one a create is
//! about to mount, cannot be deleted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use brig_proto::{ErrorCode, VolumeInfo};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Volumes of a node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct VolumesConfig {
    /// A volume's quota when its create names none.
    pub default_quota_mib: u64,
    /// The largest quota a volume may have.
    pub max_quota_mib: u64,
    /// The most volumes the node holds.
    pub max_volumes: usize,
}

impl Default for VolumesConfig {
    fn default() -> Self {
        VolumesConfig { default_quota_mib: 1024, max_quota_mib: 256 * 1024, max_volumes: 10_000 }
    }
}

/// The smallest quota (ext4's own metadata needs some room).
pub const MIN_QUOTA_MIB: u64 = 16;
/// The longest volume name.
pub const MAX_NAME_BYTES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no volume {0}")]
    NotFound(String),
    #[error("a volume named {0:?} exists already")]
    Exists(String),
    #[error("volume {volume} is mounted by {}; destroy them first", .sandboxes.join(", "))]
    InUse { volume: String, sandboxes: Vec<String> },
    #[error("bad volume name {0:?}: 1-{MAX_NAME_BYTES} letters, digits, '.', '_' or '-'")]
    BadName(String),
    #[error("bad quota {asked} MiB: from {MIN_QUOTA_MIB} to {max} MiB")]
    BadQuota { asked: u64, max: u64 },
    #[error("this node holds its maximum of {0} volumes")]
    Full(usize),
    #[error("bad volume mount: {0}")]
    BadMount(String),
    #[error("{command} failed for {path}: {output}")]
    Command { command: &'static str, path: PathBuf, output: String },
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl VolumeError {
    pub fn code(&self) -> ErrorCode {
        match self {
            VolumeError::NotFound(_) => ErrorCode::NotFound,
            VolumeError::Exists(_) => ErrorCode::AlreadyExists,
            VolumeError::InUse { .. } => ErrorCode::Conflict,
            VolumeError::BadName(_) | VolumeError::BadQuota { .. } | VolumeError::BadMount(_) => {
                ErrorCode::BadRequest
            }
            VolumeError::Full(_) => ErrorCode::ResourceExhausted,
            VolumeError::Io { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                ErrorCode::ResourceExhausted
            }
            VolumeError::Command { .. } | VolumeError::Io { .. } => ErrorCode::Unavailable,
        }
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> VolumeError + 'a {
    move |source| VolumeError::Io { what, path: path.to_owned(), source }
}

/// What a volume's record file holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub project: Option<String>,
    pub quota_bytes: u64,
    pub created_unix_ms: u64,
}

/// One volume of the node.
#[derive(Debug)]
pub(crate) struct Volume {
    pub record: VolumeRecord,
    /// Creates under way that will mount it (a delete waits for none).
    pending: AtomicUsize,
    /// Held while it is mounted or unmounted.
    mounting: Mutex<()>,
    /// Known mounted this run (so file operations and listings need not read the mount table).
    mounted: std::sync::atomic::AtomicBool,
    /// Its file operations under way on the blocking pool (its share of the node's bound).
    pub file_ops: Arc<tokio::sync::Semaphore>,
}

/// A create's hold on the volumes it mounts: none of them is deleted until it is dropped
/// (by then the sandbox is in the table, or the create failed).
pub(crate) struct MountHold(Vec<Arc<Volume>>);

impl Drop for MountHold {
    fn drop(&mut self) {
        for v in &self.0 {
            v.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A volume a create mounts, with the mount (its id, the path checked).
pub(crate) type HeldMount = (Arc<Volume>, brig_proto::VolumeMount);

/// The node's volumes.
pub(crate) struct Volumes {
    config: VolumesConfig,
    node_id: u32,
    /// Records and images.
    dir: PathBuf,
    /// Mount points.
    run: PathBuf,
    /// Host uid of container root: owner of a new volume's root.
    owner: u32,
    /// Each volume's share of file operations under way.
    file_ops_per_volume: usize,
    table: Mutex<HashMap<String, Arc<Volume>>>,
    /// Serializes creates and deletes (names stay unique; rare operations).
    changing: tokio::sync::Mutex<()>,
}

/// Whether `name` may name a volume.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with('.')
}

/// Whether `point` is a mount point in this process's mount table.
fn is_mounted(point: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let point = point.to_string_lossy();
    table.lines().any(|l| l.split(' ').nth(4) == Some(&*point))
}

fn run(command: &'static str, args: &[&std::ffi::OsStr], path: &Path) -> Result<(), VolumeError> {
    let output = std::process::Command::new(command)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| VolumeError::Command {
            command,
            path: path.to_owned(),
            output: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(VolumeError::Command { command, path: path.to_owned(), output: text })
}

fn in_project(volume: Option<&str>, caller: &str) -> bool {
    volume.is_some_and(|v| v == caller || v.starts_with(&format!("{caller}/")))
}

impl Volumes {
    pub(crate) fn open(
        config: VolumesConfig,
        node_id: u32,
        state_dir: &Path,
        run_dir: &Path,
        owner: u32,
        file_ops_per_volume: usize,
    ) -> Result<Volumes, VolumeError> {
        let dir = state_dir.join("volumes");
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let mut table = HashMap::new();
        for entry in std::fs::read_dir(&dir).map_err(io("read", &dir))?.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let read = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
            let Some(record) = read.filter(|r: &VolumeRecord| dir.join(image_name(&r.id)).exists())
            else {
                tracing::warn!(record = %path.display(), "a volume record that cannot be read, or without its image; skipped");
                continue;
            };
            let volume = Volume::new(record, file_ops_per_volume);
            table.insert(volume.record.id.clone(), Arc::new(volume));
        }
        if !table.is_empty() {
            tracing::info!(volumes = table.len(), "volumes found");
        }
        Ok(Volumes {
            config,
            node_id,
            dir,
            run: run_dir.join("volumes"),
            owner,
            file_ops_per_volume,
            table: Mutex::new(table),
            changing: tokio::sync::Mutex::new(()),
        })
    }

    /// Makes a volume; `project` is the caller's.
    pub(crate) async fn create(
        &self,
        name: &str,
        quota_mib: Option<u64>,
        project: Option<String>,
    ) -> Result<Arc<Volume>, VolumeError> {
        if !valid_name(name) {
            return Err(VolumeError::BadName(name.to_string()));
        }
        let max = self.config.max_quota_mib;
        let mib = quota_mib.unwrap_or(self.config.default_quota_mib);
        if !(MIN_QUOTA_MIB..=max).contains(&mib) {
            return Err(VolumeError::BadQuota { asked: mib, max });
        }
        let _changing = self.changing.lock().await;
        {
            let table = self.table.lock();
            if table.len() >= self.config.max_volumes {
                return Err(VolumeError::Full(self.config.max_volumes));
            }
            if table.values().any(|v| v.record.name == name && v.record.project == project) {
                return Err(VolumeError::Exists(name.to_string()));
            }
        }
        let record = VolumeRecord {
            id: format!("vol-{:08x}-{:016x}", self.node_id, rand::random::<u64>()),
            name: name.to_string(),
            project,
            quota_bytes: mib << 20,
            created_unix_ms: crate::host::clock::now_unix_ms(),
        };
        let id = record.id.clone();
        let volume = Arc::new(Volume::new(record, self.file_ops_per_volume));
        let (dir, owner, made, run) =
            (self.dir.clone(), self.owner, volume.clone(), self.run.clone());
        tokio::task::spawn_blocking(move || {
            make_volume(&dir, &made.record, owner)?;
            // Any user of a sandbox may write at its top, as in E2B's volumes.
            let opened = mount(&dir, &run, &made).and_then(|point| {
                // A volume starts empty: mkfs's lost+found is not the user's.
                let _ = std::fs::remove_dir(point.join("lost+found"));
                let mode = std::os::unix::fs::PermissionsExt::from_mode(0o777);
                std::fs::set_permissions(&point, mode).map_err(io("open up", &point))
            });
            if opened.is_err() {
                let point = run.join(&made.record.id);
                let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
                let _ = std::fs::remove_dir(&point);
                let _ = std::fs::remove_file(dir.join(format!("{}.json", made.record.id)));
                let _ = std::fs::remove_file(dir.join(image_name(&made.record.id)));
            }
            opened
        })
        .await
        .map_err(|e| VolumeError::Io {
            what: "make",
            path: PathBuf::from(&id),
            source: std::io::Error::other(e.to_string()),
        })??;
        self.table.lock().insert(volume.record.id.clone(), volume.clone());
        tracing::info!(volume = %volume.record.id, name, quota_mib = mib, "volume made");
        Ok(volume)
    }

    /// The volume `name_or_id` names for a caller of `project` (`None`: an admin, who sees
    /// every volume and names by name the ones of no project).
    pub(crate) fn find(
        &self,
        name_or_id: &str,
        project: Option<&str>,
    ) -> Result<Arc<Volume>, VolumeError> {
        let table = self.table.lock();
        let visible =
            |v: &Volume| project.is_none_or(|p| in_project(v.record.project.as_deref(), p));
        if let Some(v) = table.get(name_or_id).filter(|v| visible(v)) {
            return Ok(v.clone());
        }
        table
            .values()
            .find(|v| v.record.name == name_or_id && v.record.project.as_deref() == project)
            .cloned()
            .ok_or_else(|| VolumeError::NotFound(name_or_id.to_string()))
    }

    /// The volumes a caller of `project` sees, by name.
    pub(crate) fn list(&self, project: Option<&str>) -> Vec<Arc<Volume>> {
        let mut out: Vec<Arc<Volume>> = self
            .table
            .lock()
            .values()
            .filter(|v| project.is_none_or(|p| in_project(v.record.project.as_deref(), p)))
            .cloned()
            .collect();
        out.sort_by(|a, b| (&a.record.name, &a.record.id).cmp(&(&b.record.name, &b.record.id)));
        out
    }

    /// Deletes a volume no sandbox mounts (`mounted_by`: the sandboxes that do).
    pub(crate) async fn delete(
        &self,
        volume: &Arc<Volume>,
        mounted_by: impl Fn() -> Vec<String>,
    ) -> Result<(), VolumeError> {
        let _changing = self.changing.lock().await;
        let id = volume.record.id.clone();
        let users = mounted_by();
        if !users.is_empty() || volume.pending.load(Ordering::SeqCst) > 0 {
            let sandboxes =
                if users.is_empty() { vec!["a create under way".into()] } else { users };
            return Err(VolumeError::InUse { volume: volume.record.name.clone(), sandboxes });
        }
        self.table.lock().remove(&id);
        let (dir, point) = (self.dir.clone(), self.run.join(&id));
        let v = volume.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let _mounting = v.mounting.lock();
            v.mounted.store(false, Ordering::SeqCst);
            if is_mounted(&point) {
                nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH).map_err(|e| {
                    VolumeError::Io { what: "unmount", path: point.clone(), source: e.into() }
                })?;
            }
            let _ = std::fs::remove_dir(&point);
            let image = dir.join(image_name(&id));
            match std::fs::remove_file(&image) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("remove", &image)(e))
                }
                _ => {}
            }
            let record = dir.join(format!("{id}.json"));
            std::fs::remove_file(&record).map_err(io("remove", &record))
        })
        .await
        .map_err(|e| VolumeError::Io {
            what: "delete",
            path: PathBuf::from(&volume.record.id),
            source: std::io::Error::other(e.to_string()),
        })?;
        if let Err(e) = removed {
            // Still there: it stays in the table.
            self.table.lock().insert(volume.record.id.clone(), volume.clone());
            return Err(e);
        }
        tracing::info!(volume = %volume.record.id, name = %volume.record.name, "volume deleted");
        Ok(())
    }

    /// Holds the volumes of a create's mounts (resolved for `project`) until the sandbox is
    /// in the table; with the host directory each is bound from.
    pub(crate) fn hold_for_mount(
        &self,
        mounts: &[brig_proto::VolumeMount],
        project: Option<&str>,
    ) -> Result<(MountHold, Vec<HeldMount>), VolumeError> {
        if mounts.len() > 16 {
            return Err(VolumeError::BadMount("at most 16 volumes per sandbox".into()));
        }
        let mut hold = MountHold(Vec::new());
        let mut found = Vec::new();
        let mut paths = std::collections::HashSet::new();
        for m in mounts {
            let path = brig_container::protect::validate(&m.path).map_err(VolumeError::BadMount)?;
            if !paths.insert(path.clone()) {
                return Err(VolumeError::BadMount(format!("two volumes at {path}")));
            }
            let volume = self.find(&m.volume, project)?;
            volume.pending.fetch_add(1, Ordering::SeqCst);
            hold.0.push(volume.clone());
            let mount = brig_proto::VolumeMount {
                volume: volume.record.id.clone(),
                path,
                read_only: m.read_only,
            };
            found.push((volume, mount));
        }
        Ok((hold, found))
    }

    /// The volume's mount on the node, mounted now if it is not (blocking: call off the
    /// async workers).
    pub(crate) fn mounted(&self, volume: &Volume) -> Result<PathBuf, VolumeError> {
        mount(&self.dir, &self.run, volume)
    }

    /// Bytes the volume holds (its file system's use; 0 before it was first mounted).
    pub(crate) fn used_bytes(&self, volume: &Volume) -> u64 {
        if !volume.mounted.load(Ordering::SeqCst) {
            return 0;
        }
        let point = self.run.join(&volume.record.id);
        match nix::sys::statvfs::statvfs(&point) {
            Ok(st) => st.blocks().saturating_sub(st.blocks_free()) * st.fragment_size(),
            Err(_) => 0,
        }
    }

    /// What a caller hears of a volume.
    pub(crate) fn info(&self, volume: &Volume, mounted_by: Vec<String>) -> VolumeInfo {
        let r = &volume.record;
        VolumeInfo {
            id: r.id.clone(),
            name: r.name.clone(),
            project: r.project.clone(),
            quota_bytes: r.quota_bytes,
            used_bytes: self.used_bytes(volume),
            created_unix_ms: r.created_unix_ms,
            mounted_by,
        }
    }

    /// Unmounts every volume but `kept` ones (those kept containers mount).
    pub(crate) fn unmount_all_but(&self, kept: &std::collections::HashSet<String>) {
        for volume in self.table.lock().values() {
            if kept.contains(&volume.record.id) {
                continue;
            }
            let point = self.run.join(&volume.record.id);
            let _mounting = volume.mounting.lock();
            volume.mounted.store(false, Ordering::SeqCst);
            if is_mounted(&point) {
                if let Err(e) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
                    tracing::warn!(volume = %volume.record.id, error = %e, "cannot unmount a volume");
                }
            }
            let _ = std::fs::remove_dir(&point);
        }
        let _ = std::fs::remove_dir(&self.run);
    }

    /// Host uid of container root (the volume's file operations make files as it).
    pub(crate) fn owner(&self) -> u32 {
        self.owner
    }
}

impl Volume {
    fn new(record: VolumeRecord, file_ops: usize) -> Volume {
        Volume {
            record,
            pending: AtomicUsize::new(0),
            mounting: Mutex::new(()),
            mounted: std::sync::atomic::AtomicBool::new(false),
            file_ops: Arc::new(tokio::sync::Semaphore::new(file_ops)),
        }
    }
}

/// Volume `volume`'s mount under `run`, mounted from its image in `dir` if it is not.
fn mount(dir: &Path, run_dir: &Path, volume: &Volume) -> Result<PathBuf, VolumeError> {
    let point = run_dir.join(&volume.record.id);
    if volume.mounted.load(Ordering::SeqCst) {
        return Ok(point);
    }
    let _mounting = volume.mounting.lock();
    // Mounted by an earlier run (a kept container holds it), or by a request just before.
    if volume.mounted.load(Ordering::SeqCst) || is_mounted(&point) {
        volume.mounted.store(true, Ordering::SeqCst);
        return Ok(point);
    }
    std::fs::create_dir_all(&point).map_err(io("create", &point))?;
    let image = dir.join(image_name(&volume.record.id));
    let args: [&std::ffi::OsStr; 6] = [
        "-t".as_ref(),
        "ext4".as_ref(),
        "-o".as_ref(),
        "loop,nodev,nosuid,relatime".as_ref(),
        image.as_os_str(),
        point.as_os_str(),
    ];
    run("mount", &args, &image)?;
    // Kept out of other mount namespaces' copies of the host's table.
    let private = nix::mount::mount(
        None::<&str>,
        &point,
        None::<&str>,
        nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    );
    if let Err(e) = private {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        return Err(VolumeError::Io { what: "make private", path: point, source: e.into() });
    }
    volume.mounted.store(true, Ordering::SeqCst);
    tracing::debug!(volume = %volume.record.id, "volume mounted");
    Ok(point)
}

fn image_name(id: &str) -> String {
    format!("{id}.ext4")
}

/// Makes a volume's image (sparse, formatted, its root owned by `owner`) and then its record:
/// a record always has its image.
fn make_volume(dir: &Path, record: &VolumeRecord, owner: u32) -> Result<(), VolumeError> {
    let image = dir.join(image_name(&record.id));
    let made = (|| {
        let file = std::fs::File::create(&image).map_err(io("create", &image))?;
        file.set_len(record.quota_bytes).map_err(io("size", &image))?;
        drop(file);
        let root =
            format!("root_owner={owner}:{owner},lazy_itable_init=1,lazy_journal_init=1,nodiscard");
        let args: [&std::ffi::OsStr; 7] = [
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            root.as_ref(),
            image.as_os_str(),
        ];
        run("mkfs.ext4", &args, &image)?;
        let path = dir.join(format!("{}.json", record.id));
        let fresh = path.with_extension("json.new");
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| VolumeError::Io {
            what: "encode",
            path: path.clone(),
            source: e.into(),
        })?;
        std::fs::write(&fresh, bytes).map_err(io("write", &fresh))?;
        std::fs::rename(&fresh, &path).map_err(io("rename", &fresh))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&image);
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_plain_and_not_hidden() {
        assert!(valid_name("data"));
        assert!(valid_name("my-vol_1.2"));
        for bad in ["", ".x", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_project_sees_its_own_and_its_sub_projects_volumes() {
        assert!(in_project(Some("team"), "team"));
        assert!(in_project(Some("team/a"), "team"));
        assert!(!in_project(Some("teamb"), "team"));
        assert!(!in_project(None, "team"));
    }
}
