//! Volumes on a cluster: a volume is made on one node (its id names it), listed from every
//! node, written and read on its node directly, seen only by its project, and a sandbox that
//! mounts it is placed on its node; volumes of two nodes cannot be mounted together.

use brig_sdk::{ErrorCode, ProjectLimits, SandboxOptions};
use brig_tests::cluster::{node_of, Cluster};
use brig_tests::image;

fn volume_node(id: &str) -> u32 {
    let hex = id.strip_prefix("vol-").and_then(|r| r.get(..8)).expect("a volume id");
    u32::from_str_radix(hex, 16).expect("hex")
}

#[tokio::test]
async fn a_sandbox_that_mounts_a_volume_is_placed_on_its_node() {
    let cluster = Cluster::start(1, 2, &[]).expect("cluster");
    cluster.wait_healthy(2).await.expect("nodes up");
    let admin = cluster.admin().await.expect("admin");
    admin.set_project("vols", ProjectLimits::default()).await.expect("project");
    admin.set_project("other", ProjectLimits::default()).await.expect("project");
    let team = cluster
        .client_with_token(&admin.create_token("vols").await.expect("token"))
        .await
        .expect("team");
    let other = cluster
        .client_with_token(&admin.create_token("other").await.expect("token"))
        .await
        .expect("other");

    // Made until two nodes hold one each (placement spreads them).
    let mut made = Vec::new();
    for i in 0..12 {
        let v = team.create_volume(&format!("v{i}"), Some(32)).await.expect("create");
        made.push(v);
        let nodes: std::collections::BTreeSet<u32> =
            made.iter().map(|v| volume_node(&v.id)).collect();
        if nodes.len() == 2 {
            break;
        }
    }
    let first = &made[0];
    let elsewhere = made.iter().find(|v| volume_node(&v.id) != volume_node(&first.id));

    // Listed from every node, for its project only.
    let listed: Vec<String> =
        team.volumes().await.expect("list").into_iter().map(|v| v.id).collect();
    assert_eq!(listed.len(), made.len(), "{listed:?}");
    assert!(other.volumes().await.expect("list").is_empty());
    let hidden = other.volume_info(&first.id).await.expect_err("another project's");
    assert_eq!(hidden.code(), Some(ErrorCode::NotFound), "{hidden:?}");
    let hidden = other.volume(&first.id).read_file("/x").await.expect_err("another project's file");
    assert_eq!(hidden.code(), Some(ErrorCode::NotFound), "{hidden:?}");

    // Written by name (its id looked up, the bytes sent to its node), mounted by name.
    team.volume(&first.name).write_file("/hello.txt", b"from the cluster\n").await.expect("write");
    let sb = team
        .create(SandboxOptions::container(&image("busybox")).volume(&first.name, "/data", false))
        .await
        .expect("create with a volume");
    assert_eq!(node_of(sb.id()), volume_node(&first.id), "placed on the volume's node");
    let out = sb.exec(["cat", "/data/hello.txt"]).await.expect("exec");
    assert_eq!(out.stdout_text(), "from the cluster\n");
    let busy = team.delete_volume(&first.name).await.expect_err("mounted");
    assert_eq!(busy.code(), Some(ErrorCode::Conflict), "{busy:?}");
    let sb_id = sb.id().to_string();
    sb.destroy().await.expect("destroy");

    // Lifecycle events through the control plane: every node's, for the project only.
    let read = brig_sdk::EventsRequest { limit: 100, newest_first: true, ..Default::default() };
    let events = team.events(read.clone()).await.expect("events");
    let mine: Vec<&str> =
        events.iter().filter(|e| e.sandbox == sb_id).map(|e| e.event.as_str()).collect();
    assert_eq!(mine, ["created", "destroyed"], "{events:?}");
    assert!(other.events(read).await.expect("events").iter().all(|e| e.sandbox != sb_id));

    // Volumes of two nodes: the create says why not.
    if let Some(second) = elsewhere {
        let opts = SandboxOptions::container(&image("busybox"))
            .volume(&first.name, "/a", false)
            .volume(&second.name, "/b", false);
        let refused = team.create(opts).await.expect_err("two nodes' volumes");
        assert_eq!(refused.code(), Some(ErrorCode::BadRequest), "{refused:?}");
        assert!(refused.to_string().contains("different nodes"), "{refused}");
    }
    let missing = team
        .create(SandboxOptions::container(&image("busybox")).volume("nope", "/a", false))
        .await
        .expect_err("no such volume");
    assert_eq!(missing.code(), Some(ErrorCode::NotFound), "{missing:?}");

    for v in &made {
        team.delete_volume(&v.name).await.expect("delete");
    }
    assert!(team.volumes().await.expect("list").is_empty());
}
