//! The rooms of a crate (its top-level modules: a folder, or one file beside `lib.rs`) and the
//! imports between them, checked for circles: a crate whose rooms import one another in a
//! circle has no order a newcomer can read it in. `lib.rs` and `error.rs` (the crate's root type,
//! which every room implements a part of, and its error, which wraps the rooms' own) are not
//! rooms.
//!
//! An import is any `crate::<room>` path on a line that is not a comment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;

/// Files beside `lib.rs` that are the crate's root, not rooms.
const NOT_ROOMS: [&str; 3] = ["lib", "main", "error"];

/// Room → the other rooms it imports from, and in which of its files.
pub type RoomEdges = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The rooms of the crate whose sources are in `src`, and what each imports from the others.
pub fn room_edges(src: &Path) -> anyhow::Result<RoomEdges> {
    let mut files: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_string) else {
            continue;
        };
        if path.is_dir() {
            files.entry(stem).or_default().extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") && !NOT_ROOMS.contains(&stem.as_str())
        {
            files.entry(stem).or_default().push(path);
        }
    }
    let rooms: BTreeSet<String> = files.keys().cloned().collect();
    let root = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let known = Known { aliases: root_aliases(&root, &rooms), rooms };
    let mut edges = RoomEdges::new();
    for (room, paths) in &files {
        let found = edges.entry(room.clone()).or_default();
        for path in paths {
            let text = std::fs::read_to_string(path)?;
            let name = path.strip_prefix(src).unwrap_or(path).display().to_string();
            for target in imported_rooms(&text, &known, &module_of(&name)) {
                if &target != room {
                    found.entry(target).or_default().insert(name.clone());
                }
            }
        }
    }
    Ok(edges)
}

/// A crate's rooms, and the names its root brings in from them (`use tiers::{fullvm, microvm}`
/// in `lib.rs` makes `crate::fullvm` a path into `tiers`).
pub struct Known {
    pub rooms: BTreeSet<String>,
    pub aliases: BTreeMap<String, String>,
}

impl Known {
    fn room_of(&self, name: &str) -> Option<String> {
        match self.rooms.contains(name) {
            true => Some(name.to_string()),
            false => self.aliases.get(name).cloned(),
        }
    }
}

/// The module path of a source file under `src` (`serve/route.rs` → `[serve, route]`,
/// `serve/mod.rs` → `[serve]`).
pub fn module_of(relative: &str) -> Vec<String> {
    let mut parts: Vec<String> =
        relative.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(out)
}

/// `text` without its line comments (a `//` outside a string literal ends the line's code).
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let (mut in_string, mut escaped, mut prev) = (false, false, ' ');
        let mut end = line.len();
        for (i, c) in line.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '/' if !in_string && prev == '/' => {
                    end = i - 1;
                    break;
                }
                _ => {}
            }
            prev = c;
        }
        out.push_str(&line[..end]);
        out.push('\n');
    }
    out
}

/// The first segment of each path a use-tree starting at `rest` names: `a::b` → `[a]`,
/// `{a::{b, c}, d}` → `[a, d]`, however the tree is spread over lines.
fn heads(rest: &str) -> Vec<String> {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let (mut depth, mut items, mut current) = (0usize, Vec::new(), String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut current));
                    continue;
                }
                _ => {}
            }
            current.push(c);
        }
        items.push(current);
        return items.iter().flat_map(|item| heads(item)).collect();
    }
    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    match name.is_empty() {
        true => Vec::new(),
        false => vec![name],
    }
}

/// The names a `use` tree brings into scope (`a::{b, c as d}` → `[b, d]`), with the first
/// segment of the path each comes through.
fn brought(tree: &str) -> Vec<(String, String)> {
    let tree = tree.trim();
    let first = heads(tree).into_iter().next().unwrap_or_default();
    let mut out = Vec::new();
    if let Some(open) = tree.find('{') {
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut depth, mut current) = (0usize, String::new());
        for c in inner.chars().chain([',']) {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    for (_, name) in brought(&std::mem::take(&mut current)) {
                        out.push((first.clone(), name));
                    }
                    continue;
                }
                _ => {}
            }
            current.push(c);
        }
    } else if !tree.is_empty() {
        let name = match tree.split_once(" as ") {
            Some((_, alias)) => alias.trim().to_string(),
            None => tree.rsplit("::").next().unwrap_or(tree).trim().to_string(),
        };
        out.push((first, name));
    }
    out
}

/// What the crate root's `use` and `pub use` lines bring in from each room.
pub fn root_aliases(root: &str, rooms: &BTreeSet<String>) -> BTreeMap<String, String> {
    let code = code_of(root);
    let mut aliases = BTreeMap::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(at) = statement.find("use ") else { continue };
        let before = statement[..at].trim();
        if !(before.is_empty() || before.starts_with("pub")) || before.contains('{') {
            continue;
        }
        let tree = statement[at + 4..].trim().trim_start_matches("crate::");
        for (head, name) in brought(tree) {
            if rooms.contains(&head) && !rooms.contains(&name) {
                aliases.insert(name, head);
            }
        }
    }
    aliases
}

/// The rooms `text` (the source of module `module`) names through `crate::` paths, `super::`
/// paths that climb to the crate root, and the root's aliases, outside comments.
pub fn imported_rooms(text: &str, known: &Known, module: &[String]) -> BTreeSet<String> {
    let code = code_of(text);
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let starts_path = |at: usize| {
        at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || matches!(bytes[at - 1], b'_' | b':'))
    };
    for (at, _) in code.match_indices("crate::") {
        if starts_path(at) {
            found.extend(heads(&code[at + 7..]).iter().filter_map(|h| known.room_of(h)));
        }
    }
    for (at, _) in code.match_indices("super::") {
        if !starts_path(at) {
            continue;
        }
        let mut rest = &code[at..];
        let mut climbs = 0;
        while let Some(next) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = next;
        }
        // `super` of a module `[a, b]` is `a`; climbing past the room reaches the root.
        if climbs >= module.len() {
            found.extend(heads(rest).iter().filter_map(|h| known.room_of(h)));
        }
    }
    found
}

/// Every circle among the rooms, each as the rooms on it and the files that close it: one line
/// per circle, none when the rooms are a hierarchy.
pub fn circles(edges: &RoomEdges) -> Vec<String> {
    let mut found = BTreeSet::new();
    for start in edges.keys() {
        // Paths from `start` back to itself, shortest first (breadth first over the rooms).
        let mut queue = std::collections::VecDeque::from([vec![start.clone()]]);
        let mut seen = BTreeSet::new();
        while let Some(path) = queue.pop_front() {
            let last = path.last().expect("a path has a room");
            for next in edges.get(last).into_iter().flat_map(BTreeMap::keys) {
                if next == start {
                    let mut circle = path.clone();
                    // One name per circle, whichever room it is found from.
                    let least = (0..circle.len()).min_by_key(|i| &circle[*i]).unwrap_or(0);
                    circle.rotate_left(least);
                    let hops: Vec<String> = (0..circle.len())
                        .map(|i| {
                            let (a, b) = (&circle[i], &circle[(i + 1) % circle.len()]);
                            let files = &edges[a][b];
                            format!(
                                "{a} -> {b} ({})",
                                files.iter().cloned().collect::<Vec<_>>().join(", ")
                            )
                        })
                        .collect();
                    found.insert(hops.join("; "));
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    queue.push_back(longer);
                }
            }
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rooms(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn edges(pairs: &[(&str, &str)]) -> RoomEdges {
        let mut e = RoomEdges::new();
        for (a, b) in pairs {
            e.entry(a.to_string())
                .or_default()
                .entry(b.to_string())
                .or_default()
                .insert(format!("{a}/x.rs"));
            e.entry(b.to_string()).or_default();
        }
        e
    }

    fn known(names: &[&str]) -> Known {
        Known { rooms: rooms(names), aliases: BTreeMap::new() }
    }

    #[test]
    fn imports_are_read_from_paths_and_braces_not_comments_or_strings() {
        let text = "use crate::table::sandboxes::SandboxEntry;\n\
                    use crate::{host, Node};\n\
                    // crate::serve is only mentioned here\n\
                    //! and crate::policy here\n\
                    let x = crate::limits::Gauge::default(); // crate::tiers in a tail comment\n\
                    let s = \"a // crate::convert-ish text\";\n";
        let all = known(&["table", "host", "serve", "policy", "limits", "tiers"]);
        let module = ["serve".to_string(), "x".to_string()];
        assert_eq!(imported_rooms(text, &all, &module), rooms(&["table", "host", "limits"]));
    }

    #[test]
    fn use_lists_over_lines_nested_braces_super_paths_and_root_aliases_are_read() {
        let text = "use crate::{\n    env::{a::{b, c}, d},\n    serve::x,\n};\n\
                    use super::super::policy::Rule;\n\
                    use super::sibling::Thing;\n\
                    let m = crate::fullvm::start();\n";
        let mut all = known(&["env", "serve", "policy", "tiers", "table"]);
        all.aliases = root_aliases(
            "mod tiers;\nuse tiers::{container_host, fullvm, microvm};\npub use table::scope::{Principal as P};\n",
            &all.rooms,
        );
        assert_eq!(all.aliases.get("fullvm").map(String::as_str), Some("tiers"));
        assert_eq!(all.aliases.get("P").map(String::as_str), Some("table"));
        let module = ["table".to_string(), "x".to_string()];
        assert_eq!(
            imported_rooms(text, &all, &module),
            rooms(&["env", "serve", "policy", "tiers"]),
            "super::sibling stays in the room"
        );
        // From a leaf beside lib.rs, one `super` is the root.
        let leaf = ["limits".to_string()];
        assert_eq!(imported_rooms("use super::serve::Y;", &all, &leaf), rooms(&["serve"]));
        assert_eq!(module_of("serve/mod.rs"), vec!["serve".to_string()]);
    }

    #[test]
    fn a_hierarchy_has_no_circles_and_a_circle_is_named_once_with_its_files() {
        assert!(
            circles(&edges(&[("serve", "table"), ("table", "host"), ("serve", "host")])).is_empty()
        );
        let found =
            circles(&edges(&[("serve", "table"), ("table", "policy"), ("policy", "serve")]));
        assert_eq!(
            found,
            vec!["policy -> serve (policy/x.rs); serve -> table (serve/x.rs); table -> policy (table/x.rs)"
                .to_string()]
        );
    }
}
