//! Volumes: named directory trees that outlive sandboxes. Make one, mount it into sandboxes
//! at create ([`SandboxOptions::volume`]), and read or write its files with no sandbox
//! ([`Volume`]).
//!
//! ```no_run
//! # async fn demo(client: brig_sdk::Client) -> Result<(), brig_sdk::Error> {
//! use brig_sdk::SandboxOptions;
//! client.create_volume("datasets", None).await?;
//! client.volume("datasets").write_file("/train.jsonl", b"{}\n").await?;
//! let sb = client
//!     .create(SandboxOptions::container("debian-12").volume("datasets", "/data", true))
//!     .await?;
//! # Ok(()) }
//! ```

use brig_proto::{
    Reply, Request, VolumeAttrs, VolumeCreateRequest, VolumeEntry, VolumeInfo, VolumeMount,
    VolumeOp, VolumeWriteRequest,
};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::{expect_done, unexpected};
use crate::{Client, Error, SandboxOptions};

const UPLOAD_CHUNK: usize = 256 << 10;

impl Client {
    /// Makes a volume of `quota_mib` (the node's default when `None`).
    pub async fn create_volume(
        &self,
        name: &str,
        quota_mib: Option<u64>,
    ) -> Result<VolumeInfo, Error> {
        let req = VolumeCreateRequest { name: name.to_string(), quota_mib, project: None };
        match self.request(&Request::Volume(VolumeOp::Create(req))).await? {
            Reply::Volume(info) => Ok(info),
            other => Err(unexpected("volume_create", &other)),
        }
    }

    /// The volumes this client's token sees.
    pub async fn volumes(&self) -> Result<Vec<VolumeInfo>, Error> {
        match self.request(&Request::Volume(VolumeOp::List { project: None })).await? {
            Reply::Volumes(list) => Ok(list),
            other => Err(unexpected("volume_list", &other)),
        }
    }

    /// One volume, by id or name.
    pub async fn volume_info(&self, volume: &str) -> Result<VolumeInfo, Error> {
        match self.request(&Request::Volume(VolumeOp::Get { volume: volume.to_string() })).await? {
            Reply::Volume(info) => Ok(info),
            other => Err(unexpected("volume_get", &other)),
        }
    }

    /// Deletes a volume and everything in it; refused (`conflict`) while a sandbox mounts it.
    pub async fn delete_volume(&self, volume: &str) -> Result<(), Error> {
        let request = Request::Volume(VolumeOp::Delete { volume: volume.to_string() });
        expect_done("volume_delete", self.request(&request).await?)
    }

    /// A handle on a volume's files (by id or name); no request is made until it is used.
    pub fn volume(&self, volume: &str) -> Volume {
        Volume { client: self.clone(), volume: volume.to_string(), id: Default::default() }
    }
}

impl SandboxOptions {
    /// Mounts `volume` (id or name) at `path` in the sandbox, read-only if asked.
    pub fn volume(mut self, volume: &str, path: &str, read_only: bool) -> Self {
        self.request_mut().volumes.push(VolumeMount {
            volume: volume.to_string(),
            path: path.to_string(),
            read_only,
        });
        self
    }
}

/// A volume's files, reached with no sandbox. Paths are from the volume's root.
#[derive(Clone)]
pub struct Volume {
    client: Client,
    volume: String,
    /// Its id, once looked up (a cluster's nodes are reached by id).
    id: std::sync::Arc<tokio::sync::OnceCell<String>>,
}

fn one(request: &'static str, reply: Reply) -> Result<VolumeEntry, Error> {
    match reply {
        Reply::VolumeEntries(mut entries) if entries.len() == 1 => Ok(entries.remove(0)),
        other => Err(unexpected(request, &other)),
    }
}

impl Volume {
    /// The id or name this handle was made with.
    pub fn name(&self) -> &str {
        &self.volume
    }

    /// What requests name it by: as made on one node; its id in a cluster (whose control
    /// plane relays no file bytes: they go to the volume's node).
    async fn target(&self) -> Result<String, Error> {
        if !self.client.is_cluster() || self.volume.starts_with("vol-") {
            return Ok(self.volume.clone());
        }
        let id = self
            .id
            .get_or_try_init(|| async {
                Ok::<_, Error>(self.client.volume_info(&self.volume).await?.id)
            })
            .await?;
        Ok(id.clone())
    }

    /// Writes a whole file (parents made); returns its entry.
    pub async fn write_file(&self, path: &str, bytes: &[u8]) -> Result<VolumeEntry, Error> {
        self.upload(path, bytes, VolumeAttrs::default()).await
    }

    /// Streams `reader` into `path` (parents made) with the mode and owner asked.
    pub async fn upload(
        &self,
        path: &str,
        mut reader: impl AsyncRead + Unpin,
        attrs: VolumeAttrs,
    ) -> Result<VolumeEntry, Error> {
        let request = Request::Volume(VolumeOp::Write(VolumeWriteRequest {
            volume: self.target().await?,
            path: path.to_string(),
            parents: true,
            attrs,
        }));
        let mut exchange = self.client.open(&request).await?;
        loop {
            let mut buf = BytesMut::with_capacity(UPLOAD_CHUNK);
            let n = reader
                .read_buf(&mut buf)
                .await
                .map_err(|source| Error::LocalIo { path: path.to_string(), source })?;
            if n == 0 {
                break;
            }
            if let Err(e) = exchange.send_raw(buf.freeze()).await {
                if let Ok(Reply::Error(wire)) = exchange.reply().await {
                    return Err(wire.into());
                }
                return Err(e.into());
            }
        }
        exchange.finish_upload()?;
        match exchange.reply().await? {
            Reply::Error(e) => Err(e.into()),
            other => one("volume_write", other),
        }
    }

    /// Reads a whole file into memory.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.download(path, &mut out).await?;
        Ok(out)
    }

    /// Streams a file into `writer`; returns the bytes written.
    pub async fn download(
        &self,
        path: &str,
        mut writer: impl AsyncWrite + Unpin,
    ) -> Result<u64, Error> {
        let request = Request::Volume(VolumeOp::Read {
            volume: self.target().await?,
            path: path.to_string(),
            offset: 0,
            len: None,
        });
        let mut exchange = self.client.open(&request).await?;
        exchange.finish_upload()?;
        let size = match exchange.reply().await? {
            Reply::FileData { size } => size,
            Reply::Error(e) => return Err(e.into()),
            other => return Err(unexpected("volume_read", &other)),
        };
        let mut got = 0u64;
        while let Some(chunk) = exchange.read_raw().await? {
            got += chunk.len() as u64;
            writer
                .write_all(&chunk)
                .await
                .map_err(|source| Error::LocalIo { path: path.to_string(), source })?;
        }
        writer.flush().await.map_err(|source| Error::LocalIo { path: path.to_string(), source })?;
        if got != size {
            return Err(Error::ShortDownload { got, expected: size });
        }
        Ok(got)
    }

    /// A directory's entries `depth` levels down (1: its own), sorted by path.
    pub async fn list(&self, path: &str, depth: u32) -> Result<Vec<VolumeEntry>, Error> {
        let op = VolumeOp::ListDir { volume: self.volume.clone(), path: path.to_string(), depth };
        match self.client.request(&Request::Volume(op)).await? {
            Reply::VolumeEntries(entries) => Ok(entries),
            other => Err(unexpected("volume_list_dir", &other)),
        }
    }

    /// One entry (a symlink itself).
    pub async fn stat(&self, path: &str) -> Result<VolumeEntry, Error> {
        let op = VolumeOp::Stat { volume: self.volume.clone(), path: path.to_string() };
        one("volume_stat", self.client.request(&Request::Volume(op)).await?)
    }

    /// Makes a directory (and, with `parents`, its parents).
    pub async fn mkdir(
        &self,
        path: &str,
        parents: bool,
        attrs: VolumeAttrs,
    ) -> Result<VolumeEntry, Error> {
        let op =
            VolumeOp::Mkdir { volume: self.volume.clone(), path: path.to_string(), parents, attrs };
        one("volume_mkdir", self.client.request(&Request::Volume(op)).await?)
    }

    /// Removes a file, a symlink or a directory tree.
    pub async fn remove(&self, path: &str) -> Result<(), Error> {
        let op = VolumeOp::Remove { volume: self.volume.clone(), path: path.to_string() };
        expect_done("volume_remove", self.client.request(&Request::Volume(op)).await?)
    }

    /// Changes an entry's mode and owner.
    pub async fn set_attrs(&self, path: &str, attrs: VolumeAttrs) -> Result<VolumeEntry, Error> {
        let op = VolumeOp::SetAttrs { volume: self.volume.clone(), path: path.to_string(), attrs };
        one("volume_set_attrs", self.client.request(&Request::Volume(op)).await?)
    }
}
