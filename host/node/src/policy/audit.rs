//! The audit trail: every exec, session command, tool call, file operation, egress attempt,
//! policy change and lifecycle event of a sandbox, in order, so a reviewer or reward model can
//! see how an answer was reached.
//!
//! ```text
//! record(id, kind) ─▶ <state>/audit/<id>.jsonl   (append; past FILE_BYTES it becomes .jsonl.1,
//!                  │                              so a sandbox keeps at most 2 × FILE_BYTES)
//!                  └▶ broadcast ─▶ followers (Audit { follow: true })
//! ```
//! Files outlive their sandbox (a reviewer reads them after the rollout) until `RETENTION`
//! after their last event; the node's reaper prunes them every `PRUNE_EVERY` (a node that
//! runs for weeks keeps a day of trails, not all of them), never a live sandbox's.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use brig_hostkit::spare_files::SpareFiles;
use brig_proto::{AuditEvent, AuditKind, AuditRequest, Reply};
use brig_transport::Exchange;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::host::clock::now_unix_ms;
use crate::table::sandboxes::SandboxEntry;
use crate::{Node, NodeError};

/// Bytes of one audit file before it rotates.
const FILE_BYTES: u64 = 4 << 20;
/// How long the trail of a destroyed sandbox is kept.
pub(crate) const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How often the reaper prunes trails past `RETENTION`.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The most pruned trail files kept (empty) for new trails, in `audit-spare` beside `audit`.
const SPARE_TRAILS: usize = 4096;
/// Events returned per `Audit` reply frame.
pub const BATCH: usize = 256;

/// Where a trail stands; its file is opened per event (a node has too many sandboxes to keep
/// a descriptor open for each).
struct Trail {
    next_seq: u64,
    bytes: u64,
}

/// One sandbox's place in the trail map.
#[derive(Default)]
enum Slot {
    /// Its first event reads where the trail stands.
    #[default]
    Unopened,
    Open(Trail),
    /// Removed by `close`: writers take the map's current slot instead.
    Closed,
}

/// The node's audit trails.
pub struct AuditLog {
    dir: PathBuf,
    /// Pruned trails' files, emptied, for new trails (see `SpareFiles`).
    spares: SpareFiles,
    /// One slot per sandbox with events this run.
    trails: Mutex<HashMap<String, Arc<Mutex<Slot>>>>,
    live: broadcast::Sender<(String, AuditEvent)>,
}

impl AuditLog {
    pub fn open(dir: &Path) -> Result<AuditLog, NodeError> {
        std::fs::create_dir_all(dir).map_err(|source| NodeError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let spare_dir = dir.with_file_name("audit-spare");
        let spares = SpareFiles::open(&spare_dir, SPARE_TRAILS).map_err(|source| {
            NodeError::Io { what: format!("create {}", spare_dir.display()), source }
        })?;
        Ok(AuditLog {
            dir: dir.to_owned(),
            spares,
            trails: Mutex::default(),
            live: broadcast::channel(4096).0,
        })
    }

    fn path(&self, id: &str, rotated: bool) -> PathBuf {
        self.dir.join(if rotated { format!("{id}.jsonl.1") } else { format!("{id}.jsonl") })
    }

    /// Appends one event to a sandbox's trail. Never fails the request it describes: an
    /// unwritable trail is logged. Each trail has its own lock, so a slow write (or a first
    /// event reading a trail back after a restart) holds up only its own sandbox.
    pub fn record(&self, id: &str, kind: AuditKind) {
        // A slot closed between taking it from the map and locking it is retired: take the
        // map's current one (a fresh slot reads the trail back, so numbers never repeat).
        let slot = self.trails.lock().entry(id.to_string()).or_default().clone();
        let mut state = slot.lock();
        if matches!(*state, Slot::Closed) {
            drop(state);
            return self.record(id, kind);
        }
        if matches!(*state, Slot::Unopened) {
            match self.open_trail(id) {
                Ok(trail) => *state = Slot::Open(trail),
                Err(e) => {
                    tracing::warn!(sandbox = id, error = %e, "audit trail unwritable");
                    return;
                }
            }
        }
        let Slot::Open(trail) = &mut *state else { return };
        let event = AuditEvent { seq: trail.next_seq, unix_ms: now_unix_ms(), kind };
        trail.next_seq += 1;
        let Ok(mut line) = serde_json::to_vec(&event) else { return };
        line.push(b'\n');
        if trail.bytes + line.len() as u64 > FILE_BYTES {
            let _ = std::fs::rename(self.path(id, false), self.path(id, true));
            trail.bytes = 0;
        }
        if let Err(e) = self.create_file(id).and_then(|mut f| f.write_all(&line)) {
            tracing::warn!(sandbox = id, error = %e, "audit trail write");
        }
        trail.bytes += line.len() as u64;
        drop(state);
        let _ = self.live.send((id.to_string(), event));
    }

    fn create_file(&self, id: &str) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new().create(true).append(true).open(self.path(id, false))
    }

    /// Opens a trail for appending, continuing its sequence after a node restart.
    fn open_trail(&self, id: &str) -> std::io::Result<Trail> {
        let last = self.read(id, 0).last().map(|e| e.seq).unwrap_or(0);
        let path = self.path(id, false);
        let bytes = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A new trail: in a pruned one's file if there is one (no inode made).
                if let Err(e) = self.spares.take_empty_as(&path) {
                    tracing::warn!(sandbox = id, error = %e, "spare audit file dropped");
                }
                0
            }
            Err(e) => return Err(e),
        };
        Ok(Trail { next_seq: last + 1, bytes })
    }

    /// The events of a sandbox with `seq > after`, oldest first.
    pub fn read(&self, id: &str, after: u64) -> Vec<AuditEvent> {
        let mut out = Vec::new();
        for rotated in [true, false] {
            let Ok(file) = std::fs::File::open(self.path(id, rotated)) else { continue };
            for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<AuditEvent>(&line) {
                    if event.seq > after {
                        out.push(event);
                    }
                }
            }
        }
        out
    }

    /// Whether a sandbox ever had a trail here.
    pub fn exists(&self, id: &str) -> bool {
        self.path(id, false).exists()
    }

    /// Live events of every sandbox.
    pub fn subscribe(&self) -> broadcast::Receiver<(String, AuditEvent)> {
        self.live.subscribe()
    }

    /// Closes a destroyed sandbox's file (its trail stays readable until `RETENTION`).
    pub fn close(&self, id: &str) {
        let slot = self.trails.lock().remove(id);
        if let Some(slot) = slot {
            // Waits for a write in flight; a record that took this slot before it left the map
            // sees it closed and starts over.
            *slot.lock() = Slot::Closed;
        }
    }

    /// Deletes the trail files untouched for longer than `retention`, except those of the
    /// sandboxes `live` names (an idle sandbox keeps its trail); returns how many went.
    pub(crate) fn prune(&self, retention: Duration, live: impl Fn(&str) -> bool) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut pruned = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let id = name
                .strip_suffix(".jsonl.1")
                .or_else(|| name.strip_suffix(".jsonl"))
                .unwrap_or(&name);
            if live(id) {
                continue;
            }
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > retention);
            // Emptied and kept for a new trail (deleted past SPARE_TRAILS).
            if old && self.spares.give_emptied(&entry.path()).is_ok() {
                pruned += 1;
            }
        }
        pruned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle(n: u64) -> AuditKind {
        AuditKind::Lifecycle { event: "test".into(), detail: n.to_string() }
    }

    #[test]
    fn trails_keep_order_across_rotation_and_reopen() {
        let state = tempfile::tempdir().expect("test");
        let dir = state.path().join("audit");
        let log = AuditLog::open(&dir).expect("test");
        let big = "x".repeat(64 << 10);
        for i in 0..200u64 {
            log.record(
                "sb-a",
                AuditKind::SessionCommand { session: i.to_string(), command: big.clone() },
            );
        }
        log.record("sb-b", lifecycle(1));
        let events = log.read("sb-a", 0);
        // Rotation keeps at most two files: the newest events, in order, none repeated.
        assert!(events.len() < 200 && events.len() > 60, "{} kept", events.len());
        assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        assert_eq!(events.last().expect("test").seq, 200);
        assert_eq!(log.read("sb-a", 199).len(), 1);
        drop(log);
        let log = AuditLog::open(&dir).expect("test");
        log.record("sb-a", lifecycle(2));
        assert_eq!(log.read("sb-a", 200)[0].seq, 201);
        assert_eq!(log.read("sb-b", 0).len(), 1);
        assert!(log.read("sb-none", 0).is_empty());
    }

    /// Trails untouched past the retention go, both files of a rotated one included; a fresh
    /// trail and an old one of a live sandbox stay.
    #[test]
    fn old_trails_of_gone_sandboxes_are_pruned() {
        let state = tempfile::tempdir().expect("test");
        let dir = state.path().join("audit");
        let log = AuditLog::open(&dir).expect("test");
        for id in ["sb-old", "sb-idle", "sb-new"] {
            log.record(id, lifecycle(1));
        }
        std::fs::write(dir.join("sb-old.jsonl.1"), b"").expect("rotated");
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(3 * 3600);
        for name in ["sb-old.jsonl", "sb-old.jsonl.1", "sb-idle.jsonl"] {
            let file = std::fs::File::options().append(true).open(dir.join(name));
            file.expect("trail").set_modified(long_ago).expect("age it");
        }
        let pruned = log.prune(Duration::from_secs(3600), |id| id == "sb-idle");
        assert_eq!(pruned, 2);
        assert!(!log.exists("sb-old") && !dir.join("sb-old.jsonl.1").exists());
        assert_eq!(log.read("sb-idle", 0).len(), 1, "a live sandbox keeps its trail");
        assert_eq!(log.read("sb-new", 0).len(), 1);
        assert_eq!(log.prune(RETENTION, |_| false), 0);
        // The pruned files are kept, empty, and the next new trail takes one.
        let spares =
            || std::fs::read_dir(state.path().join("audit-spare")).expect("spares").count();
        assert_eq!(spares(), 2);
        log.record("sb-next", lifecycle(1));
        let events = log.read("sb-next", 0);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].seq, 1);
        assert_eq!(spares(), 1);
    }
}

/// Records one sandbox's exec outcomes (the exec pump outlives the request).
#[derive(Clone)]
pub(crate) struct Recorder {
    log: Arc<AuditLog>,
    metrics: Arc<crate::host::metrics::Metrics>,
    id: String,
    /// The sandbox's tier, for the exec latency metric.
    tier: &'static str,
}

impl Recorder {
    pub fn record(&self, kind: AuditKind) {
        self.log.record(&self.id, kind);
        self.metrics.audit_events.inc();
    }

    pub fn exec_end(&self, exec_id: u64, r: &brig_proto::ExecResult) {
        let outcome = if r.oom_killed {
            "oom_killed"
        } else if r.timed_out {
            "timed_out"
        } else if r.killed {
            "killed"
        } else if r.signal.is_some() {
            "signaled"
        } else {
            "exited"
        };
        self.metrics.observe_exec(self.tier, Duration::from_micros(r.duration_us));
        self.record(AuditKind::ExecEnd {
            exec_id,
            exit_code: r.exit_code,
            signal: r.signal,
            outcome: outcome.into(),
            duration_ms: r.duration_us / 1000,
            stdout_bytes: r.stdout_bytes,
            stderr_bytes: r.stderr_bytes,
            truncated: r.truncated,
        });
    }
}

impl Node {
    pub(crate) fn recorder(&self, entry: &SandboxEntry) -> Recorder {
        Recorder {
            log: self.inner.audit.clone(),
            metrics: self.inner.metrics.clone(),
            id: entry.id.to_string(),
            tier: entry.tier.as_str(),
        }
    }

    /// Records an event for a sandbox that exists (requests naming garbage ids leave no trail).
    pub(crate) fn audit_if_live(&self, sandbox: &str, kind: AuditKind) {
        if let Ok(entry) = self.inner.sandboxes.get(sandbox) {
            self.inner.audit.record(&entry.id.to_string(), kind);
            self.inner.metrics.audit_events.inc();
        }
    }

    /// Records a lifecycle event in the sandbox's trail and in the node's journal (with the
    /// sandbox's labels while it is in the table).
    pub(crate) fn audit_lifecycle(&self, id: &str, event: &str, detail: impl Into<String>) {
        let now = self.inner.sandboxes.get(id).ok().map(|e| (e.spec().labels, e.created_unix_ms));
        self.audit_lifecycle_of(id, event, detail, now);
    }

    /// As [`Node::audit_lifecycle`], for a sandbox not (yet) in the table: with its labels
    /// and creation time.
    pub(crate) fn audit_lifecycle_of(
        &self,
        id: &str,
        event: &str,
        detail: impl Into<String>,
        now: Option<(Vec<(String, String)>, u64)>,
    ) {
        let detail: String = detail.into();
        self.inner.journal.record(id, event, detail.clone(), now);
        self.inner.audit.record(id, AuditKind::Lifecycle { event: event.into(), detail });
        self.inner.metrics.audit_events.inc();
    }

    /// Streams a sandbox's trail: what is kept, then (with `follow`) what happens next, until
    /// the sandbox is gone.
    pub(crate) async fn audit_stream(
        &self,
        req: AuditRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let id: brig_core::SandboxId = req.sandbox.parse()?;
        let id = id.to_string();
        let live = self.inner.sandboxes.get(&id).is_ok();
        if !live && !self.inner.audit.exists(&id) {
            return Err(NodeError::SandboxNotFound(id));
        }
        let max = self.inner.config.limits.audit_followers;
        let _follower = match req.follow {
            true => {
                Some(self.inner.audit_followers.enter(max, crate::limits::Limit::AuditFollowers)?)
            }
            false => None,
        };
        // Subscribe before reading the files, so nothing falls between the two.
        let mut events = self.inner.audit.subscribe();
        let mut last = req.after_seq;
        let send = |batch: Vec<AuditEvent>, last: &mut u64| {
            if let Some(e) = batch.last() {
                *last = e.seq;
            }
            Reply::Audit(batch)
        };
        let kept = self.inner.audit.read(&id, last);
        for chunk in kept.chunks(BATCH) {
            exchange.reply(&send(chunk.to_vec(), &mut last)).await?;
        }
        if !req.follow {
            return Ok(Some(Reply::Done));
        }
        let peer_gone = exchange.peer_gone();
        tokio::pin!(peer_gone);
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(Duration::from_millis(500), events.recv()) => next,
                () = &mut peer_gone => return Err(brig_transport::TransportError::PeerGone.into()),
            };
            match next {
                Ok(Ok((sb, event))) if sb == id && event.seq > last => {
                    exchange.reply(&send(vec![event], &mut last)).await?;
                }
                Ok(Ok(_)) => {}
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    let missed = self.inner.audit.read(&id, last);
                    for chunk in missed.chunks(BATCH) {
                        exchange.reply(&send(chunk.to_vec(), &mut last)).await?;
                    }
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => return Ok(Some(Reply::Done)),
                Err(_) => {
                    if self.inner.sandboxes.get(&id).is_err() {
                        let rest = self.inner.audit.read(&id, last);
                        if !rest.is_empty() {
                            exchange.reply(&send(rest, &mut last)).await?;
                        }
                        return Ok(Some(Reply::Done));
                    }
                }
            }
        }
    }
}
