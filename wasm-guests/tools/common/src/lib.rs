//! Helpers shared by Brig's built-in tool components: input parsing and workspace paths.
//!
//! Every tool takes JSON input and returns JSON output. Paths in inputs are relative to the
//! sandbox workspace, which the host preopens at [`WORKSPACE`]. The host (WASI preopens) is what
//! keeps a tool inside the workspace; the checks here only turn obvious escapes into clear
//! messages instead of opaque "not permitted" errors.

use serde::de::DeserializeOwned;
use std::path::{Component, PathBuf};

/// Where the host mounts the sandbox workspace inside the guest.
pub const WORKSPACE: &str = "/workspace";

/// Parses the call input as JSON into `T`, with an error message an agent can act on.
pub fn parse_input<T: DeserializeOwned>(input: &str) -> Result<T, String> {
    serde_json::from_str(input).map_err(|e| format!("invalid input: {e}"))
}

/// Serializes a tool result as JSON.
pub fn to_output<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode output: {e}"))
}

/// Maps a workspace-relative path to the guest path under [`WORKSPACE`].
///
/// A leading `/workspace` is accepted; other absolute paths and `..` components are refused.
pub fn workspace_path(path: &str) -> Result<PathBuf, String> {
    let trimmed = path.strip_prefix(WORKSPACE).unwrap_or(path);
    let relative = trimmed.trim_start_matches('/');
    if path.starts_with('/') && !path.starts_with(WORKSPACE) {
        return Err(format!("path {path:?} is outside the workspace"));
    }
    let mut out = PathBuf::from(WORKSPACE);
    for part in std::path::Path::new(relative).components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return Err(format!("path {path:?} is outside the workspace")),
        }
    }
    Ok(out)
}

/// Strips the [`WORKSPACE`] prefix for display, so outputs show workspace-relative paths.
pub fn display_path(path: &std::path::Path) -> String {
    let s = path.to_string_lossy();
    match s.strip_prefix(WORKSPACE) {
        Some("") => ".".to_string(),
        Some(rest) => rest.trim_start_matches('/').to_string(),
        None => s.into_owned(),
    }
}
