//! The layer store through the SDK: import, list, inspect, tag, remove, verify, GC,
//! environments, and checkpoints of sandboxes.

use std::path::{Path, PathBuf};

use brig_proto::{CallerInfo, ImageOp, NodeOp, StrayObject};
use brig_proto::{
    CheckpointRequest, ImageFormat, ImageImportRequest, LayerInfo, NodeStatus, Reply, Request,
};
use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use crate::client::{expect_done, unexpected};
use crate::{Client, Error, Sandbox};

/// What to import.
#[derive(Debug, Clone)]
pub enum ImageSource {
    /// A directory here: sent as a tarball (ownership kept by number).
    Dir(PathBuf),
    /// A tarball here (plain or compressed).
    Tar(PathBuf),
    /// An OCI image layout or `docker save` archive here (a tarball).
    Oci(PathBuf),
    /// A self-contained EROFS image here.
    Erofs(PathBuf),
    /// A path on the node itself (no upload).
    OnNode { path: String, format: ImageFormat },
}

/// What a GC removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GcSummary {
    pub removed_layers: u64,
    pub removed_chunks: u64,
    pub freed_bytes: u64,
}

fn local_io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::LocalIo { path: path.display().to_string(), source }
}

impl Client {
    /// Imports a layer as `name@version` (the next version when `None`).
    pub async fn import_image(
        &self,
        name: &str,
        version: Option<u32>,
        source: ImageSource,
    ) -> Result<LayerInfo, Error> {
        let (format, node_path) = match &source {
            ImageSource::Dir(_) | ImageSource::Tar(_) => (ImageFormat::Tar, None),
            ImageSource::Oci(_) => (ImageFormat::Oci, None),
            ImageSource::Erofs(_) => (ImageFormat::Erofs, None),
            ImageSource::OnNode { path, format } => (*format, Some(path.clone())),
        };
        let request = Request::Image(ImageOp::Import(ImageImportRequest {
            name: name.to_string(),
            version,
            format,
            node_path,
        }));
        let mut exchange = self.open(&request).await?;
        match source {
            ImageSource::OnNode { .. } => {}
            ImageSource::Dir(dir) => {
                let mut tar = tokio::process::Command::new("tar")
                    .arg("--numeric-owner")
                    .arg("--xattrs")
                    .arg("-cf")
                    .arg("-")
                    .arg("-C")
                    .arg(&dir)
                    .arg(".")
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .map_err(local_io(&dir))?;
                let mut out =
                    tar.stdout.take().ok_or_else(|| Error::Config("tar has no stdout".into()))?;
                send_all(&mut exchange, &mut out, &dir).await?;
                let status = tar.wait().await.map_err(local_io(&dir))?;
                if !status.success() {
                    return Err(Error::Config(format!(
                        "tar of {} failed: {status}",
                        dir.display()
                    )));
                }
            }
            ImageSource::Tar(p) | ImageSource::Oci(p) | ImageSource::Erofs(p) => {
                let mut file = tokio::fs::File::open(&p).await.map_err(local_io(&p))?;
                send_all(&mut exchange, &mut file, &p).await?;
            }
        }
        exchange.finish_upload()?;
        match exchange.reply().await? {
            Reply::Layer(info) => Ok(info),
            Reply::Error(e) => Err(e.into()),
            other => Err(unexpected("image_import", &other)),
        }
    }

    /// Every tagged layer.
    pub async fn images(&self) -> Result<Vec<LayerInfo>, Error> {
        match self.request(&Request::Image(ImageOp::List)).await? {
            Reply::Layers(list) => Ok(list),
            other => Err(unexpected("image_list", &other)),
        }
    }

    /// A layer and the paths of its files.
    pub async fn inspect_image(&self, reference: &str) -> Result<(LayerInfo, Vec<String>), Error> {
        match self
            .request(&Request::Image(ImageOp::Inspect { reference: reference.to_string() }))
            .await?
        {
            Reply::LayerDetails { layer, paths } => Ok((layer, paths)),
            other => Err(unexpected("image_inspect", &other)),
        }
    }

    /// Gives a layer another name and version.
    pub async fn tag_image(
        &self,
        reference: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<LayerInfo, Error> {
        let request = Request::Image(ImageOp::Tag {
            reference: reference.to_string(),
            name: name.to_string(),
            version,
        });
        match self.request(&request).await? {
            Reply::Layer(info) => Ok(info),
            other => Err(unexpected("image_tag", &other)),
        }
    }

    /// Removes a tag (refused while a sandbox uses the layer).
    pub async fn remove_image(&self, reference: &str) -> Result<(), Error> {
        expect_done(
            "image_remove",
            self.request(&Request::Image(ImageOp::Remove { reference: reference.to_string() }))
                .await?,
        )
    }

    /// Fetches and checks every chunk of a layer.
    pub async fn verify_image(&self, reference: &str) -> Result<LayerInfo, Error> {
        match self
            .request(&Request::Image(ImageOp::Verify { reference: reference.to_string() }))
            .await?
        {
            Reply::Layer(info) => Ok(info),
            other => Err(unexpected("image_verify", &other)),
        }
    }

    /// Removes layer data nothing references.
    pub async fn gc_images(&self) -> Result<GcSummary, Error> {
        match self.request(&Request::Image(ImageOp::Gc)).await? {
            Reply::Gc { removed_layers, removed_chunks, freed_bytes } => {
                Ok(GcSummary { removed_layers, removed_chunks, freed_bytes })
            }
            other => Err(unexpected("image_gc", &other)),
        }
    }

    /// Empties the node's chunk cache (for cold-start measurements).
    pub async fn drop_image_cache(&self) -> Result<(), Error> {
        expect_done("image_cache_drop", self.request(&Request::Image(ImageOp::CacheDrop)).await?)
    }

    /// Defines an environment: layer references, base first.
    pub async fn create_env(&self, name: &str, layers: &[&str]) -> Result<(), Error> {
        let layers = layers.iter().map(|s| s.to_string()).collect();
        expect_done(
            "env_create",
            self.request(&Request::Image(ImageOp::EnvCreate { name: name.to_string(), layers }))
                .await?,
        )
    }

    /// Pulls `reference` (`python:3.12-slim`, `localhost:5000/x:tag`, `…@sha256:…`) from its
    /// registry into the node's layer store: one layer per image layer (a layer the store has
    /// already is not downloaded again), the image the environment `name` (default
    /// `pulled/<reference>`), which sandboxes are created from as `env:<name>`.
    pub async fn pull_image(
        &self,
        reference: &str,
        name: Option<&str>,
    ) -> Result<brig_proto::PulledImage, Error> {
        let request = brig_proto::ImagePullRequest {
            reference: reference.to_string(),
            name: name.map(str::to_string),
            progress: false,
        };
        match self.request(&Request::Image(ImageOp::Pull(request))).await? {
            Reply::Pulled(pulled) => Ok(pulled),
            other => Err(unexpected("image_pull", &other)),
        }
    }

    /// Pulls as [`Client::pull_image`] does, calling `on_progress` with the pull's state as it
    /// goes (a few times a second at most, each the whole state).
    pub async fn pull_image_with_progress(
        &self,
        reference: &str,
        name: Option<&str>,
        mut on_progress: impl FnMut(&brig_proto::PullProgress),
    ) -> Result<brig_proto::PulledImage, Error> {
        let request = brig_proto::ImagePullRequest {
            reference: reference.to_string(),
            name: name.map(str::to_string),
            progress: true,
        };
        let mut exchange = self.open(&Request::Image(ImageOp::Pull(request))).await?;
        exchange.finish_upload()?;
        loop {
            match exchange.reply().await? {
                Reply::PullProgress(progress) => on_progress(&progress),
                Reply::Pulled(pulled) => return Ok(pulled),
                Reply::Error(e) => return Err(e.into()),
                other => return Err(unexpected("image_pull", &other)),
            }
        }
    }

    pub async fn envs(&self) -> Result<Vec<(String, Vec<String>)>, Error> {
        match self.request(&Request::Image(ImageOp::EnvList)).await? {
            Reply::Envs(envs) => Ok(envs),
            other => Err(unexpected("env_list", &other)),
        }
    }

    /// What the node left on its host that belongs to none of its sandboxes (processes,
    /// cgroups, mounts, links, files), leaving out what was touched in the last `min_age`;
    /// with `remove`, removes it. Needs an admin connection.
    pub async fn doctor(
        &self,
        remove: bool,
        min_age: std::time::Duration,
    ) -> Result<Vec<StrayObject>, Error> {
        let min_age_secs = u32::try_from(min_age.as_secs()).unwrap_or(u32::MAX);
        match self.request(&Request::Node(NodeOp::Doctor { remove, min_age_secs })).await? {
            Reply::Strays(found) => Ok(found),
            other => Err(unexpected("node_doctor", &other)),
        }
    }

    /// Who this client's token speaks for: its project, or admin (asked of the control plane
    /// in cluster mode, else of the node).
    pub async fn whoami(&self) -> Result<CallerInfo, Error> {
        match self.request(&Request::Node(NodeOp::Whoami)).await? {
            Reply::Caller(caller) => Ok(caller),
            other => Err(unexpected("whoami", &other)),
        }
    }

    /// What the node reports about itself.
    pub async fn node_status(&self) -> Result<NodeStatus, Error> {
        match self.request(&Request::Node(NodeOp::Status)).await? {
            Reply::NodeStatus(status) => Ok(status),
            other => Err(unexpected("node_status", &other)),
        }
    }
}

pub(crate) async fn send_all(
    exchange: &mut brig_transport::ClientExchange,
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    path: &Path,
) -> Result<(), Error> {
    loop {
        let mut buf = BytesMut::with_capacity(256 << 10);
        if reader.read_buf(&mut buf).await.map_err(local_io(path))? == 0 {
            return Ok(());
        }
        if let Err(e) = exchange.send_raw(buf.freeze()).await {
            if let Ok(Reply::Error(wire)) = exchange.reply().await {
                return Err(wire.into());
            }
            return Err(e.into());
        }
    }
}

impl Sandbox {
    /// Turns this container's writable layer into layer `name@version`, without `scrub` paths;
    /// a new sandbox stacked on the same layers plus this one starts from this state.
    pub async fn checkpoint(
        &self,
        name: &str,
        version: Option<u32>,
        scrub: &[&str],
    ) -> Result<LayerInfo, Error> {
        let request = Request::Image(ImageOp::Checkpoint(CheckpointRequest {
            sandbox: self.id().to_string(),
            name: name.to_string(),
            version,
            scrub: scrub.iter().map(|s| s.to_string()).collect(),
        }));
        match self.client().request(&request).await? {
            Reply::Layer(info) => Ok(info),
            other => Err(unexpected("checkpoint", &other)),
        }
    }
}
