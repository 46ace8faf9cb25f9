//! The dependency rules of `ARCHITECTURE.md`, checked against the workspace's real graph.
//!
//! The rules live in the map itself, in a fenced `layering` block:
//!
//! ```text
//! brig-node -> brig-core, brig-vmtier     every workspace crate brig-node may depend on directly
//! brig-node !-> brig-vmm, kvm-ioctls       packages brig-node must never reach (dev deps aside)
//! # a comment
//! ```
//!
//! The graph comes from `cargo metadata` (its `resolve` section), so it is what Cargo builds,
//! not what a manifest seems to say.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use anyhow::{bail, Context};

/// The rules the map states.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Workspace crate → the workspace crates it may depend on directly.
    pub allowed: BTreeMap<String, BTreeSet<String>>,
    /// Crate → packages it must never reach through normal or build dependencies.
    pub never: BTreeMap<String, BTreeSet<String>>,
}

/// The dependency graph, by package name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Graph {
    /// The workspace's own crates.
    pub members: BTreeSet<String>,
    /// Package → its direct dependencies of any kind (normal, build, dev).
    pub direct: BTreeMap<String, BTreeSet<String>>,
    /// Package → its direct normal and build dependencies (what it links or runs at build).
    pub linked: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// Everything `from` reaches through normal and build dependencies.
    pub fn reach(&self, from: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([from.to_string()]);
        while let Some(next) = queue.pop_front() {
            for dep in self.linked.get(&next).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    queue.push_back(dep.clone());
                }
            }
        }
        seen
    }
}

/// Reads the `layering` block of a Markdown document.
pub fn parse_rules(markdown: &str) -> anyhow::Result<Rules> {
    let mut lines = markdown.lines();
    lines.by_ref().find(|l| l.trim() == "```layering").context("no ```layering block")?;
    let mut rules = Rules::default();
    let mut closed = false;
    for (n, raw) in lines.enumerate() {
        let line = raw.trim();
        if line == "```" {
            closed = true;
            break;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let list = |s: &str| -> BTreeSet<String> {
            s.split(',').map(str::trim).filter(|d| !d.is_empty()).map(String::from).collect()
        };
        if let Some((from, to)) = line.split_once("!->") {
            rules.never.entry(from.trim().to_string()).or_default().extend(list(to));
        } else if let Some((from, to)) = line.split_once("->") {
            let from = from.trim().to_string();
            if rules.allowed.insert(from.clone(), list(to)).is_some() {
                bail!("layering line {}: {from} has two `->` lines", n + 1);
            }
        } else {
            bail!("layering line {}: expected `A -> B, C` or `A !-> x`: {line:?}", n + 1);
        }
    }
    if !closed {
        bail!("the ```layering block is not closed");
    }
    Ok(rules)
}

/// The graph in `cargo metadata --format-version 1` output.
pub fn graph_from_metadata(metadata: &serde_json::Value) -> anyhow::Result<Graph> {
    let packages = metadata["packages"].as_array().context("metadata without packages")?;
    let name_of: BTreeMap<&str, &str> =
        packages.iter().filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?))).collect();
    let name = |id: &str| -> anyhow::Result<String> {
        name_of.get(id).map(|n| n.to_string()).with_context(|| format!("unknown package {id}"))
    };
    let mut graph = Graph::default();
    for id in metadata["workspace_members"].as_array().context("no workspace_members")? {
        graph.members.insert(name(id.as_str().context("member id")?)?);
    }
    let nodes = metadata["resolve"]["nodes"].as_array().context("metadata without resolve")?;
    for node in nodes {
        let from = name(node["id"].as_str().context("node id")?)?;
        for dep in node["deps"].as_array().into_iter().flatten() {
            let to = name(dep["pkg"].as_str().context("dep pkg")?)?;
            let kinds = dep["dep_kinds"].as_array().cloned().unwrap_or_default();
            let linked =
                kinds.is_empty() || kinds.iter().any(|k| k["kind"].as_str() != Some("dev"));
            graph.direct.entry(from.clone()).or_default().insert(to.clone());
            if linked {
                graph.linked.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    Ok(graph)
}

/// Every way `graph` breaks `rules`, one sentence each (empty: the map holds).
pub fn violations(rules: &Rules, graph: &Graph) -> Vec<String> {
    let mut found = Vec::new();
    for member in &graph.members {
        let Some(allowed) = rules.allowed.get(member) else {
            found.push(format!("{member} is not in the map (add a `{member} -> …` line)"));
            continue;
        };
        for dep in graph.direct.get(member).into_iter().flatten() {
            if graph.members.contains(dep) && !allowed.contains(dep) {
                found.push(format!("{member} depends on {dep}, which the map does not allow"));
            }
        }
    }
    for (from, allowed) in &rules.allowed {
        if !graph.members.contains(from) {
            found.push(format!("the map names {from}, which is not a workspace crate"));
        }
        for to in allowed.iter().filter(|to| !graph.members.contains(*to)) {
            found.push(format!("the map lets {from} use {to}, which is not a workspace crate"));
        }
    }
    for (from, never) in &rules.never {
        if !graph.members.contains(from) {
            found.push(format!("the map forbids edges of {from}, which is not a workspace crate"));
            continue;
        }
        let reach = graph.reach(from);
        for bad in never.intersection(&reach) {
            found.push(format!("{from} reaches {bad}, which the map forbids"));
        }
    }
    found
}

/// The workspace's graph, from `cargo metadata` run on the repository.
pub fn workspace_graph() -> anyhow::Result<Graph> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked", "--manifest-path"])
        .arg(crate::repo_root().join("Cargo.toml"))
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    graph_from_metadata(&serde_json::from_slice(&out.stdout).context("cargo metadata's JSON")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "text\n```layering\n# comment\na ->\nb -> a\nc -> a, b\nb !-> evil\n```\n";

    fn graph(edges: &[(&str, &str, bool)]) -> Graph {
        let mut g = Graph { members: ["a", "b", "c"].map(String::from).into(), ..Graph::default() };
        for (from, to, linked) in edges {
            g.direct.entry(from.to_string()).or_default().insert(to.to_string());
            if *linked {
                g.linked.entry(from.to_string()).or_default().insert(to.to_string());
            }
        }
        g
    }

    #[test]
    fn the_rules_block_is_read() {
        let rules = parse_rules(MAP).expect("rules");
        assert_eq!(rules.allowed["a"], BTreeSet::new());
        assert_eq!(rules.allowed["c"], ["a", "b"].map(String::from).into());
        assert_eq!(rules.never["b"], ["evil"].map(String::from).into());
        assert!(parse_rules("no block").is_err());
        assert!(parse_rules("```layering\na -> b\n").is_err(), "unclosed");
        assert!(parse_rules("```layering\na b\n```").is_err(), "no arrow");
    }

    #[test]
    fn a_graph_that_keeps_the_map_passes() {
        let rules = parse_rules(MAP).expect("rules");
        let g = graph(&[("b", "a", true), ("c", "b", true), ("b", "serde", true)]);
        assert_eq!(violations(&rules, &g), Vec::<String>::new());
    }

    #[test]
    fn a_forbidden_direct_edge_fails() {
        let rules = parse_rules(MAP).expect("rules");
        // a -> c is not in the map, even as a dev-dependency.
        let g = graph(&[("a", "c", false)]);
        let found = violations(&rules, &g);
        assert_eq!(found, vec!["a depends on c, which the map does not allow".to_string()]);
    }

    #[test]
    fn a_forbidden_package_reached_through_another_fails() {
        let rules = parse_rules(MAP).expect("rules");
        let g = graph(&[("b", "a", true), ("a", "helper", true), ("helper", "evil", true)]);
        assert_eq!(
            violations(&rules, &g),
            vec!["b reaches evil, which the map forbids".to_string()]
        );
        // Through a dev-dependency only, it is not linked: allowed.
        let g = graph(&[("b", "helper", false), ("helper", "evil", true)]);
        assert_eq!(violations(&rules, &g), Vec::<String>::new());
    }

    #[test]
    fn cargo_metadata_is_read_with_dev_edges_apart() {
        let json = serde_json::json!({
            "packages": [{"id": "a 1", "name": "a"}, {"id": "b 1", "name": "b"},
                         {"id": "x 1", "name": "x"}],
            "workspace_members": ["a 1", "b 1"],
            "resolve": {"nodes": [
                {"id": "a 1", "deps": [{"pkg": "b 1", "dep_kinds": [{"kind": null}]},
                                       {"pkg": "x 1", "dep_kinds": [{"kind": "dev"}]}]},
                {"id": "b 1", "deps": [{"pkg": "x 1", "dep_kinds": [{"kind": "build"}]}]},
                {"id": "x 1", "deps": []}
            ]}
        });
        let g = graph_from_metadata(&json).expect("graph");
        assert_eq!(g.members, ["a", "b"].map(String::from).into());
        assert_eq!(g.direct["a"], ["b", "x"].map(String::from).into());
        assert_eq!(g.linked["a"], ["b"].map(String::from).into());
        assert_eq!(g.reach("a"), ["b", "x"].map(String::from).into(), "x through b's build dep");
    }

    #[test]
    fn a_crate_missing_from_the_map_or_a_stale_name_fails() {
        let mut rules = parse_rules(MAP).expect("rules");
        rules.allowed.remove("c");
        rules.allowed.insert("gone".into(), BTreeSet::new());
        let found = violations(&rules, &graph(&[]));
        assert!(found.iter().any(|v| v.starts_with("c is not in the map")), "{found:?}");
        assert!(found.iter().any(|v| v.contains("names gone")), "{found:?}");
    }
}
