//! `files`: read, write and list files in the sandbox workspace.
//!
//! Input: `{"op":"read","path":"a.txt","offset":0,"limit":65536}`,
//! `{"op":"write","path":"a.txt","content":"...","append":false}`,
//! `{"op":"list","path":".","recursive":false}`, `{"op":"remove","path":"a.txt"}`,
//! `{"op":"mkdir","path":"dir"}`.

use brig_tool_common::{display_path, parse_input, to_output, workspace_path};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};

wit_bindgen::generate!({ world: "tool-component", path: "../../wit" });

use exports::brig::tool::tool::{Guest, Info};

/// Upper bound on bytes one `read` returns.
const MAX_READ_BYTES: u64 = 4 << 20;
/// Upper bound on entries one `list` returns.
const MAX_LIST_ENTRIES: usize = 10_000;

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Op {
    Read {
        path: String,
        #[serde(default)]
        offset: u64,
        limit: Option<u64>,
    },
    Write {
        path: String,
        content: String,
        #[serde(default)]
        append: bool,
    },
    List {
        #[serde(default = "dot")]
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    Remove {
        path: String,
    },
    Mkdir {
        path: String,
    },
}

fn dot() -> String {
    ".".to_string()
}

#[derive(Serialize)]
struct Entry {
    path: String,
    kind: &'static str,
    size: u64,
}

struct Files;

impl Guest for Files {
    fn describe() -> Info {
        Info {
            name: "files".into(),
            description: "Read, write, list, remove files and make directories in the workspace"
                .into(),
            input_schema: r#"{"type":"object","required":["op"],"properties":{"op":{"enum":["read","write","list","remove","mkdir"]},"path":{"type":"string"},"content":{"type":"string"},"append":{"type":"boolean"},"offset":{"type":"integer"},"limit":{"type":"integer"},"recursive":{"type":"boolean"}}}"#.into(),
        }
    }

    fn call(input: String) -> Result<String, String> {
        match parse_input::<Op>(&input)? {
            Op::Read { path, offset, limit } => read(&path, offset, limit),
            Op::Write { path, content, append } => write(&path, &content, append),
            Op::List { path, recursive } => list(&path, recursive),
            Op::Remove { path } => {
                let p = workspace_path(&path)?;
                let meta = std::fs::symlink_metadata(&p).map_err(|e| format!("{path}: {e}"))?;
                if meta.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) }
                    .map_err(|e| format!("{path}: {e}"))?;
                to_output(&serde_json::json!({ "removed": path }))
            }
            Op::Mkdir { path } => {
                std::fs::create_dir_all(workspace_path(&path)?)
                    .map_err(|e| format!("{path}: {e}"))?;
                to_output(&serde_json::json!({ "created": path }))
            }
        }
    }
}

fn read(path: &str, offset: u64, limit: Option<u64>) -> Result<String, String> {
    let p = workspace_path(path)?;
    let mut file = std::fs::File::open(&p).map_err(|e| format!("{path}: {e}"))?;
    let size = file.metadata().map_err(|e| format!("{path}: {e}"))?.len();
    file.seek(SeekFrom::Start(offset)).map_err(|e| format!("{path}: {e}"))?;
    let limit = limit.unwrap_or(MAX_READ_BYTES).min(MAX_READ_BYTES);
    let mut buf = Vec::new();
    file.take(limit).read_to_end(&mut buf).map_err(|e| format!("{path}: {e}"))?;
    let content = String::from_utf8(buf).map_err(|_| format!("{path}: not UTF-8 text"))?;
    let end = offset.saturating_add(content.len() as u64);
    to_output(
        &serde_json::json!({ "path": path, "size": size, "content": content, "truncated": end < size }),
    )
}

fn write(path: &str, content: &str, append: bool) -> Result<String, String> {
    let p = workspace_path(path)?;
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{path}: {e}"))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&p)
        .map_err(|e| format!("{path}: {e}"))?;
    file.write_all(content.as_bytes()).map_err(|e| format!("{path}: {e}"))?;
    to_output(&serde_json::json!({ "path": path, "written": content.len() }))
}

fn list(path: &str, recursive: bool) -> Result<String, String> {
    let root = workspace_path(path)?;
    let mut out = Vec::new();
    let mut pending = vec![root];
    while let Some(dir) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", display_path(&dir)))?;
        for entry in entries {
            let entry = entry.map_err(|e| e.to_string())?;
            let meta = entry.metadata().map_err(|e| e.to_string())?;
            let ft = meta.file_type();
            let kind = if ft.is_dir() {
                "dir"
            } else if ft.is_symlink() {
                "symlink"
            } else {
                "file"
            };
            if recursive && ft.is_dir() {
                pending.push(entry.path());
            }
            out.push(Entry { path: display_path(&entry.path()), kind, size: meta.len() });
            if out.len() >= MAX_LIST_ENTRIES {
                return to_output(&serde_json::json!({ "entries": out, "truncated": true }));
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    to_output(&serde_json::json!({ "entries": out, "truncated": false }))
}

export!(Files);
