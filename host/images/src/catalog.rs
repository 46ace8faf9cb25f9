//! The node-local catalog: layer names and versions, environments, and layer records.
//!
//! ```text
//! <store>/catalog.json        { "layers": { "base/debian-12": { "1": "<digest>", … } },
//!                               "envs": { "flask-4521": ["base/debian-12@3", …] } }
//! <store>/layers/<digest>.json   the layer record (chunks, sizes)
//! <store>/layers/<digest>.meta   the layer's EROFS meta image
//! ```
//! Names are `kind/name` paths of `[a-z0-9._-]`; versions count up from 1 per name and are
//! never reused while the name lives. A reference is `name@version`, `name` (its latest
//! version) or `sha256:<digest>`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::lazyfs::ChunkEntry;
use crate::StoreError;

/// What a layer is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerRecord {
    /// `sha256:<hex>` of the meta image and the chunk list.
    pub digest: String,
    /// Store chunks, one per 256 KiB slot of the layer's blob device.
    pub chunks: Vec<ChunkEntry>,
    /// Bytes of chunk data (what a full read would fetch).
    pub data_bytes: u64,
    pub meta_bytes: u64,
    pub files: u64,
    pub created_unix_ms: u64,
    /// How it was made (`tar`, `oci`, `dir`, `erofs`, `checkpoint of sb-…`).
    pub source: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub layers: BTreeMap<String, BTreeMap<u32, String>>,
    pub envs: BTreeMap<String, Vec<String>>,
    /// Variables of an environment, as catalogs before [`EnvConfig`] kept them (read, then
    /// moved into `configs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_variables: BTreeMap<String, Vec<(String, String)>>,
    /// How the processes of an environment's sandboxes start (a pulled image's config), by
    /// environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, EnvConfig>,
}

/// How the processes of an environment's sandboxes start: an OCI image's `Env`, `WorkingDir`,
/// `User`, `Entrypoint` and `Cmd`. A request's own values go on top.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// The directory commands start in when the request names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The user commands run as when the request names none (a name or `uid[:gid]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
}

impl EnvConfig {
    /// The image's own command (`Entrypoint` then `Cmd`), run by a command request with no
    /// arguments; empty when the image names none.
    pub fn command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self == &EnvConfig::default()
    }
}

impl Catalog {
    /// Moves variables an older catalog kept apart into [`Catalog::configs`].
    pub fn upgrade(&mut self) {
        for (name, env) in std::mem::take(&mut self.env_variables) {
            self.configs.entry(name).or_default().env = env;
        }
    }
}

/// A parsed layer reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    Name { name: String, version: Option<u32> },
    Digest(String),
}

/// Checks a layer or environment name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.split('/').all(|part| {
            !part.is_empty()
                && !part.starts_with('.')
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadName(name.to_string()))
    }
}

impl Reference {
    pub fn parse(text: &str) -> Result<Reference, StoreError> {
        if let Some(hex) = text.strip_prefix("sha256:") {
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(Reference::Digest(text.to_string()));
            }
            return Err(StoreError::BadReference(text.to_string()));
        }
        let (name, version) = match text.split_once('@') {
            Some((n, v)) => {
                (n, Some(v.parse::<u32>().map_err(|_| StoreError::BadReference(text.to_string()))?))
            }
            None => (text, None),
        };
        validate_name(name)?;
        Ok(Reference::Name { name: name.to_string(), version })
    }
}

impl Catalog {
    /// The digest a reference points to now.
    pub fn resolve(
        &self,
        reference: &Reference,
    ) -> Result<(String, Option<(String, u32)>), StoreError> {
        match reference {
            Reference::Digest(d) => Ok((d.clone(), None)),
            Reference::Name { name, version } => {
                let versions =
                    self.layers.get(name).ok_or_else(|| StoreError::NoLayer(name.clone()))?;
                let (v, digest) = match version {
                    Some(v) => (
                        *v,
                        versions
                            .get(v)
                            .ok_or_else(|| StoreError::NoLayer(format!("{name}@{v}")))?,
                    ),
                    None => versions
                        .iter()
                        .next_back()
                        .map(|(v, d)| (*v, d))
                        .ok_or_else(|| StoreError::NoLayer(name.clone()))?,
                };
                Ok((digest.clone(), Some((name.clone(), v))))
            }
        }
    }

    /// Records `digest` as `name@version` (the next version when `None`).
    pub fn add(
        &mut self,
        name: &str,
        version: Option<u32>,
        digest: &str,
    ) -> Result<u32, StoreError> {
        validate_name(name)?;
        let versions = self.layers.entry(name.to_string()).or_default();
        let v = match version {
            Some(0) => return Err(StoreError::BadReference(format!("{name}@0"))),
            Some(v) => {
                if let Some(existing) = versions.get(&v) {
                    if existing != digest {
                        return Err(StoreError::VersionTaken(format!("{name}@{v}")));
                    }
                }
                v
            }
            None => versions.keys().next_back().map_or(1, |v| v + 1),
        };
        versions.insert(v, digest.to_string());
        Ok(v)
    }

    /// Whether any name points at `digest`.
    pub fn references(&self, digest: &str) -> bool {
        self.layers.values().any(|v| v.values().any(|d| d == digest))
    }

    /// `(name, version, digest)` of every tag, sorted.
    pub fn tags(&self) -> Vec<(String, u32, String)> {
        self.layers
            .iter()
            .flat_map(|(name, versions)| {
                versions.iter().map(|(v, d)| (name.clone(), *v, d.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_versions() {
        let mut c = Catalog::default();
        assert_eq!(c.add("toolkit/harness", None, "sha256:a").expect("add"), 1);
        assert_eq!(c.add("toolkit/harness", None, "sha256:b").expect("add"), 2);
        assert_eq!(c.add("toolkit/harness", Some(17), "sha256:c").expect("add"), 17);
        assert!(c.add("toolkit/harness", Some(2), "sha256:z").is_err());
        let latest =
            c.resolve(&Reference::parse("toolkit/harness").expect("parse")).expect("resolve");
        assert_eq!(latest, ("sha256:c".into(), Some(("toolkit/harness".into(), 17))));
        let v1 =
            c.resolve(&Reference::parse("toolkit/harness@1").expect("parse")).expect("resolve");
        assert_eq!(v1.0, "sha256:a");
        for bad in ["", "Base/x", "a//b", "../x", "a@b", "x@-1", ".hidden", "sha256:zz"] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_older_catalogs_variables_become_its_env_configs() {
        let old = r#"{"layers":{},"envs":{"app":["oci/a"]},"env_variables":{"app":[["A","1"]]}}"#;
        let mut c: Catalog = serde_json::from_str(old).expect("an older catalog reads");
        c.upgrade();
        assert!(c.env_variables.is_empty());
        let config = &c.configs["app"];
        assert_eq!(config.env, [("A".to_string(), "1".to_string())]);
        assert_eq!(config.command(), Vec::<String>::new());
        let saved = serde_json::to_string(&c).expect("save");
        assert!(!saved.contains("env_variables"), "{saved}");
        let config = EnvConfig {
            entrypoint: vec!["/bin/sh".into(), "-c".into()],
            cmd: vec!["run".into()],
            ..EnvConfig::default()
        };
        assert_eq!(config.command(), ["/bin/sh", "-c", "run"]);
    }
}
