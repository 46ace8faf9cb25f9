//! The walking skeleton end to end: a real brigd, real QUIC, real Wasmtime, driven by brig-sdk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use brig_sdk::{
    CallLimits, CallOutcome, CallRequest, Client, ConnectOptions, ErrorCode, Pin, SandboxOptions,
};
use brig_tests::{guest, Daemon};
use sha2::{Digest, Sha256};

fn chaos(args: &[&str]) -> CallRequest {
    CallRequest {
        tool: "chaos".into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

async fn with_chaos(daemon: &Daemon) -> Client {
    let client = daemon.client().await.expect("connect");
    let bytes = std::fs::read(guest("testing/chaos.wasm")).expect("chaos.wasm");
    client.add_tool("chaos", bytes).await.expect("add chaos");
    client
}

/// Keeps calling a tool in its own sandbox until stopped; counts failures.
fn bystander(client: Client) -> (Arc<AtomicBool>, tokio::task::JoinHandle<(u64, u64)>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let sandbox = client
            .create(SandboxOptions::fncall().label("role", "bystander"))
            .await
            .expect("create");
        sandbox.write_file("data.json", br#"{"n":41}"#).await.expect("write");
        let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        while !flag.load(Ordering::Relaxed) {
            let r = sandbox.call("jq", r#"{"query":"$.n","path":"data.json"}"#).await;
            match r {
                Ok(r) if r.output == r#"{"results":[41]}"# => ok.fetch_add(1, Ordering::Relaxed),
                _ => failed.fetch_add(1, Ordering::Relaxed),
            };
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (ok.into_inner(), failed.into_inner())
    });
    (stop, task)
}

#[tokio::test]
async fn wrong_token_and_old_protocol_are_refused() {
    let daemon = Daemon::start().expect("brigd");
    let good = daemon.connect_options().expect("opts");
    let bad = ConnectOptions { token: "0".repeat(64), ..good.clone() };
    let err = Client::connect(bad).await.expect_err("refused");
    assert_eq!(err.code(), Some(ErrorCode::Unauthenticated), "{err}");
    assert!(!err.retryable());

    let wrong_pin = ConnectOptions { pin: Pin::Sha256("ab".repeat(32)), ..good.clone() };
    assert!(Client::connect(wrong_pin).await.is_err(), "a different certificate must be refused");

    // An SDK of another protocol version hears a clear refusal, not a hang.
    let pin = brig_transport::CertPin::from_hex(match &good.pin {
        Pin::Sha256(h) => h,
        Pin::CertFile(_) => unreachable!("state dir gives a fingerprint"),
    })
    .expect("pin");
    let old = brig_transport::ClientConnection::connect(good.addr, &pin, &good.token, 0).await;
    match old {
        Err(brig_transport::TransportError::HelloRefused { status, message }) => {
            assert_eq!(status, brig_proto::hello::HelloStatus::VersionMismatch);
            assert!(message.contains("protocol"), "{message}");
        }
        other => panic!("expected a version refusal, got {:?}", other.map(|_| ())),
    }

    let client = Client::connect(good).await.expect("good token works");
    assert!(client.call("jq", r#"{"query":"$","json":1}"#).await.expect("call").is_success());
}

#[tokio::test]
async fn every_tool_works_in_a_sandbox() {
    let daemon = Daemon::start().expect("brigd");
    let client = with_chaos(&daemon).await;
    let names: Vec<String> =
        client.tools().await.expect("tools").into_iter().map(|t| t.name).collect();
    for tool in ["files", "grep", "patch", "jq", "chaos"] {
        assert!(names.iter().any(|n| n == tool), "{tool} missing from {names:?}");
    }
    let sb = client.create(SandboxOptions::fncall()).await.expect("create");

    let r = sb
        .call("files", r#"{"op":"write","path":"src/lib.py","content":"def f():\n    return 1\n"}"#)
        .await
        .expect("write");
    assert_eq!(r.outcome, CallOutcome::Ok, "{r:?}");
    let r = sb.call("files", r#"{"op":"read","path":"src/lib.py"}"#).await.expect("read");
    let v: serde_json::Value = serde_json::from_str(&r.output).expect("json");
    assert_eq!(v["content"], "def f():\n    return 1\n");
    let r = sb.call("files", r#"{"op":"list","path":".","recursive":true}"#).await.expect("list");
    assert!(r.output.contains("src/lib.py"), "{}", r.output);

    let r = sb.call("grep", r#"{"pattern":"return \\d","suffix":".py"}"#).await.expect("grep");
    let v: serde_json::Value = serde_json::from_str(&r.output).expect("json");
    assert_eq!(v["matches"][0]["path"], "src/lib.py");
    assert_eq!(v["matches"][0]["line"], 2);

    let patch = "--- a/src/lib.py\n+++ b/src/lib.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n--- /dev/null\n+++ b/NEW.md\n@@ -0,0 +1 @@\n+new file\n";
    let r =
        sb.call("patch", &serde_json::json!({ "patch": patch }).to_string()).await.expect("patch");
    assert_eq!(r.outcome, CallOutcome::Ok, "{r:?}");
    assert_eq!(sb.read_file("src/lib.py").await.expect("read"), b"def f():\n    return 2\n");
    assert_eq!(sb.read_file("NEW.md").await.expect("read"), b"new file\n");
    let bad = "--- a/src/lib.py\n+++ b/src/lib.py\n@@ -1,2 +1,2 @@\n def g():\n-    return 9\n+    return 3\n";
    let r =
        sb.call("patch", &serde_json::json!({ "patch": bad }).to_string()).await.expect("patch");
    assert!(matches!(r.outcome, CallOutcome::ToolError(_)), "{r:?}");

    sb.write_file("data/scores.json", br#"{"runs":[{"score":3},{"score":9}]}"#)
        .await
        .expect("upload");
    let r = sb
        .call("jq", r#"{"query":"$.runs[?@.score > 5].score","path":"data/scores.json"}"#)
        .await
        .expect("jq");
    assert_eq!(r.output, r#"{"results":[9]}"#);

    let mut cat = chaos(&["cat"]);
    cat.stdin = b"stdin reaches commands".to_vec();
    let r = sb.call_with(cat).await.expect("cat");
    assert_eq!(
        (r.outcome.clone(), r.stdout_text().to_string()),
        (CallOutcome::Exit(0), "stdin reaches commands".into())
    );
    let mut env = chaos(&["env", "GREETING"]);
    env.env = vec![("GREETING".into(), "hello".into())];
    assert_eq!(sb.call_with(env).await.expect("env").stdout_text(), "hello\n");
}

#[tokio::test]
async fn hostile_guests_end_as_outcomes_while_others_keep_working() {
    let daemon = Daemon::start().expect("brigd");
    let client = with_chaos(&daemon).await;
    let (stop, watcher) = bystander(client.clone());

    let limited = |mut c: CallRequest, limits: CallLimits| {
        c.limits = limits;
        c
    };
    let r = client
        .call_with(limited(
            chaos(&["loop"]),
            CallLimits { timeout_ms: Some(300), ..Default::default() },
        ))
        .await
        .expect("loop");
    assert_eq!(r.outcome, CallOutcome::Timeout);
    assert!(r.duration_us < 2_000_000, "deadline overshot: {} us", r.duration_us);

    let r = client
        .call_with(limited(
            chaos(&["alloc", "100000"]),
            CallLimits { memory_mib: Some(32), ..Default::default() },
        ))
        .await
        .expect("alloc");
    assert_eq!(r.outcome, CallOutcome::OutOfMemory, "{r:?}");

    let r = client
        .call_with(limited(
            chaos(&["flood"]),
            CallLimits { output_bytes: Some(65_536), ..Default::default() },
        ))
        .await
        .expect("flood");
    assert_eq!(r.outcome, CallOutcome::OutputOverflow);
    assert_eq!(r.stdout.len(), 65_536);

    let r = client.call_with(chaos(&["panic"])).await.expect("panic");
    assert!(matches!(r.outcome, CallOutcome::Trap(_)), "{r:?}");

    // Several at once, in parallel with the bystander.
    let storms: Vec<_> = (0..8)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move {
                c.call_with(limited(
                    chaos(&["loop"]),
                    CallLimits { timeout_ms: Some(500), ..Default::default() },
                ))
                .await
            })
        })
        .collect();
    for s in storms {
        assert_eq!(s.await.expect("join").expect("call").outcome, CallOutcome::Timeout);
    }

    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = watcher.await.expect("bystander");
    assert_eq!(failed, 0, "bystander saw failures");
    assert!(ok > 10, "bystander made only {ok} calls");
}

#[tokio::test]
async fn malformed_components_are_refused() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("text", b"definitely not wasm".to_vec()),
        ("truncated", std::fs::read(guest("tools/jq.wasm")).expect("jq")[..5000].to_vec()),
        ("core-module", core_module),
    ];
    for (name, bytes) in cases {
        let err =
            client.add_tool(name, bytes).await.err().unwrap_or_else(|| panic!("{name} accepted"));
        assert_eq!(err.code(), Some(ErrorCode::InvalidComponent), "{name}: {err}");
        assert!(!err.retryable());
    }
    let err = client.add_tool("../evil", b"\0asm".to_vec()).await.expect_err("bad name");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let err = client.call("text", "").await.expect_err("not registered");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    // The daemon is fine.
    assert!(client.call("jq", r#"{"query":"$","json":1}"#).await.expect("call").is_success());
}

#[tokio::test]
async fn nothing_leaves_the_workspace() {
    let daemon = Daemon::start().expect("brigd");
    let client = with_chaos(&daemon).await;
    let sb = client.create(SandboxOptions::fncall()).await.expect("create");
    sb.write_file("inside.txt", b"ok").await.expect("write");
    let workspace = daemon.state_dir().join("fncall/workspaces").join(sb.id());
    assert!(workspace.join("inside.txt").exists());
    std::os::unix::fs::symlink("/etc", workspace.join("etc-link")).expect("symlink");
    std::os::unix::fs::symlink("../../../../", workspace.join("up-link")).expect("symlink");

    for path in ["../../access-token", "/etc/passwd", "etc-link/passwd", "up-link/access-token"] {
        let r = sb.call_with(chaos(&["read", path])).await.expect("read");
        assert_eq!(r.outcome, CallOutcome::Exit(1), "guest read {path}: {r:?}");
        let r = sb.call_with(chaos(&["write", path, "x"])).await.expect("write");
        assert_eq!(r.outcome, CallOutcome::Exit(1), "guest write {path}: {r:?}");
        let r = sb
            .call("files", &serde_json::json!({ "op": "read", "path": path }).to_string())
            .await
            .expect("files");
        assert!(matches!(r.outcome, CallOutcome::ToolError(_)), "files read {path}: {r:?}");
        let err =
            sb.read_file(path).await.err().unwrap_or_else(|| panic!("API read {path} succeeded"));
        assert!(
            matches!(err.code(), Some(ErrorCode::PermissionDenied | ErrorCode::NotFound)),
            "{path}: {err}"
        );
        if path.starts_with('/') {
            // The API roots absolute paths at the workspace: this lands inside it.
            sb.write_file(path, b"x").await.expect("write inside");
            assert_eq!(
                std::fs::read(workspace.join(path.trim_start_matches('/'))).expect("inside"),
                b"x"
            );
        } else {
            assert!(sb.write_file(path, b"x").await.is_err(), "API write {path} succeeded");
        }
    }
    assert_ne!(std::fs::read("/etc/passwd").expect("host passwd"), b"x");
    let token = std::fs::read_to_string(daemon.state_dir().join("access-token")).expect("token");
    let secret = token.trim().strip_prefix("e2b_").unwrap_or_default();
    assert!(
        secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit()),
        "the daemon's token file was touched: {token:?}"
    );
    // One-shot calls see no filesystem at all.
    let r = client.call_with(chaos(&["read", "/workspace/inside.txt"])).await.expect("read");
    assert_eq!(r.outcome, CallOutcome::Exit(1));
}

#[tokio::test]
async fn large_files_stream_byte_exact() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::fncall()).await.expect("create");
    let size = 96 << 20;
    let data: Vec<u8> =
        (0..size).map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let written = sb.upload("big/blob.bin", &data[..]).await.expect("upload");
    assert_eq!(written, size as u64);
    assert_eq!(sb.stat("big/blob.bin").await.expect("stat").size, size as u64);
    let mut sink = Vec::with_capacity(size);
    let got = sb.download("big/blob.bin", &mut sink).await.expect("download");
    assert_eq!(got, size as u64);
    assert_eq!(Sha256::digest(&sink), Sha256::digest(&data));
    let entries = sb.list_dir("big").await.expect("ls");
    assert_eq!(entries.len(), 1);
    sb.remove("big", true).await.expect("rm");
    assert_eq!(sb.stat("big").await.err().and_then(|e| e.code()), Some(ErrorCode::NotFound));
}

#[tokio::test]
async fn sandboxes_persist_across_restart_and_expire_when_idle() {
    let mut daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let keep = client.create(SandboxOptions::fncall().label("job", "j1")).await.expect("create");
    keep.write_file("state.txt", b"before restart").await.expect("write");
    let short = client
        .create(SandboxOptions::fncall().label("job", "j1").idle_ttl(Duration::from_millis(1500)))
        .await
        .expect("create");
    assert_eq!(client.list(&[("job", "j1")]).await.expect("ls").len(), 2);
    assert_eq!(client.list(&[("job", "other")]).await.expect("ls").len(), 0);

    daemon.restart().expect("restart");
    let client = daemon.client().await.expect("reconnect");
    let keep = client.sandbox(keep.id());
    assert_eq!(keep.read_file("state.txt").await.expect("read"), b"before restart");

    tokio::time::sleep(Duration::from_millis(3000)).await;
    let err = client.sandbox(short.id()).status().await.expect_err("expired");
    assert_eq!(err.code(), Some(ErrorCode::Expired), "{err}");
    assert!(keep.status().await.is_ok());
    keep.destroy().await.expect("destroy");
    let err = keep.status().await.expect_err("destroyed");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    let err = client.sandbox("sb-nothex").status().await.expect_err("bad id");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
}

#[tokio::test]
async fn garbage_on_the_wire_gets_a_typed_error_and_the_daemon_stays_up() {
    let mut daemon = Daemon::start().expect("brigd");
    let opts = daemon.connect_options().expect("opts");
    let Pin::Sha256(hex) = &opts.pin else { unreachable!("fingerprint") };
    let pin = brig_transport::CertPin::from_hex(hex).expect("pin");
    let conn = brig_transport::ClientConnection::connect_current(opts.addr, &pin, &opts.token)
        .await
        .expect("conn");
    // A frame whose body is not a Request, and a length prefix past the limit.
    for raw in [vec![3, 0, 0, 0, 0xff, 0xff, 0xff], vec![0xff, 0xff, 0xff, 0x7f, 1, 2, 3]] {
        let reply = raw_request(&conn, raw).await;
        match reply {
            brig_proto::Reply::Error(e) => assert_eq!(e.code, ErrorCode::BadRequest),
            other => panic!("expected an error, got {other:?}"),
        }
    }
    assert!(daemon.is_running());
    let client = daemon.client().await.expect("connect");
    assert!(client.call("jq", r#"{"query":"$","json":1}"#).await.expect("call").is_success());
}

/// Sends raw bytes as a request stream and reads one reply frame.
async fn raw_request(conn: &brig_transport::ClientConnection, raw: Vec<u8>) -> brig_proto::Reply {
    let mut exchange = conn.open_raw(bytes::Bytes::from(raw)).await.expect("open");
    exchange.finish_upload().expect("finish");
    exchange.reply().await.expect("reply")
}

#[tokio::test]
async fn no_network_and_fuel_limits() {
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(config.path(), "[fncall]\nfuel = true\n").expect("write config");
    let daemon =
        Daemon::start_with(&["--config", config.path().to_str().expect("utf8")]).expect("brigd");
    let client = with_chaos(&daemon).await;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr").to_string();
    let r = client.call_with(chaos(&["connect", &addr])).await.expect("connect");
    assert_eq!(r.outcome, CallOutcome::Exit(1), "{r:?}");
    assert!(listener.accept().is_err(), "a guest reached a host socket");

    let mut spin = chaos(&["loop"]);
    spin.limits =
        CallLimits { fuel: Some(5_000_000), timeout_ms: Some(10_000), ..Default::default() };
    let r = client.call_with(spin).await.expect("fuel");
    assert_eq!(r.outcome, CallOutcome::FuelExhausted, "{r:?}");
    // Fuel metering on, ordinary calls still work.
    assert!(client.call("jq", r#"{"query":"$","json":1}"#).await.expect("call").is_success());
}
