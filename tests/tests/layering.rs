//! The crate map holds itself: the workspace's real dependency graph (`cargo metadata`) keeps
//! every rule of the `layering` block in ARCHITECTURE.md. The checker's own tests, which feed it
//! fake graphs with forbidden edges, are in `brig_tests::layering`.

use brig_tests::layering;

#[test]
fn the_workspace_keeps_the_dependency_rules_of_the_map() -> anyhow::Result<()> {
    let map = std::fs::read_to_string(brig_tests::repo_root().join("ARCHITECTURE.md"))?;
    let rules = layering::parse_rules(&map)?;
    let graph = layering::workspace_graph()?;
    assert!(graph.members.len() >= 20, "the workspace has {} crates", graph.members.len());
    let found = layering::violations(&rules, &graph);
    assert!(
        found.is_empty(),
        "ARCHITECTURE.md's dependency rules are broken:\n{}",
        found.join("\n")
    );
    Ok(())
}

#[test]
fn the_node_crates_rooms_import_one_another_without_circles() -> anyhow::Result<()> {
    let src = brig_tests::repo_root().join("host/node/src");
    let edges = brig_tests::rooms::room_edges(&src)?;
    for room in ["serve", "table", "policy", "host", "tiers", "environments", "execs", "lifecycle"]
    {
        assert!(edges.contains_key(room), "brig-node has no room {room}: {:?}", edges.keys());
    }
    let found = brig_tests::rooms::circles(&edges);
    assert!(found.is_empty(), "brig-node's rooms import in circles:\n{}", found.join("\n"));
    Ok(())
}
