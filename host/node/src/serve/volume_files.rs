//! The volume requests: create, list, get and delete, and file operations on a volume with
//! no sandbox. Every file operation runs on the blocking pool within the volume's share and
//! the node's bound of file work and its deadline (`crate::serve::file_work`), confined to the
//! volume's root as a container's files are (`brig_container::files::RootDir`: no path
//! leaves it, no FIFO or device is opened). Owners are the ids a sandbox sees.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use brig_container::files::{FileError, OwnedRootDir, RootDir};
use brig_proto::{FileKind, Reply, VolumeAttrs, VolumeEntry, VolumeOp, VolumeWriteRequest};
use brig_transport::Exchange;
use bytes::BytesMut;

use crate::environments::volumes::{MountHold, Volume, VolumeError};
use crate::serve::files::CHUNK_BYTES;
use crate::serve::route::{stream, Conversation};
use crate::{Node, NodeError};
use brig_container::protect::Bind;
use brig_core::VolumeBinding;

/// The most entries one listing returns (all levels together).
pub const MAX_LISTED: usize = 100_000;
/// The deepest listing.
pub const MAX_DEPTH: u32 = 64;

fn file_error(e: FileError) -> NodeError {
    match e.io_kind() {
        Some(std::io::ErrorKind::NotFound) => NodeError::Volume(VolumeError::NotFound(match &e {
            FileError::Io { path, .. } => format!("path {path}"),
            other => other.to_string(),
        })),
        Some(kind) => NodeError::Io {
            what: e.to_string(),
            source: std::io::Error::new(kind, brig_core::sandbox::chain(&e)),
        },
        None => NodeError::Volume(VolumeError::BadMount(e.to_string())),
    }
}

fn to_ms(secs: i64, nsec: u64) -> u64 {
    u64::try_from(secs).unwrap_or(0) * 1000 + nsec / 1_000_000
}

impl Node {
    /// The sandboxes that mount volume `id`.
    pub(crate) fn mounted_by(&self, id: &str) -> Vec<String> {
        let mut users: Vec<String> = self
            .inner
            .sandboxes
            .all()
            .into_iter()
            .filter(|e| e.spec().volumes.iter().any(|v| v.volume == id))
            .map(|e| e.id.to_string())
            .collect();
        users.sort();
        users
    }

    /// The volumes a create mounts (resolved in its `project`), held until the sandbox is in
    /// the table, mounted on the node, with their binds for the container.
    pub(crate) async fn volumes_for_create(
        &self,
        req: &brig_proto::CreateRequest,
        project: Option<&str>,
    ) -> Result<(Option<MountHold>, Vec<VolumeBinding>, Vec<Bind>), NodeError> {
        if req.volumes.is_empty() {
            return Ok((None, Vec::new(), Vec::new()));
        }
        let (hold, found) = self.inner.volumes.hold_for_mount(&req.volumes, project)?;
        let mut bindings = Vec::new();
        let mut binds = Vec::new();
        for (volume, mount) in found {
            let node = self.clone();
            let point = tokio::task::spawn_blocking(move || node.inner.volumes.mounted(&volume))
                .await
                .map_err(|e| NodeError::Io {
                    what: "mounting a volume".into(),
                    source: std::io::Error::other(e.to_string()),
                })??;
            binds.push(Bind {
                source: point,
                target: mount.path.clone(),
                read_only: mount.read_only,
            });
            bindings.push(VolumeBinding {
                volume: mount.volume,
                path: mount.path,
                read_only: mount.read_only,
            });
        }
        Ok((Some(hold), bindings, binds))
    }

    /// Unmounts the volumes no kept sandbox mounts (the node is stopping).
    pub(crate) fn unmount_volumes(&self) {
        let kept: std::collections::HashSet<String> = self
            .inner
            .sandboxes
            .all()
            .into_iter()
            .flat_map(|e| e.spec().volumes.into_iter().map(|v| v.volume))
            .collect();
        self.inner.volumes.unmount_all_but(&kept);
    }

    fn volume(&self, name_or_id: &str) -> Result<Arc<Volume>, NodeError> {
        Ok(self.inner.volumes.find(name_or_id, None)?)
    }

    /// Runs `work` on the volume's root, mounted, within its share of file work.
    async fn on_volume<T: Send + 'static>(
        &self,
        volume: &Arc<Volume>,
        what: &str,
        work: impl FnOnce(RootDir<'_>, u32) -> Result<T, NodeError> + Send + 'static,
    ) -> Result<T, NodeError> {
        let node = self.clone();
        let v = volume.clone();
        let gate = &self.inner.file_work;
        gate.run(volume.file_ops.clone(), what, move || {
            let volumes = &node.inner.volumes;
            let point = volumes.mounted(&v)?;
            let root = open_root(&point)?;
            let owner = volumes.owner();
            let dir = OwnedRootDir::new(root, owner);
            work(dir.dir(), owner)
        })
        .await?
    }

    /// The volume family: every op, the streamed ones (read, write) on `exchange`.
    pub(crate) async fn volume_request(
        &self,
        op: VolumeOp,
        exchange: Conversation<'_>,
    ) -> Result<Option<Reply>, NodeError> {
        let kind = op.kind();
        let volumes = &self.inner.volumes;
        let reply = match op {
            VolumeOp::Write(req) => return self.volume_write(req, stream(exchange, kind)?).await,
            VolumeOp::Read { volume, path, offset, len } => {
                let exchange = stream(exchange, kind)?;
                return self.volume_read(&volume, path, offset, len, exchange).await;
            }
            VolumeOp::Create(req) => {
                let v = volumes.create(&req.name, req.quota_mib, req.project).await?;
                Reply::Volume(volumes.info(&v, Vec::new()))
            }
            VolumeOp::List { project } => {
                let list = volumes.list(project.as_deref());
                Reply::Volumes(
                    list.iter().map(|v| volumes.info(v, self.mounted_by(&v.record.id))).collect(),
                )
            }
            VolumeOp::Get { volume } => {
                let v = self.volume(&volume)?;
                Reply::Volume(volumes.info(&v, self.mounted_by(&v.record.id)))
            }
            VolumeOp::Delete { volume } => {
                let v = self.volume(&volume)?;
                let id = v.record.id.clone();
                volumes.delete(&v, || self.mounted_by(&id)).await?;
                Reply::Done
            }
            VolumeOp::ListDir { volume, path, depth } => {
                let v = self.volume(&volume)?;
                let depth = depth.clamp(1, MAX_DEPTH);
                let entries = self
                    .on_volume(&v, "volume list", move |root, owner| {
                        list_tree(&root, owner, &path, depth)
                    })
                    .await?;
                Reply::VolumeEntries(entries)
            }
            VolumeOp::Stat { volume, path } => {
                let v = self.volume(&volume)?;
                let entry = self
                    .on_volume(&v, "volume stat", move |root, owner| entry(&root, owner, &path))
                    .await?;
                Reply::VolumeEntries(vec![entry])
            }
            VolumeOp::Mkdir { volume, path, parents, attrs } => {
                let v = self.volume(&volume)?;
                let entry = self
                    .on_volume(&v, "volume mkdir", move |root, owner| {
                        let made = root.mkdir(&path, parents);
                        match made {
                            Err(e) if e.io_kind() == Some(std::io::ErrorKind::AlreadyExists) => {
                                return Err(NodeError::Volume(VolumeError::Exists(path)));
                            }
                            other => other.map_err(file_error)?,
                        }
                        set_attrs(&root, owner, &path, attrs)?;
                        entry(&root, owner, &path)
                    })
                    .await?;
                Reply::VolumeEntries(vec![entry])
            }
            VolumeOp::Remove { volume, path } => {
                let v = self.volume(&volume)?;
                self.on_volume(&v, "volume remove", move |root, _| {
                    root.remove(&path, true).map_err(file_error)
                })
                .await?;
                Reply::Done
            }
            VolumeOp::SetAttrs { volume, path, attrs } => {
                let v = self.volume(&volume)?;
                let entry = self
                    .on_volume(&v, "volume set attributes", move |root, owner| {
                        set_attrs(&root, owner, &path, attrs)?;
                        entry(&root, owner, &path)
                    })
                    .await?;
                Reply::VolumeEntries(vec![entry])
            }
        };
        Ok(Some(reply))
    }

    /// A file uploaded into a volume, chunk by chunk as it arrives.
    pub(crate) async fn volume_write(
        &self,
        req: VolumeWriteRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let v = match self.volume(&req.volume) {
            Ok(v) => v,
            Err(e) => {
                exchange.refuse_upload();
                return Err(e);
            }
        };
        let (path, parents, attrs) = (req.path.clone(), req.parents, req.attrs);
        let opened = self
            .on_volume(&v, "volume write", move |root, _| {
                let file =
                    root.open_write(&path, false, parents, attrs.mode).map_err(file_error)?;
                Ok(file)
            })
            .await;
        let mut file = match opened {
            Ok(file) => file,
            Err(e) => {
                exchange.refuse_upload();
                return Err(e);
            }
        };
        let limit = self.inner.config.max_upload_bytes;
        let mut written: u64 = 0;
        while let Some(chunk) = exchange.read_upload().await? {
            written += chunk.len() as u64;
            if written > limit {
                exchange.refuse_upload();
                return Err(NodeError::UploadTooLarge(limit));
            }
            let wrote = self
                .inner
                .file_work
                .run(v.file_ops.clone(), "volume write", move || {
                    let mut file = file;
                    file.write_all(&chunk).map(|()| file)
                })
                .await?;
            file = match wrote {
                Ok(file) => file,
                Err(e) => {
                    exchange.refuse_upload();
                    return Err(NodeError::Io { what: req.path.clone(), source: e });
                }
            };
        }
        let synced = self
            .inner
            .file_work
            .run(v.file_ops.clone(), "volume write", move || file.sync_data())
            .await?;
        synced.map_err(|source| NodeError::Io { what: req.path.clone(), source })?;
        let path = req.path.clone();
        let entry = self
            .on_volume(&v, "volume write", move |root, owner| {
                set_attrs(&root, owner, &path, attrs)?;
                entry(&root, owner, &path)
            })
            .await?;
        Ok(Some(Reply::VolumeEntries(vec![entry])))
    }

    /// A volume's file sent as `FileData` and its bytes, read in pieces.
    pub(crate) async fn volume_read(
        &self,
        volume: &str,
        path: String,
        offset: u64,
        len: Option<u64>,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let v = self.volume(volume)?;
        let what = path.clone();
        let (mut file, size) = self
            .on_volume(&v, "volume read", move |root, _| {
                let mut file = root.open_read(&path).map_err(file_error)?;
                let size = file
                    .metadata()
                    .map_err(|source| NodeError::Io { what: path.clone(), source })?;
                file.seek(SeekFrom::Start(offset))
                    .map_err(|source| NodeError::Io { what: path.clone(), source })?;
                Ok((file, size.len()))
            })
            .await?;
        let available = size.saturating_sub(offset);
        let size = len.map_or(available, |len| len.min(available));
        exchange.reply(&Reply::FileData { size }).await?;
        let mut remaining = size;
        while remaining > 0 {
            let want = usize::try_from(remaining).unwrap_or(CHUNK_BYTES).min(CHUNK_BYTES);
            let piece = self
                .inner
                .file_work
                .run(v.file_ops.clone(), "volume read", move || {
                    let mut buf = BytesMut::zeroed(want);
                    let n = file.read(&mut buf)?;
                    buf.truncate(n);
                    Ok::<_, std::io::Error>((file, buf))
                })
                .await?;
            let (back, buf) =
                piece.map_err(|source| NodeError::Io { what: what.clone(), source })?;
            file = back;
            if buf.is_empty() {
                break;
            }
            remaining -= buf.len() as u64;
            exchange.send_raw(buf.freeze()).await?;
        }
        Ok(None)
    }
}

fn open_root(point: &std::path::Path) -> Result<OwnedFd, NodeError> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(point, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| NodeError::Io { what: point.display().to_string(), source: e.into() })
}

/// Mode and owner as asked (sandbox ids become host ids above `owner`, container root's).
fn set_attrs(
    root: &RootDir<'_>,
    owner: u32,
    path: &str,
    attrs: VolumeAttrs,
) -> Result<(), NodeError> {
    let host = |id: Option<u32>| id.map(|id| owner.saturating_add(id));
    if attrs.mode.is_none() && attrs.uid.is_none() && attrs.gid.is_none() {
        return Ok(());
    }
    root.set_attrs(path, attrs.mode, (host(attrs.uid), host(attrs.gid))).map_err(file_error)
}

/// One entry as a caller hears it.
fn entry(root: &RootDir<'_>, owner: u32, path: &str) -> Result<VolumeEntry, NodeError> {
    let (st, target) = root.lstat(path).map_err(file_error)?;
    Ok(to_entry(display(path), &st, target, owner))
}

fn display(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    format!("/{}", parts.join("/"))
}

fn to_entry(
    path: String,
    st: &rustix::fs::Stat,
    target: Option<String>,
    owner: u32,
) -> VolumeEntry {
    use rustix::fs::FileType;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    };
    VolumeEntry {
        path,
        kind,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid.saturating_sub(owner),
        gid: st.st_gid.saturating_sub(owner),
        atime_unix_ms: to_ms(st.st_atime, st.st_atime_nsec),
        mtime_unix_ms: to_ms(st.st_mtime, st.st_mtime_nsec),
        ctime_unix_ms: to_ms(st.st_ctime, st.st_ctime_nsec),
        target,
    }
}

/// A directory's entries `depth` levels down, sorted by path, at most [`MAX_LISTED`].
fn list_tree(
    root: &RootDir<'_>,
    owner: u32,
    path: &str,
    depth: u32,
) -> Result<Vec<VolumeEntry>, NodeError> {
    let mut out = Vec::new();
    let top = display(path);
    // The asked directory must exist; a deeper one may go meanwhile.
    root.list(&top).map_err(file_error)?;
    let mut level = vec![top];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            let Ok(listed) = root.list(&dir) else { continue };
            for e in listed {
                let (st, target) = match root.lstat(&e.path) {
                    Ok(found) => found,
                    Err(_) => continue,
                };
                let item = to_entry(e.path.clone(), &st, target, owner);
                if item.kind == FileKind::Dir {
                    next.push(item.path.clone());
                }
                out.push(item);
                if out.len() >= MAX_LISTED {
                    out.sort_by(|a, b| a.path.cmp(&b.path));
                    return Ok(out);
                }
            }
        }
        level = next;
        if level.is_empty() {
            break;
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}
