//! `patch`: apply a unified diff (one or many files, `git diff` output included) to the workspace.
//!
//! Input: `{"patch":"--- a/x\n+++ b/x\n@@ ...","strip":1,"dry_run":false}`.
//! All files are checked before any is written: a patch that does not apply changes nothing.
//! `--- /dev/null` creates a file, `+++ /dev/null` deletes one.

use brig_tool_common::{parse_input, to_output, workspace_path};
use serde::Deserialize;
use std::path::PathBuf;

wit_bindgen::generate!({ world: "tool-component", path: "../../wit" });

use exports::brig::tool::tool::{Guest, Info};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    patch: String,
    /// Leading path components to strip from file names, as `patch -p`.
    #[serde(default = "one")]
    strip: usize,
    #[serde(default)]
    dry_run: bool,
}

fn one() -> usize {
    1
}

/// What applying one file's section will do.
enum Change {
    Write { path: PathBuf, shown: String, content: String, created: bool },
    Delete { path: PathBuf, shown: String },
}

struct PatchTool;

impl Guest for PatchTool {
    fn describe() -> Info {
        Info {
            name: "patch".into(),
            description: "Apply a unified diff to files in the workspace (all or nothing)".into(),
            input_schema: r#"{"type":"object","required":["patch"],"properties":{"patch":{"type":"string"},"strip":{"type":"integer"},"dry_run":{"type":"boolean"}}}"#.into(),
        }
    }

    fn call(input: String) -> Result<String, String> {
        let input: Input = parse_input(&input)?;
        let sections = split_sections(&input.patch);
        if sections.is_empty() {
            return Err("no file sections (`--- a` / `+++ b` lines) in patch".into());
        }
        let mut changes = Vec::new();
        for section in &sections {
            changes.push(plan(section, input.strip)?);
        }
        let mut report = Vec::new();
        for change in changes {
            match change {
                Change::Write { path, shown, content, created } => {
                    if !input.dry_run {
                        if let Some(parent) = path.parent() {
                            std::fs::create_dir_all(parent).map_err(|e| format!("{shown}: {e}"))?;
                        }
                        std::fs::write(&path, content).map_err(|e| format!("{shown}: {e}"))?;
                    }
                    let action = if created { "created" } else { "modified" };
                    report.push(serde_json::json!({ "path": shown, "action": action }));
                }
                Change::Delete { path, shown } => {
                    if !input.dry_run {
                        std::fs::remove_file(&path).map_err(|e| format!("{shown}: {e}"))?;
                    }
                    report.push(serde_json::json!({ "path": shown, "action": "deleted" }));
                }
            }
        }
        to_output(&serde_json::json!({ "files": report, "dry_run": input.dry_run }))
    }
}

/// Splits a multi-file diff into per-file sections starting at their `--- ` line.
fn split_sections(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut sections = Vec::new();
    let mut current: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        let starts_file = line.starts_with("--- ")
            && lines.get(i + 1).is_some_and(|next| next.starts_with("+++ "));
        if starts_file {
            if let Some(done) = current.take() {
                sections.push(done);
            }
            current = Some(String::new());
        } else if line.starts_with("diff --git ") {
            if let Some(done) = current.take() {
                sections.push(done);
            }
            continue;
        }
        if let Some(cur) = current.as_mut() {
            cur.push_str(line);
        }
    }
    if let Some(done) = current {
        sections.push(done);
    }
    sections
}

fn header_path(name: &str, strip: usize) -> Option<String> {
    let name = name.split('\t').next().unwrap_or(name).trim();
    if name == "/dev/null" {
        return None;
    }
    let parts: Vec<&str> = name.split('/').collect();
    Some(parts[strip.min(parts.len().saturating_sub(1))..].join("/"))
}

fn plan(section: &str, strip: usize) -> Result<Change, String> {
    let patch = diffy::Patch::from_str(section).map_err(|e| format!("cannot parse patch: {e}"))?;
    let old = patch.original().and_then(|n| header_path(n, strip));
    let new = patch.modified().and_then(|n| header_path(n, strip));
    match (old, new) {
        (None, None) => Err("patch section names no file".into()),
        (Some(old), None) => {
            let path = workspace_path(&old)?;
            let base = std::fs::read_to_string(&path).map_err(|e| format!("{old}: {e}"))?;
            diffy::apply(&base, &patch).map_err(|e| format!("{old}: {e}"))?;
            Ok(Change::Delete { path, shown: old })
        }
        (old, Some(new)) => {
            let created = old.is_none();
            let base = match &old {
                Some(o) => {
                    let p = workspace_path(o)?;
                    std::fs::read_to_string(&p).map_err(|e| format!("{o}: {e}"))?
                }
                None => String::new(),
            };
            let content = diffy::apply(&base, &patch).map_err(|e| format!("{new}: {e}"))?;
            Ok(Change::Write { path: workspace_path(&new)?, shown: new, content, created })
        }
    }
}

export!(PatchTool);
