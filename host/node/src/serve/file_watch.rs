//! `FileOp::Watch`: a directory's changes streamed to the client as they happen, from the
//! tier's watch ([`brig_core::sandbox::Sandbox::watch`]). The first reply is an empty batch
//! (the watch is in place); the stream ends when the client goes, the watched directory goes
//! (`Done`), or the sandbox does. A sandbox has at most `limits.watches_per_sandbox` at once.

use brig_core::files::WatchBatch;
use brig_core::sandbox::Op;
use brig_proto::{FileChange, FileEvent, FileEvents, FileWatchRequest, Reply};
use brig_transport::Exchange;

use crate::limits::Limit;
use crate::{Node, NodeError};

fn wire(batch: WatchBatch) -> FileEvents {
    let events = batch
        .changes
        .into_iter()
        .map(|c| FileEvent {
            path: c.path,
            change: match c.change {
                brig_core::files::Change::Create => FileChange::Create,
                brig_core::files::Change::Write => FileChange::Write,
                brig_core::files::Change::Remove => FileChange::Remove,
                brig_core::files::Change::Rename => FileChange::Rename,
                brig_core::files::Change::Chmod => FileChange::Chmod,
            },
            is_dir: c.is_dir,
        })
        .collect();
    FileEvents { events, lost: batch.lost }
}

pub(crate) async fn watch(
    node: &Node,
    req: FileWatchRequest,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
    let entry = node.live(&req.sandbox).await?;
    entry.require(Op::FileWatch)?;
    let max = node.inner.config.limits.watches_per_sandbox;
    let _slot = entry.watches.enter(max, Limit::WatchesPerSandbox)?;
    let mut watch =
        entry.sandbox.watch(&req.path, req.recursive).await.map_err(|e| entry.fail(e))?;
    entry.touch();
    exchange.reply(&Reply::FileEvents(wire(WatchBatch::default()))).await?;
    let peer_gone = exchange.peer_gone();
    tokio::pin!(peer_gone);
    loop {
        let next = tokio::select! {
            next = watch.next() => next,
            () = &mut peer_gone => return Err(brig_transport::TransportError::PeerGone.into()),
        };
        match next {
            Ok(Some(batch)) => exchange.reply(&Reply::FileEvents(wire(batch))).await?,
            Ok(None) => return Ok(Some(Reply::Done)),
            Err(e) => return Err(entry.gone_error().unwrap_or_else(|| entry.fail(e))),
        }
    }
}
