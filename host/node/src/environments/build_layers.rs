//! The layers of COPY and WORKDIR steps, staged on the node from the build context: the
//! image's own directories above them keep the attributes the image gives them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use brig_builder::context::DirAttributes;
use brig_builder::{Context, ContextError, CopySpec};
use brig_images::LayerStore;

use crate::environments::build_step::{blocking, import_staged, ImageBuildError, StepAt};
use crate::NodeError;

/// A layer of what `spec` copies from `context` to `dest` (absolute).
pub(crate) async fn copy_layer(
    store: &Arc<LayerStore>,
    context: &Context,
    spec: &CopySpec,
    dest: &str,
    dirs: HashMap<String, DirAttributes>,
    at: &StepAt,
) -> Result<String, NodeError> {
    let (context, spec, dest) = (context.clone(), spec.clone(), dest.to_string());
    staged_layer(store, at, move |root| {
        let image_dir = |p: &str| dirs.get(p).copied().flatten();
        context.stage(&spec, &dest, root, &image_dir).map(drop)
    })
    .await
}

/// A layer that makes directory `dir` (and what is missing above it).
pub(crate) async fn dir_layer(
    store: &Arc<LayerStore>,
    dir: &str,
    dirs: HashMap<String, DirAttributes>,
    at: &StepAt,
) -> Result<String, NodeError> {
    let dir = dir.to_string();
    staged_layer(store, at, move |root| {
        let image_dir = |p: &str| dirs.get(p).copied().flatten();
        Context::make_dir(root, &dir, &image_dir)
    })
    .await
}

/// A layer of the tree `fill` stages at its root (on the blocking pool), kept as the step's
/// cache entry.
async fn staged_layer(
    store: &Arc<LayerStore>,
    at: &StepAt,
    fill: impl FnOnce(&Path) -> Result<(), ContextError> + Send + 'static,
) -> Result<String, NodeError> {
    let staging = brig_images::build::Staging::new_in(&store.work_dir())?;
    let root = staging.path().join("root");
    blocking(move || {
        std::fs::create_dir(&root)
            .map_err(|source| ContextError::Io { what: "staging root".into(), source })?;
        fill(&root)
    })
    .await?
    .map_err(ImageBuildError::from)?;
    import_staged(store, staging, at).await
}
