//! Brig's image builds, the parts without side effects: a Dockerfile (or E2B template steps)
//! becomes a list of [`Step`]s (`dockerfile`); each step either adds a layer (RUN, COPY/ADD,
//! WORKDIR) or changes the image config (ENV, USER, CMD, …) ([`ImageConfig`]); every step has
//! a cache key from its parent's key, the step and its inputs' hashes (`key`), so an
//! unchanged rebuild runs nothing; COPY sources are read from the build context without ever
//! leaving it (`context`). The node runs the steps (`brig-node::build`).

pub mod context;
pub mod dockerfile;
pub mod key;
pub mod step;

pub use context::{Context, ContextError};
pub use dockerfile::{parse_dockerfile, DockerfileError};
pub use key::StepKey;
pub use step::{Command, CopySpec, ImageConfig, Step};
