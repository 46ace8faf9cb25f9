//! A short demo rollout through the SDK: what an agent's tool loop does against Brig.
//!
//! Run a daemon first (`brigd --tools-dir artifacts/guests/tools`), then
//! `cargo run -p brig-sdk --example rollout`. Set BRIG_STATE_DIR if brigd uses another state
//! directory.

use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, ErrorCode, SandboxOptions, Tier};

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
    println!("fncall sandbox destroyed");

    let container = container_rollout(&client).await?;
    // What ran on this machine, tier by tier.
    println!("[tier] fncall: ran (one-shot calls and a stateful sandbox)");
    println!("[tier] container: {container}");
    for tier in [Tier::Microvm, Tier::Fullvm] {
        println!(
            "[tier] {}: {}",
            format!("{tier:?}").to_lowercase(),
            vm_tier(&client, tier).await?
        );
    }
    println!("demo done");
    Ok(())
}

/// Creates a VM sandbox of `tier`, runs a command in it and removes it; or says why the tier
/// is not offered here.
async fn vm_tier(client: &Client, tier: Tier) -> anyhow::Result<String> {
    let started = Instant::now();
    match client.create(SandboxOptions::tier(tier)).await {
        Ok(sandbox) => {
            let out = sandbox.exec(["uname", "-r"]).await?;
            sandbox.destroy().await?;
            Ok(format!(
                "ran (kernel {} in the guest, {:?} create to answer)",
                out.stdout_text().trim(),
                started.elapsed()
            ))
        }
        Err(e) if e.code() == Some(ErrorCode::Unavailable) => Ok(format!("not offered here: {e}")),
        Err(e) => Err(e.into()),
    }
}

/// The same loop in a Linux container: a shell session that keeps its state, a test run, and
/// a runaway command stopped by its timeout.
async fn container_rollout(client: &Client) -> anyhow::Result<String> {
    let image = std::env::var("BRIG_DEMO_IMAGE").unwrap_or_else(|_| "debian-12".to_string());
    let started = Instant::now();
    let sandbox = match client
        .create(SandboxOptions::container(&image).label("job", "demo").memory_mib(512))
        .await
    {
        Ok(sandbox) => sandbox,
        Err(e) if e.code() == Some(ErrorCode::Unavailable) => {
            return Ok(format!("not offered here: {e}"));
        }
        Err(e) => return Err(e.into()),
    };
    println!("container {} ({image}) created in {:?}", sandbox.id(), started.elapsed());
    sandbox.write_file("/workspace/app.py", b"def add(a, b):\n    return a + b\n").await?;
    sandbox
        .write_file(
            "/workspace/test_app.py",
            b"from app import add\nassert add(2, 3) == 5\nprint('tests passed')\n",
        )
        .await?;
    let shell = sandbox.open_session().await?;
    let t = Duration::from_secs(30);
    shell.run("cd /workspace && export PYTHONDONTWRITEBYTECODE=1", t).await?;
    let run = shell
        .run("python3 test_app.py && git init -q . && git add -A && echo committed-ready", t)
        .await?;
    println!("session in {}: exit {:?}\n{}", run.cwd, run.exit_code, run.stdout_text().trim_end());
    let runaway =
        sandbox.exec_with(Cmd::shell("sleep 600").timeout(Duration::from_millis(300))).await?;
    println!("runaway command: timed_out={}", runaway.result.timed_out);
    shell.close().await?;
    sandbox.destroy().await?;
    println!("container destroyed");
    Ok(format!("ran ({image}: session, tests, a runaway command stopped)"))
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
