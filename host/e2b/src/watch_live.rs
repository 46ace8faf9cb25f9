//! Watchers fed by the node's directory watch ([`brig_sdk::Sandbox::watch`]: inotify inside
//! the sandbox, with its rights), for tiers that serve one; the others are polled
//! ([`crate::watch`]). Changes arrive as they happen, so short-lived files, renames and mode
//! changes are seen, and a recursive watch follows directories made later. Names are relative
//! to the watched directory, as envd's; with `include_entry` each event that leaves an entry
//! behind carries it (looked up as the event is passed on, so it may show a later state).
//!
//! When the node's queue overflowed (the tree changed faster than the client read), the
//! watch ends with `resource_exhausted` saying events were lost: the client watches again and
//! lists the tree, rather than trusting a stream with a hole in it.

use brig_sdk::{FileChange, FileEvent, FileWatch, Sandbox};
use tokio::sync::watch;

use crate::connect::{Code, ConnectError};
use crate::envd::brig_error;
use crate::filesystem::entry_info;
use crate::pb::filesystem as pb;
use crate::watch::{ended, EventTx, Slot};
use crate::Gateway;

/// Starts the node's watch of `root`; `None` if the sandbox's tier has none (poll instead).
pub(crate) async fn start(
    sb: &Sandbox,
    root: &str,
    recursive: bool,
) -> Result<Option<FileWatch>, ConnectError> {
    match sb.watch(root, recursive).await {
        Ok(w) => Ok(Some(w)),
        Err(e) if e.is_unsupported() => Ok(None),
        Err(e) => Err(brig_error(e)),
    }
}

/// What a live watcher needs besides its watch.
pub(crate) struct Live {
    pub gw: Gateway,
    pub sb: Sandbox,
    pub root: String,
    pub include_entry: bool,
    pub alive: watch::Receiver<()>,
}

/// envd's event for one change.
async fn event(live: &Live, e: FileEvent) -> pb::FilesystemEvent {
    let kind = match e.change {
        FileChange::Create => pb::EventType::Create,
        FileChange::Write => pb::EventType::Write,
        FileChange::Remove => pb::EventType::Remove,
        FileChange::Rename => pb::EventType::Rename,
        FileChange::Chmod => pb::EventType::Chmod,
    };
    let name = e.path.strip_prefix(&live.root).unwrap_or(&e.path).trim_start_matches('/');
    let mut entry = None;
    let stays = !matches!(e.change, FileChange::Remove | FileChange::Rename);
    if live.include_entry && stays {
        if let Ok(mut stat) = live.sb.stat(&e.path).await {
            stat.path = e.path.clone();
            entry = Some(entry_info(&stat, &*live.gw.inner.owner_names.of(&live.sb).await));
        }
    }
    pb::FilesystemEvent { name: name.to_string(), r#type: kind as i32, entry }
}

/// Passes the node's changes on until `tx` closes, the watch ends, or the sandbox's watchers
/// are ended; a failure (or lost events) ends the watch with why.
pub(crate) async fn run(mut live: Live, mut watch: FileWatch, tx: EventTx, slot: Option<Slot>) {
    loop {
        let next = tokio::select! {
            next = watch.next_batch() => next,
            _ = tx.closed() => break,
            _ = ended(&mut live.alive) => {
                let _ = tx.send(Err(ConnectError::SandboxGone(live.sb.id().to_string()))).await;
                break;
            }
        };
        let batch = match next {
            Ok(Some(batch)) => batch,
            Ok(None) => break,
            Err(e) => {
                let _ = tx.send(Err(brig_error(e))).await;
                break;
            }
        };
        for e in batch.events {
            if tx.send(Ok(event(&live, e).await)).await.is_err() {
                return;
            }
        }
        if batch.lost {
            let lost = ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "{} changed faster than the watcher could report: events were lost; \
                     watch it again and list it",
                    live.root
                ),
            );
            let _ = tx.send(Err(lost)).await;
            break;
        }
    }
    drop(slot);
}
