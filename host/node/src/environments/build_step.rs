//! One step of an image build, as both the build (`build`) and the layers it makes
//! (`build_layers`) see it: where the build is, how a step fails, how its layer is stored.

use brig_builder::StepKey;
use brig_images::{ImportSource, LayerStore};

use crate::NodeError;

#[derive(Debug, thiserror::Error)]
pub enum ImageBuildError {
    #[error(transparent)]
    Dockerfile(#[from] brig_builder::DockerfileError),
    #[error(transparent)]
    Context(#[from] brig_builder::ContextError),
    #[error("a build starts with FROM (an image, env:NAME or scratch)")]
    NoFrom,
    #[error("COPY needs a build context (none was sent)")]
    NoContext,
    #[error("step {step}/{steps} `{text}` failed: {how}{}", tail(.log))]
    StepFailed { step: u32, steps: u32, text: String, how: String, log: String },
}

fn tail(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("; its output ended with:\n{log}")
    }
}

impl ImageBuildError {
    pub(crate) fn code(&self) -> brig_proto::ErrorCode {
        use brig_builder::ContextError as C;
        use brig_proto::ErrorCode;
        match self {
            ImageBuildError::Context(C::Escape(_)) => ErrorCode::PermissionDenied,
            ImageBuildError::Context(C::TooLarge { .. }) => ErrorCode::TooLarge,
            ImageBuildError::Context(C::Io { .. }) => ErrorCode::Internal,
            _ => ErrorCode::BadRequest,
        }
    }
}

/// Which step a build is at, for its events, errors and cache entry.
pub(crate) struct StepAt {
    pub number: u32,
    pub total: u32,
    pub text: String,
    pub key: StepKey,
}

impl StepAt {
    pub(crate) fn failed(&self, how: String, log: String) -> ImageBuildError {
        ImageBuildError::StepFailed {
            step: self.number,
            steps: self.total,
            text: self.text.clone(),
            how,
            log,
        }
    }
}

/// Runs blocking work (hashing, unpacking, staging) off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Io { what: "build task".into(), source: std::io::Error::other(e) })
}

/// What a staged layer is called in its record.
pub(crate) fn layer_label(at: &StepAt) -> String {
    format!("build step {}/{}: {}", at.number, at.total, at.text)
}

/// Imports a staged layer tree as the step's cache entry; its digest.
pub(crate) async fn import_staged(
    store: &LayerStore,
    staging: brig_images::build::Staging,
    at: &StepAt,
) -> Result<String, NodeError> {
    let (name, label) = (at.key.layer_name(), layer_label(at));
    Ok(store.import(&name, None, ImportSource::Staged(staging, label)).await?.digest)
}
