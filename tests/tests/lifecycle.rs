//! Sandbox lifecycles end to end: pause and implicit resume, groups by label, lifetimes, fork,
//! reattaching after a client crash, and brigd restarts.

use brig_proto::SandboxOp;
use std::time::{Duration, Instant};

use brig_sdk::{
    Client, Cmd, ErrorCode, ExecEvent, IdleAction, Lifetimes, Sandbox, SandboxOptions, SandboxState,
};
use brig_tests::{image, Daemon};

/// brigd with a fast reaper, plus extra arguments.
fn daemon_with(extra: &[&str]) -> Daemon {
    Daemon::start_with_config("reap_interval_ms = 100\n", extra).expect("brigd")
}

async fn sh(sb: &Sandbox, script: &str) -> String {
    let out = sb.exec(["sh", "-c", script]).await.expect("exec");
    assert!(out.success(), "{script}: {:?} {}", out.result, out.stderr_text());
    out.stdout_text()
}

/// Starts a process that counts up in /tmp/count every 50 ms, detached from any exec.
async fn start_counter(sb: &Sandbox) {
    // Written aside and renamed, so a reader never finds the file truncated and not yet written.
    sh(
        sb,
        "(i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; \
         sleep 0.05; done) </dev/null >/dev/null 2>&1 &",
    )
    .await;
}

async fn state(sb: &Sandbox) -> SandboxState {
    sb.status().await.expect("status").state
}

#[tokio::test]
async fn pause_mid_session_then_an_exec_resumes_with_everything_intact() {
    let daemon = daemon_with(&[]);
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let session = sb.open_session().await.expect("session");
    let out = session
        .run(
            "mkdir -p /work && cd /work && export ROLLOUT=r7 && echo step1 > notes",
            Duration::from_secs(10),
        )
        .await
        .expect("run");
    assert_eq!(out.exit_code, Some(0));
    start_counter(&sb).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    sb.pause().await.expect("pause");
    let info = sb.status().await.expect("status");
    assert_eq!(info.state, SandboxState::Paused);
    assert!(info.paused_unix_ms.is_some());
    let cpu_at_pause = info.usage.expect("usage").cpu_ns;
    // Frozen: no CPU at all while paused. Status does not resume.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let info = sb.status().await.expect("status");
    assert_eq!(info.state, SandboxState::Paused);
    assert_eq!(info.usage.expect("usage").cpu_ns, cpu_at_pause, "a paused sandbox used CPU");

    // The exec resumes it first, transparently.
    let started = Instant::now();
    let count: u64 = sh(&sb, "cat /tmp/count").await.trim().parse().expect("count");
    eprintln!("first exec after pause took {:?}", started.elapsed());
    assert_eq!(state(&sb).await, SandboxState::Running);
    // The counter kept its value across the pause and keeps counting after it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let later: u64 = sh(&sb, "cat /tmp/count").await.trim().parse().expect("count");
    assert!(later > count, "the background process is not running: {count} -> {later}");
    let out =
        session.run("pwd; echo $ROLLOUT; cat notes", Duration::from_secs(10)).await.expect("run");
    assert_eq!(out.stdout_text(), "/work\nr7\nstep1\n");

    // Pausing twice and resuming twice are no-ops; a file read resumes too.
    sb.pause().await.expect("pause");
    sb.pause().await.expect("pause again");
    assert_eq!(sb.read_file("/work/notes").await.expect("read"), b"step1\n");
    assert_eq!(state(&sb).await, SandboxState::Running);
    sb.resume().await.expect("resume a running sandbox");
    sb.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_group_of_100_pauses_by_label_in_seconds_and_stops_using_cpu() {
    let daemon = daemon_with(&[]);
    let client = daemon.client().await.expect("connect");
    let job = "job-preempted";
    let creates = (0..100).map(|i| {
        let client = client.clone();
        async move {
            let sb = client
                .create(
                    SandboxOptions::container(&image("busybox"))
                        .label("job", job)
                        .label("rollout", &i.to_string())
                        .cpu_millis(10),
                )
                .await
                .expect("create");
            // A CPU burner capped at 1% of a core, detached from the exec.
            sh(&sb, "(while :; do :; done) </dev/null >/dev/null 2>&1 &").await;
            sb
        }
    });
    let group: Vec<Sandbox> = futures::future::join_all(creates).await;
    let other = client
        .create(SandboxOptions::container(&image("busybox")).label("job", "other"))
        .await
        .expect("create");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let paused = client.pause_matching(&[("job", job)]).await.expect("pause group");
    let took = started.elapsed();
    eprintln!("paused 100 sandboxes in {took:?}");
    assert_eq!(paused.len(), 100);
    assert!(took < Duration::from_secs(10), "pausing 100 took {took:?}");
    assert_eq!(state(&other).await, SandboxState::Running);

    let cpu = |client: Client, ids: Vec<String>| async move {
        let mut total = 0;
        for id in ids {
            let info = client.sandbox(&id).status().await.expect("status");
            assert_eq!(info.state, SandboxState::Paused, "{id}");
            total += info.usage.expect("usage").cpu_ns;
        }
        total
    };
    let before = cpu(client.clone(), paused.clone()).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = cpu(client.clone(), paused.clone()).await;
    assert_eq!(before, after, "paused sandboxes used CPU");

    let listed = client.list(&[("job", job)]).await.expect("ls");
    assert!(listed.iter().all(|s| s.state == SandboxState::Paused));
    let resumed = client.resume_matching(&[("job", job)]).await.expect("resume group");
    assert_eq!(resumed.len(), 100);
    let out = group[42].exec(["echo", "back"]).await.expect("exec");
    assert_eq!(out.stdout_text(), "back\n");

    let gone = client.destroy_matching(&[("job", job)]).await.expect("destroy group");
    assert_eq!(gone.len(), 100);
    assert!(client.list(&[("job", job)]).await.expect("ls").is_empty());
    assert_eq!(state(&other).await, SandboxState::Running);
    assert!(client.destroy_matching(&[]).await.is_err(), "an empty selector must be refused");
}

#[tokio::test]
async fn idle_ttl_pauses_then_the_paused_ttl_destroys_and_max_lifetime_fires() {
    let daemon = daemon_with(&[]);
    let client = daemon.client().await.expect("connect");
    let sb = client
        .create(
            SandboxOptions::container(&image("busybox"))
                .idle_ttl(Duration::from_millis(800))
                .pause_when_idle()
                .paused_ttl(Duration::from_millis(1500)),
        )
        .await
        .expect("create");
    let info = sb.status().await.expect("status");
    assert_eq!(
        (info.idle_ttl_ms, info.idle_action, info.paused_ttl_ms),
        (800, IdleAction::Pause, Some(1500))
    );
    sh(&sb, "echo kept > /kept").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(&sb).await != SandboxState::Paused {
        assert!(Instant::now() < deadline, "the idle TTL did not pause it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A request resumes it and resets its idle clock.
    assert_eq!(sh(&sb, "cat /kept").await, "kept\n");
    assert_eq!(state(&sb).await, SandboxState::Running);
    // Idle again: paused, then destroyed after the paused TTL, with a distinct error.
    let deadline = Instant::now() + Duration::from_secs(15);
    let err = loop {
        match sb.status().await {
            Ok(_) => {
                assert!(Instant::now() < deadline, "the paused TTL did not fire");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Some(ErrorCode::Expired), "{err}");
    assert!(err.to_string().contains("paused"), "{err}");

    // The maximum lifetime fires however busy the sandbox is.
    let busy = client
        .create(
            SandboxOptions::container(&image("busybox")).max_lifetime(Duration::from_millis(1500)),
        )
        .await
        .expect("create");
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match busy.exec(["true"]).await {
            Ok(_) => {
                assert!(Instant::now() < deadline, "max lifetime did not fire");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Some(ErrorCode::Expired), "{err}");
    assert!(err.to_string().contains("maximum lifetime"), "{err}");

    // Lifetimes can be changed on a live sandbox.
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let info = sb
        .set_lifetimes(
            Lifetimes::new()
                .idle_ttl(Duration::from_secs(60))
                .idle_action(IdleAction::Pause)
                .max_lifetime(Some(Duration::from_secs(3600))),
        )
        .await
        .expect("set lifetimes");
    assert_eq!(
        (info.idle_ttl_ms, info.idle_action, info.max_lifetime_ms),
        (60_000, IdleAction::Pause, Some(3_600_000))
    );
    let info = sb.set_lifetimes(Lifetimes::new().max_lifetime(None)).await.expect("clear");
    assert_eq!(info.max_lifetime_ms, None);
    assert_eq!(info.idle_ttl_ms, 60_000);
}

#[tokio::test]
async fn fork_children_start_from_the_parent_and_diverge() {
    let daemon = daemon_with(&[]);
    let client = daemon.client().await.expect("connect");
    let parent = client
        .create(
            SandboxOptions::container(&image("busybox")).label("job", "fork").env("MODE", "eval"),
        )
        .await
        .expect("create");
    sh(
        &parent,
        "mkdir -p /repo && echo patched > /repo/file && rm /bin/vi && ln -s file /repo/link",
    )
    .await;
    sh(&parent, "echo 00112233445566778899aabbccddeeff > /etc/machine-id").await;
    start_counter(&parent).await;
    let parent_ids = sh(&parent, "hostname; cat /etc/machine-id").await;

    let started = Instant::now();
    let children = parent.fork(4).await.expect("fork");
    eprintln!("fork of 4 took {:?}", started.elapsed());
    assert_eq!(children.len(), 4);
    let mut identities = vec![parent_ids];
    for (i, child) in children.iter().enumerate() {
        let info = child.status().await.expect("status");
        assert!(info.labels.contains(&("forked-from".to_string(), parent.id().to_string())));
        assert!(info.labels.contains(&("job".to_string(), "fork".to_string())));
        let out = sh(
            child,
            "cat /repo/file; readlink /repo/link; test -e /bin/vi || echo novi; echo $MODE",
        )
        .await;
        assert_eq!(out, "patched\nfile\nnovi\neval\n");
        // Files are cloned, processes are not: the child's copy of the counter stands still.
        let out = sh(
            child,
            "a=$(cat /tmp/count); sleep 0.3; b=$(cat /tmp/count); [ $a = $b ] && echo still",
        )
        .await;
        assert_eq!(out, "still\n", "processes were cloned");
        sh(child, &format!("echo child{i} > /repo/file")).await;
        identities.push(sh(child, "hostname; cat /etc/machine-id").await);
    }
    let mut unique = identities.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        identities.len(),
        "forks share a hostname or machine id: {identities:?}"
    );
    for (i, child) in children.iter().enumerate() {
        assert_eq!(sh(child, "cat /repo/file").await, format!("child{i}\n"));
    }
    assert_eq!(sh(&parent, "cat /repo/file").await, "patched\n");
    assert_eq!(state(&parent).await, SandboxState::Running);

    // A paused sandbox forks too (and stays paused).
    parent.pause().await.expect("pause");
    let more = parent.fork_labeled(2, &[("branch", "b")]).await.expect("fork paused");
    assert_eq!(more.len(), 2);
    assert_eq!(state(&parent).await, SandboxState::Paused);
    assert_eq!(sh(&more[1], "cat /repo/file").await, "patched\n");

    // fncall workspaces fork the same way.
    let ws = client.create(SandboxOptions::fncall()).await.expect("create");
    ws.write_file("src/a.txt", b"v1").await.expect("write");
    let kids = ws.fork(2).await.expect("fork fncall");
    kids[0].write_file("src/a.txt", b"v2").await.expect("write");
    assert_eq!(kids[1].read_file("src/a.txt").await.expect("read"), b"v1");
    assert_eq!(kids[0].read_file("src/a.txt").await.expect("read"), b"v2");
    assert_eq!(ws.read_file("src/a.txt").await.expect("read"), b"v1");

    let err = client.sandbox("sb-00000000-0000000000000000").fork(1).await.expect_err("no parent");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
}

#[tokio::test]
async fn a_crashed_client_reconnects_and_gets_the_whole_output() {
    let daemon = daemon_with(&[]);
    let (id, exec_id, session_id) = {
        let client = daemon.client().await.expect("connect");
        let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
        let session = sb.open_session().await.expect("session");
        session.run("cd /tmp && X=1", Duration::from_secs(5)).await.expect("run");
        let mut stream = sb
            .exec_stream(Cmd::shell(
                "for i in $(seq 1 40); do echo line$i; sleep 0.025; done; echo done >&2; exit 3",
            ))
            .await
            .expect("exec");
        let first = stream.next().await.expect("event").expect("ok");
        assert!(matches!(first, ExecEvent::Stdout(_)));
        let ids = (sb.id().to_string(), stream.exec_id(), session.id().to_string());
        // The worker dies: its connection goes away mid-command.
        client.close().await;
        ids
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = daemon.client().await.expect("reconnect");
    let sb = client.sandbox(&id);
    let execs = sb.execs().await.expect("execs");
    let listed = execs.iter().find(|e| e.exec_id == exec_id).expect("exec listed");
    assert_eq!(listed.argv[0], "sh");
    let out = sb.attach(exec_id).await.expect("attach").collect().await.expect("collect");
    let expected: String = (1..=40).map(|i| format!("line{i}\n")).collect();
    assert_eq!(out.stdout_text(), expected);
    assert_eq!(out.stderr_text(), "done\n");
    assert_eq!(out.result.exit_code, Some(3));
    // Attaching again after it finished replays it all again.
    let again = sb.attach(exec_id).await.expect("attach").collect().await.expect("collect");
    assert_eq!(again.stdout, out.stdout);
    assert_eq!(sb.sessions().await.expect("sessions"), vec![session_id.clone()]);
    let out =
        sb.session(&session_id).run("pwd; echo $X", Duration::from_secs(5)).await.expect("run");
    assert_eq!(out.stdout_text(), "/tmp\n1\n");
    let err = sb.attach(999).await.expect_err("no such exec");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
}

#[tokio::test]
async fn sandboxes_survive_brigd_restarts_and_crashes() {
    let mut daemon = daemon_with(&["--on-exit", "keep"]);
    let client = daemon.client().await.expect("connect");
    let paused = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    sh(&paused, "echo before > /state").await;
    start_counter(&paused).await;
    paused.pause().await.expect("pause");
    let running =
        client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    start_counter(&running).await;
    let fncall = client.create(SandboxOptions::fncall()).await.expect("create");
    fncall.write_file("f", b"ws").await.expect("write");

    daemon.restart().expect("restart");
    let client = daemon.client().await.expect("reconnect");
    let paused = client.sandbox(paused.id());
    assert_eq!(state(&paused).await, SandboxState::Paused);
    assert_eq!(sh(&paused, "cat /state").await, "before\n");
    let a: u64 = sh(&paused, "cat /tmp/count").await.trim().parse().expect("count");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b: u64 = sh(&paused, "cat /tmp/count").await.trim().parse().expect("count");
    assert!(b > a, "the paused sandbox's process did not survive: {a} -> {b}");
    let running = client.sandbox(running.id());
    assert_eq!(state(&running).await, SandboxState::Running);

    // A destroyed container's cgroups wait as a spare for the next create.
    let gone = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    gone.destroy().await.expect("destroy");
    assert!(!spare_cgroups(&daemon).is_empty(), "no spare cgroup kept");
    let text = brig_tests::net::metrics_text(daemon.state_dir()).expect("metrics");
    assert_eq!(brig_tests::net::metric(&text, "brig_container_spare_cgroups "), 1.0, "{text}");

    // A crash (SIGKILL, no cleanup) loses nothing either, and the spares it left are removed
    // by the next start.
    daemon.crash().expect("crash");
    daemon.start_again().expect("start");
    let client = daemon.client().await.expect("reconnect");
    assert_eq!(spare_cgroups(&daemon), Vec::<std::path::PathBuf>::new());
    let running = client.sandbox(running.id());
    let a: u64 = sh(&running, "cat /tmp/count").await.trim().parse().expect("count");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b: u64 = sh(&running, "cat /tmp/count").await.trim().parse().expect("count");
    assert!(b > a, "the running sandbox's process did not survive: {a} -> {b}");
    assert_eq!(client.sandbox(fncall.id()).read_file("f").await.expect("read"), b"ws");
    assert_eq!(sh(&client.sandbox(paused.id()), "cat /state").await, "before\n");
}

/// The node's spare cgroups (destroyed containers' cgroups kept for the next create), in any
/// v1 hierarchy.
fn spare_cgroups(daemon: &Daemon) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else { return found };
    for c in controllers.flatten() {
        let Ok(children) = std::fs::read_dir(c.path().join(format!("brig-0-{}", daemon.tag())))
        else {
            continue;
        };
        found.extend(
            children
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("spare-"))
                .map(|e| e.path()),
        );
    }
    found
}

/// The freezer file of a container's cgroup (v1 or v2), found by sandbox id.
fn freezer_file(id: &str) -> std::path::PathBuf {
    for (root, file) in
        [("/sys/fs/cgroup/freezer", "freezer.state"), ("/sys/fs/cgroup", "cgroup.freeze")]
    {
        let Ok(parents) = std::fs::read_dir(root) else { continue };
        for p in parents.flatten().filter(|p| p.file_name().to_string_lossy().starts_with("brig-"))
        {
            let path = p.path().join(id).join(file);
            if path.exists() {
                return path;
            }
        }
    }
    panic!("no freezer for {id}");
}

/// A crash does not restart the TTL clocks (last use and pause time come back as they were),
/// and a sandbox the node had frozen for a fork or checkpoint when it died comes back
/// running, not hanging.
#[tokio::test]
async fn ttl_clocks_survive_a_crash_and_a_frozen_running_sandbox_is_thawed() {
    let mut daemon = daemon_with(&["--on-exit", "keep"]);
    let client = daemon.client().await.expect("connect");
    let hour = Duration::from_secs(3600);
    let options = || SandboxOptions::container(&image("busybox")).idle_ttl(hour);
    let used = client.create(options()).await.expect("create");
    let paused = client.create(options()).await.expect("create");
    paused.pause().await.expect("pause");
    let frozen = client.create(options()).await.expect("create");
    // A use more than the 5 s slack after the record's is saved within a reaper tick.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    sh(&used, "true").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = used.status().await.expect("status");
    let paused_at = paused.status().await.expect("status").paused_unix_ms;
    assert!(paused_at.is_some());
    // As if the node died mid-fork: the container is frozen while its record says running.
    let freezer = freezer_file(frozen.id());
    let value = if freezer.ends_with("freezer.state") { "FROZEN" } else { "1" };
    std::fs::write(&freezer, value).expect("freeze");

    daemon.crash().expect("crash");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    daemon.start_again().expect("start");
    let client = daemon.client().await.expect("reconnect");
    let after = client.sandbox(used.id()).status().await.expect("status");
    // Saved within the node's 5 s slack: at most that much early, never restarted (a reaper
    // tick between the exec's start and its end saves the first of its two uses).
    let early = before.last_used_unix_ms.saturating_sub(after.last_used_unix_ms);
    assert!(
        after.last_used_unix_ms <= before.last_used_unix_ms && early <= 5_000,
        "the idle clock restarted: {} before the crash, {} after",
        before.last_used_unix_ms,
        after.last_used_unix_ms
    );
    let paused = client.sandbox(paused.id());
    assert_eq!(paused.status().await.expect("status").paused_unix_ms, paused_at);
    let frozen = client.sandbox(frozen.id());
    assert_eq!(state(&frozen).await, SandboxState::Running);
    let out = frozen
        .exec_with(Cmd::shell("echo thawed").timeout(Duration::from_secs(10)))
        .await
        .expect("exec");
    assert_eq!(out.stdout_text(), "thawed\n");
}

/// A create whose client is gone before the reply arrives made a sandbox nobody heard of:
/// nobody could use or destroy it, so the node destroys it at once and nothing is left.
#[tokio::test]
async fn a_sandbox_whose_create_was_never_acknowledged_is_destroyed() {
    let daemon = daemon_with(&[]);
    let opts = daemon.connect_options().expect("options");
    let pin = match &opts.pin {
        brig_sdk::Pin::Sha256(hex) => brig_transport::CertPin::from_hex(hex).expect("pin"),
        brig_sdk::Pin::CertFile(_) => unreachable!("a state directory gives a fingerprint"),
    };
    let create =
        brig_proto::Request::Sandbox(SandboxOp::Create(Box::new(brig_proto::CreateRequest {
            tier: Some(brig_proto::Tier::Container),
            image: Some(image("busybox")),
            ..Default::default()
        })));
    let client = daemon.client().await.expect("client");
    // The request must reach brigd and the connection close before the reply leaves: the
    // container takes milliseconds to make, so some wait before the close lands in between.
    let mut heard = None;
    for wait_ms in [0u64, 1, 2, 4, 8, 16, 32, 64] {
        let conn = brig_transport::ClientConnection::connect_current(opts.addr, &pin, &opts.token)
            .await
            .expect("connect");
        let exchange = conn.open(&create).await.expect("send the create");
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        conn.close();
        drop(exchange);
        let deadline = Instant::now() + Duration::from_secs(10);
        while heard.is_none() && Instant::now() < deadline {
            heard = daemon
                .log_text()
                .lines()
                .find(|l| l.contains("the client left before the reply"))
                .map(str::to_string);
            let live = client.list(&[]).await.expect("list");
            if heard.is_none() && !live.is_empty() {
                // Acknowledged after all (the reply left before the close): try closer.
                for sb in live {
                    client.sandbox(&sb.id).destroy().await.expect("destroy");
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if heard.is_some() {
            break;
        }
    }
    let line = heard.expect("no create was cut off by its client's close");
    assert!(line.contains("sb-"), "{line}");
    assert!(client.list(&[]).await.expect("list").is_empty(), "{line}");
    let records = std::fs::read_dir(daemon.state_dir().join("sandboxes")).expect("records");
    let records = records.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json"));
    assert_eq!(records.count(), 0, "a record outlived the sandbox");
}

/// Everything of sandbox `id` the host holds by name: cgroups and run-directory entries.
fn host_objects_of(id: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let roots = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer"];
    for root in roots.iter().map(std::path::Path::new).chain([std::path::Path::new("/run/brig")]) {
        let Ok(parents) = std::fs::read_dir(root) else { continue };
        for p in parents.flatten() {
            let path = p.path().join(id);
            if path.exists() {
                found.push(path);
            }
        }
    }
    found
}

/// A fork the node dies in is rolled back at the next start, never left half done: its
/// children are gone with everything they held, the parent runs thawed with its files, and the
/// fork's intent is cleared. First a real crash while the children's layers are copied
/// (nothing recorded yet); then, as if the node died right after recording the children and
/// before clearing the intent, the intent of a finished fork is put back before a restart.
#[tokio::test]
async fn a_fork_cut_short_by_a_crash_is_rolled_back() {
    let mut daemon = daemon_with(&["--on-exit", "keep"]);
    for after_recording in [false, true] {
        fork_then_crash(&mut daemon, after_recording).await;
    }
}

async fn fork_then_crash(daemon: &mut Daemon, after_recording: bool) {
    let client = daemon.client().await.expect("connect");
    let options = SandboxOptions::container(&image("busybox")).memory_mib(2048).disk_mib(2048);
    let parent = client.create(options).await.expect("create");
    // A writable layer big enough that copying it into 8 children takes a while.
    sh(&parent, "dd if=/dev/zero of=/big bs=1M count=192 2>/dev/null; echo kept > /note").await;
    let ops = daemon.state_dir().join("ops");
    let records = daemon.state_dir().join("sandboxes");
    let children: Vec<String> = if after_recording {
        let kids = parent.fork(8).await.expect("fork");
        let children: Vec<String> = kids.iter().map(|k| k.id().to_string()).collect();
        daemon.crash().expect("crash");
        let intent = serde_json::json!({ "parent": parent.id(), "children": children });
        let path = ops.join(format!("fork-{}.json", parent.id()));
        std::fs::write(path, intent.to_string()).expect("put the intent back");
        children
    } else {
        let forking = client.sandbox(parent.id());
        let fork = tokio::spawn(async move { forking.fork(8).await });
        let deadline = Instant::now() + Duration::from_secs(30);
        let intent = loop {
            let file = std::fs::read_dir(&ops).expect("ops dir").flatten().find(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("fork-") && name.ends_with(".json")
            });
            if let Some(file) = file {
                break std::fs::read(file.path()).expect("intent");
            }
            assert!(Instant::now() < deadline, "no fork intent appeared");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        daemon.crash().expect("crash");
        // The client may go on trying to reach the dead node; it must not have been answered.
        if fork.is_finished() {
            assert!(fork.await.expect("task").is_err(), "the fork was answered before the crash");
        } else {
            fork.abort();
        }
        let intent: serde_json::Value = serde_json::from_slice(&intent).expect("json");
        let ids = intent["children"].as_array().expect("children").iter();
        ids.map(|c| c.as_str().expect("id").to_string()).collect()
    };
    assert_eq!(children.len(), 8);

    daemon.start_again().expect("start");
    let client = daemon.client().await.expect("reconnect");
    let live: Vec<String> =
        client.list(&[]).await.expect("list").into_iter().map(|s| s.id).collect();
    assert_eq!(live, vec![parent.id().to_string()], "only the parent is left");
    let parent = client.sandbox(parent.id());
    assert_eq!(state(&parent).await, SandboxState::Running);
    let out = parent
        .exec_with(Cmd::shell("cat /note; ls -l /big | wc -l").timeout(Duration::from_secs(10)))
        .await
        .expect("exec in the thawed parent");
    assert_eq!(out.stdout_text(), "kept\n1\n");
    for child in &children {
        let err = client.sandbox(child).status().await.expect_err("a rolled-back child");
        assert_eq!(err.code(), Some(ErrorCode::NotFound), "{child}: {err}");
        assert_eq!(
            host_objects_of(child),
            Vec::<std::path::PathBuf>::new(),
            "{child} left objects"
        );
        assert!(!records.join(format!("{child}.json")).exists());
    }
    assert_eq!(std::fs::read_dir(&ops).expect("ops").count(), 0, "the intent was cleared");
    let trail = parent.audit(0).await.expect("audit");
    let rollback = trail
        .iter()
        .map(|e| format!("{:?}", e.kind))
        .find(|k| k.contains("fork-rolled-back"))
        .expect("the rollback is in the parent's audit trail");
    if after_recording {
        // Recorded children were restored, then destroyed by the rollback itself.
        assert!(children.iter().all(|c| rollback.contains(c.as_str())), "{rollback}");
    }
    parent.destroy().await.expect("destroy");
}
