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
    let mut edges = RoomEdges::new();
    for (room, paths) in &files {
        let found = edges.entry(room.clone()).or_default();
        for path in paths {
            let text = std::fs::read_to_string(path)?;
            let name = path.strip_prefix(src).unwrap_or(path).display().to_string();
            for target in imported_rooms(&text, &rooms) {
                if &target != room {
                    found.entry(target).or_default().insert(name.clone());
                }
            }
        }
    }
    Ok(edges)
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

/// The rooms `text` names as `crate::<room>` outside comments.
pub fn imported_rooms(text: &str, rooms: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split(" //").next().unwrap_or(code);
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let name: String =
                rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            // `crate::{a, b}`: each name in the braces.
            if name.is_empty() && rest.starts_with('{') {
                let inner = rest[1..].split('}').next().unwrap_or_default();
                for part in inner.split(',') {
                    let head = part.trim().split("::").next().unwrap_or_default();
                    if rooms.contains(head) {
                        found.insert(head.to_string());
                    }
                }
            } else if rooms.contains(&name) {
                found.insert(name);
            }
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

    #[test]
    fn imports_are_read_from_paths_and_braces_not_comments() {
        let text = "use crate::table::sandboxes::SandboxEntry;\n\
                    use crate::{host, Node};\n\
                    // crate::serve is only mentioned here\n\
                    //! and crate::policy here\n\
                    let x = crate::limits::Gauge::default(); // crate::tiers in a tail comment\n";
        let all = rooms(&["table", "host", "serve", "policy", "limits", "tiers"]);
        assert_eq!(imported_rooms(text, &all), rooms(&["table", "host", "limits"]));
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
