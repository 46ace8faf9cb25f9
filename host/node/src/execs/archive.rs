//! A finished command's output served from where its tier keeps it on disk (a container's
//! spool, [`brig_core::exec::ExecArchive`]) rather than from the node's memory: a hub with an
//! archive lets its output go as soon as the command has finished and nobody streams it, and a
//! client that attaches later is served from the archive.
//!
//! Reading an archive holds its output in memory for as long as the client takes it, so the
//! node reads at most [`ARCHIVE_READS`] at once; a read has [`ARCHIVE_READ_DEADLINE`], and the
//! tier bounds its size (a spool keeps 8 MiB per command).

use std::time::Duration;

use brig_core::exec::{ExecArchive, ExecEvent};
use brig_proto::{OutputStream, Reply};
use brig_transport::{Exchange, TransportError};
use tokio::sync::Semaphore;

use crate::NodeError;

/// Archives read at once on the node.
const ARCHIVE_READS: usize = 8;
/// How long reading one may take, waiting for a turn included.
const ARCHIVE_READ_DEADLINE: Duration = Duration::from_secs(30);

static READS: Semaphore = Semaphore::const_new(ARCHIVE_READS);

/// Streams `archive`'s output to the client, each reply within `stall`. `Ok(false)`: the
/// archive could not be read (let go, damaged, too slow); nothing was sent, and the caller
/// serves what the node kept instead.
pub(crate) async fn replay(
    archive: &dyn ExecArchive,
    exchange: &mut Exchange,
    stall: Duration,
) -> Result<bool, NodeError> {
    let read = async {
        let _turn = READS.acquire().await.ok()?;
        match archive.read().await {
            Ok(read) => Some(read),
            Err(e) => {
                tracing::debug!(error = %e, "a finished command's archive cannot be read");
                None
            }
        }
    };
    let Ok(Some(read)) = tokio::time::timeout(ARCHIVE_READ_DEADLINE, read).await else {
        return Ok(false);
    };
    for event in read.output {
        let (stream, data) = match event {
            ExecEvent::Stdout(b) => (OutputStream::Stdout, b.to_vec()),
            ExecEvent::Stderr(b) => (OutputStream::Stderr, b.to_vec()),
            ExecEvent::Exited(_) | ExecEvent::Detached(_) => continue,
        };
        send(exchange, &Reply::Output { stream, data }, stall).await?;
    }
    if read.gap {
        let note = "[brig: output past what is kept on disk was not kept]\n";
        let reply = Reply::Output { stream: OutputStream::Stderr, data: note.into() };
        send(exchange, &reply, stall).await?;
    }
    Ok(true)
}

async fn send(exchange: &mut Exchange, reply: &Reply, stall: Duration) -> Result<(), NodeError> {
    // A client that takes nothing for so long has left without hanging up.
    tokio::time::timeout(stall, exchange.reply(reply))
        .await
        .map_err(|_| TransportError::PeerGone)??;
    Ok(())
}
