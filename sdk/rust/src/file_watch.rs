//! A sandbox's file metadata and directory watches.

use std::collections::BTreeMap;

use brig_proto::{FileEvents, FileOp, FileStat, FileWatchRequest, Reply, Request};
use brig_transport::ClientExchange;

use crate::client::unexpected;
use crate::{Error, Sandbox};

impl Sandbox {
    /// Makes `metadata` the metadata of a file or directory (keys lowercased; an empty map
    /// clears it); its entry after. Metadata follows the file through a rename and shows in
    /// [`Sandbox::stat`] and [`Sandbox::list_dir`].
    pub async fn set_file_metadata(
        &self,
        path: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<FileStat, Error> {
        let op =
            FileOp::SetMetadata { sandbox: self.id().to_string(), path: path.into(), metadata };
        match self.client().request(&Request::File(op)).await? {
            Reply::Stat(stat) => Ok(stat),
            other => Err(unexpected("file_set_metadata", &other)),
        }
    }

    /// Watches directory `path` (with `recursive`, every directory below it too, those made
    /// later included); the watch is in place when this returns.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<FileWatch, Error> {
        let req = FileWatchRequest { sandbox: self.id().to_string(), path: path.into(), recursive };
        let mut exchange = self.client().open(&Request::File(FileOp::Watch(req))).await?;
        exchange.finish_upload()?;
        let mut watch = FileWatch { exchange, done: false };
        // The first batch is empty: the watch is in place.
        watch.next_batch().await?;
        Ok(watch)
    }
}

/// A directory's changes as the node sends them; dropping it ends the watch.
pub struct FileWatch {
    exchange: ClientExchange,
    done: bool,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch").field("done", &self.done).finish_non_exhaustive()
    }
}

impl FileWatch {
    /// The next batch of changes, waiting for it; `None` once the watch ended (its directory
    /// went away, or the sandbox did).
    pub async fn next_batch(&mut self) -> Result<Option<FileEvents>, Error> {
        crate::security::next_batch(&mut self.exchange, &mut self.done, "file_watch", |reply| {
            match reply {
                Reply::FileEvents(batch) => Ok(vec![batch]),
                other => Err(Box::new(other)),
            }
        })
        .await
        .map(|batch| batch.and_then(|mut b| b.pop()))
    }
}
