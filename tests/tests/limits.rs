//! Bounded everything: each of the node's `[limits]` reached by one client is a typed
//! `QuotaExceeded` error for that client, while other requests and clients carry on.

use std::time::Duration;

use brig_sdk::{Cmd, Error, ErrorCode, ExecEvent, SandboxOptions};
use brig_tests::{image, Daemon};

const LIMITS: &str = "[limits]
sessions_per_sandbox = 2
execs_per_sandbox = 3
streams_per_connection = 4
audit_followers = 1
exec_stdin_bytes = 65536
";

fn quota_exceeded<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) -> String {
    match result {
        Err(e) if e.code() == Some(ErrorCode::QuotaExceeded) => e.to_string(),
        other => panic!("{what}: expected QuotaExceeded, got {other:?}"),
    }
}

#[tokio::test]
async fn every_limit_is_a_typed_error_for_its_client_and_others_carry_on() {
    let daemon = Daemon::start_with_config(LIMITS, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let bystander = daemon.client().await.expect("second client");

    // Sessions: two open, the third refused; closing one makes room.
    let s1 = sb.open_session().await.expect("session 1");
    let _s2 = sb.open_session().await.expect("session 2");
    let text = quota_exceeded("third session", sb.open_session().await);
    assert!(text.contains("limits.sessions_per_sandbox"), "{text}");
    s1.close().await.expect("close");
    let _s3 = sb.open_session().await.expect("a session once one closed");

    // Execs: finished ones make room for new ones; three running fill the table.
    for i in 0..5 {
        let out = sb.exec(["echo", &i.to_string()]).await.expect("finished execs make room");
        assert_eq!(out.stdout_text(), format!("{i}\n"));
    }
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(sb.exec_stream(Cmd::new(["sleep", "30"])).await.expect("running exec"));
    }
    let text = quota_exceeded("fourth running exec", sb.exec(["true"]).await);
    assert!(text.contains("limits.execs_per_sandbox"), "{text}");

    // Streams per connection: the three execs hold three streams; one more fits, then the
    // next request on this connection is refused while another client is served. The node
    // frees a finished request's place just after its last reply is sent, so a request sent
    // the moment the refused exec's error arrives may still find the connection full (seen on
    // a loaded machine): the follower is retried while that is so.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let follow = loop {
        let mut follow = sb.audit_stream(0, true).await.expect("audit follower");
        match follow.next_batch().await {
            Ok(batch) => {
                assert!(batch.is_some(), "the follower's first batch is the trail so far");
                break follow;
            }
            Err(e)
                if e.code() == Some(ErrorCode::QuotaExceeded)
                    && e.to_string().contains("limits.streams_per_connection")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("audit follower: {e}"),
        }
    };
    let text = quota_exceeded("fifth open request", client.node_status().await);
    assert!(text.contains("limits.streams_per_connection"), "{text}");
    bystander.node_status().await.expect("another connection is served");

    // Audit followers, node-wide: the bystander cannot follow while this client does.
    let other = bystander.sandbox(sb.id());
    let mut second = other.audit_stream(0, true).await.expect("open");
    let text = quota_exceeded("second follower", second.next_batch().await);
    assert!(text.contains("limits.audit_followers"), "{text}");
    assert!(other.audit(0).await.expect("reading the trail is not following").len() > 1);

    // Freeing the streams frees the connection.
    // The node learns of the drop asynchronously (the client's STOP_SENDING has to arrive and
    // the follower's task to end), so the kill is retried while the connection is still full.
    drop(follow);
    for exec in &running {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match sb.kill(exec.exec_id()).await {
                Ok(()) => break,
                Err(e)
                    if e.code() == Some(ErrorCode::QuotaExceeded)
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("kill, on the stream the follower freed: {e}"),
            }
        }
    }
    for mut exec in running {
        while let Some(event) = exec.next().await {
            if matches!(event, Ok(ExecEvent::Exited(_)) | Err(_)) {
                break;
            }
        }
    }
    let mut status = None;
    for _ in 0..50 {
        status = client.node_status().await.ok();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(status.is_some(), "the connection serves again once its requests end");

    // Streamed stdin past its byte limit: the client hears why, the command ran with what
    // fitted and its stdin closed, and its output is kept for attach.
    let mut exec =
        sb.exec_stream(Cmd::shell("wc -c; echo done").stdin_stream()).await.expect("streamed exec");
    let exec_id = exec.exec_id();
    let mut stdin = exec.take_stdin().expect("stdin");
    let feeder = tokio::spawn(async move {
        let chunk = bytes::Bytes::from(vec![b'x'; 16 * 1024]);
        for _ in 0..64 {
            if stdin.write(chunk.clone()).await.is_err() {
                break;
            }
        }
    });
    let mut refused = None;
    while let Some(event) = exec.next().await {
        if let Err(e) = event {
            refused = Some(e);
            break;
        }
    }
    let refused = refused.expect("the exec ended without the stdin limit error");
    let text = quota_exceeded("stdin over its limit", Err::<(), _>(refused));
    assert!(text.contains("limits.exec_stdin_bytes"), "{text}");
    feeder.await.expect("feeder");
    let kept = sb.attach(exec_id).await.expect("attach").collect().await.expect("output");
    let counted: u64 = kept.stdout_text().lines().next().unwrap_or("").trim().parse().expect("wc");
    assert!(counted <= 65536, "the command read {counted} bytes, over the limit");
    assert!(kept.stdout_text().ends_with("done\n"), "{}", kept.stdout_text());

    // The node is healthy for everyone.
    assert_eq!(sb.exec(["echo", "ok"]).await.expect("exec").stdout_text(), "ok\n");
    sb.destroy().await.expect("destroy");
}

/// A connection's stream credit starts small and grows with use: a thousand requests open at
/// once on one connection (four times the first credit) are all served.
#[tokio::test]
async fn a_thousand_requests_open_at_once_on_one_connection_are_served() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let stream = sb.exec_stream(Cmd::shell("sleep 30")).await.expect("exec");
    let exec_id = stream.exec_id();
    let attached = futures::future::join_all((0..1000).map(|_| sb.attach(exec_id))).await;
    let failed: Vec<_> = attached.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} of 1000 attaches failed: {:?}", failed.len(), failed.first());
    sb.kill(exec_id).await.expect("kill");
    for mut a in attached.into_iter().flatten().take(3) {
        while let Some(event) = a.next().await {
            if matches!(event, Ok(ExecEvent::Exited(_)) | Err(_)) {
                break;
            }
        }
    }
    sb.destroy().await.expect("destroy");
}
