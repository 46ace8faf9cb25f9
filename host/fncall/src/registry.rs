//! Registered tools: names → content-addressed components → ready-to-instantiate `InstancePre`s.
//!
//! ```text
//! <state>/components/<sha256>.wasm                    the bytes a user registered
//! <state>/precompiled/<engine key>/<sha256>.cwasm     native code for these engine settings
//! <state>/tools.json                                  name → digest, world, description
//! ```
//! A component is compiled once per engine setting; later starts load the `.cwasm` in well
//! under a millisecond. Registering checks that the component implements a world Brig runs
//! (`brig:tool/tool@0.1.0` or `wasi:cli/run@0.2`) and imports nothing the tier does not provide.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::Component;
use wasmtime_wasi::p2::bindings::CommandPre;

use crate::engine::BrigEngine;
use crate::invoke::{HostState, ToolComponentPre};
use crate::{precompiled, FncallError};

/// The export that makes a component a Brig tool.
pub const TOOL_EXPORT: &str = "brig:tool/tool@0.1.0";
/// The export that makes a component a WASI command.
pub const COMMAND_EXPORT_PREFIX: &str = "wasi:cli/run@0.2";
/// Largest component accepted.
pub const MAX_COMPONENT_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolWorld {
    /// Exports `brig:tool/tool`: `call(input) -> result<string, string>`.
    Tool,
    /// Exports `wasi:cli/run`: args, env, stdin in; stdout, stderr, exit code out.
    Command,
}

/// What a registered tool is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSummary {
    pub name: String,
    /// `sha256:<hex>` of the component bytes.
    pub digest: String,
    pub world: ToolWorld,
    pub description: String,
    pub size_bytes: u64,
}

pub(crate) enum ToolPre {
    Tool(ToolComponentPre<HostState>),
    Command(CommandPre<HostState>),
}

/// A validated, compiled component not yet registered.
pub(crate) struct Prepared {
    name: String,
    digest: String,
    world: ToolWorld,
    size_bytes: u64,
    pub pre: ToolPre,
}

pub(crate) struct LoadedTool {
    pub summary: ToolSummary,
    pub pre: ToolPre,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    tools: Vec<ToolSummary>,
}

pub(crate) struct ToolRegistry {
    dir: PathBuf,
    precompiled_dir: PathBuf,
    by_name: RwLock<HashMap<String, Arc<LoadedTool>>>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FncallError + '_ {
    move |source| FncallError::Io { path: path.to_owned(), source }
}

impl ToolRegistry {
    /// Opens the registry and loads every tool in its index. A tool whose files are damaged is
    /// skipped with an error log; the node still starts.
    pub fn open(engine: &BrigEngine, dir: &Path) -> Result<ToolRegistry, FncallError> {
        let components = dir.join("components");
        std::fs::create_dir_all(&components).map_err(io(&components))?;
        let precompiled_dir = dir.join("precompiled").join(&engine.key);
        std::fs::create_dir_all(&precompiled_dir).map_err(io(&precompiled_dir))?;
        let registry = ToolRegistry {
            dir: dir.to_owned(),
            precompiled_dir,
            by_name: RwLock::new(HashMap::new()),
        };
        let index_path = dir.join("tools.json");
        let index: Index = match std::fs::read(&index_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| FncallError::Io {
                path: index_path.clone(),
                source: std::io::Error::other(e),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Index::default(),
            Err(e) => return Err(io(&index_path)(e)),
        };
        let mut loaded = HashMap::new();
        for summary in index.tools {
            match registry.load(engine, &summary) {
                Ok(pre) => {
                    loaded.insert(summary.name.clone(), Arc::new(LoadedTool { summary, pre }));
                }
                Err(e) => {
                    tracing::error!(tool = %summary.name, error = %e, "cannot load tool; skipped")
                }
            }
        }
        tracing::info!(tools = loaded.len(), "fncall tools loaded");
        *registry.by_name.write() = loaded;
        Ok(registry)
    }

    fn wasm_path(&self, digest: &str) -> PathBuf {
        self.dir.join("components").join(format!("{}.wasm", hex_of(digest)))
    }

    fn cwasm_path(&self, digest: &str) -> PathBuf {
        self.precompiled_dir.join(format!("{}.cwasm", hex_of(digest)))
    }

    /// Loads a registered component: precompiled if possible, else compiled from its bytes.
    fn load(&self, engine: &BrigEngine, summary: &ToolSummary) -> Result<ToolPre, FncallError> {
        let cwasm = self.cwasm_path(&summary.digest);
        let component = match precompiled::load(&engine.engine, &cwasm) {
            Some(component) => component,
            None => {
                let wasm = self.wasm_path(&summary.digest);
                let bytes = std::fs::read(&wasm).map_err(io(&wasm))?;
                if digest_of(&bytes) != summary.digest {
                    return Err(FncallError::InvalidComponent(format!(
                        "{} does not match its digest {}",
                        wasm.display(),
                        summary.digest
                    )));
                }
                self.compile_and_cache(engine, &bytes, &summary.digest)?
            }
        };
        let (_, pre) = link(engine, &component)?;
        Ok(pre)
    }

    fn compile_and_cache(
        &self,
        engine: &BrigEngine,
        bytes: &[u8],
        digest: &str,
    ) -> Result<Component, FncallError> {
        let component = Component::new(&engine.engine, bytes)
            .map_err(|e| FncallError::InvalidComponent(format!("not a valid component: {e:#}")))?;
        let cwasm = self.cwasm_path(digest);
        match component.serialize() {
            Ok(native) => write_atomic(&cwasm, &native)?,
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot serialize component"),
        }
        Ok(component)
    }

    /// Validates and compiles a component (blocking: compiling takes ~100 ms per MiB).
    pub fn prepare(
        &self,
        engine: &BrigEngine,
        name: &str,
        bytes: &[u8],
    ) -> Result<Prepared, FncallError> {
        validate_name(name)?;
        if bytes.len() > MAX_COMPONENT_BYTES {
            return Err(FncallError::InvalidComponent(format!(
                "{} bytes is over the {MAX_COMPONENT_BYTES}-byte limit",
                bytes.len()
            )));
        }
        if !bytes.starts_with(b"\0asm") {
            return Err(FncallError::InvalidComponent("not a WebAssembly binary".into()));
        }
        let digest = digest_of(bytes);
        let component = match precompiled::load(&engine.engine, &self.cwasm_path(&digest)) {
            Some(component) => component,
            None => self.compile_and_cache(engine, bytes, &digest)?,
        };
        let (world, pre) = link(engine, &component)?;
        let wasm = self.wasm_path(&digest);
        if !wasm.exists() {
            write_atomic(&wasm, bytes)?;
        }
        Ok(Prepared { name: name.to_string(), digest, world, size_bytes: bytes.len() as u64, pre })
    }

    /// Registers a prepared component under its name, replacing any earlier tool of that name.
    pub fn commit(
        &self,
        prepared: Prepared,
        description: String,
    ) -> Result<ToolSummary, FncallError> {
        let Prepared { name, digest, world, size_bytes, pre } = prepared;
        let summary = ToolSummary { name: name.clone(), digest, world, description, size_bytes };
        let mut by_name = self.by_name.write();
        by_name.insert(name.clone(), Arc::new(LoadedTool { summary: summary.clone(), pre }));
        self.save_index(&by_name)?;
        tracing::info!(tool = %name, digest = %summary.digest, world = ?world, "tool registered");
        Ok(summary)
    }

    pub fn remove(&self, name: &str) -> Result<(), FncallError> {
        let mut by_name = self.by_name.write();
        by_name.remove(name).ok_or_else(|| FncallError::ToolNotFound(name.to_string()))?;
        self.save_index(&by_name)
    }

    /// Looks a tool up by name, or by `sha256:<hex>` digest of any registered tool.
    pub fn get(&self, name: &str) -> Result<Arc<LoadedTool>, FncallError> {
        let by_name = self.by_name.read();
        if let Some(tool) = by_name.get(name) {
            return Ok(tool.clone());
        }
        if name.starts_with("sha256:") {
            if let Some(tool) = by_name.values().find(|t| t.summary.digest == name) {
                return Ok(tool.clone());
            }
        }
        Err(FncallError::ToolNotFound(name.to_string()))
    }

    pub fn list(&self) -> Vec<ToolSummary> {
        let mut tools: Vec<_> = self.by_name.read().values().map(|t| t.summary.clone()).collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    fn save_index(&self, by_name: &HashMap<String, Arc<LoadedTool>>) -> Result<(), FncallError> {
        let mut tools: Vec<_> = by_name.values().map(|t| t.summary.clone()).collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let bytes = serde_json::to_vec_pretty(&Index { tools })
            .map_err(|e| FncallError::Internal(format!("cannot encode tool index: {e}")))?;
        write_atomic(&self.dir.join("tools.json"), &bytes)
    }
}

/// Checks the component's world and builds its pre-instantiation.
fn link(engine: &BrigEngine, component: &Component) -> Result<(ToolWorld, ToolPre), FncallError> {
    let ty = component.component_type();
    let mut world = None;
    let mut exports = Vec::new();
    for (name, item) in ty.exports(&engine.engine) {
        exports.push(name.to_string());
        if !matches!(item.ty, ComponentItem::ComponentInstance(_)) {
            continue;
        }
        if name == TOOL_EXPORT {
            world = Some(ToolWorld::Tool);
        } else if name.starts_with(COMMAND_EXPORT_PREFIX) && world.is_none() {
            world = Some(ToolWorld::Command);
        }
    }
    let world = world.ok_or_else(|| {
        FncallError::InvalidComponent(format!(
            "it exports neither {TOOL_EXPORT} nor {COMMAND_EXPORT_PREFIX}.x (exports: [{}])",
            exports.join(", ")
        ))
    })?;
    let instance_pre = engine.linker.instantiate_pre(component).map_err(|e| {
        FncallError::InvalidComponent(format!(
            "it imports something the fncall tier does not provide (only WASI 0.2 is): {e:#}"
        ))
    })?;
    let pre = match world {
        ToolWorld::Tool => ToolPre::Tool(ToolComponentPre::new(instance_pre).map_err(|e| {
            FncallError::InvalidComponent(format!(
                "its {TOOL_EXPORT} does not match the WIT: {e:#}"
            ))
        })?),
        ToolWorld::Command => ToolPre::Command(CommandPre::new(instance_pre).map_err(|e| {
            FncallError::InvalidComponent(format!(
                "its wasi:cli/run does not match WASI 0.2: {e:#}"
            ))
        })?),
    };
    Ok((world, pre))
}

fn validate_name(name: &str) -> Result<(), FncallError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(FncallError::BadToolName(name.to_string()))
    }
}

pub(crate) fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// Writes via a temporary file and rename, so readers never see a partial file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FncallError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("grep").is_ok());
        assert!(validate_name("my-tool_2.v1").is_ok());
        for bad in ["", "../x", "A", ".hidden", "a/b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }
}
