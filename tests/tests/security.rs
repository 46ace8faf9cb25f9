//! Containment and observability through the SDK: egress rules switched mid-task, protected
//! paths and evaluation forks, the audit trail of a scripted rollout, and the metrics endpoint.

use std::time::Duration;

use brig_sdk::{AuditEvent, AuditKind, Cmd, ErrorCode, ImageSource, Sandbox, SandboxOptions};
use brig_tests::net::{metric, metrics_text, Mirror};
use brig_tests::{artifacts, image, Daemon};

/// Fetches the mirror's page from inside a sandbox; the page text, or "" when the connection
/// was refused, dropped or timed out.
async fn fetch(sb: &Sandbox, addr: &str, port: u16) -> String {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {addr} {port} | tail -n 1");
    let out = sb.exec_with(Cmd::shell(&script)).await.expect("exec");
    out.stdout_text().trim().to_string()
}

/// The sandbox's audit trail once `complete` holds for it (the kernel log that egress
/// attempts come from is read asynchronously, so they reach the trail a moment later).
async fn audit_until(sb: &Sandbox, complete: impl Fn(&[AuditEvent]) -> bool) -> Vec<AuditEvent> {
    for _ in 0..50 {
        let events = sb.audit(0).await.expect("audit");
        if complete(&events) {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the audit trail never showed the events: {:#?}", sb.audit(0).await);
}

fn egress(e: &AuditEvent, allowed: bool, dst: &str, port: u16) -> bool {
    matches!(&e.kind, AuditKind::Egress { allowed: a, dst: d, port: Some(p), .. }
        if *a == allowed && d == dst && *p == port)
}

/// Links are served from slots made ready ahead and given back on destroy: whatever a slot
/// went through, the next sandbox gets exactly the rules it asked for.
#[tokio::test]
async fn pooled_links_always_carry_the_rules_asked_for() {
    let mirror = Mirror::start("pooled-link").expect("mirror");
    let service = format!("mirror={}", mirror.rule());
    let daemon = Daemon::start_with(&["--egress-service", &service]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let (addr, port) = (mirror.addr.as_str(), mirror.port);
    let open = || SandboxOptions::container(&image("busybox")).egress(["mirror"]);
    let closed = || SandboxOptions::container(&image("busybox")).egress(Vec::<String>::new());
    for round in 0..6 {
        let sb = client.create(open()).await.expect("create open");
        assert_eq!(fetch(&sb, addr, port).await, "pooled-link", "round {round}: allowed");
        assert_eq!(fetch(&sb, addr, 8081).await, "", "round {round}: another port");
        let shut = client.create(closed()).await.expect("create closed");
        assert_eq!(fetch(&shut, addr, port).await, "", "round {round}: closed link");
        // A slot whose rules changed goes back under its new rules, not its first ones.
        if round % 2 == 0 {
            sb.set_egress(Vec::<String>::new()).await.expect("close");
            shut.set_egress(["mirror"]).await.expect("open");
        }
        sb.destroy().await.expect("destroy");
        shut.destroy().await.expect("destroy");
    }
    let sandboxes = futures::future::join_all((0..6).map(|i| {
        let options = if i % 2 == 0 { open() } else { closed() };
        client.create(options)
    }))
    .await;
    for (i, sb) in sandboxes.into_iter().enumerate() {
        let sb = sb.expect("create at once");
        let want = if i % 2 == 0 { "pooled-link" } else { "" };
        assert_eq!(fetch(&sb, addr, port).await, want, "sandbox {i} made at once");
    }
}

#[tokio::test]
async fn egress_rules_switch_mid_task_and_every_attempt_is_audited() {
    let mirror = Mirror::start("hello-from-the-mirror").expect("mirror");
    let service = format!("mirror={}", mirror.rule());
    let daemon = Daemon::start_with(&["--egress-service", &service]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let (addr, port) = (mirror.addr.as_str(), mirror.port);

    // No egress asked: no link at all, only loopback.
    let closed = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    assert_eq!(fetch(&closed, addr, port).await, "");
    let lo = closed
        .exec_with(Cmd::shell(
            "for i in 1 2 3 4 5 6 7 8 9 10; do nc -l -p 9000 -e echo over-loopback & sleep 0.2; \
             nc -w 2 127.0.0.1 9000 </dev/null | grep over && break; done",
        ))
        .await
        .expect("exec");
    assert!(
        lo.stdout_text().contains("over-loopback"),
        "loopback inside a sandbox: {} {} {:?}",
        lo.stdout_text(),
        lo.stderr_text(),
        lo.result
    );

    // Stage "setup": the mirror service is allowed, its other ports are not.
    let sb = client
        .create(SandboxOptions::container(&image("busybox")).egress(["mirror"]))
        .await
        .expect("create with egress");
    let info = sb.status().await.expect("status");
    assert_eq!(info.egress.as_deref(), Some(&["mirror".to_string()][..]));
    assert!(info.address.is_some(), "a sandbox with egress has an address");
    assert_eq!(fetch(&sb, addr, port).await, "hello-from-the-mirror");
    assert_eq!(fetch(&sb, addr, 8081).await, "", "another port of an allowed host");

    // Stage "solve": everything closed; the same fetch now fails.
    sb.set_egress(Vec::<String>::new()).await.expect("close egress");
    assert_eq!(fetch(&sb, addr, port).await, "", "closed egress still let a connection through");

    // Stage "verify": an explicit destination opens it again.
    sb.set_egress([mirror.rule()]).await.expect("open egress");
    assert_eq!(fetch(&sb, addr, port).await, "hello-from-the-mirror");

    // Rules are checked: unknown services and malformed rules are typed errors.
    let unknown = sb.set_egress(["pypi"]).await.expect_err("unknown service");
    assert_eq!(unknown.code(), Some(ErrorCode::BadRequest), "{unknown}");
    let malformed = sb.set_egress(["10.1.2.3/40"]).await.expect_err("malformed rule");
    assert_eq!(malformed.code(), Some(ErrorCode::BadRequest), "{malformed}");
    let on_fncall = client.create(SandboxOptions::fncall().egress(["mirror"])).await;
    assert!(on_fncall.is_err(), "fncall sandboxes have no network to open");

    // The trail shows the allowed and the denied attempts and the policy changes, in order.
    // Two allowed attempts (setup, reopened), denied ones to the other port and while closed.
    let events = audit_until(&sb, |events| {
        events.iter().filter(|e| egress(e, true, addr, port)).count() >= 2
            && events.iter().any(|e| egress(e, false, addr, 8081))
            && events.iter().any(|e| egress(e, false, addr, port))
    })
    .await;
    let policies: Vec<Vec<String>> = events
        .iter()
        .filter_map(|e| match &e.kind {
            AuditKind::Policy { rules } => Some(rules.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(policies, vec![vec!["mirror".to_string()], vec![], vec![mirror.rule()]]);

    let text = metrics_text(daemon.state_dir()).expect("metrics");
    assert!(metric(&text, "brig_egress_connections_total{verdict=\"denied\"}") >= 2.0, "{text}");
    assert!(metric(&text, "brig_egress_connections_total{verdict=\"allowed\"}") >= 2.0, "{text}");
}

#[tokio::test]
async fn protected_paths_hold_and_evaluation_forks_reveal_them() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    // A task layer with tests the agent may read and an answer it may not see.
    let tmp = tempfile::tempdir().expect("tmp");
    let task = tmp.path().join("task");
    std::fs::create_dir_all(task.join("task/tests")).expect("mkdir");
    std::fs::create_dir_all(task.join("task/answer")).expect("mkdir");
    std::fs::write(task.join("task/tests/check.sh"), "grep -q 42 /task/solution\n").expect("w");
    std::fs::write(task.join("task/answer/ref.txt"), "42\n").expect("w");
    client
        .import_image(
            "base/busybox",
            None,
            ImageSource::Erofs(artifacts().join("images/busybox.erofs")),
        )
        .await
        .expect("import base");
    client.import_image("workspace/task", None, ImageSource::Dir(task)).await.expect("import");
    client.create_env("task", &["base/busybox@1", "workspace/task@1"]).await.expect("env");
    let opts = SandboxOptions::container("env:task")
        .read_only_path("/task/tests")
        .hidden_path("/task/answer");
    let agent = client.create(opts).await.expect("create");

    let attack = agent
        .exec_with(Cmd::shell(
            "cat /task/tests/check.sh; ls -A /task/answer; cat /task/answer/ref.txt 2>&1; \
             echo 'exit 0' > /task/tests/check.sh 2>&1; rm -rf /task/tests 2>&1; \
             mv /task/tests /task/t2 2>&1; umount /task/answer 2>&1; \
             mv /task /task.moved 2>&1 && mkdir -p /task/tests && echo 'exit 0' > /task/tests/check.sh; \
             echo 41 > /task/solution; echo done",
        ))
        .await
        .expect("exec");
    let out = attack.stdout_text();
    assert!(out.starts_with("grep -q 42 /task/solution\n"), "tests readable: {out}");
    assert!(!out.contains("42\n"), "the hidden answer leaked: {out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.ends_with("done\n"), "{out}");
    assert_eq!(
        agent.read_file("/task/tests/check.sh").await.expect("read"),
        b"grep -q 42 /task/solution\n"
    );

    // Evaluation: a fork with none of the agent's processes, its files, and the protected
    // paths as the image has them, hidden ones shown read-only.
    agent
        .exec_with(Cmd::shell(
            "echo 42 > /task/solution; echo 42 > /task.moved/solution 2>/dev/null; true",
        ))
        .await
        .expect("solve");
    let eval = agent.fork_for_evaluation().await.expect("evaluation fork");
    let graded = eval
        .exec_with(Cmd::shell(
            "cat /task/answer/ref.txt; sh /task/tests/check.sh && echo PASS; \
             (echo x > /task/answer/ref.txt) 2>&1 | grep -c Read-only",
        ))
        .await
        .expect("grade");
    assert_eq!(graded.stdout_text(), "42\nPASS\n1\n", "{}", graded.stderr_text());

    let bad = client
        .create(SandboxOptions::container(&image("busybox")).read_only_path("/etc/../../x"))
        .await
        .expect_err("bad path");
    assert_eq!(bad.code(), Some(ErrorCode::BadRequest), "{bad}");
    let missing = client
        .create(SandboxOptions::container(&image("busybox")).hidden_path("/no/such/path"))
        .await
        .expect_err("missing path");
    assert!(missing.to_string().contains("/no/such/path"), "{missing}");
    // A refused create leaves nothing mounted (live containers hold their mounts in their own
    // namespaces, not the host's).
    let mounts: Vec<String> =
        daemon.leaks().into_iter().filter(|l| l.starts_with("mount ")).collect();
    assert!(mounts.is_empty(), "a refused create left mounts: {mounts:?}");
}

#[tokio::test]
async fn the_audit_trail_reproduces_a_scripted_rollout_and_metrics_move() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let before = metrics_text(daemon.state_dir()).expect("metrics");

    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let script: Vec<Vec<&str>> = vec![
        vec!["sh", "-c", "echo one > /a"],
        vec!["cat", "/a"],
        vec!["ls", "/"],
        vec!["sh", "-c", "exit 3"],
    ];
    for argv in &script {
        sb.exec(argv.clone()).await.expect("exec");
    }
    let session = sb.open_session().await.expect("session");
    session.run("cd /tmp && pwd", Duration::from_secs(10)).await.expect("session run");
    sb.write_file("/notes.txt", b"hello").await.expect("write");
    sb.read_file("/notes.txt").await.expect("read");
    sb.pause().await.expect("pause");
    sb.exec(["true"]).await.expect("exec after pause");
    let mut follow = sb.audit_stream(0, true).await.expect("follow");
    sb.destroy().await.expect("destroy");

    // Following ends when the sandbox is gone, with everything up to its destruction.
    let mut followed = Vec::new();
    while let Some(batch) = follow.next_batch().await.expect("batch") {
        followed.extend(batch);
    }
    let events = sb.audit(0).await.expect("audit after destroy");
    assert_eq!(followed, events);
    assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1), "{events:#?}");

    let argvs: Vec<Vec<String>> = events
        .iter()
        .filter_map(|e| match &e.kind {
            AuditKind::ExecStart { argv, .. } => Some(argv.clone()),
            _ => None,
        })
        .collect();
    let mut expected: Vec<Vec<String>> =
        script.iter().map(|a| a.iter().map(|s| s.to_string()).collect()).collect();
    expected.push(vec!["true".into()]);
    assert_eq!(argvs, expected, "the trail replays the rollout's commands in order");
    let exit_codes: Vec<Option<i32>> = events
        .iter()
        .filter_map(|e| match &e.kind {
            AuditKind::ExecEnd { exit_code, .. } => Some(*exit_code),
            _ => None,
        })
        .collect();
    assert_eq!(exit_codes, vec![Some(0), Some(0), Some(0), Some(3), Some(0)]);
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            AuditKind::Lifecycle { event, .. } => Some(event.clone()),
            AuditKind::SessionCommand { command, .. } => Some(format!("session {command}")),
            AuditKind::File { op, path, ok: true, .. } => Some(format!("{op} {path}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "created",
            "session cd /tmp && pwd",
            "write /notes.txt",
            "read /notes.txt",
            "paused",
            "resumed",
            "destroyed"
        ]
    );

    let after = metrics_text(daemon.state_dir()).expect("metrics");
    let delta = |series: &str| metric(&after, series) - metric(&before, series);
    assert_eq!(delta("brig_requests_total{kind=\"exec\"}"), 5.0, "{after}");
    assert_eq!(delta("brig_sandbox_creates_total{tier=\"container\"}"), 1.0);
    assert_eq!(delta("brig_exec_duration_seconds_count{tier=\"container\"}"), 5.0);
    assert!(delta("brig_audit_events_total") >= events.len() as f64 - 1.0);
    let refused = client.sandbox("sb-00000000-0000000000000000").status().await;
    assert!(refused.is_err());
    let last = metrics_text(daemon.state_dir()).expect("metrics");
    assert!(
        metric(&last, "brig_requests_refused_total{kind=\"status\",code=\"not_found\"}") >= 1.0,
        "{last}"
    );
}
