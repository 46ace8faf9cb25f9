//! The node's lifecycle journal: every sandbox's lifecycle events (created, paused, resumed,
//! forked, checkpointed, destroyed, expired, …) in one sequence, each with the project and the
//! labels its sandbox had, for E2B's events API and webhooks (`SandboxOp::Events`). It is fed
//! by the audit trail's lifecycle records (`Node::audit_lifecycle`), so the two never differ.
//!
//! ```text
//! record ─▶ <state>/events.jsonl   (append; past FILE_BYTES it becomes .jsonl.1: at most
//!        │                          2 × FILE_BYTES on disk, read back at start)
//!        ├▶ the last MEMORY_EVENTS in memory (reads)
//!        └▶ broadcast ─▶ followers (webhook deliveries)
//! ```
//! A sandbox's labels are remembered from its first event on, so the events after it is
//! gone (destroyed, expired) still carry its project.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use brig_proto::LifecycleEvent;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::host::clock::now_unix_ms;

/// Bytes of the journal file before it rotates.
const FILE_BYTES: u64 = 8 << 20;
/// Events kept in memory for reads (the newest), at most this many ...
pub const MEMORY_EVENTS: usize = 50_000;
/// ... and at most about this many bytes (a sandbox's labels may take 64 KiB).
pub const MEMORY_BYTES: usize = 64 << 20;
/// Events one read returns at most.
pub const MAX_READ: usize = 1_000;

struct Journal {
    events: VecDeque<LifecycleEvent>,
    /// About what `events` holds, in bytes.
    events_bytes: usize,
    next_seq: u64,
    bytes: u64,
    /// Labels and creation time of the sandboxes seen, until they are gone.
    known: HashMap<String, (Vec<(String, String)>, u64)>,
}

/// The node's lifecycle journal.
pub struct LifecycleJournal {
    path: PathBuf,
    journal: Mutex<Journal>,
    live: broadcast::Sender<LifecycleEvent>,
}

/// About the bytes one event holds in memory.
fn size_of(e: &LifecycleEvent) -> usize {
    let labels: usize = e.labels.iter().map(|(k, v)| k.len() + v.len() + 48).sum();
    128 + e.sandbox.len() + e.event.len() + e.detail.len() + labels
}

impl Journal {
    /// Keeps `event`, forgetting the oldest ones past the count or the byte bound.
    fn keep(&mut self, event: LifecycleEvent) {
        self.events_bytes += size_of(&event);
        self.events.push_back(event);
        while self.events.len() > MEMORY_EVENTS || self.events_bytes > MEMORY_BYTES {
            let Some(old) = self.events.pop_front() else { break };
            self.events_bytes = self.events_bytes.saturating_sub(size_of(&old));
        }
    }
}

/// Events that end a sandbox (its labels are forgotten after them).
fn ends(event: &str) -> bool {
    matches!(event, "destroyed" | "expired")
}

impl LifecycleJournal {
    /// Opens the journal in `dir`, reading back what an earlier run wrote.
    pub fn open(dir: &Path) -> LifecycleJournal {
        let path = dir.join("events.jsonl");
        let mut kept = Journal {
            events: VecDeque::new(),
            events_bytes: 0,
            next_seq: 1,
            bytes: 0,
            known: HashMap::new(),
        };
        for file in [path.with_extension("jsonl.1"), path.clone()] {
            let Ok(f) = std::fs::File::open(&file) else { continue };
            for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<LifecycleEvent>(&line) {
                    kept.keep(event);
                }
            }
        }
        let (events, events_bytes) = (kept.events, kept.events_bytes);
        let next_seq = events.back().map_or(1, |e| e.seq + 1);
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        let mut known = HashMap::new();
        for e in &events {
            if ends(&e.event) {
                known.remove(&e.sandbox);
            } else {
                known.insert(e.sandbox.clone(), (e.labels.clone(), e.started_unix_ms));
            }
        }
        LifecycleJournal {
            path,
            journal: Mutex::new(Journal { events, events_bytes, next_seq, bytes, known }),
            live: broadcast::channel(4096).0,
        }
    }

    /// Records one event of `sandbox`; `now` is its labels and creation time while it is
    /// in the table (`None` once it is gone: the last ones seen are used). Never fails what
    /// it records: an unwritable journal is logged.
    pub fn record(
        &self,
        sandbox: &str,
        event: &str,
        detail: String,
        now: Option<(Vec<(String, String)>, u64)>,
    ) {
        let mut j = self.journal.lock();
        let (labels, started_unix_ms) = match now {
            Some(known) => {
                j.known.insert(sandbox.to_string(), known.clone());
                known
            }
            None => j.known.get(sandbox).cloned().unwrap_or_default(),
        };
        if ends(event) {
            j.known.remove(sandbox);
        }
        let project = labels
            .iter()
            .find(|(k, _)| k == crate::table::scope::PROJECT_LABEL)
            .map(|(_, v)| v.clone());
        let record = LifecycleEvent {
            seq: j.next_seq,
            unix_ms: now_unix_ms(),
            sandbox: sandbox.to_string(),
            event: event.to_string(),
            detail,
            project,
            labels,
            started_unix_ms,
        };
        j.next_seq += 1;
        if let Ok(mut line) = serde_json::to_vec(&record) {
            line.push(b'\n');
            if j.bytes + line.len() as u64 > FILE_BYTES {
                let _ = std::fs::rename(&self.path, self.path.with_extension("jsonl.1"));
                j.bytes = 0;
            }
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .and_then(|mut f| f.write_all(&line));
            match written {
                Ok(()) => j.bytes += line.len() as u64,
                Err(e) => tracing::warn!(error = %e, "lifecycle journal write"),
            }
        }
        j.keep(record.clone());
        drop(j);
        let _ = self.live.send(record);
    }

    /// Events with `seq > after` that `keep` keeps, oldest first, at most `limit`.
    pub fn read(
        &self,
        after: u64,
        limit: usize,
        keep: impl Fn(&LifecycleEvent) -> bool,
    ) -> Vec<LifecycleEvent> {
        let j = self.journal.lock();
        let start = j.events.partition_point(|e| e.seq <= after);
        j.events.range(start..).filter(|e| keep(e)).take(limit.min(MAX_READ)).cloned().collect()
    }

    /// The newest `limit` events `keep` keeps, oldest first.
    pub fn read_newest(
        &self,
        limit: usize,
        keep: impl Fn(&LifecycleEvent) -> bool,
    ) -> Vec<LifecycleEvent> {
        let j = self.journal.lock();
        let mut out: Vec<LifecycleEvent> =
            j.events.iter().rev().filter(|e| keep(e)).take(limit.min(MAX_READ)).cloned().collect();
        out.reverse();
        out
    }

    /// Events as they are recorded.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.live.subscribe()
    }
}

/// Whether `event` is for a caller of `project` (`None`: every event).
fn visible(event: &LifecycleEvent, project: Option<&str>) -> bool {
    project.is_none_or(|p| {
        event.project.as_deref().is_some_and(|e| e == p || e.starts_with(&format!("{p}/")))
    })
}

impl crate::Node {
    /// Serves `SandboxOp::Events`: what the journal holds after `after_seq`, then (with
    /// `follow`) each event as it is recorded, until the client goes.
    pub(crate) async fn events(
        &self,
        req: brig_proto::EventsRequest,
        exchange: &mut brig_transport::Exchange,
    ) -> Result<Option<brig_proto::Reply>, crate::NodeError> {
        let journal = &self.inner.journal;
        let keep = |e: &LifecycleEvent| {
            req.sandbox.as_ref().is_none_or(|s| &e.sandbox == s)
                && (req.events.is_empty() || req.events.contains(&e.event))
                && visible(e, req.project.as_deref())
        };
        let limit = if req.limit == 0 { MAX_READ } else { req.limit as usize };
        // Subscribed before the backlog is read: nothing falls between the two.
        let mut live = journal.subscribe();
        let backlog = match req.newest_first {
            true => journal.read_newest(limit, keep),
            false => journal.read(req.after_seq, limit, keep),
        };
        if !req.follow {
            return Ok(Some(brig_proto::Reply::Events(backlog)));
        }
        let max = self.inner.config.limits.event_followers;
        let _follower =
            self.inner.event_followers.enter(max, crate::limits::Limit::EventFollowers)?;
        let mut last = backlog.last().map_or(req.after_seq, |e| e.seq);
        exchange.reply(&brig_proto::Reply::Events(backlog)).await?;
        let peer_gone = exchange.peer_gone();
        tokio::pin!(peer_gone);
        loop {
            let next = tokio::select! {
                next = live.recv() => next,
                () = &mut peer_gone => return Err(brig_transport::TransportError::PeerGone.into()),
            };
            match next {
                Ok(event) if event.seq > last => {
                    last = event.seq;
                    if keep(&event) {
                        exchange.reply(&brig_proto::Reply::Events(vec![event])).await?;
                    }
                }
                Ok(_) => {}
                // A follower too slow for the broadcast reads what it missed from the journal.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let missed = journal.read(last, MAX_READ, keep);
                    if let Some(e) = missed.last() {
                        last = e.seq;
                    }
                    if !missed.is_empty() {
                        exchange.reply(&brig_proto::Reply::Events(missed)).await?;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(project: &str) -> Option<(Vec<(String, String)>, u64)> {
        Some((vec![(crate::table::scope::PROJECT_LABEL.to_string(), project.to_string())], 7))
    }

    #[test]
    fn events_keep_their_project_after_the_sandbox_is_gone_and_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = LifecycleJournal::open(dir.path());
        journal.record("sb-1", "created", String::new(), labels("team"));
        journal.record("sb-2", "created", String::new(), None);
        journal.record("sb-1", "destroyed", String::new(), None);
        let all = journal.read(0, 100, |_| true);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(all[2].project.as_deref(), Some("team"), "{all:?}");
        assert_eq!(all[2].started_unix_ms, 7, "{all:?}");
        let newest = journal.read_newest(2, |_| true);
        assert_eq!(newest.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(all[1].project, None);
        let after = journal.read(1, 100, |e| e.sandbox == "sb-1");
        assert_eq!(after.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(), ["destroyed"]);

        let again = LifecycleJournal::open(dir.path());
        again.record("sb-3", "created", String::new(), None);
        let all = again.read(0, 100, |_| true);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(again.read(0, 2, |_| true).len(), 2, "the limit holds");
    }

    #[test]
    fn large_labels_are_held_within_the_byte_bound() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = LifecycleJournal::open(dir.path());
        let big = vec![("k".to_string(), "v".repeat(60 << 10))];
        let n = MEMORY_BYTES / (60 << 10) + 200;
        for i in 0..n {
            journal.record(&format!("sb-{i}"), "created", String::new(), Some((big.clone(), 1)));
            journal.record(&format!("sb-{i}"), "destroyed", String::new(), None);
        }
        let j = journal.journal.lock();
        assert!(j.events_bytes <= MEMORY_BYTES, "{} bytes", j.events_bytes);
        assert!(j.events.len() < 2 * n, "the oldest went");
        assert_eq!(j.events.back().map(|e| e.seq), Some(2 * n as u64), "the newest stayed");
    }
}
