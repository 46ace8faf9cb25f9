//! `grep`: search workspace files by regular expression.
//!
//! Input: `{"pattern":"fn main","path":".","ignore_case":false,"max_matches":200,"suffix":".rs"}`.
//! Output: `{"matches":[{"path":"src/main.rs","line":3,"text":"fn main() {"}],"truncated":false}`.
//! Binary files (a NUL byte in the first 8 KiB) and files over 8 MiB are skipped.

use brig_tool_common::{display_path, parse_input, to_output, workspace_path};
use regex::RegexBuilder;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

wit_bindgen::generate!({ world: "tool-component", path: "../../wit" });

use exports::brig::tool::tool::{Guest, Info};

const MAX_FILE_BYTES: u64 = 8 << 20;
const MAX_LINE_CHARS: usize = 400;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    pattern: String,
    #[serde(default = "dot")]
    path: String,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default = "default_max")]
    max_matches: usize,
    /// Only files whose name ends with this, e.g. `.py`.
    suffix: Option<String>,
}

fn dot() -> String {
    ".".to_string()
}
fn default_max() -> usize {
    200
}

#[derive(Serialize)]
struct Match {
    path: String,
    line: usize,
    text: String,
}

struct Grep;

impl Guest for Grep {
    fn describe() -> Info {
        Info {
            name: "grep".into(),
            description: "Search workspace files with a regular expression".into(),
            input_schema: r#"{"type":"object","required":["pattern"],"properties":{"pattern":{"type":"string"},"path":{"type":"string"},"ignore_case":{"type":"boolean"},"max_matches":{"type":"integer"},"suffix":{"type":"string"}}}"#.into(),
        }
    }

    fn call(input: String) -> Result<String, String> {
        let input: Input = parse_input(&input)?;
        let re = RegexBuilder::new(&input.pattern)
            .case_insensitive(input.ignore_case)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| format!("bad pattern: {e}"))?;
        let mut matches = Vec::new();
        let mut files = Vec::new();
        collect_files(workspace_path(&input.path)?, &mut files)?;
        files.sort();
        let mut truncated = false;
        'files: for file in files {
            if let Some(sfx) = &input.suffix {
                if !file.to_string_lossy().ends_with(sfx.as_str()) {
                    continue;
                }
            }
            let Ok(meta) = std::fs::metadata(&file) else { continue };
            if meta.len() > MAX_FILE_BYTES {
                continue;
            }
            let Ok(bytes) = std::fs::read(&file) else { continue };
            if bytes.iter().take(8192).any(|b| *b == 0) {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            for (i, line) in text.lines().enumerate() {
                if re.is_match(line) {
                    if matches.len() >= input.max_matches {
                        truncated = true;
                        break 'files;
                    }
                    let text: String = line.chars().take(MAX_LINE_CHARS).collect();
                    matches.push(Match { path: display_path(&file), line: i + 1, text });
                }
            }
        }
        to_output(&serde_json::json!({ "matches": matches, "truncated": truncated }))
    }
}

fn collect_files(root: PathBuf, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let meta =
        std::fs::symlink_metadata(&root).map_err(|e| format!("{}: {e}", display_path(&root)))?;
    if meta.is_file() {
        out.push(root);
        return Ok(());
    }
    let mut pending = vec![root];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            if ft.is_dir() && name != ".git" {
                pending.push(entry.path());
            } else if ft.is_file() {
                out.push(entry.path());
            }
        }
    }
    Ok(())
}

export!(Grep);
