//! The fncall backend against the real guest components (built by scripts/build-guests.sh).

use std::path::PathBuf;
use std::time::Duration;

use brig_core::{CallLimits, CallOutcome, ToolCall};
use brig_fncall::{FncallBackend, FncallConfig, FncallError, ToolWorld};

fn guests() -> PathBuf {
    let root = std::env::var_os("BRIG_ARTIFACTS").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("../../artifacts")
    });
    let dir = root.join("guests");
    assert!(
        dir.join("tools/jq.wasm").exists(),
        "run scripts/build-guests.sh first ({})",
        dir.display()
    );
    dir
}

async fn backend(state: &std::path::Path) -> FncallBackend {
    let backend = FncallBackend::open(FncallConfig::default(), state).expect("open");
    backend.add_tools_from_dir(&guests().join("tools")).await.expect("tools");
    backend.add_tools_from_dir(&guests().join("testing")).await.expect("testing");
    backend
}

fn chaos(args: &[&str]) -> ToolCall {
    ToolCall {
        tool: "chaos".into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn tools_register_and_run() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = backend(tmp.path()).await;
    let tools = b.tools();
    assert_eq!(tools.iter().find(|t| t.name == "chaos").map(|t| t.world), Some(ToolWorld::Command));
    assert_eq!(tools.iter().find(|t| t.name == "jq").map(|t| t.world), Some(ToolWorld::Tool));

    let r = b
        .call(
            ToolCall::new_tool("jq", r#"{"query":"$.a[*].b","json":{"a":[{"b":1},{"b":2}]}}"#),
            None,
        )
        .await
        .expect("call");
    assert_eq!(r.outcome, CallOutcome::Ok, "{r:?}");
    assert_eq!(r.output, r#"{"results":[1,2]}"#);

    let r =
        b.call(ToolCall { stdin: b"hello".to_vec(), ..chaos(&["cat"]) }, None).await.expect("cat");
    assert_eq!((r.outcome, r.stdout), (CallOutcome::Exit(0), b"hello".to_vec()));

    // WASI 0.2's `exit` carries only success or failure, so any non-zero code arrives as 1.
    let r = b.call(chaos(&["exit", "7"]), None).await.expect("exit");
    assert_eq!(r.outcome, CallOutcome::Exit(1));
}

#[tokio::test]
async fn limits_become_outcomes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = backend(tmp.path()).await;
    let mut looping = chaos(&["loop"]);
    looping.limits = CallLimits { timeout: Some(Duration::from_millis(200)), ..Default::default() };
    let r = b.call(looping, None).await.expect("loop");
    assert_eq!(r.outcome, CallOutcome::Timeout);
    assert!(r.duration < Duration::from_secs(2), "{:?}", r.duration);

    let mut bomb = chaos(&["alloc", "100000"]);
    bomb.limits.memory_bytes = Some(32 << 20);
    let r = b.call(bomb, None).await.expect("alloc");
    assert_eq!(r.outcome, CallOutcome::OutOfMemory, "{r:?}");

    let mut flood = chaos(&["flood"]);
    flood.limits.output_bytes = Some(100_000);
    let r = b.call(flood, None).await.expect("flood");
    assert_eq!(r.outcome, CallOutcome::OutputOverflow);
    assert_eq!(r.stdout.len(), 100_000);

    let r = b.call(chaos(&["panic"]), None).await.expect("panic");
    assert!(matches!(r.outcome, CallOutcome::Trap(_)), "{r:?}");
}

#[tokio::test]
async fn bad_components_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = FncallBackend::open(FncallConfig::default(), tmp.path()).expect("open");
    for bytes in [
        b"not wasm at all".to_vec(),
        b"\0asm\x0d\0\x01\0garbage".to_vec(),
        b"\0asm\x01\0\0\0".to_vec(),
    ] {
        let err = b.add_tool("bad", bytes).await.expect_err("refused");
        assert!(matches!(err, FncallError::InvalidComponent(_)), "{err:?}");
    }
    assert!(matches!(
        b.call(ToolCall::new_tool("bad", ""), None).await,
        Err(FncallError::ToolNotFound(_))
    ));
}

#[tokio::test]
async fn workspace_is_the_only_filesystem() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = backend(tmp.path()).await;
    let ws = b.create_workspace("sb1").expect("ws");
    let write =
        ToolCall::new_tool("files", r#"{"op":"write","path":"notes/a.txt","content":"hi"}"#);
    assert_eq!(b.call(write, Some(&ws)).await.expect("write").outcome, CallOutcome::Ok);
    assert_eq!(std::fs::read_to_string(ws.path().join("notes/a.txt")).expect("read"), "hi");
    std::os::unix::fs::symlink("/etc", ws.path().join("etc")).expect("symlink");
    for path in ["../../x", "/etc/passwd", "etc/passwd"] {
        let r = b.call(chaos(&["read", path]), Some(&ws)).await.expect("read");
        assert_eq!(r.outcome, CallOutcome::Exit(1), "{path}: {r:?}");
    }
    // No workspace: no filesystem at all.
    let r = b.call(chaos(&["read", "/workspace/notes/a.txt"]), None).await.expect("read");
    assert_eq!(r.outcome, CallOutcome::Exit(1));
}
