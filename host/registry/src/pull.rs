//! Pulling an image from an OCI distribution registry into the layer store: each image layer
//! becomes the Brig layer `oci/<hex of its diff digest>` (converted once: a layer already there
//! is neither downloaded nor converted again), and the image an environment of those layers.
//!
//! ```text
//! manifest + config ─▶ for each layer: in the store? ─ yes ─▶ reuse
//!                                         └ no ─▶ download (digest checked) ─▶ unpack (diff
//!                                                 digest checked, capped) ─▶ import
//! env NAME = [oci/<diff₁>, oci/<diff₂>, …]   (from the last layer that hides all below)
//! ```

use std::path::Path;
use std::sync::Arc;

use brig_images::{EnvConfig, ImportSource, LayerStore, StoreError};
use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde::Deserialize;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use crate::progress::{LayerState, Progress};
use crate::unpack::{unpack_layer, Compression, UnpackError};

/// Where images come from and how much of them is taken in.
#[derive(Debug, Clone)]
pub struct PullConfig {
    /// Registries (`host:port`) spoken to over plain HTTP, not HTTPS. Empty by default.
    pub insecure: Vec<String>,
    /// Credentials by registry (`host:port`): user and password.
    pub credentials: Vec<(String, String, String)>,
    /// PEM files of CAs trusted besides the system's.
    pub ca_files: Vec<std::path::PathBuf>,
    /// Mirrors by registry (`docker.io` → `["mirror.local:5000"]`): an image of the registry
    /// is pulled from its mirrors first, in order, and from the registry itself when none
    /// can serve it.
    pub mirrors: Vec<(String, Vec<String>)>,
    /// Most compressed bytes of one layer.
    pub max_layer_download_bytes: u64,
    /// Most uncompressed bytes of one layer.
    pub max_layer_bytes: u64,
    /// Most uncompressed bytes of one image.
    pub max_image_bytes: u64,
}

impl Default for PullConfig {
    fn default() -> Self {
        PullConfig {
            insecure: Vec::new(),
            credentials: Vec::new(),
            ca_files: Vec::new(),
            mirrors: Vec::new(),
            max_layer_download_bytes: 16 << 30,
            max_layer_bytes: 32 << 30,
            max_image_bytes: 64 << 30,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0:?} is not an image reference: {1}")]
    BadReference(String, String),
    #[error("{reference}: {what}: {source}")]
    Registry {
        reference: String,
        what: &'static str,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    #[error(
        "{reference}: layer {digest} has media type {media_type:?}, which Brig does not unpack"
    )]
    NotALayer { reference: String, digest: String, media_type: String },
    #[error("{reference}: the image config is unreadable: {detail}")]
    BadConfig { reference: String, detail: String },
    #[error("{reference}: the image has {layers} layers; at most {MAX_LAYERS} are pulled")]
    TooManyLayers { reference: String, layers: usize },
    #[error("{reference}: the registry did not send the manifest and config within {after:?}")]
    Stalled { reference: String, after: std::time::Duration },
    #[error(
        "{reference}: the manifest has {layers} layers but the config {diff_ids} diff digests"
    )]
    LayerCount { reference: String, layers: usize, diff_ids: usize },
    #[error("{reference}: layer {digest} failed to download: {detail} (nothing of it was kept)")]
    Download { reference: String, digest: String, detail: String },
    #[error("{reference}: layer {digest} is larger than {cap} bytes compressed")]
    LayerTooLarge { reference: String, digest: String, cap: u64 },
    #[error("{reference}: the image unpacks to more than {cap} bytes")]
    ImageTooLarge { reference: String, cap: u64 },
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The environment the image is (`env:<name>` creates from it).
    pub name: String,
    /// Digest of the image manifest pulled (the platform's, for an index).
    pub manifest_digest: String,
    /// Bottom first.
    pub layers: Vec<PulledLayer>,
    /// Compressed bytes downloaded (layers only).
    pub downloaded_bytes: u64,
    pub config: ImageConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledLayer {
    /// The Brig layer: `oci/<hex>`.
    pub layer: String,
    pub diff_id: String,
    /// Already in the store: not downloaded.
    pub reused: bool,
    /// Compressed bytes downloaded for it (0 when reused).
    pub downloaded_bytes: u64,
}

/// The parts of an image's config a sandbox uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

/// What a sandbox of the image starts with: its variables, directory, user and command. An
/// empty `WorkingDir` or `User` is the default (`/`, root), as for Docker.
fn env_config(config: &ImageConfig) -> EnvConfig {
    let env = config.env.iter().flatten().filter_map(|v| v.split_once('='));
    let nonempty = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
    EnvConfig {
        env: env.map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        working_dir: nonempty(&config.working_dir),
        user: nonempty(&config.user),
        entrypoint: config.entrypoint.clone().unwrap_or_default(),
        cmd: config.cmd.clone().unwrap_or_default(),
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Option<ImageConfig>,
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// The Brig layer an OCI layer with diff digest `diff_id` becomes.
pub fn layer_name(diff_id: &str) -> String {
    format!("oci/{}", diff_id.strip_prefix("sha256:").unwrap_or(diff_id))
}

/// The environment name for `reference` when none is given: `pulled/` and the reference with
/// every character a name may not have made a `-`.
pub fn default_name(reference: &str) -> String {
    let clean: String = reference
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-/".contains(c) { c } else { '-' })
        .collect();
    let parts: Vec<&str> = clean.split('/').filter(|p| !p.is_empty()).collect();
    let joined: Vec<String> = parts.iter().map(|p| p.trim_start_matches('.').to_string()).collect();
    format!("pulled/{}", joined.join("/"))
}

/// Pulls `reference` into `store` as environment `name` (default [`default_name`]).
pub async fn pull(
    store: &LayerStore,
    config: &PullConfig,
    reference: &str,
    name: Option<&str>,
    progress: &Progress,
) -> Result<Pulled, PullError> {
    let image: Reference = reference.parse().map_err(|e: oci_client::ParseError| {
        PullError::BadReference(reference.into(), e.to_string())
    })?;
    let mirrors = config
        .mirrors
        .iter()
        .filter(|(r, _)| r == image.registry() || r == image.resolve_registry())
        .flat_map(|(_, mirrors)| mirrors);
    for mirror in mirrors {
        let (repository, mirror_host) = (image.repository().to_string(), mirror.clone());
        let at_mirror = match image.digest() {
            Some(digest) => Reference::with_digest(mirror_host, repository, digest.into()),
            None => {
                let tag = image.tag().unwrap_or("latest").to_string();
                Reference::with_tag(mirror_host, repository, tag)
            }
        };
        match pull_from(store, config, reference, at_mirror, name, progress).await {
            Ok(pulled) => return Ok(pulled),
            Err(e)
                if matches!(
                    e.failure(),
                    PullFailure::Unreachable | PullFailure::NotFound | PullFailure::Denied
                ) =>
            {
                tracing::warn!(%reference, %mirror, error = %e, "a mirror could not serve the image; trying the next");
            }
            Err(e) => return Err(e),
        }
    }
    pull_from(store, config, reference, image, name, progress).await
}

/// Pulls `image` (`reference` itself, or where a mirror has it) as [`pull`] does.
async fn pull_from(
    store: &LayerStore,
    config: &PullConfig,
    reference: &str,
    image: Reference,
    name: Option<&str>,
    progress: &Progress,
) -> Result<Pulled, PullError> {
    let registry = image.resolve_registry().to_string();
    let mut roots = Vec::new();
    for file in &config.ca_files {
        let data = std::fs::read(file).map_err(|source| PullError::Io {
            what: format!("CA file {}", file.display()),
            source,
        })?;
        roots.push(Certificate { encoding: CertificateEncoding::Pem, data });
    }
    let client_config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(config.insecure.clone()),
        extra_root_certificates: roots,
        // A registry that stops sending fails the request (and a blob download is retried).
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        ..ClientConfig::default()
    };
    let registry_error = |what: &'static str| {
        let reference = reference.to_string();
        move |source| PullError::Registry { reference, what, source }
    };
    let client = Client::try_from(client_config).map_err(registry_error("client setup"))?;
    let auth = config
        .credentials
        .iter()
        .find(|(r, _, _)| *r == registry || *r == image.registry())
        .map_or(RegistryAuth::Anonymous, |(_, u, p)| RegistryAuth::Basic(u.clone(), p.clone()));
    client
        .auth(&image, &auth, RegistryOperation::Pull)
        .await
        .map_err(registry_error("authentication"))?;
    let manifest =
        tokio::time::timeout(MANIFEST_DEADLINE, client.pull_manifest_and_config(&image, &auth))
            .await
            .map_err(|_| PullError::Stalled {
                reference: reference.into(),
                after: MANIFEST_DEADLINE,
            })?;
    let (manifest, manifest_digest, config_json) = manifest.map_err(registry_error("manifest"))?;
    if manifest.layers.len() > MAX_LAYERS {
        let layers = manifest.layers.len();
        return Err(PullError::TooManyLayers { reference: reference.into(), layers });
    }
    let bad_config = |detail: String| PullError::BadConfig { reference: reference.into(), detail };
    let parsed: ConfigFile =
        serde_json::from_str(&config_json).map_err(|e| bad_config(e.to_string()))?;
    let diff_ids = parsed.rootfs.diff_ids;
    if diff_ids.len() != manifest.layers.len() {
        return Err(PullError::LayerCount {
            reference: reference.into(),
            layers: manifest.layers.len(),
            diff_ids: diff_ids.len(),
        });
    }
    progress.start(
        reference,
        manifest.layers.iter().map(|d| (d.digest.clone(), u64::try_from(d.size).unwrap_or(0))),
    );
    // First what the store has, and downloads of the rest started (a few at a time), so
    // later layers arrive while earlier ones are converted.
    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_DOWNLOADS));
    let mut plan = Vec::with_capacity(diff_ids.len());
    for (index, (descriptor, diff_id)) in manifest.layers.iter().zip(&diff_ids).enumerate() {
        let layer = layer_name(diff_id);
        let known = match store.digest_of(&layer) {
            Ok(digest) => Some(digest),
            // Converted by another node sharing the blob backend: only its record comes here.
            Err(_) => store.adopt_shared(&layer, &layer).await?.map(|info| info.digest),
        };
        if let Some(digest) = known {
            tracing::debug!(%layer, %digest, "layer already converted");
            progress.set_state(index, LayerState::Reused);
            // Whether it hides what is below it was found when it was converted.
            let hides_below = store.record(&digest).await?.source.ends_with(HIDES_BELOW);
            plan.push(Step::Known { layer, hides_below });
            continue;
        }
        let compression = Compression::of_media_type(&descriptor.media_type).ok_or_else(|| {
            PullError::NotALayer {
                reference: reference.into(),
                digest: descriptor.digest.clone(),
                media_type: descriptor.media_type.clone(),
            }
        })?;
        let staging = brig_images::build::Staging::new_in(&store.work_dir()).map_err(|e| {
            PullError::Io { what: "staging directory".into(), source: std::io::Error::other(e) }
        })?;
        let blob = staging.path().join("blob");
        let (client, image, config) = (client.clone(), image.clone(), config.clone());
        let (descriptor, reference) = (descriptor.clone(), reference.to_string());
        let (limit, progress) = (limit.clone(), progress.clone());
        let task = tokio::spawn(async move {
            let _turn = limit.acquire_owned().await;
            let report = |bytes| progress.downloaded(index, bytes);
            download(&client, &image, &descriptor, &blob, &config, &reference, report).await
        });
        plan.push(Step::Fetch(Fetch { task: AbortOnDrop(task), staging, compression, layer }));
    }
    let mut layers = Vec::with_capacity(diff_ids.len());
    let (mut downloaded, mut unpacked_total, mut bottom) = (0u64, 0u64, 0usize);
    for (i, (step, (descriptor, diff_id))) in
        plan.into_iter().zip(manifest.layers.iter().zip(&diff_ids)).enumerate()
    {
        let fetch = match step {
            Step::Known { layer, hides_below } => {
                if hides_below {
                    bottom = i;
                }
                let diff_id = diff_id.clone();
                layers.push(PulledLayer { layer, diff_id, reused: true, downloaded_bytes: 0 });
                continue;
            }
            Step::Fetch(fetch) => fetch,
        };
        let Fetch { mut task, staging, compression, layer } = fetch;
        let bytes = (&mut task.0).await.map_err(|e| PullError::Io {
            what: "download task".into(),
            source: std::io::Error::other(e),
        })??;
        progress.set_state(i, LayerState::Converting);
        downloaded += bytes;
        let blob = staging.path().join("blob");
        let root = staging.path().join("root");
        std::fs::create_dir(&root)
            .map_err(|source| PullError::Io { what: "staging root".into(), source })?;
        let cap = config.max_layer_bytes.min(config.max_image_bytes.saturating_sub(unpacked_total));
        let (blob2, root2, name) = (blob.clone(), root.clone(), descriptor.digest.clone());
        let unpacked = tokio::task::spawn_blocking(move || {
            unpack_layer(&blob2, compression, &root2, cap, &name)
        })
        .await
        .map_err(|e| PullError::Io {
            what: "unpack task".into(),
            source: std::io::Error::other(e),
        })?
        .map_err(|e| match e {
            UnpackError::TooLarge { cap, .. } if cap < config.max_layer_bytes => {
                PullError::ImageTooLarge {
                    reference: reference.into(),
                    cap: config.max_image_bytes,
                }
            }
            other => other.into(),
        })?;
        unpacked_total += unpacked.bytes;
        if &unpacked.diff_id != diff_id {
            return Err(UnpackError::DiffDigest {
                layer: descriptor.digest.clone(),
                expected: diff_id.clone(),
                actual: unpacked.diff_id,
            }
            .into());
        }
        if unpacked.hides_below {
            bottom = i;
        }
        let _ = std::fs::remove_file(&blob);
        let mut label = format!("oci {reference} layer {}", descriptor.digest);
        if unpacked.hides_below {
            label.push_str(HIDES_BELOW);
        }
        let info = store.import(&layer, None, ImportSource::Staged(staging, label)).await?;
        store.share_name(&layer, &info.digest).await?;
        progress.set_state(i, LayerState::Done);
        let diff_id = diff_id.clone();
        layers.push(PulledLayer { layer, diff_id, reused: false, downloaded_bytes: bytes });
    }
    let name = name.map_or_else(|| default_name(reference), str::to_string);
    let env: Vec<String> = layers[bottom..].iter().map(|l| l.layer.clone()).collect();
    store.create_env(&name, env).await?;
    let config = parsed.config.unwrap_or_default();
    store.set_env_config(&name, env_config(&config)).await?;
    tracing::info!(%reference, %name, layers = layers.len(), downloaded, "image pulled");
    Ok(Pulled { name, manifest_digest, layers, downloaded_bytes: downloaded, config })
}

/// The end of the source of a converted layer whose root is opaque (it hides every layer
/// below it): an image that reuses it starts there too.
const HIDES_BELOW: &str = " (opaque root: hides the layers below)";

/// Most layers an image may have (overlay stacks past about 128 lower layers fail to mount).
pub const MAX_LAYERS: usize = 128;
/// How long a registry may take to accept a connection, and to send the next bytes.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long the manifest and the image config may take together (a registry that trickles
/// them byte by byte is cut off).
const MANIFEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Layer downloads of one pull under way at once.
const CONCURRENT_DOWNLOADS: usize = 3;

/// What a pull does with one layer.
enum Step {
    /// The store has it (this node's catalog, or another node's through the backend).
    Known {
        layer: String,
        hides_below: bool,
    },
    Fetch(Fetch),
}

/// A layer being downloaded into `staging`. The download stops when this is dropped (a pull
/// that failed on an earlier layer), before its staging directory goes.
struct Fetch {
    task: AbortOnDrop<Result<u64, PullError>>,
    staging: brig_images::build::Staging,
    compression: Compression,
    layer: String,
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Tries of one blob download before a pull gives up on it.
const DOWNLOAD_TRIES: u32 = 4;
/// The wait before the first retry; it doubles with each.
const FIRST_BACKOFF: std::time::Duration = std::time::Duration::from_millis(250);

/// Downloads one layer blob into `path`. A download cut short (the registry restarted, the
/// connection dropped) goes on from the bytes it has with a Range request, or from the start
/// if the registry sends the whole blob, up to [`DOWNLOAD_TRIES`] times with a doubling wait.
/// The whole blob's digest is checked here (a resumed part is not checked by the client); a
/// mismatch or a download that cannot finish is an error, and the caller's staging directory,
/// with the part, goes with it.
async fn download(
    client: &Client,
    image: &Reference,
    descriptor: &oci_client::manifest::OciDescriptor,
    path: &Path,
    config: &PullConfig,
    reference: &str,
    report: impl Fn(u64),
) -> Result<u64, PullError> {
    use oci_client::client::BlobResponse;
    use sha2::{Digest, Sha256};
    let failed = |detail: String| PullError::Download {
        reference: reference.into(),
        digest: descriptor.digest.clone(),
        detail,
    };
    let too_large = || PullError::LayerTooLarge {
        reference: reference.into(),
        digest: descriptor.digest.clone(),
        cap: config.max_layer_download_bytes,
    };
    let cap = config.max_layer_download_bytes;
    if u64::try_from(descriptor.size).unwrap_or(u64::MAX) > cap {
        return Err(too_large());
    }
    let file_error = |source| PullError::Io { what: "blob file".into(), source };
    let mut out = tokio::fs::File::create(path).await.map_err(file_error)?;
    let (mut hasher, mut bytes) = (Sha256::new(), 0u64);
    let mut backoff = FIRST_BACKOFF;
    let mut last_error = String::new();
    for attempt in 0..DOWNLOAD_TRIES {
        if attempt > 0 {
            tracing::info!(blob = %descriptor.digest, bytes, attempt, error = %last_error, "resuming a blob download");
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
        let response = if bytes == 0 {
            client.pull_blob_stream(image, descriptor).await.map(BlobResponse::Full)
        } else {
            client.pull_blob_stream_partial(image, descriptor, bytes, None).await
        };
        let mut stream = match response {
            Ok(BlobResponse::Partial(stream)) => stream,
            Ok(BlobResponse::Full(stream)) => {
                // The whole blob again: start over.
                if bytes > 0 {
                    out.set_len(0).await.map_err(file_error)?;
                    out.seek(std::io::SeekFrom::Start(0)).await.map_err(file_error)?;
                    (hasher, bytes) = (Sha256::new(), 0);
                }
                stream
            }
            Err(e) if retryable(&e) => {
                last_error = e.to_string();
                continue;
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        let mut cut = None;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    cut = Some(e.to_string());
                    break;
                }
            };
            bytes += chunk.len() as u64;
            if bytes > cap {
                return Err(too_large());
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(file_error)?;
            report(bytes);
        }
        match cut {
            None => {
                out.flush().await.map_err(file_error)?;
                let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
                if descriptor.digest.starts_with("sha256:") && actual != descriptor.digest {
                    return Err(failed(format!("its bytes are {actual}")));
                }
                return Ok(bytes);
            }
            // The client's own check of a whole blob failed: nothing to resume.
            Some(e) if e.contains("igest") => return Err(failed(e)),
            Some(e) => last_error = e,
        }
    }
    Err(failed(format!("gave up after {DOWNLOAD_TRIES} tries: {last_error}")))
}

/// Whether a failed blob request may succeed when tried again (the registry or the network,
/// not the request).
fn retryable(e: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::OciDistributionError as O;
    match e {
        O::RequestError(_) | O::IoError(_) => true,
        O::ServerError { code, .. } => *code >= 500 || *code == 429,
        _ => false,
    }
}

/// What kind of failure a pull met, for the caller's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullFailure {
    /// The reference is malformed.
    BadReference,
    /// The registry refused the credentials (or asked for some).
    Denied,
    /// No such repository, tag or digest.
    NotFound,
    /// The registry could not be reached or failed.
    Unreachable,
    /// The image is malformed: a layer that is no layer, paths out of its root, a diff digest
    /// that does not match.
    BadImage,
    /// Past a configured cap.
    TooLarge,
    /// A blob arrived cut short or with the wrong digest.
    Corrupt,
    /// The layer store failed.
    Store,
    Internal,
}

impl PullError {
    pub fn failure(&self) -> PullFailure {
        use oci_client::errors::{OciDistributionError as O, OciErrorCode as C};
        match self {
            PullError::BadReference(..) => PullFailure::BadReference,
            PullError::Registry { source, .. } => match source {
                O::AuthenticationFailure(_) | O::UnauthorizedError { .. } => PullFailure::Denied,
                O::ImageManifestNotFoundError(_) => PullFailure::NotFound,
                O::ServerError { code: 401 | 403, .. } => PullFailure::Denied,
                O::ServerError { code: 404, .. } => PullFailure::NotFound,
                O::RegistryError { envelope, .. } => {
                    let codes = || envelope.errors.iter().map(|e| &e.code);
                    if codes().any(|c| matches!(c, C::Unauthorized | C::Denied)) {
                        PullFailure::Denied
                    } else if codes().any(|c| {
                        matches!(
                            c,
                            C::ManifestUnknown | C::NameUnknown | C::NotFound | C::BlobUnknown
                        )
                    }) {
                        PullFailure::NotFound
                    } else {
                        PullFailure::Unreachable
                    }
                }
                O::UnsupportedMediaTypeError(_)
                | O::UnsupportedSchemaVersionError(_)
                | O::ManifestParsingError(_)
                | O::IncompatibleLayerMediaTypeError(_) => PullFailure::BadImage,
                O::DigestError(_) => PullFailure::Corrupt,
                _ => PullFailure::Unreachable,
            },
            PullError::NotALayer { .. }
            | PullError::BadConfig { .. }
            | PullError::LayerCount { .. } => PullFailure::BadImage,
            PullError::Download { .. } => PullFailure::Corrupt,
            PullError::TooManyLayers { .. } => PullFailure::TooLarge,
            PullError::Stalled { .. } => PullFailure::Unreachable,
            PullError::LayerTooLarge { .. } | PullError::ImageTooLarge { .. } => {
                PullFailure::TooLarge
            }
            PullError::Unpack(
                UnpackError::TooLarge { .. } | UnpackError::TooManyEntries { .. },
            ) => PullFailure::TooLarge,
            PullError::Unpack(UnpackError::PathEscape { .. } | UnpackError::DiffDigest { .. }) => {
                PullFailure::BadImage
            }
            PullError::Unpack(UnpackError::Io { .. }) => PullFailure::BadImage,
            PullError::Store(_) => PullFailure::Store,
            PullError::Io { .. } => PullFailure::Internal,
        }
    }
}
