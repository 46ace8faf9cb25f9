//! Loading precompiled components: the one place in this crate that calls an unsafe API.
#![allow(unsafe_code)]

use std::path::Path;

use wasmtime::component::Component;
use wasmtime::Engine;

/// Loads a `.cwasm` this node wrote earlier; `None` if absent or unusable (the caller then
/// recompiles from the original bytes).
pub(crate) fn load(engine: &Engine, path: &Path) -> Option<Component> {
    if !path.exists() {
        return None;
    }
    // `deserialize_file` trusts the file to be native code produced by `Component::serialize`
    // for a compatible engine and not to change while mapped. Only
    // `ToolRegistry::compile_and_cache` writes these files, into the node's own state directory
    // under a directory named by this engine's compatibility hash, and always by
    // write-to-temporary-then-rename, so a file at `path` is complete and never rewritten in
    // place. Wasmtime itself rejects files from another version or with other settings.
    // SAFETY: the file is ours, complete and immutable, as above (upheld by compile_and_cache).
    let loaded = unsafe { Component::deserialize_file(engine, path) };
    match loaded {
        Ok(component) => Some(component),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %format!("{e:#}"), "precompiled component unusable; recompiling");
            None
        }
    }
}
