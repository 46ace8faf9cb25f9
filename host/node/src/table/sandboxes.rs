//! The node's table of live sandboxes, persisted so a restarted node finds them again, plus a
//! bounded memory of recently destroyed ones so a client hears *why* its sandbox is gone.
//!
//! ```text
//! <state>/sandboxes/<id>.json     id, spec (lifetimes included), paused, tier state
//! ```
//! A record is rewritten in place, in the slots of `brig_hostkit::slot_file` (a record too
//! large for a slot is written whole to a temporary file and renamed over it, as all were
//! before, and is read either way).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use brig_core::sandbox::{Op, Persistence, Requested, Sandbox, SandboxError, TierRecord};
use brig_core::{IdleAction, SandboxId, SandboxSpec, Tier};
use brig_hostkit::slot_file::{self, SlotFile};
use brig_hostkit::spare_files::SpareFiles;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::execs::hub::ExecTable;
use crate::host::clock::now_unix_ms;
use crate::table::session_table::SessionTable;
use crate::NodeError;

/// How many destroyed sandboxes are remembered.
const TOMBSTONES: usize = 65_536;

pub(crate) struct SandboxEntry {
    pub id: SandboxId,
    pub tier: Tier,
    pub created_unix_ms: u64,
    spec: RwLock<SandboxSpec>,
    last_used_unix_ms: AtomicU64,
    /// The last use its record holds (see [`SandboxTable::save_clocks`]).
    saved_last_used_unix_ms: AtomicU64,
    /// When it was paused; 0 while it runs.
    paused_unix_ms: AtomicU64,
    /// Whether its pause kept its files only (its processes ended).
    paused_files_only: std::sync::atomic::AtomicBool,
    /// The tier's sandbox: every request reaches the tier through it.
    pub sandbox: Arc<dyn Sandbox>,
    /// Its commands, running and recently finished (clients re-attach by id).
    pub execs: ExecTable,
    /// Its open shell sessions.
    pub sessions: SessionTable,
    /// Serializes pause, resume and destroy of this sandbox.
    pub transition: tokio::sync::Mutex<()>,
    /// What it asks for (its tier's [`Sandbox::requested`], fixed at creation), counted in
    /// the table's sums while it is in the table.
    asked: Requested,
    /// Why it left the table, once it has: a request that was under way when it was destroyed
    /// hears this rather than whatever its tier saw as the sandbox went away.
    gone: std::sync::OnceLock<Gone>,
    /// Its record file's newest slot (`None` until this run first writes it); the lock also
    /// puts concurrent saves (a clock save and a state change) in one order.
    record_seq: Mutex<Option<u64>>,
    /// Its file operations under way on the node's blocking pool (see `file_work`), made at
    /// the first one with the node's bound.
    file_ops: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
    /// Its use over its life (`crate::host::usage_history`).
    pub(crate) usage_history: Mutex<crate::host::usage_history::UsageHistory>,
    /// Its directory watches (bounded by `limits.watches_per_sandbox`).
    pub(crate) watches: crate::limits::Gauge,
}

impl SandboxEntry {
    pub fn new(
        id: SandboxId,
        spec: SandboxSpec,
        created_unix_ms: u64,
        sandbox: Arc<dyn Sandbox>,
    ) -> Self {
        SandboxEntry {
            id,
            tier: spec.tier,
            created_unix_ms,
            spec: RwLock::new(spec),
            last_used_unix_ms: AtomicU64::new(created_unix_ms),
            saved_last_used_unix_ms: AtomicU64::new(created_unix_ms),
            paused_unix_ms: AtomicU64::new(0),
            paused_files_only: Default::default(),
            execs: ExecTable::default(),
            sessions: SessionTable::default(),
            transition: tokio::sync::Mutex::new(()),
            // Before `sandbox` moves in.
            asked: sandbox.requested().unwrap_or_default(),
            sandbox,
            gone: std::sync::OnceLock::new(),
            record_seq: Mutex::new(None),
            file_ops: std::sync::OnceLock::new(),
            usage_history: Mutex::default(),
            watches: crate::limits::Gauge::default(),
        }
    }

    /// Its bound of file operations under way (`max` of them, fixed at the first use).
    pub fn file_ops(&self, max: usize) -> Arc<tokio::sync::Semaphore> {
        self.file_ops.get_or_init(|| Arc::new(tokio::sync::Semaphore::new(max))).clone()
    }

    /// A failure of its tier, as the node reports it (naming this sandbox). Once the sandbox
    /// has left the table, the failure is that it is gone, and why.
    pub fn fail(&self, e: SandboxError) -> NodeError {
        match self.gone.get() {
            Some(gone) => gone.error(&self.id.to_string()),
            None => NodeError::sandbox(&self.id.to_string(), self.tier, e),
        }
    }

    /// Why it left the table, as a request hears it, once it has.
    pub fn gone_error(&self) -> Option<NodeError> {
        self.gone.get().map(|gone| gone.error(&self.id.to_string()))
    }

    /// `Ok` if its tier serves `op`, else the typed refusal.
    pub fn require(&self, op: Op) -> Result<(), NodeError> {
        self.sandbox.capabilities().require(op).map_err(|e| self.fail(e))
    }

    pub fn spec(&self) -> SandboxSpec {
        self.spec.read().clone()
    }

    pub fn update_spec(&self, f: impl FnOnce(&mut SandboxSpec)) {
        f(&mut self.spec.write());
    }

    pub fn touch(&self) {
        self.last_used_unix_ms.store(now_unix_ms(), Ordering::Relaxed);
    }

    pub fn last_used_unix_ms(&self) -> u64 {
        self.last_used_unix_ms.load(Ordering::Relaxed)
    }

    pub fn paused_unix_ms(&self) -> Option<u64> {
        match self.paused_unix_ms.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// Its clocks as its record left them before a restart: its TTLs count the time the node
    /// was down. A record from before clocks were kept (no last use) counts idleness from now.
    pub fn restore_clocks(&self, record: &SandboxRecord) {
        let last_used = match record.last_used_unix_ms {
            0 => now_unix_ms(),
            t => t.max(self.created_unix_ms),
        };
        self.last_used_unix_ms.store(last_used, Ordering::Relaxed);
        self.saved_last_used_unix_ms.store(last_used, Ordering::Relaxed);
        self.paused_unix_ms.store(record.paused_unix_ms, Ordering::Relaxed);
        self.set_paused_files_only(record.paused_files_only);
    }

    /// Whether its pause kept its files only.
    pub fn paused_files_only(&self) -> bool {
        self.paused_files_only.load(Ordering::Relaxed)
    }

    pub fn set_paused_files_only(&self, files_only: bool) {
        self.paused_files_only.store(files_only, Ordering::Relaxed);
    }

    pub fn set_paused(&self, paused: bool) {
        self.paused_unix_ms.store(if paused { now_unix_ms().max(1) } else { 0 }, Ordering::Relaxed);
    }

    /// What its lifetimes say should happen at `now`, if anything.
    pub fn due(&self, now: u64) -> Option<Due> {
        let spec = self.spec.read();
        if let Some(max) = spec.max_lifetime {
            if now >= self.created_unix_ms.saturating_add(ms(max)) {
                return Some(Due::Destroy(format!(
                    "destroyed at its maximum lifetime of {:.1} s",
                    max.as_secs_f64()
                )));
            }
        }
        match self.paused_unix_ms() {
            Some(paused_at) => {
                let ttl = spec.paused_ttl?;
                (now >= paused_at.saturating_add(ms(ttl))).then(|| {
                    Due::Destroy(format!("destroyed after {:.1} s paused", ttl.as_secs_f64()))
                })
            }
            None => {
                if now < self.last_used_unix_ms().saturating_add(ms(spec.idle_ttl)) {
                    return None;
                }
                Some(match spec.idle_action {
                    IdleAction::Pause => Due::Pause { files_only: false },
                    IdleAction::PauseFilesOnly => Due::Pause { files_only: true },
                    IdleAction::Destroy => Due::Destroy(format!(
                        "destroyed after its idle TTL of {:.1} s",
                        spec.idle_ttl.as_secs_f64()
                    )),
                })
            }
        }
    }
}

/// A lifetime that has run out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Due {
    Pause { files_only: bool },
    Destroy(String),
}

/// How far behind a sandbox's last use its record may fall.
pub(crate) const CLOCK_SLACK_MS: u64 = 5_000;

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxRecord {
    pub id: SandboxId,
    pub spec: SandboxSpec,
    pub created_unix_ms: u64,
    #[serde(default)]
    pub paused_unix_ms: u64,
    /// Its pause kept its files only.
    #[serde(default)]
    pub paused_files_only: bool,
    /// Its last use, saved at most [`CLOCK_SLACK_MS`] behind (0 in records from before).
    #[serde(default)]
    pub last_used_unix_ms: u64,
    /// Its tier's part, as the tier wrote it ([`Sandbox::record`]): what taking it back
    /// needs, tagged with its kind and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierRecord>,
    /// Records from before tier records were tagged held the tier's part in one of these
    /// (a container's, a VM's, a container's in a container-host VM); read, never written.
    #[serde(default, skip_serializing)]
    pub container: Option<serde_json::Value>,
    #[serde(default, skip_serializing)]
    pub machine: Option<serde_json::Value>,
    #[serde(default, skip_serializing)]
    pub hosted: Option<serde_json::Value>,
}

impl SandboxRecord {
    /// Its tier's part: the tagged one, or that of a record from before, tagged as its tier
    /// tags it now (version 1 of each).
    pub fn tier_record(&self) -> Option<TierRecord> {
        let legacy = |kind: &str, body: &Option<serde_json::Value>| {
            body.clone().map(|body| TierRecord { kind: kind.to_string(), version: 1, body })
        };
        self.tier
            .clone()
            .or_else(|| legacy(brig_container::record::RECORD_KIND, &self.container))
            .or_else(|| legacy(brig_vmtier::records::MACHINE_RECORD_KIND, &self.machine))
            .or_else(|| legacy(brig_vmtier::records::HOSTED_RECORD_KIND, &self.hosted))
    }
}

/// Where destroyed sandboxes' record files wait for the next ones, under the records' directory.
const SPARE_DIR: &str = "spare";
/// The most record files kept spare: 32 KiB of disk each.
const SPARE_RECORDS: usize = 1024;

pub(crate) struct SandboxTable {
    dir: PathBuf,
    /// Record files of destroyed sandboxes, kept for the next ones (see `SpareFiles`).
    spares: SpareFiles,
    live: RwLock<HashMap<SandboxId, Arc<SandboxEntry>>>,
    /// What the live sandboxes ask for, summed as they enter and leave the table (under its
    /// write lock), so admitting a create costs the same at 10 sandboxes as at 10,000.
    asked: Mutex<Requested>,
    gone: Mutex<Tombstones>,
}

#[derive(Default)]
struct Tombstones {
    order: VecDeque<SandboxId>,
    reasons: HashMap<SandboxId, Gone>,
}

/// Why a sandbox left the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Destroyed because a client asked.
    Destroyed,
    /// Destroyed by the node because a lifetime limit fired; the text says which.
    Expired(String),
}

impl Gone {
    /// What a request for the sandbox `id` hears once it is gone.
    pub fn error(&self, id: &str) -> NodeError {
        match self {
            Gone::Expired(reason) => {
                NodeError::SandboxExpired { id: id.to_string(), reason: reason.clone() }
            }
            Gone::Destroyed => NodeError::SandboxDestroyed(id.to_string()),
        }
    }
}

impl SandboxTable {
    pub fn new(dir: &Path) -> Result<SandboxTable, NodeError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| NodeError::Io { what: dir.display().to_string(), source })?;
        let spare_dir = dir.join(SPARE_DIR);
        let spares = SpareFiles::open(&spare_dir, SPARE_RECORDS)
            .map_err(|source| NodeError::Io { what: spare_dir.display().to_string(), source })?;
        Ok(SandboxTable {
            dir: dir.to_owned(),
            spares,
            live: RwLock::default(),
            asked: Mutex::default(),
            gone: Mutex::default(),
        })
    }

    /// Records persisted by an earlier run of the node.
    pub fn saved_records(&self) -> Vec<SandboxRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("json") => {}
                // A write a crash cut short; the record it was to replace (if any) is whole.
                Some("tmp") => {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                _ => continue,
            }
            match read_record(&path).map(|b| serde_json::from_slice::<SandboxRecord>(&b)) {
                Ok(Ok(record)) => out.push(record),
                _ => tracing::warn!(path = %path.display(), "unreadable sandbox record skipped"),
            }
        }
        out
    }

    /// Where the records are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn len(&self) -> usize {
        self.live.read().len()
    }

    /// Writes the sandbox's record; a crash mid-write leaves the one before it readable.
    pub fn save(&self, entry: &SandboxEntry) -> Result<(), NodeError> {
        let tier = match entry.sandbox.capabilities().persistence {
            Persistence::Record | Persistence::Machine | Persistence::Hosted => {
                entry.sandbox.record().map_err(|e| NodeError::Io {
                    what: "sandbox record".into(),
                    source: std::io::Error::other(e),
                })?
            }
            Persistence::Spec => None,
            // Dies with the daemon: no record, and no clock for `save_clocks` to come back for.
            Persistence::Ephemeral => {
                entry.saved_last_used_unix_ms.store(entry.last_used_unix_ms(), Ordering::Relaxed);
                return Ok(());
            }
        };
        let last_used = entry.last_used_unix_ms();
        let record = SandboxRecord {
            id: entry.id,
            spec: entry.spec(),
            created_unix_ms: entry.created_unix_ms,
            paused_unix_ms: entry.paused_unix_ms().unwrap_or(0),
            paused_files_only: entry.paused_files_only(),
            last_used_unix_ms: last_used,
            tier,
            container: None,
            machine: None,
            hosted: None,
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| NodeError::Io {
            what: "sandbox record".into(),
            source: std::io::Error::other(e),
        })?;
        let path = self.record_path(&entry.id);
        let io = |source| NodeError::Io { what: path.display().to_string(), source };
        if entry.gone.get().is_some() {
            // Destroyed meanwhile: the record must not outlive the sandbox.
            return Ok(());
        }
        {
            let mut seq = entry.record_seq.lock();
            if entry.gone.get().is_some() {
                // `remove` forgets the record under this lock: nothing is written after it (the
                // file may be another sandbox's by then).
                return Ok(());
            }
            if bytes.len() > slot_file::MAX_BODY_BYTES {
                self.replace_whole(&entry.id, &path, &bytes).map_err(io)?;
                *seq = None; // the next slot write reads the file afresh
            } else {
                let write_slot = |mut file: SlotFile| file.write(&bytes).map(|()| file.seq());
                let written = match *seq {
                    Some(last) => SlotFile::at(&path, last).and_then(write_slot),
                    // The first record of a sandbox appears whole or not at all: a crash in
                    // the middle of its create leaves no record without an intact slot.
                    None if !path.exists() => self.create_record(&entry.id, &path, &bytes),
                    None => SlotFile::open_or_create(&path).and_then(write_slot),
                };
                match written {
                    Ok(newest) => *seq = Some(newest),
                    // Forgotten while this was written: the sandbox is gone.
                    Err(_) if entry.gone.get().is_some() => return Ok(()),
                    Err(e) => return Err(io(e)),
                }
            }
        }
        entry.saved_last_used_unix_ms.store(last_used, Ordering::Relaxed);
        Ok(())
    }

    /// Makes a sandbox's record file: its first slot written to a temporary file renamed into
    /// place (removed at the next start if a crash leaves it). Returns the slot's sequence.
    fn create_record(&self, id: &SandboxId, path: &Path, bytes: &[u8]) -> std::io::Result<u64> {
        // A destroyed sandbox's file, cleared and written while still spare, then renamed into
        // place: no inode made (see `SpareFiles`).
        if let Some(spare) = self.spares.take() {
            let filled = SlotFile::reuse(&spare).and_then(|mut file| {
                file.write(bytes)?;
                std::fs::rename(&spare, path)?;
                Ok(file.seq())
            });
            match filled {
                Ok(seq) => return Ok(seq),
                Err(e) => {
                    tracing::warn!(spare = %spare.display(), error = %e, "spare record file dropped");
                    let _ = std::fs::remove_file(&spare);
                }
            }
        }
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{id}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)?;
        let mut file = SlotFile::create(tmp.path())?;
        file.write(bytes)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(file.seq())
    }

    /// Writes a record too large for a slot: whole, to a temporary file renamed over it (one
    /// per writer; removed at the next start if a crash leaves it).
    fn replace_whole(&self, id: &SandboxId, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!("{id}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)?;
        std::io::Write::write_all(&mut tmp, bytes)?;
        tmp.persist(path).map(drop).map_err(|e| e.error)
    }

    /// Saves the records of sandboxes used more than [`CLOCK_SLACK_MS`] after their record
    /// says, so idle TTLs survive a restart (at most that much early). Blocking; returns how
    /// many were written.
    pub fn save_clocks(&self) -> usize {
        let stale: Vec<Arc<SandboxEntry>> = self
            .live
            .read()
            .values()
            .filter(|e| {
                e.last_used_unix_ms()
                    > e.saved_last_used_unix_ms
                        .load(Ordering::Relaxed)
                        .saturating_add(CLOCK_SLACK_MS)
            })
            .cloned()
            .collect();
        let mut saved = 0;
        for entry in stale {
            match self.save(&entry) {
                Ok(()) => saved += 1,
                Err(e) => tracing::warn!(sandbox = %entry.id, error = %e, "cannot save its clock"),
            }
        }
        saved
    }

    /// Adds a sandbox (its record is written separately, by [`SandboxTable::save`]).
    pub fn insert(&self, entry: SandboxEntry) -> Arc<SandboxEntry> {
        let entry = Arc::new(entry);
        let mut live = self.live.write();
        self.count(&entry.asked, true);
        if let Some(replaced) = live.insert(entry.id, entry.clone()) {
            self.count(&replaced.asked, false);
        }
        entry
    }

    /// Adds `asked` to the sums, or takes it off; called under the table's write lock.
    fn count(&self, asked: &Requested, added: bool) {
        let mut sums = self.asked.lock();
        if added {
            sums.memory_bytes += asked.memory_bytes;
            sums.cpu_millis += asked.cpu_millis;
        } else {
            sums.memory_bytes = sums.memory_bytes.saturating_sub(asked.memory_bytes);
            sums.cpu_millis = sums.cpu_millis.saturating_sub(asked.cpu_millis);
        }
    }

    /// What the live sandboxes ask for in all: memory bytes and CPU millicores.
    pub fn asked(&self) -> (u64, u64) {
        let sums = *self.asked.lock();
        (sums.memory_bytes, sums.cpu_millis)
    }

    /// Finds a live sandbox by id text.
    pub fn get(&self, id: &str) -> Result<Arc<SandboxEntry>, NodeError> {
        let parsed: SandboxId = id.parse()?;
        if let Some(entry) = self.live.read().get(&parsed) {
            return Ok(entry.clone());
        }
        match self.gone.lock().reasons.get(&parsed) {
            Some(gone) => Err(gone.error(id)),
            None => Err(NodeError::SandboxNotFound(id.to_string())),
        }
    }

    /// Takes a sandbox out of the table and forgets its record, remembering why.
    pub fn remove(&self, id: &SandboxId, reason: Gone) -> Option<Arc<SandboxEntry>> {
        let entry = {
            let mut live = self.live.write();
            let entry = live.remove(id)?;
            self.count(&entry.asked, false);
            entry
        };
        let _ = entry.gone.set(reason.clone());
        {
            // A save under way finishes first; later ones see `gone` and write nothing.
            let _saving = entry.record_seq.lock();
            self.forget(id);
        }
        let mut gone = self.gone.lock();
        if gone.order.len() >= TOMBSTONES {
            if let Some(old) = gone.order.pop_front() {
                gone.reasons.remove(&old);
            }
        }
        gone.order.push_back(*id);
        gone.reasons.insert(*id, reason);
        Some(entry)
    }

    /// Removes the record of a sandbox (destroyed, or not restorable): its file becomes a spare
    /// for the next sandbox's record, unless it holds a record written whole (larger than the
    /// two slots), which is deleted.
    pub fn forget(&self, id: &SandboxId) {
        let path = self.record_path(id);
        let slotted = std::fs::metadata(&path).is_ok_and(|m| m.len() <= 2 * slot_file::SLOT_BYTES);
        let removed = if slotted { self.spares.give(&path) } else { std::fs::remove_file(&path) };
        if let Err(e) = removed {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove sandbox record");
            }
        }
    }

    /// Every sandbox, in no particular order (cheap: for counting and summing).
    pub fn all(&self) -> Vec<Arc<SandboxEntry>> {
        self.live.read().values().cloned().collect()
    }

    pub fn list(&self, selector: &[(String, String)]) -> Vec<Arc<SandboxEntry>> {
        let mut out: Vec<_> = self
            .live
            .read()
            .values()
            .filter(|e| e.spec.read().matches(selector))
            .cloned()
            .collect();
        out.sort_by_cached_key(|e| (e.created_unix_ms, e.id.to_string()));
        out
    }

    /// Sandboxes with a lifetime that has run out, and what is due.
    pub fn due(&self, now_unix_ms: u64) -> Vec<(Arc<SandboxEntry>, Due)> {
        self.live
            .read()
            .values()
            .filter_map(|e| e.due(now_unix_ms).map(|d| (e.clone(), d)))
            .collect()
    }
}

/// Largest record file read whole (one written before slots, or too large for one).
const MAX_WHOLE_RECORD_BYTES: u64 = 4 << 20;

/// A record file's newest slot, or the whole file (a record written whole).
fn read_record(path: &Path) -> std::io::Result<Vec<u8>> {
    slot_file::read_record(path, MAX_WHOLE_RECORD_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_of(tier: Tier, tier_record: Option<TierRecord>) -> SandboxRecord {
        let spec = SandboxSpec {
            tier,
            image: None,
            labels: Vec::new(),
            idle_ttl: std::time::Duration::from_secs(600),
            idle_action: IdleAction::Destroy,
            paused_ttl: None,
            max_lifetime: None,
            egress: None,
            net_slot: None,
            qos: brig_core::QosClass::default(),
            volumes: Vec::new(),
        };
        SandboxRecord {
            id: SandboxId::generate(brig_core::NodeId(1)),
            spec,
            created_unix_ms: 1,
            paused_unix_ms: 0,
            paused_files_only: false,
            last_used_unix_ms: 1,
            tier: tier_record,
            container: None,
            machine: None,
            hosted: None,
        }
    }

    /// Records written before tier records were tagged (the tier's part in `container`,
    /// `machine` or `hosted`) read back as the tier's tagged record of version 1; a record
    /// written now holds the tagged one only.
    #[test]
    fn records_from_before_tagging_still_read_and_new_ones_are_tagged() {
        let container = brig_container::record::ContainerRecord {
            layers: vec![("/l/base.erofs".into(), None)],
            layer_digests: vec!["sha256:aa".into()],
            env: vec![("A".into(), "1".into())],
            shell: "/bin/sh".into(),
            memory_bytes: 1 << 30,
            pids: 64,
            cpu_millis: 1000,
            disk_bytes: 1 << 30,
            protected: Vec::new(),
            cwd: None,
            user: None,
            command: Vec::new(),
            binds: Vec::new(),
        };
        let machine = brig_vmtier::MachineRecord {
            memory_from: "/s/env".into(),
            layers: Vec::new(),
            writable: None,
            cow_base: None,
            net: None,
            paused: true,
        };
        let hosted = brig_vmtier::HostedRecord {
            vm: "chost-1".into(),
            vm_layers: vec!["/l/base.img".into()],
            env: Vec::new(),
            shell: "/bin/sh".into(),
            memory_bytes: 1 << 28,
            cpu_millis: 500,
        };
        for (tier, field, body) in [
            (Tier::Container, "container", serde_json::to_value(&container).expect("json")),
            (Tier::Microvm, "machine", serde_json::to_value(&machine).expect("json")),
            (Tier::Container, "hosted", serde_json::to_value(&hosted).expect("json")),
        ] {
            // The file as a node before this change wrote it.
            let mut old = serde_json::to_value(record_of(tier, None)).expect("json");
            old.as_object_mut().expect("object").insert(field.into(), body);
            let bytes = serde_json::to_vec(&old).expect("bytes");
            let read: SandboxRecord = serde_json::from_slice(&bytes).expect("an old record reads");
            let tier_record = read.tier_record().expect("its tier's part");
            match field {
                "container" => assert_eq!(
                    brig_container::record::ContainerRecord::from_tier(&tier_record),
                    Ok(container.clone())
                ),
                "hosted" => assert_eq!(
                    brig_vmtier::HostedRecord::from_tier(&tier_record),
                    Ok(hosted.clone())
                ),
                _ => assert_eq!(
                    brig_vmtier::MachineRecord::from_tier(&tier_record),
                    Ok(machine.clone())
                ),
            }
        }
        let new = record_of(Tier::Container, Some(container.to_tier().expect("record")));
        let written = serde_json::to_value(&new).expect("json");
        assert!(written.get("tier").is_some() && written.get("container").is_none());
        let back: SandboxRecord = serde_json::from_value(written).expect("reads");
        assert_eq!(back.tier_record(), Some(container.to_tier().expect("record")));
    }

    #[test]
    fn a_record_is_read_from_its_newest_slot_or_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sb-00000000-0000000000000003.json");
        // Written whole (before slots, or too large for one).
        std::fs::write(&path, br#"{"whole":1}"#).expect("write");
        assert_eq!(read_record(&path).expect("read"), br#"{"whole":1}"#);
        // Rewritten in slots over it: the newest slot is the record.
        let mut file = SlotFile::open_or_create(&path).expect("open");
        file.write(br#"{"slot":1}"#).expect("write");
        file.write(br#"{"slot":2}"#).expect("write");
        assert_eq!(read_record(&path).expect("read"), br#"{"slot":2}"#);
        let mut again = SlotFile::open_or_create(&path).expect("reopen");
        again.write(br#"{"slot":3}"#).expect("write");
        assert_eq!(again.seq(), 3);
        assert_eq!(read_record(&path).expect("read"), br#"{"slot":3}"#);
        let big = vec![b' '; slot_file::MAX_BODY_BYTES + 1];
        assert!(again.write(&big).is_err(), "too large for a slot: written whole instead");
    }

    #[test]
    fn a_record_write_cut_short_is_removed_at_the_next_start() {
        let dir = tempfile::tempdir().expect("tmp");
        let table = SandboxTable::new(dir.path()).expect("table");
        let cut = dir.path().join("sb-00000000-0000000000000001.a1b2c3.tmp");
        std::fs::write(&cut, b"{\"id\":").expect("write");
        let damaged = dir.path().join("sb-00000000-0000000000000002.json");
        std::fs::write(&damaged, b"{").expect("write");
        assert!(table.saved_records().is_empty());
        assert!(!cut.exists(), "a temporary record outlived the start");
        // A whole-looking name with damaged contents is not the restart's to delete.
        assert!(damaged.exists());
    }
}
