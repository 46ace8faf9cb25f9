//! Faults below brigd: a container's shim killed, the state directory's disk full, etcd
//! stopped under a cluster. Each gives the typed error it should, to the requests it
//! concerns, and nothing else is lost.

use std::time::Duration;

use brig_sdk::{Cmd, ErrorCode, ProjectLimits, SandboxOptions};
use brig_tests::cluster::Cluster;
use brig_tests::{image, Daemon};

/// The host pid of the shim of container `id` of `daemon`: the `brig-shim` in its cgroup
/// whose parent is not.
fn shim_of(daemon: &Daemon, id: &str) -> i32 {
    let procs = format!("/sys/fs/cgroup/pids/brig-0-{}/{id}/cgroup.procs", daemon.tag());
    let pids: Vec<i32> = std::fs::read_to_string(&procs)
        .unwrap_or_else(|e| panic!("{procs}: {e}"))
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(") ").next()?.split(' ').nth(1)?.parse().ok()
    };
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    *pids
        .iter()
        .find(|&&p| {
            comm(p).trim() == "brig-shim" && parent(p).is_some_and(|pp| !pids.contains(&pp))
        })
        .unwrap_or_else(|| panic!("no shim among {pids:?}"))
}

#[tokio::test]
async fn a_killed_shim_loses_its_sandbox_only() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let opts = || SandboxOptions::container(&image("busybox"));
    let victim = client.create(opts()).await.expect("create");
    let bystander = client.create(opts()).await.expect("create");
    let shim = shim_of(&daemon, victim.id());
    let killed = std::process::Command::new("kill").args(["-9", &shim.to_string()]).status();
    assert!(killed.expect("kill").success(), "kill the shim");

    // Its sandbox is lost, with the reason; the other one runs on.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        match victim.exec(["true"]).await {
            Err(e) => break e,
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(_) => panic!("a sandbox whose shim was killed still runs commands"),
        }
    };
    assert_eq!(err.code(), Some(ErrorCode::SandboxLost), "{err}");
    assert!(err.to_string().contains("shim"), "{err}");
    let out = bystander.exec_with(Cmd::shell("echo fine")).await.expect("bystander");
    assert_eq!(out.stdout_text(), "fine\n");
    assert!(victim.status().await.is_ok(), "a lost sandbox can still be looked at");
    victim.destroy().await.expect("a lost sandbox can be destroyed");
    bystander.destroy().await.expect("destroy");
    assert!(daemon.leaks().is_empty(), "{:#?}", daemon.leaks());
}

#[tokio::test]
async fn a_full_state_disk_refuses_what_needs_it_and_loses_nothing() {
    let mut daemon = Daemon::start_on_small_disk(48 << 20, &["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let opts = || SandboxOptions::container(&image("busybox"));
    let kept = client.create(opts()).await.expect("create");
    kept.write_file("/data/note", b"before").await.expect("write");

    // Fill the state directory's filesystem to the last byte.
    let fill = daemon.state_dir().join("fill");
    let filled = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("dd if=/dev/zero of={} bs=1M 2>/dev/null", fill.display()))
        .status()
        .expect("dd");
    assert!(!filled.success(), "dd should end on a full disk");

    // A create cannot be recorded: a typed error, and no half-made sandbox.
    let err = client.create(opts()).await.expect_err("a create on a full state disk");
    assert_eq!(err.code(), Some(ErrorCode::ResourceExhausted), "{err}");
    assert!(err.to_string().contains("No space left"), "{err}");
    // What is there runs on (its command output is not spooled meanwhile).
    let out = kept.exec_with(Cmd::shell("cat /data/note; echo ran")).await.expect("exec");
    assert_eq!(out.stdout_text(), "beforeran\n");
    assert_eq!(client.list(&[]).await.expect("list").len(), 1);
    assert!(daemon.is_running());

    // Space back: everything goes on, and a restart finds all of it.
    std::fs::remove_file(&fill).expect("free the disk");
    let fresh = client.create(opts()).await.expect("create once there is room");
    daemon.crash().expect("crash");
    daemon.start_again().expect("start again");
    let client = daemon.client().await.expect("reconnect");
    let mut ids: Vec<String> =
        client.list(&[]).await.expect("list").into_iter().map(|s| s.id).collect();
    ids.sort();
    let mut want = vec![kept.id().to_string(), fresh.id().to_string()];
    want.sort();
    assert_eq!(ids, want);
    let note = client.sandbox(kept.id()).read_file("/data/note").await.expect("read");
    assert_eq!(note, b"before");
    for id in &ids {
        client.sandbox(id).destroy().await.expect("destroy");
    }
    assert!(daemon.leaks().is_empty(), "{:#?}", daemon.leaks());
}

#[tokio::test]
async fn etcd_stopped_refuses_what_needs_it_and_serves_the_rest() {
    let mut cluster = Cluster::start(1, 1, &[]).expect("cluster");
    cluster.wait_healthy(1).await.expect("node up");
    let admin = brig_sdk::Client::connect(cluster.connect_options().expect("options"))
        .await
        .expect("admin");
    let limits = ProjectLimits { max_live: Some(10), max_creates_per_sec: None };
    admin.set_project("p", limits).await.expect("project");
    let token = admin.create_token("p").await.expect("token");
    let before = admin.create(SandboxOptions::fncall()).await.expect("create");

    cluster.etcd.stop();
    // What changes the cluster's shared state is refused, typed and retryable...
    let err = admin.set_project("q", limits).await.expect_err("no etcd");
    assert_eq!(err.code(), Some(ErrorCode::Unavailable), "{err}");
    // ...while sandboxes are served, and placed, from what the replica holds.
    before.status().await.expect("status without etcd");
    let call = before.call("jq", r#"{"query":"$.a","json":{"a":1}}"#).await.expect("call");
    assert!(call.is_success(), "{call:?}");
    let during = admin.create(SandboxOptions::fncall()).await.expect("create without etcd");

    cluster.etcd.start_again().expect("etcd back");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match admin.set_project("q", limits).await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("etcd back, but the project is still refused: {e}"),
        }
    }
    let projects = admin.projects().await.expect("projects");
    for name in ["p", "q"] {
        assert!(projects.iter().any(|p| p.name == name), "{name} lost: {projects:?}");
    }
    let member = cluster.client_with_token(&token).await.expect("token from before");
    member.create(SandboxOptions::fncall()).await.expect("member create");
    for sb in [before, during] {
        sb.status().await.expect("sandbox from before and during");
    }
}

/// A killed lazy file system server (`brig-lazyfs`) is replaced at once by one that takes its
/// mount over: a container that had the store layer mounted reads the pages it had not read
/// yet, whole, as well as those it had; new sandboxes read the layer in full; brigd keeps
/// running.
#[tokio::test]
async fn a_killed_lazy_server_is_taken_over_and_running_sandboxes_read_on() {
    use brig_sdk::ImageSource;
    use sha2::{Digest, Sha256};
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let tmp = tempfile::tempdir().expect("tmp");
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    std::fs::create_dir_all(tmp.path().join("data")).expect("mkdir");
    std::fs::write(tmp.path().join("data/big.bin"), &data).expect("write");
    let source = ImageSource::Dir(tmp.path().to_path_buf());
    client.import_image("workspace/fault", None, source).await.expect("import");
    let image = format!("{}+workspace/fault", image("busybox"));
    let before = client.create(SandboxOptions::container(&image)).await.expect("create");
    let head = before.exec(["sh", "-c", "head -c 4096 /data/big.bin | wc -c"]).await.expect("exec");
    assert_eq!(head.stdout_text().trim(), "4096");

    let record = std::fs::read(daemon.run_dir().join("lazyfs.pid")).expect("lazyfs.pid");
    let record: serde_json::Value = serde_json::from_slice(&record).expect("pid record");
    let pid = record["pid"].as_i64().expect("pid");
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.expect("kill").success(), "kill brig-lazyfs");

    let after = client.create(SandboxOptions::container(&image)).await.expect("create after");
    let sum = after.exec(["sha256sum", "/data/big.bin"]).await.expect("exec");
    let want = hex::encode(Sha256::digest(&data));
    assert_eq!(sum.stdout_text().split_whitespace().next(), Some(want.as_str()), "{sum:?}");
    let again = before.exec(["sh", "-c", "head -c 4096 /data/big.bin | wc -c"]).await;
    assert_eq!(again.expect("exec").stdout_text().trim(), "4096", "a page read before is kept");
    let unread = before.exec(["sh", "-c", "tail -c 100000 /data/big.bin | sha256sum"]).await;
    let unread = unread.expect("exec");
    let want = hex::encode(Sha256::digest(&data[data.len() - 100_000..]));
    assert_eq!(
        unread.stdout_text().split_whitespace().next(),
        Some(want.as_str()),
        "pages not read before the kill: {unread:?}"
    );
    let log = daemon.log_text();
    assert!(log.contains("the lazy file system server died; a new one took over its mount"));
    let record = std::fs::read(daemon.run_dir().join("lazyfs.pid")).expect("lazyfs.pid");
    let record: serde_json::Value = serde_json::from_slice(&record).expect("pid record");
    assert_ne!(record["pid"].as_i64(), Some(pid), "the killed server is still on record");
    before.destroy().await.expect("destroy");
    after.destroy().await.expect("destroy");
    assert!(daemon.leaks().is_empty(), "{:#?}", daemon.leaks());
}
