//! Image builds: a Dockerfile or a list of steps (an E2B template's) run on the node's
//! container tier, each step a layer or a change of the image config, with a step cache.

use serde::{Deserialize, Serialize};

use crate::OutputStream;

/// Build environment `name` (`env:NAME` creates from it). A tar of the build context follows
/// as the upload when `context` is set (COPY reads from it). Replies: `BuildEvent`s as it
/// goes, then `Built`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ImageBuildRequest {
    pub name: String,
    pub source: BuildSource,
    /// Build variables over the Dockerfile's `ARG` defaults.
    pub build_args: Vec<(String, String)>,
    pub context: bool,
    /// Run every step, taking nothing from the step cache.
    pub no_cache: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum BuildSource {
    /// A Dockerfile's text (one stage).
    Dockerfile(String),
    /// Steps, the first a `From`.
    Steps(Vec<BuildStep>),
}

/// A command of a step: the shell form runs through `/bin/sh -c`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum BuildCommand {
    Shell(String),
    Exec(Vec<String>),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum BuildStep {
    /// `scratch`, `env:NAME` or a registry image.
    From(String),
    Run(BuildCommand),
    /// Context paths to `dest`; `chown` as `(uid, gid)`, or `owner` a user (`name[:group]`)
    /// of the image; `chmod` octal bits.
    Copy {
        sources: Vec<String>,
        dest: String,
        chown: Option<(u32, u32)>,
        owner: Option<String>,
        chmod: Option<u32>,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    Cmd(BuildCommand),
    Entrypoint(BuildCommand),
    Label(Vec<(String, String)>),
    /// A command run as `user` (the image's user unchanged).
    RunAs {
        command: BuildCommand,
        user: String,
    },
}

/// How a build goes: step `step` of `steps` (from 1).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BuildEvent {
    pub step: u32,
    pub steps: u32,
    pub kind: BuildEventKind,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum BuildEventKind {
    /// The step begins: as a Dockerfile line; `cached` when its result is taken from the
    /// step cache (it does not run).
    Started { text: String, cached: bool },
    /// Output of a running step (lossy UTF-8, a line or a piece of one).
    Log { stream: OutputStream, text: String },
    /// The step is done, having taken `millis`.
    Finished { millis: u64 },
}

/// What a build made.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct BuiltImage {
    pub name: String,
    /// The environment's layers, bottom first.
    pub layers: Vec<String>,
    pub steps_run: u32,
    pub steps_cached: u32,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}
