//! Image builds through the SDK: a Dockerfile (or steps) and a build context directory, run
//! by the node step by step with a step cache (`Client::build_image`).

use std::path::PathBuf;

use brig_proto::{
    BuildEvent, BuildSource, BuildStep, BuiltImage, ImageBuildRequest, ImageOp, Reply, Request,
};

use crate::client::unexpected;
use crate::images::send_all;
use crate::{Client, Error};

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    request: ImageBuildRequest,
    context: Option<PathBuf>,
}

impl BuildOptions {
    /// Environment `name` from a Dockerfile's text.
    pub fn dockerfile(name: &str, text: &str) -> BuildOptions {
        BuildOptions::of(name, BuildSource::Dockerfile(text.to_string()))
    }

    /// Environment `name` from steps (the first a `From`).
    pub fn steps(name: &str, steps: Vec<BuildStep>) -> BuildOptions {
        BuildOptions::of(name, BuildSource::Steps(steps))
    }

    fn of(name: &str, source: BuildSource) -> BuildOptions {
        let request = ImageBuildRequest {
            name: name.to_string(),
            source,
            build_args: Vec::new(),
            context: false,
            no_cache: false,
        };
        BuildOptions { request, context: None }
    }

    /// The directory COPY and ADD read from (sent as a tar; symlinks are sent as links).
    pub fn context(mut self, dir: impl Into<PathBuf>) -> BuildOptions {
        self.context = Some(dir.into());
        self.request.context = true;
        self
    }

    /// A value for an `ARG`.
    pub fn build_arg(mut self, name: &str, value: &str) -> BuildOptions {
        self.request.build_args.push((name.to_string(), value.to_string()));
        self
    }

    /// Runs every step, taking nothing from the step cache.
    pub fn no_cache(mut self) -> BuildOptions {
        self.request.no_cache = true;
        self
    }
}

impl Client {
    /// Builds an environment, calling `on_event` as each step starts, logs and finishes.
    /// A step that fails is a `bad_request` error saying which step, how, and how its
    /// output ended.
    pub async fn build_image(
        &self,
        options: BuildOptions,
        mut on_event: impl FnMut(&BuildEvent),
    ) -> Result<BuiltImage, Error> {
        let mut exchange =
            self.open(&Request::Image(ImageOp::Build(options.request.clone()))).await?;
        if let Some(dir) = &options.context {
            let mut tar = tokio::process::Command::new("tar")
                .args(["--numeric-owner", "-cf", "-", "-C"])
                .arg(dir)
                .arg(".")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|source| Error::LocalIo { path: dir.display().to_string(), source })?;
            let mut out =
                tar.stdout.take().ok_or_else(|| Error::Config("tar has no stdout".into()))?;
            send_all(&mut exchange, &mut out, dir).await?;
            let status = tar
                .wait()
                .await
                .map_err(|source| Error::LocalIo { path: dir.display().to_string(), source })?;
            if !status.success() {
                return Err(Error::Config(format!("tar of {} failed: {status}", dir.display())));
            }
        }
        exchange.finish_upload()?;
        loop {
            match exchange.reply().await? {
                Reply::BuildEvent(event) => on_event(&event),
                Reply::Built(built) => return Ok(built),
                Reply::Error(e) => return Err(e.into()),
                other => return Err(unexpected("image_build", &other)),
            }
        }
    }
}
