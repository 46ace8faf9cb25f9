//! The cluster: etcd, two control-plane replicas and three nodes, all real processes on
//! loopback. Placement spreads sandboxes, data-plane requests go straight to nodes with signed
//! tokens, a lost node fails its sandboxes clearly, a lost replica loses nothing, and project
//! quotas refuse with clear errors.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brig_proto::{ControlOp, Reply, Request};
use brig_sdk::{ErrorCode, Pin, ProjectLimits, SandboxOptions};
use brig_tests::cluster::{node_of, Cluster};
use brig_tests::image;
use brig_transport::{CertPin, ClientConnection};

fn spread(ids: &[String]) -> BTreeMap<u32, usize> {
    let mut by_node = BTreeMap::new();
    for id in ids {
        *by_node.entry(node_of(id)).or_default() += 1;
    }
    by_node
}

async fn connect(
    addr: &std::net::SocketAddr,
    pin: &Pin,
    token: &str,
) -> anyhow::Result<ClientConnection> {
    let Pin::Sha256(hex) = pin else { anyhow::bail!("pin is not a fingerprint") };
    Ok(ClientConnection::connect_current(*addr, &CertPin::from_hex(hex)?, token).await?)
}

#[tokio::test]
async fn placement_spreads_routes_go_direct_and_quotas_refuse() {
    let cluster = Cluster::start(2, 3, &[]).expect("cluster");
    cluster.wait_healthy(3).await.expect("nodes up");
    let admin = cluster.admin().await.expect("admin");
    assert!(admin.is_cluster());

    // Creates spread over the nodes; the sandbox ids name them.
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(admin.create(SandboxOptions::fncall()).await.expect("create").id().to_string());
    }
    let by_node = spread(&ids);
    assert!(by_node.len() >= 2, "all on one node: {by_node:?}");
    assert!(by_node.keys().all(|n| (1..=3).contains(n)), "{by_node:?}");

    // Files and calls go to the owning node directly.
    let sb = admin.sandbox(&ids[0]);
    sb.write_file("notes.txt", b"hello cluster\n").await.expect("write");
    assert_eq!(sb.read_file("notes.txt").await.expect("read"), b"hello cluster\n");

    // A container lands on a node too, and exec streams from it.
    let c = admin.create(SandboxOptions::container(&image("busybox"))).await.expect("container");
    let out = c.exec(["echo", "from a node"]).await.expect("exec");
    assert_eq!(out.stdout_text(), "from a node\n");
    c.destroy().await.expect("destroy");

    // A new worker that only knows the id reconnects through the control plane's route.
    let worker = cluster.admin().await.expect("worker");
    let info = worker.sandbox(&ids[1]).status().await.expect("status by id");
    assert_eq!(info.id, ids[1]);
    let listed = worker.list(&[]).await.expect("list");
    assert!(ids.iter().all(|id| listed.iter().any(|s| &s.id == id)), "list misses sandboxes");

    // One-shot calls: the first go through the control plane, then straight to nodes.
    for _ in 0..40 {
        let r = admin.call("jq", r#"{"query":"$.a","json":{"a":1}}"#).await.expect("call");
        assert!(r.is_success(), "{r:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let hops = admin.call_hops();
    assert!(hops.direct > 0 && hops.via_control > 0, "{hops:?}");

    // Node tokens: the control plane signs one per node and project; a node admits only its
    // own, unaltered.
    let control = cluster.controls[0].connect_options().expect("control");
    let raw = connect(&control.addr, &control.pin, &control.token).await.expect("raw control");
    let route =
        match raw.request(&Request::Control(ControlOp::Route { sandbox: ids[0].clone() })).await {
            Ok(Reply::Route(route)) => route,
            other => panic!("route: {other:?}"),
        };
    let owner = &cluster.nodes[(node_of(&ids[0]) - 1) as usize];
    let other = &cluster.nodes[(node_of(&ids[0]) % 3) as usize];
    let (owner_opts, other_opts) =
        (owner.connect_options().expect("owner"), other.connect_options().expect("other"));
    connect(&owner_opts.addr, &owner_opts.pin, &route.token).await.expect("token admits owner");
    let refused = connect(&other_opts.addr, &other_opts.pin, &route.token).await;
    assert!(refused.is_err(), "a token for one node opened another");
    let mut tampered = route.token.clone();
    let last = tampered.pop().expect("char");
    tampered.push(if last == '0' { '1' } else { '0' });
    assert!(connect(&owner_opts.addr, &owner_opts.pin, &tampered).await.is_err(), "tampered");

    // A bad token is refused at the control plane.
    let err = cluster.client_with_token(&"0".repeat(64)).await.expect_err("refused");
    assert!(err.to_string().contains("cannot connect"), "{err}");

    // Projects: team may hold 3 live sandboxes, team/a is under it.
    admin
        .set_project("team", ProjectLimits { max_live: Some(3), max_creates_per_sec: None })
        .await
        .expect("project");
    admin.set_project("team/a", ProjectLimits::default()).await.expect("sub-project");
    let token = admin.create_token("team/a").await.expect("token");
    let member = cluster.client_with_token(&token).await.expect("member");
    // Each token knows whom it speaks for (the E2B gateway scopes templates by it).
    let who = member.whoami().await.expect("whoami");
    assert_eq!((who.project.as_deref(), who.admin), (Some("team/a"), false));
    let who = admin.whoami().await.expect("whoami");
    assert_eq!((who.project, who.admin), (None, true));
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(member.create(SandboxOptions::fncall()).await.expect("within quota"));
    }
    let err = member.create(SandboxOptions::fncall()).await.expect_err("over quota");
    assert_eq!(err.code(), Some(ErrorCode::QuotaExceeded), "{err}");
    assert!(err.to_string().contains("\"team\"") && err.to_string().contains("3 live"), "{err}");
    // The project sees its own sandboxes only.
    let visible = member.list(&[]).await.expect("list");
    assert_eq!(visible.len(), 3, "{visible:?}");
    let err = member.sandbox(&ids[0]).status().await.expect_err("not ours");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
    // Admin-only requests are refused.
    let err = member.create_token("team").await.expect_err("not admin");
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    // Destroying one frees a slot once the node's heartbeat shows it.
    mine.pop().expect("one").destroy().await.expect("destroy");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match member.create(SandboxOptions::fncall()).await {
            Ok(_) => break,
            Err(e) if e.code() == Some(ErrorCode::QuotaExceeded) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("create after destroy: {e}"),
        }
    }

    // Creation rate: 2 per second, shared by the two replicas.
    admin
        .set_project("burst", ProjectLimits { max_live: None, max_creates_per_sec: Some(2) })
        .await
        .expect("project");
    let burst_token = admin.create_token("burst").await.expect("token");
    let burst = cluster.client_with_token(&burst_token).await.expect("burst client");
    let mut refused = None;
    for _ in 0..6 {
        if let Err(e) = burst.create(SandboxOptions::fncall()).await {
            refused = Some(e);
            break;
        }
    }
    let err = refused.expect("rate limit hit");
    assert_eq!(err.code(), Some(ErrorCode::QuotaExceeded), "{err}");
    assert!(err.to_string().contains("creates per second"), "{err}");

    // The CLI speaks to the control plane too.
    let brig = |args: &[&str]| {
        let out = std::process::Command::new(brig_tests::binary("brig"))
            .arg("--state-dir")
            .arg(cluster.controls[1].state_dir())
            .args(args)
            .output()
            .expect("brig");
        assert!(out.status.success(), "brig {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let nodes: serde_json::Value =
        serde_json::from_str(&brig(&["--json", "cluster"])).expect("cluster json");
    assert_eq!(nodes.as_array().map(Vec::len), Some(3), "{nodes}");
    brig(&["project", "set", "cli", "--max-live", "7"]);
    let listed = brig(&["project", "list"]);
    assert!(
        listed.lines().any(|l| l.starts_with("cli ") && l.contains("max_live      7")),
        "{listed}"
    );
    // `brig token`: this CLI's token as an E2B API key; with a project, a new one for it (an
    // E2B API key too) that admits a client scoped to the project.
    let own = brig(&["token"]);
    let file = std::fs::read_to_string(cluster.controls[1].state_dir().join("access-token"))
        .expect("token file");
    let secret = file.lines().next().expect("a token").trim_start_matches("e2b_");
    assert_eq!(own.trim(), format!("e2b_{secret}"));
    let made = brig(&["token", "cli"]);
    assert!(made.trim().starts_with("e2b_"), "{made}");
    let scoped = cluster.client_with_token(made.trim()).await.expect("the new token admits");
    assert_eq!(scoped.whoami().await.expect("whoami").project.as_deref(), Some("cli"));
}

#[tokio::test]
async fn a_lost_node_fails_its_sandboxes_and_placement_moves_on() {
    let mut cluster = Cluster::start(1, 3, &[]).expect("cluster");
    cluster.wait_healthy(3).await.expect("nodes up");
    let admin = cluster.admin().await.expect("admin");
    let mut ids = Vec::new();
    while spread(&ids).get(&1).copied().unwrap_or(0) == 0 {
        ids.push(admin.create(SandboxOptions::fncall()).await.expect("create").id().to_string());
        assert!(ids.len() < 60, "nothing landed on node 1");
    }
    let on_one = ids.iter().find(|id| node_of(id) == 1).expect("on node 1").clone();

    cluster.nodes[0].crash().expect("kill node 1");
    let started = Instant::now();
    // Within seconds the control plane marks it down and its sandboxes are reported lost.
    let err = loop {
        let fresh = cluster.admin().await.expect("client");
        match fresh.sandbox(&on_one).status().await {
            Err(e) if e.code() == Some(ErrorCode::SandboxLost) => break e,
            _ if started.elapsed() > Duration::from_secs(15) => panic!("node 1 never marked down"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert!(err.to_string().contains("stopped heartbeating"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(12), "took {:?}", started.elapsed());
    // The client that held a connection to node 1 gets the same clear error.
    let err = admin.sandbox(&on_one).status().await.expect_err("lost");
    assert_eq!(err.code(), Some(ErrorCode::SandboxLost), "{err}");
    let status = admin.cluster_status().await.expect("status");
    assert!(status.iter().any(|n| n.node == 1 && !n.healthy), "{status:?}");

    // New creates land elsewhere.
    for _ in 0..8 {
        let sb = admin.create(SandboxOptions::fncall()).await.expect("create");
        assert_ne!(node_of(sb.id()), 1);
    }

    // The node rejoins cleanly and takes work again.
    cluster.nodes[0].start_again().expect("restart node 1");
    cluster.wait_healthy(3).await.expect("rejoined");
    let mut landed = false;
    for _ in 0..30 {
        let sb = admin.create(SandboxOptions::fncall()).await.expect("create");
        if node_of(sb.id()) == 1 {
            landed = true;
            break;
        }
    }
    assert!(landed, "the rejoined node got no placements");
}

#[tokio::test]
async fn losing_a_control_replica_loses_nothing() {
    let mut cluster = Cluster::start(2, 2, &[]).expect("cluster");
    cluster.wait_healthy(2).await.expect("nodes up");
    let mut opts = cluster.connect_options().expect("options");
    opts.failover_after = Duration::from_secs(2);
    let admin = brig_sdk::Client::connect(opts).await.expect("admin");
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(admin.create(SandboxOptions::fncall()).await.expect("create").id().to_string());
    }
    admin
        .set_project("p", ProjectLimits { max_live: Some(100), max_creates_per_sec: None })
        .await
        .expect("project");
    let token = admin.create_token("p").await.expect("token");

    cluster.controls[0].crash().expect("kill replica 0");
    // Existing sandboxes answer (the data path never touched the control plane).
    for id in &ids {
        admin.sandbox(id).status().await.expect("status after replica loss");
    }
    // Creates, lists and the project state go on through the other replica.
    let sb = admin.create(SandboxOptions::fncall()).await.expect("create via replica 1");
    ids.push(sb.id().to_string());
    let listed = admin.list(&[]).await.expect("list");
    assert!(ids.iter().all(|id| listed.iter().any(|s| &s.id == id)));
    let projects = admin.projects().await.expect("projects");
    assert!(projects.iter().any(|p| p.name == "p" && p.limits.max_live == Some(100)));
    // A token made through the lost replica still works (it lives in etcd).
    let member = cluster.client_with_token(&token).await.expect("member via replica 1");
    member.create(SandboxOptions::fncall()).await.expect("member create");
}
