//! Errors of the fncall tier. Guest failures are not here: they are call outcomes.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FncallError {
    #[error("no tool named {0:?} is registered")]
    ToolNotFound(String),
    #[error("tool name {0:?} is invalid (use 1-64 of [a-z0-9_.-])")]
    BadToolName(String),
    #[error("component refused: {0}")]
    InvalidComponent(String),
    #[error("cannot configure the Wasmtime engine: {0}")]
    Engine(String),
    #[error("all {0} call slots are busy; retry shortly")]
    Busy(u32),
    #[error("I/O error on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("path {0:?} is outside the workspace")]
    PathEscape(String),
    #[error("{path:?}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("internal error: {0}")]
    Internal(String),
}
