//! A short demo rollout through the SDK: what an agent's tool loop does against Brig.
//!
//! Run a daemon first (`brigd --tools-dir artifacts/guests/tools`), then
//! `cargo run -p brig-sdk --example rollout`. Set BRIG_STATE_DIR if brigd uses another state
//! directory.

use std::time::Instant;

use brig_sdk::{Client, SandboxOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::connect_local().await?;
    println!("connected to {}", client.server_version().await);
    let tools = client.tools().await?;
    println!("tools: {}", tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", "));

    // A one-shot call: the throughput path.
    let started = Instant::now();
    let r = client
        .call(
            "jq",
            r#"{"query":"$.steps[*].reward","json":{"steps":[{"reward":0.5},{"reward":1.0}]}}"#,
        )
        .await?;
    println!("jq one-shot: {} in {:?} -> {}", r.outcome_name(), started.elapsed(), r.output);

    // A stateful sandbox: the agent edits a repository over several calls.
    let sandbox =
        client.create(SandboxOptions::fncall().label("job", "demo").label("rollout", "0")).await?;
    println!("sandbox {}", sandbox.id());
    sandbox.write_file("repo/app.py", b"def add(a, b):\n    return a - b\n").await?;
    let found = sandbox.call("grep", r#"{"pattern":"return","path":"repo"}"#).await?;
    println!("grep: {}", found.output);
    let patch = "--- a/repo/app.py\n+++ b/repo/app.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";
    let patched = sandbox.call("patch", &serde_json::json!({ "patch": patch }).to_string()).await?;
    println!("patch: {}", patched.output);
    let fixed = String::from_utf8(sandbox.read_file("repo/app.py").await?)?;
    println!("repo/app.py now:\n{fixed}");
    let listing = sandbox.call("files", r#"{"op":"list","path":".","recursive":true}"#).await?;
    println!("files: {}", listing.output);

    // Many one-shot calls at once over one connection, as a rollout batch would make them.
    let started = Instant::now();
    let calls = (0..2000).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            let input = format!(r#"{{"query":"$.n","json":{{"n":{i}}}}}"#);
            client.call("jq", &input).await
        })
    });
    let mut ok = 0;
    for call in futures_lite(calls.collect()).await {
        if call.is_ok_and(|r| r.is_ok_and(|r| r.is_success())) {
            ok += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("2000 concurrent one-shot calls: {ok} ok in {secs:.2} s ({:.0}/s)", 2000.0 / secs);

    sandbox.destroy().await?;
    println!("sandbox destroyed; demo done");
    Ok(())
}

/// Awaits every task in order.
async fn futures_lite<T>(
    tasks: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await);
    }
    out
}
