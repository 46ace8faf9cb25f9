//! File metadata and directory watches through the native SDK, on containers: metadata is kept
//! with a file (an extended attribute), replaced whole and cleared, and
//! follows a rename; a recursive watch sees what commands in the sandbox do as they do it,
//! folders made later included; a sandbox holds at most `limits.watches_per_sandbox` watches
//! (a typed error past it, a slot given back when a watch is dropped); and a watch ends when
//! its sandbox does, leaving no process behind.

use std::collections::BTreeMap;
use std::time::Duration;

use brig_sdk::{ErrorCode, FileChange, FileEvent, FileWatch, Sandbox, SandboxOptions};
use brig_tests::{image, Daemon};

async fn shell(sb: &Sandbox, script: &str) -> String {
    let out = sb.exec(["sh", "-c", script]).await.expect("exec");
    assert_eq!(out.result.exit_code, Some(0), "{script}: {}", out.stderr_text());
    out.stdout_text()
}

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Events from `watch` until one is `path` with `change`, or 10 s pass.
async fn until(watch: &mut FileWatch, path: &str, change: FileChange) -> Vec<FileEvent> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.iter().any(|e: &FileEvent| e.path == path && e.change == change) {
        let batch = tokio::time::timeout_at(deadline, watch.next_batch())
            .await
            .unwrap_or_else(|_| panic!("no {path} {change:?} within 10 s: {seen:?}"))
            .expect("watch")
            .unwrap_or_else(|| panic!("the watch ended before {path} {change:?}: {seen:?}"));
        assert!(!batch.lost, "{seen:?}");
        seen.extend(batch.events);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_stays_with_files_and_watches_see_changes_as_they_happen() {
    let daemon =
        Daemon::start_with_config("[limits]\nwatches_per_sandbox = 2\n", &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");

    // Metadata: kept, lowercased, replaced whole, following a rename, readable inside.
    sb.write_file("/tmp/m.txt", b"m").await.expect("write");
    let set = sb.set_file_metadata("/tmp/m.txt", meta(&[("Owner", "ann")])).await.expect("set");
    assert_eq!(set.metadata, meta(&[("owner", "ann")]));
    let both = meta(&[("owner", "bob"), ("stage", "eval")]);
    sb.set_file_metadata("/tmp/m.txt", both.clone()).await.expect("replace");
    shell(&sb, "mv /tmp/m.txt /tmp/n.txt").await;
    assert_eq!(sb.stat("/tmp/n.txt").await.expect("stat").metadata, both);
    let listed = sb.list_dir("/tmp").await.expect("list");
    let n = listed.iter().find(|e| e.path.ends_with("/n.txt")).expect("n.txt listed");
    assert_eq!(n.metadata, both);
    let cleared = sb.set_file_metadata("/tmp/n.txt", BTreeMap::new()).await.expect("clear");
    assert!(cleared.metadata.is_empty(), "{cleared:?}");
    let bad = sb.set_file_metadata("/tmp/n.txt", meta(&[("a b", "x")])).await.expect_err("bad");
    assert_eq!(bad.code(), Some(ErrorCode::BadRequest), "{bad:?}");
    let fifo = shell(&sb, "mkfifo /tmp/fifo && echo made").await;
    assert_eq!(fifo.trim(), "made");
    let refused = sb.set_file_metadata("/tmp/fifo", meta(&[("k", "v")])).await.expect_err("fifo");
    assert_eq!(refused.code(), Some(ErrorCode::BadRequest), "{refused:?}");

    // A recursive watch: every kind of change, short-lived files, a tree made at once.
    shell(&sb, "mkdir -p /w").await;
    let mut watch = sb.watch("/w", true).await.expect("watch");
    shell(&sb, "cd /w && echo 1 > f && chmod 600 f && mv f g && touch brief && rm brief").await;
    shell(&sb, "mkdir -p /w/a/b && echo deep > /w/a/b/deep.txt").await;
    let seen = until(&mut watch, "/w/a/b/deep.txt", FileChange::Create).await;
    let saw =
        |path: &str, change: FileChange| seen.iter().any(|e| e.path == path && e.change == change);
    for (path, change) in [
        ("/w/f", FileChange::Create),
        ("/w/f", FileChange::Write),
        ("/w/f", FileChange::Chmod),
        ("/w/f", FileChange::Rename),
        ("/w/g", FileChange::Create),
        ("/w/brief", FileChange::Create),
        ("/w/brief", FileChange::Remove),
        ("/w/a", FileChange::Create),
    ] {
        assert!(saw(path, change), "{path} {change:?} missing from {seen:?}");
    }
    assert!(seen.iter().any(|e| e.path == "/w/a" && e.is_dir), "{seen:?}");
    // The folder made later is followed.
    shell(&sb, "echo later > /w/a/b/later.txt").await;
    until(&mut watch, "/w/a/b/later.txt", FileChange::Create).await;

    // Two watches at most here; dropping one gives its slot back.
    let second = sb.watch("/tmp", false).await.expect("second watch");
    let third = sb.watch("/tmp", false).await.expect_err("a third watch");
    assert_eq!(third.code(), Some(ErrorCode::QuotaExceeded), "{third:?}");
    assert!(third.to_string().contains("watches_per_sandbox"), "{third}");
    drop(second);
    let mut again = None;
    for _ in 0..50 {
        match sb.watch("/tmp", false).await {
            Ok(w) => {
                again = Some(w);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(again.is_some(), "the dropped watch's slot did not come back");

    // A watch ends with its sandbox; its process went with the container.
    sb.destroy().await.expect("destroy");
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.next_batch().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the watch did not end with its sandbox");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
}

fn brig(daemon: &Daemon) -> std::process::Command {
    let mut cmd = std::process::Command::new(brig_tests::binary("brig"));
    cmd.arg("--state-dir").arg(daemon.state_dir());
    cmd
}

/// `brig file meta` sets and shows a file's metadata; `brig file watch` prints changes as
/// they happen, a line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_metadata_and_watches_a_directory() {
    use std::io::BufRead;
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    shell(&sb, "mkdir -p /w && echo x > /w/a.txt").await;
    let meta = brig(&daemon)
        .args(["--json", "file", "meta", sb.id(), "/w/a.txt", "Stage=eval"])
        .output()
        .expect("brig file meta");
    assert!(meta.status.success(), "{}", String::from_utf8_lossy(&meta.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&meta.stdout).expect("json");
    assert_eq!(shown[0]["metadata"]["stage"], "eval", "{shown}");
    let ls = brig(&daemon).args(["file", "ls", sb.id(), "/w"]).output().expect("brig file ls");
    assert!(String::from_utf8_lossy(&ls.stdout).contains("[stage=eval]"), "{ls:?}");

    let mut watch = brig(&daemon)
        .args(["file", "watch", "-r", sb.id(), "/w"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("brig file watch");
    let stdout = watch.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The watch is in place once the CLI has connected: make changes until one shows.
    let mut seen = Vec::new();
    for attempt in 0..50 {
        shell(&sb, &format!("mkdir -p /w/d{attempt} && touch /w/d{attempt}/f")).await;
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(line);
        }
        if seen.iter().any(|l| l.contains("/f")) {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen.iter().any(|l| l.starts_with("create") && l.ends_with("/f")), "{seen:?}");
    sb.destroy().await.expect("destroy");
}
