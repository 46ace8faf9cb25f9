//! envd's directory watchers on Brig's file API: `WatchDir` streams and the sync SDK's polled
//! watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`). Where the sandbox's tier
//! watches directories itself (containers: inotify in the sandbox), a watcher passes its
//! changes on as they happen ([`crate::watch_live`]); elsewhere it looks at its tree every
//! [`WATCH_EVERY`] and reports the differences.
//!
//! Every watcher belongs to its sandbox, and what it may cost is bounded there:
//! - a sandbox has at most [`MAX_WATCHES_PER_SANDBOX`] watchers of both kinds (all sandboxes
//!   [`MAX_WATCHES`]), so one sandbox cannot use up another's;
//! - a watched tree has at most [`MAX_WATCH_ENTRIES`] entries (a larger one is refused with
//!   `resource_exhausted`, naming the limit);
//! - a sandbox's watchers look at their trees one at a time, and after a look that took `T` the
//!   next waits `(SCAN_SHARE - 1) × T`: watching costs a sandbox at most 1/[`SCAN_SHARE`] of a
//!   scanner's time however many watchers it has;
//! - a sandbox's watchers end when it is killed or paused through the gateway, or when a look
//!   finds it gone: streams end with the "not found" error, polled watchers are dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use brig_sdk::{FileKind, Sandbox, SandboxState};
use tokio::sync::{mpsc, watch};

use crate::connect::{self, Code, Codec, ConnectError};
use crate::envd::{self, EnvdUser};
use crate::filesystem::{walk, watch_target};
use crate::pb::filesystem as pb;
use crate::watch_live::Live;
use crate::Gateway;

/// How often a watcher looks at its tree.
pub const WATCH_EVERY: Duration = Duration::from_millis(200);
/// Watchers (streams and polled) one sandbox may have at once.
pub const MAX_WATCHES_PER_SANDBOX: usize = 16;
/// Watchers of all sandboxes at once.
pub const MAX_WATCHES: usize = 4096;
/// Most entries a watched tree may have.
pub const MAX_WATCH_ENTRIES: usize = 10_000;
/// A sandbox's looks take at most one part in this of the time.
pub const SCAN_SHARE: u32 = 4;
/// Events a polled watcher keeps until they are read.
const MAX_QUEUED_EVENTS: usize = 10_000;

/// Every sandbox's watchers.
#[derive(Default)]
pub struct Watchers {
    state: parking_lot::Mutex<State>,
    generation: AtomicU64,
}

#[derive(Default)]
struct State {
    total: usize,
    sandboxes: HashMap<String, SandboxWatches>,
}

struct SandboxWatches {
    /// Tells this entry from a later one of the same id.
    generation: u64,
    /// Watchers holding a [`Slot`] here.
    count: usize,
    /// Held while one of the sandbox's watchers looks at its tree.
    scanning: Arc<tokio::sync::Mutex<()>>,
    /// Dropped when the sandbox's watchers are ended: every receiver wakes.
    _alive: watch::Sender<()>,
    alive: watch::Receiver<()>,
    polled: HashMap<String, Arc<Watcher>>,
}

/// A watcher's place in its sandbox's count, given back when dropped.
pub(crate) struct Slot {
    gw: Gateway,
    sandbox: String,
    generation: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.gw.inner.watchers.state.lock();
        let State { total, sandboxes } = &mut *state;
        let Some(entry) = sandboxes.get_mut(&self.sandbox) else { return };
        if entry.generation != self.generation {
            return;
        }
        entry.count = entry.count.saturating_sub(1);
        *total = total.saturating_sub(1);
        if entry.count == 0 && entry.polled.is_empty() {
            // It holds no watcher (so no slot): dropping it here takes no lock.
            sandboxes.remove(&self.sandbox);
        }
    }
}

/// What a watcher's loop shares with its sandbox's other watchers.
struct Scanner {
    scanning: Arc<tokio::sync::Mutex<()>>,
    /// Wakes when the sandbox's watchers are ended.
    alive: watch::Receiver<()>,
}

/// Resolves when the sandbox's watchers are ended (the sender is dropped).
pub(crate) async fn ended(alive: &mut watch::Receiver<()>) {
    while alive.changed().await.is_ok() {}
}

impl Scanner {
    /// The tree under `root` (at most [`MAX_WATCH_ENTRIES`] entries), taking the sandbox's
    /// turn and leaving the rest of its share of time to others.
    async fn look(
        &self,
        sb: &Sandbox,
        root: &str,
        recursive: bool,
    ) -> Result<Snapshot, ConnectError> {
        let _turn = self.scanning.clone().lock_owned().await;
        let started = Instant::now();
        let snapshot = snapshot(sb, root, recursive).await;
        tokio::time::sleep(started.elapsed() * (SCAN_SHARE - 1)).await;
        snapshot
    }
}

impl Watchers {
    /// A new watcher's slot in sandbox `id`, or the limit it would pass.
    fn take(&self, gw: &Gateway, id: &str) -> Result<(Slot, Scanner), ConnectError> {
        let mut state = self.state.lock();
        if state.total >= MAX_WATCHES {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("this node watches {MAX_WATCHES} directories already"),
            ));
        }
        let entry = state.sandboxes.entry(id.to_string()).or_insert_with(|| {
            let (alive_tx, alive_rx) = watch::channel(());
            SandboxWatches {
                generation: self.generation.fetch_add(1, Ordering::Relaxed),
                count: 0,
                scanning: Default::default(),
                _alive: alive_tx,
                alive: alive_rx,
                polled: HashMap::new(),
            }
        });
        if entry.count >= MAX_WATCHES_PER_SANDBOX {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "sandbox {id} has {MAX_WATCHES_PER_SANDBOX} directory watchers already \
                     (the most one sandbox may have); remove one first"
                ),
            ));
        }
        entry.count += 1;
        let slot = Slot { gw: gw.clone(), sandbox: id.to_string(), generation: entry.generation };
        let scanner = Scanner { scanning: entry.scanning.clone(), alive: entry.alive.clone() };
        state.total += 1;
        Ok((slot, scanner))
    }

    /// Ends every watcher of sandbox `id` (it was killed, paused or found gone).
    pub(crate) fn forget(&self, id: &str) {
        let removed = {
            let mut state = self.state.lock();
            let removed = state.sandboxes.remove(id);
            if let Some(entry) = &removed {
                state.total = state.total.saturating_sub(entry.count);
            }
            removed
        };
        // Dropped outside the lock: the polled watchers' slots look for their entry.
        drop(removed);
    }
}

/// What a watcher remembers of a tree: each path's kind, size and modification time.
type Snapshot = BTreeMap<String, (FileKind, u64, u64)>;

async fn snapshot(sb: &Sandbox, root: &str, recursive: bool) -> Result<Snapshot, ConnectError> {
    let depth = if recursive { crate::filesystem::MAX_DEPTH } else { 1 };
    let (entries, complete) = walk(sb, root, depth, MAX_WATCH_ENTRIES + 1).await?;
    if !complete || entries.len() > MAX_WATCH_ENTRIES {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "{root} holds more than {MAX_WATCH_ENTRIES} entries, the most a watcher follows; \
                 watch a smaller directory{}",
                if recursive { " or without recursion" } else { "" }
            ),
        ));
    }
    Ok(entries.into_iter().map(|e| (e.path, (e.kind, e.size, e.modified_unix_ms))).collect())
}

/// The events that turn `before` into `after`, named relative to `root`.
fn diff(root: &str, before: &Snapshot, after: &Snapshot) -> Vec<pb::FilesystemEvent> {
    let rel = |p: &str| p.strip_prefix(root).unwrap_or(p).trim_start_matches('/').to_string();
    let mut events = Vec::new();
    for (path, now) in after {
        let kind = match before.get(path) {
            None => pb::EventType::Create,
            Some(was) if was != now => pb::EventType::Write,
            Some(_) => continue,
        };
        events.push(pb::FilesystemEvent { name: rel(path), r#type: kind as i32, entry: None });
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        events.push(pb::FilesystemEvent {
            name: rel(path),
            r#type: pb::EventType::Remove as i32,
            entry: None,
        });
    }
    events
}

pub(crate) type EventTx = mpsc::Sender<Result<pb::FilesystemEvent, ConnectError>>;

/// Watches `root` until `tx` closes or the sandbox's watchers end, sending each round's events
/// (after a first look). A failed look ends the watch with why; if the sandbox is gone, all
/// its watchers end.
async fn watch_loop(
    gw: Gateway,
    sb: Sandbox,
    root: String,
    recursive: bool,
    tx: EventTx,
    scanner: Scanner,
    slot: Option<Slot>,
) {
    let mut alive = scanner.alive.clone();
    let mut before: Option<Snapshot> = None;
    loop {
        if before.is_some() {
            tokio::select! {
                _ = tokio::time::sleep(WATCH_EVERY) => {}
                _ = tx.closed() => break,
                _ = ended(&mut alive) => {
                    let _ = tx.send(Err(ConnectError::SandboxGone(sb.id().to_string()))).await;
                    break;
                }
            }
        }
        let looked = tokio::select! {
            looked = scanner.look(&sb, &root, recursive) => looked,
            _ = tx.closed() => break,
            _ = ended(&mut alive) => Err(ConnectError::SandboxGone(sb.id().to_string())),
        };
        let after = match looked {
            Ok(s) => s,
            Err(e) => {
                let gone = !running(&sb).await;
                let e = if gone { ConnectError::SandboxGone(sb.id().to_string()) } else { e };
                let _ = tx.send(Err(e)).await;
                if gone {
                    gw.inner.watchers.forget(sb.id());
                }
                break;
            }
        };
        if let Some(before) = &before {
            for event in diff(&root, before, &after) {
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        }
        before = Some(after);
    }
    drop(slot);
}

async fn running(sb: &Sandbox) -> bool {
    matches!(sb.status().await, Ok(info) if info.state == SandboxState::Running)
}

/// `WatchDir`: `start`, then events as the tree changes, keepalives while it does not.
pub(crate) async fn watch_dir(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    use pb::watch_dir_response::{Event, KeepAlive, StartEvent};
    let codec = Codec::streaming(headers)?;
    let sb = envd::sandbox(gw, headers).await?;
    let req: pb::WatchDirRequest = connect::single_stream_request(codec, body).await?;
    let user = EnvdUser::from_headers(headers)?;
    let (slot, scanner) = gw.inner.watchers.take(gw, sb.id())?;
    let root = watch_target(&sb, &user, &req.path).await?;
    let (tx, rx) = mpsc::channel(256);
    match crate::watch_live::start(&sb, &root, req.recursive).await? {
        Some(live) => {
            let alive = scanner.alive.clone();
            let how = Live { gw: gw.clone(), sb, root, include_entry: req.include_entry, alive };
            tokio::spawn(crate::watch_live::run(how, live, tx, Some(slot)));
        }
        None => {
            tokio::spawn(watch_loop(gw.clone(), sb, root, req.recursive, tx, scanner, Some(slot)));
        }
    }
    let deadline = connect::deadline(headers).map(|d| tokio::time::Instant::now() + d);
    let first = futures::stream::iter([Ok(pb::WatchDirResponse {
        event: Some(Event::Start(StartEvent {})),
    })]);
    let rest = futures::stream::unfold((rx, deadline), |(mut rx, deadline)| async move {
        let next = async {
            match tokio::time::timeout(Duration::from_secs(50), rx.recv()).await {
                Ok(Some(Ok(e))) => Some(Ok(Event::Filesystem(e))),
                Ok(Some(Err(e))) => Some(Err(e)),
                Ok(None) => None,
                Err(_) => Some(Ok(Event::Keepalive(KeepAlive {}))),
            }
        };
        let item = match deadline {
            Some(at) => match tokio::time::timeout_at(at, next).await {
                Ok(item) => item?,
                // The client's deadline ends a watch normally.
                Err(_) => return None,
            },
            None => next.await?,
        };
        let ended = item.is_err();
        let message = item.map(|e| pb::WatchDirResponse { event: Some(e) });
        Some((message, (rx, if ended { Some(tokio::time::Instant::now()) } else { deadline })))
    });
    Ok(connect::stream_reply(codec, futures::StreamExt::chain(first, rest)))
}

/// A polled watcher: events collected between the SDK's polls. It holds its sandbox slot
/// until it is removed.
struct Watcher {
    events: parking_lot::Mutex<VecDeque<pb::FilesystemEvent>>,
    failed: parking_lot::Mutex<Option<ConnectError>>,
    /// Dropped with the watcher: its loop ends.
    _stop: mpsc::Sender<()>,
    _slot: Slot,
}

pub(crate) async fn create_watcher(
    gw: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::CreateWatcherRequest,
) -> Result<pb::CreateWatcherResponse, ConnectError> {
    let (slot, scanner) = gw.inner.watchers.take(gw, sb.id())?;
    let root = watch_target(&sb, &user, &req.path).await?;
    let (stop, mut stopped) = mpsc::channel::<()>(1);
    let watcher = Arc::new(Watcher {
        events: Default::default(),
        failed: Default::default(),
        _stop: stop,
        _slot: slot,
    });
    let id = format!("w-{}", hex::encode(rand_id()));
    let (tx, mut rx) = mpsc::channel(256);
    let sandbox = sb.id().to_string();
    match crate::watch_live::start(&sb, &root, req.recursive).await? {
        Some(live) => {
            let alive = scanner.alive.clone();
            let how = Live { gw: gw.clone(), sb, root, include_entry: req.include_entry, alive };
            tokio::spawn(crate::watch_live::run(how, live, tx, None));
        }
        None => {
            tokio::spawn(watch_loop(gw.clone(), sb, root, req.recursive, tx, scanner, None));
        }
    }
    let weak = Arc::downgrade(&watcher);
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                item = rx.recv() => item,
                _ = stopped.recv() => None,
            };
            let (Some(item), Some(w)) = (item, weak.upgrade()) else { return };
            match item {
                Ok(event) => {
                    let mut q = w.events.lock();
                    if q.len() < MAX_QUEUED_EVENTS {
                        q.push_back(event);
                    }
                }
                Err(e) => {
                    *w.failed.lock() = Some(e);
                    return;
                }
            }
        }
    });
    let kept = {
        let mut state = gw.inner.watchers.state.lock();
        match state.sandboxes.get_mut(&sandbox) {
            Some(entry) if entry.generation == watcher._slot.generation => {
                entry.polled.insert(id.clone(), watcher.clone());
                true
            }
            // The sandbox's watchers ended meanwhile.
            _ => false,
        }
    };
    if !kept {
        return Err(ConnectError::SandboxGone(sandbox));
    }
    drop(watcher);
    Ok(pb::CreateWatcherResponse { watcher_id: id })
}

fn polled(gw: &Gateway, sb: &Sandbox, id: &str) -> Result<Arc<Watcher>, ConnectError> {
    gw.inner
        .watchers
        .state
        .lock()
        .sandboxes
        .get(sb.id())
        .and_then(|e| e.polled.get(id))
        .cloned()
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("no watcher {id}")))
}

/// Drops polled watcher `id` of `sb` (its slot is given back as it goes).
fn remove_polled(gw: &Gateway, sb: &Sandbox, id: &str) {
    let removed = {
        let mut state = gw.inner.watchers.state.lock();
        state.sandboxes.get_mut(sb.id()).and_then(|e| e.polled.remove(id))
    };
    // Dropped outside the lock: its slot takes it.
    drop(removed);
}

pub(crate) async fn watcher_events(
    gw: &Gateway,
    sb: Sandbox,
    _: EnvdUser,
    req: pb::GetWatcherEventsRequest,
) -> Result<pb::GetWatcherEventsResponse, ConnectError> {
    let w = polled(gw, &sb, &req.watcher_id)?;
    let failed = w.failed.lock().take();
    if let Some(e) = failed {
        drop(w);
        remove_polled(gw, &sb, &req.watcher_id);
        return Err(e);
    }
    let events = w.events.lock().drain(..).collect();
    Ok(pb::GetWatcherEventsResponse { events })
}

pub(crate) async fn remove_watcher(
    gw: &Gateway,
    sb: Sandbox,
    _: EnvdUser,
    req: pb::RemoveWatcherRequest,
) -> Result<pb::RemoveWatcherResponse, ConnectError> {
    drop(polled(gw, &sb, &req.watcher_id)?);
    remove_polled(gw, &sb, &req.watcher_id);
    Ok(pb::RemoveWatcherResponse {})
}

fn rand_id() -> [u8; 8] {
    let mut id = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_differences_name_paths_relative_to_the_root() {
        let before: Snapshot = [
            ("/w/a".to_string(), (FileKind::File, 1, 10)),
            ("/w/b".to_string(), (FileKind::File, 1, 10)),
        ]
        .into();
        let after: Snapshot = [
            ("/w/a".to_string(), (FileKind::File, 2, 11)),
            ("/w/c/d".to_string(), (FileKind::File, 0, 12)),
        ]
        .into();
        let mut got: Vec<(String, i32)> =
            diff("/w", &before, &after).into_iter().map(|e| (e.name, e.r#type)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("a".into(), pb::EventType::Write as i32),
                ("b".into(), pb::EventType::Remove as i32),
                ("c/d".into(), pb::EventType::Create as i32),
            ]
        );
    }
}
