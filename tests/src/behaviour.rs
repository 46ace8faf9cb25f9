//! What a container sandbox does through the SDK, checked the same way wherever it runs: on
//! the node's kernel (`tests/container.rs`) and in a container-host VM inside the emulated
//! host (`tests/container_host.rs`). One function, so "behaves like one on the host kernel"
//! means the same checks pass, not two lists that drift apart.

use std::time::Duration;

use brig_sdk::{
    Client, Cmd, ErrorCode, ExecEvent, FileKind, Sandbox, SandboxOptions, SandboxState,
};

/// Scales the timeouts in the checks (emulated hosts run guest code ~10× slower).
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub slow: u32,
}

impl Pace {
    fn secs(self, s: u64) -> Duration {
        Duration::from_secs(s * u64::from(self.slow))
    }
}

/// Creates a container with `options` (a busybox image) and runs every check on it: exec
/// output, exit codes, streaming, stdin (given and streamed), cwd, env, users, the output cap,
/// timeouts, kills, sessions, files and their errors, the disk quota, pause with implicit
/// resume, and containment of `/proc/kpagecgroup`; then destroys it. Returns the sandbox's
/// `placement` and the names of the checks passed, or the first that failed.
pub async fn check_container(
    client: &Client,
    options: SandboxOptions,
    pace: Pace,
) -> Result<(String, Vec<&'static str>), String> {
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let sb =
        client.create(options.env("FROM_CREATE", "yes").disk_mib(16)).await.map_err(e("create"))?;
    let info = sb.status().await.map_err(e("status"))?;
    let placement = info.placement.clone().unwrap_or_default();
    let mut passed = Vec::new();
    let run = |script: &str| Cmd::shell(script).timeout(pace.secs(30));

    check_exec_output(&sb).await?;
    passed.push("stdout, stderr and exit code");

    let out = sb.exec(["sh", "-c", "kill -TERM $$"]).await.map_err(e("exec"))?;
    if out.result.signal != Some(15) || out.result.exit_code.is_some() {
        return Err(format!("a command killed by a signal: {:?}", out.result));
    }
    passed.push("death by signal");

    check_streaming(&sb, pace).await?;
    passed.push("output streamed as produced");

    check_command_data(&sb).await?;
    passed.push("argv, environment and directory as data");

    let out = sb
        .exec_with(
            Cmd::new(["sh", "-c", "cat; echo; pwd; echo $FROM_CREATE $FROM_EXEC"])
                .stdin(b"to-stdin".to_vec())
                .cwd("/tmp")
                .env("FROM_EXEC", "too"),
        )
        .await
        .map_err(e("exec with stdin"))?;
    if out.stdout != b"to-stdin\n/tmp\nyes too\n" {
        return Err(format!("stdin, cwd and env: {:?}", out.stdout_text()));
    }
    passed.push("stdin, cwd and environment");

    check_streamed_stdin(&sb).await?;
    passed.push("streamed stdin");

    let out = sb.exec_with(Cmd::new(["id", "-u"]).user("nobody")).await.map_err(e("as nobody"))?;
    if out.stdout != b"65534\n" {
        return Err(format!("as nobody: {out:?}"));
    }
    passed.push("commands as another user");

    check_output_cap(&sb, pace).await?;
    passed.push("output cap");

    let out = sb
        .exec_with(Cmd::shell("sleep 30").timeout(pace.secs(1)))
        .await
        .map_err(e("past its timeout"))?;
    if !out.result.timed_out {
        return Err(format!("timeout: {:?}", out.result));
    }
    passed.push("timeout");

    let running =
        sb.exec_stream(run("echo started; sleep 60; echo never")).await.map_err(e("exec"))?;
    let id = running.exec_id();
    drop(running);
    let mut again = sb.attach(id).await.map_err(e("attach"))?;
    match again.next().await {
        Some(Ok(ExecEvent::Stdout(b))) if &b[..] == b"started\n" => {}
        other => return Err(format!("attached, first event: {other:?}")),
    }
    sb.kill(id).await.map_err(e("kill"))?;
    let out = again.collect().await.map_err(e("collect after kill"))?;
    if !out.result.killed || !out.stdout.is_empty() {
        return Err(format!("after kill: {out:?}"));
    }
    passed.push("re-attach by exec id, kill");

    let shell = sb.open_session().await.map_err(e("open_session"))?;
    shell
        .run("mkdir -p /work && cd /work && export KEPT=1", pace.secs(30))
        .await
        .map_err(e("run"))?;
    let out = shell.run("echo $KEPT $(pwd)", pace.secs(30)).await.map_err(e("run"))?;
    if out.stdout != b"1 /work\n" || out.cwd != "/work" || out.exit_code != Some(0) {
        return Err(format!("session state: {out:?}"));
    }
    let pending = shell.run("sleep 30", Duration::from_millis(300)).await.map_err(e("run"))?;
    if !pending.is_running() {
        return Err(format!("a command past its call's timeout stopped: {pending:?}"));
    }
    shell.interrupt().await.map_err(e("interrupt"))?;
    let out = shell.wait(pace.secs(30)).await.map_err(e("wait"))?;
    if out.exit_code.is_none() || out.exit_code == Some(0) {
        return Err(format!("interrupted command: {out:?}"));
    }
    shell.close().await.map_err(e("session close"))?;
    passed.push("session: state, pending command, interrupt");

    let blob: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    sb.write_file("/work/data/blob", &blob).await.map_err(e("write_file"))?;
    if sb.read_file("/work/data/blob").await.map_err(e("read_file"))? != blob {
        return Err("a file changed in transit".into());
    }
    let st = sb.stat("/work/data/blob").await.map_err(e("stat"))?;
    if st.size != blob.len() as u64 || st.kind != FileKind::File {
        return Err(format!("stat: {st:?}"));
    }
    sb.mkdir("/work/empty", false).await.map_err(e("mkdir"))?;
    let names: Vec<String> = sb
        .list_dir("/work")
        .await
        .map_err(e("list"))?
        .into_iter()
        .map(|f| f.path.rsplit('/').next().unwrap_or_default().to_string())
        .collect();
    if !(names.contains(&"data".to_string()) && names.contains(&"empty".to_string())) {
        return Err(format!("list: {names:?}"));
    }
    sb.remove("/work/data", true).await.map_err(e("remove"))?;
    match sb.stat("/work/data/blob").await {
        Err(err) if err.code() == Some(ErrorCode::NotFound) => {}
        other => return Err(format!("stat after remove: {other:?}")),
    }
    match sb.read_file("/no/such/file").await {
        Err(err) if err.code() == Some(ErrorCode::NotFound) => {}
        other => return Err(format!("reading a missing file: {other:?}")),
    }
    passed.push("files: write, read, stat, list, mkdir, remove, not_found");

    let out = sb
        .exec_with(run("dd if=/dev/zero of=/fill bs=1M count=64 2>&1; echo rc=$?"))
        .await
        .map_err(e("disk fill"))?;
    if !out.stdout_text().contains("No space left") {
        return Err(format!("the 16 MiB disk quota did not hold: {}", out.stdout_text()));
    }
    sb.exec(["rm", "-f", "/fill"]).await.map_err(e("rm"))?;
    passed.push("disk quota");

    let out = sb.exec(["sh", "-c", "cat /proc/kpagecgroup >/dev/null"]).await.map_err(e("exec"))?;
    if out.result.exit_code == Some(0) {
        return Err("/proc/kpagecgroup was readable".into());
    }
    passed.push("/proc/kpagecgroup refused");

    sb.exec(["sh", "-c", "echo kept > /tmp/mark"]).await.map_err(e("exec"))?;
    sb.pause().await.map_err(e("pause"))?;
    let state = sb.status().await.map_err(e("status"))?.state;
    if state != SandboxState::Paused {
        return Err(format!("after pause: {state:?}"));
    }
    let out = sb.exec(["cat", "/tmp/mark"]).await.map_err(e("exec after pause"))?;
    if out.stdout != b"kept\n"
        || sb.status().await.map_err(e("status"))?.state != SandboxState::Running
    {
        return Err(format!("implicit resume: {out:?}"));
    }
    passed.push("pause, implicit resume");

    sb.destroy().await.map_err(e("destroy"))?;
    match sb.exec(["true"]).await {
        Err(err) if err.code() == Some(ErrorCode::NotFound) => {}
        other => return Err(format!("exec after destroy: {other:?}")),
    }
    passed.push("destroy");
    Ok((placement, passed))
}

fn err(what: &'static str) -> impl Fn(brig_sdk::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// A command's stdout, stderr and exit status come back apart.
pub async fn check_exec_output(sb: &Sandbox) -> Result<(), String> {
    let out = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]).await.map_err(err("exec"))?;
    if out.stdout != b"out\n" || out.stderr != b"err\n" || out.result.exit_code != Some(3) {
        return Err(format!("exec output and status: {out:?}"));
    }
    Ok(())
}

/// A command's argv, environment and directory reach it as data: an argument with a newline,
/// quotes and `$`, and environment names with a space or a newline arrive unchanged (read back
/// from `/proc/self/environ`); what execve cannot carry (a name with `=`) is refused with a
/// clear `BadRequest`, for every tier alike.
pub async fn check_command_data(sb: &Sandbox) -> Result<(), String> {
    let tricky = "a\nb 'c' \"d\" $e `f`";
    let out = sb.exec(["printf", "%s", tricky]).await.map_err(err("printf"))?;
    if out.stdout != tricky.as_bytes() || out.result.exit_code != Some(0) {
        return Err(format!("an argument with a newline came back as {:?}", out.stdout_text()));
    }
    let out = sb
        .exec_with(
            Cmd::new(["cat", "/proc/self/environ"])
                .env("WITH SPACE", "v 1")
                .env("WITH\nNEWLINE", "v\n2")
                .env("PLAIN", "$(echo not run)"),
        )
        .await
        .map_err(err("environ"))?;
    let environ: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    for wanted in [&b"WITH SPACE=v 1"[..], b"WITH\nNEWLINE=v\n2", b"PLAIN=$(echo not run)"] {
        if !environ.contains(&wanted) {
            return Err(format!(
                "{:?} did not reach the command: {:?}",
                String::from_utf8_lossy(wanted),
                out.stdout_text()
            ));
        }
    }
    match sb.exec_with(Cmd::new(["true"]).env("A=B", "x")).await {
        Err(e) if e.code() == Some(ErrorCode::BadRequest) && e.to_string().contains("A=B") => {}
        other => return Err(format!("an environment name with `=`: {other:?}")),
    }
    let out = sb.exec_with(Cmd::new(["pwd"]).cwd("/tmp")).await.map_err(err("cwd"))?;
    if out.stdout_text().trim() != "/tmp" {
        return Err(format!("cwd: {:?}", out.stdout_text()));
    }
    Ok(())
}

/// Output arrives as it is produced: three lines, a pause between them.
pub async fn check_streaming(sb: &Sandbox, pace: Pace) -> Result<(), String> {
    let run = |script: &str| Cmd::shell(script).timeout(pace.secs(30));
    let mut stream = sb
        .exec_stream(run("for i in 1 2 3; do echo line-$i; sleep 0.3; done"))
        .await
        .map_err(err("exec_stream"))?;
    let mut chunks = 0;
    while let Some(event) = stream.next().await {
        match event.map_err(err("stream"))? {
            ExecEvent::Stdout(_) => chunks += 1,
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exited(r) if r.exit_code == Some(0) => break,
            ExecEvent::Exited(r) => return Err(format!("streamed exec: {r:?}")),
        }
    }
    if chunks < 2 {
        return Err(format!("output came in {chunks} piece(s), not as produced"));
    }
    Ok(())
}

/// Stdin streamed as the client sends it reaches the command whole.
pub async fn check_streamed_stdin(sb: &Sandbox) -> Result<(), String> {
    let mut piped =
        sb.exec_stream(Cmd::new(["wc", "-c"]).stdin_stream()).await.map_err(err("stdin stream"))?;
    for _ in 0..4 {
        piped.write_stdin(vec![b'x'; 50_000]).await.map_err(err("write_stdin"))?;
    }
    piped.close_stdin().map_err(err("close_stdin"))?;
    let out = piped.collect().await.map_err(err("collect"))?;
    if out.stdout_text().trim() != "200000" {
        return Err(format!("streamed stdin: {out:?}"));
    }
    Ok(())
}

/// Output past the cap stops the command; what came back stops at the cap.
pub async fn check_output_cap(sb: &Sandbox, pace: Pace) -> Result<(), String> {
    let run = |script: &str| Cmd::shell(script).timeout(pace.secs(30));
    let out = sb
        .exec_with(run("while true; do echo yyyyyyyy; done").output_limit(10_000))
        .await
        .map_err(err("past the cap"))?;
    if !out.result.truncated || out.stdout.len() != 10_000 {
        return Err(format!(
            "cap: truncated {} at {} bytes",
            out.result.truncated,
            out.stdout.len()
        ));
    }
    Ok(())
}

/// A guest decides what a file read returns: `/dev/zero` never ends and a sparse 10 GiB file
/// reads as 10 GiB of zeros. Through the file API each is refused with `too_large` once past
/// the node's per-read limit, and the daemon gives back what it held (its RSS ends within
/// 96 MiB of where it started; the limit is `max_guest_read_mib`, 256 MiB by default and 16 in
/// the emulated hosts). Returns a line for the report.
pub async fn check_oversized_reads(client: &Client, sb: &Sandbox) -> Result<String, String> {
    let made = sb
        .exec([
            "sh",
            "-c",
            "mkdir -p /tmp && dd if=/dev/zero of=/tmp/sparse-10g bs=1 count=0 seek=10737418240",
        ])
        .await
        .map_err(err("making a sparse file"))?;
    if !made.success() {
        return Err(format!("making a sparse file: {made:?}"));
    }
    let before = client.node_status().await.map_err(err("node status"))?.daemon_rss_bytes;
    let mut peak = before;
    for path in ["/dev/zero", "/tmp/sparse-10g"] {
        match sb.read_file(path).await {
            Err(e) if e.code() == Some(ErrorCode::TooLarge) => {}
            // A container's file API refuses a device before reading anything: bounded too.
            Err(e)
                if path == "/dev/zero"
                    && e.code() == Some(ErrorCode::BadRequest)
                    && e.to_string().contains("not a regular file") => {}
            Err(e) => return Err(format!("reading {path}: {e} (wanted too_large)")),
            Ok(data) => return Err(format!("reading {path} returned {} bytes", data.len())),
        }
        let now = client.node_status().await.map_err(err("node status"))?.daemon_rss_bytes;
        peak = peak.max(now);
    }
    // The sandbox and the daemon still serve.
    let out = sb.exec(["echo", "still-here"]).await.map_err(err("exec after the reads"))?;
    if out.stdout != b"still-here\n" {
        return Err(format!("exec after the reads: {out:?}"));
    }
    let after = client.node_status().await.map_err(err("node status"))?.daemon_rss_bytes;
    let mib = |b: u64| b / (1 << 20);
    if after > before + (96 << 20) {
        return Err(format!(
            "brigd's RSS grew from {} MiB to {} MiB over two refused reads",
            mib(before),
            mib(after)
        ));
    }
    Ok(format!(
        "oversized reads refused (too_large); brigd RSS {} -> {} MiB (peak seen {} MiB)",
        mib(before),
        mib(after),
        mib(peak)
    ))
}
