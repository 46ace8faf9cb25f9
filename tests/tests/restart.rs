//! Nothing lost across a brigd crash: commands keep running and their output, re-read by id
//! after a `kill -9` of brigd and a restart, is complete and in order.

use std::time::Duration;

use brig_sdk::{Client, Cmd, ExecEvent, ImageSource, SandboxOptions};
use brig_tests::{image, Daemon};
use sha2::{Digest, Sha256};

/// `kill -9`s brigd, leaves it down for `down`, starts it again and reconnects.
async fn crash_and_restart(daemon: &mut Daemon, down: Duration) -> Client {
    daemon.crash().expect("crash");
    tokio::time::sleep(down).await;
    daemon.start_again().expect("start");
    daemon.client().await.expect("reconnect")
}

/// Exec `id`'s whole output and result, read by id; it has 20 s to end (`ends` says why it
/// should).
async fn output_by_id(sb: &brig_sdk::Sandbox, id: u64, ends: &str) -> brig_sdk::ExecOutput {
    tokio::time::timeout(Duration::from_secs(20), async {
        sb.attach(id).await.expect("attach").collect().await.expect("output")
    })
    .await
    .unwrap_or_else(|_| panic!("exec {id} did not end: {ends}"))
}

fn seq(from: u64, to: u64) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

#[tokio::test]
async fn exec_output_survives_a_brigd_crash_complete_and_in_order() {
    let mut daemon = Daemon::start_with(&["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");

    // Finished before the crash: re-read by id after it.
    let done = sb.exec(["sh", "-c", "echo done; echo to-stderr >&2; exit 3"]).await.expect("exec");
    // Writes steadily through the crash, on both streams, then exits 7.
    let ticker = Cmd::shell(
        "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo $i; echo e$i >&2; sleep 0.02; done; exit 7",
    );
    let mut ticking = sb.exec_stream(ticker).await.expect("ticker");
    // Floods more than a pipe holds while brigd is down: it must block, not die of SIGPIPE.
    let flood = Cmd::shell("sleep 0.3; seq 1 200000").output_limit(8 << 20);
    let flooding = sb.exec_stream(flood).await.expect("flood");
    // Silent through the crash, then speaks.
    let late = sb.exec_stream(Cmd::shell("sleep 2; echo late")).await.expect("late");
    let ids = (done.exec_id, ticking.exec_id(), flooding.exec_id(), late.exec_id());
    let mut seen = String::new();
    while seen.lines().count() < 5 {
        match ticking.next().await.expect("event").expect("ticker event") {
            ExecEvent::Stdout(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exited(r) => panic!("the ticker ended early: {r:?}"),
        }
    }
    drop((ticking, flooding, late));
    let client = crash_and_restart(&mut daemon, Duration::from_millis(700)).await;
    let sb = client.sandbox(sb.id());

    let log = daemon.log_text();
    let resumed = log.lines().find(|l| l.contains("commands kept across the restart"));
    // Three were running (the log line ends with `resumed=3`, maybe coloured).
    assert!(resumed.is_some_and(|l| l.trim_end().ends_with('3')), "{resumed:?}");

    let again = sb.attach(ids.0).await.expect("attach finished").collect().await.expect("output");
    assert_eq!(again.stdout_text(), "done\n");
    assert_eq!(again.stderr_text(), "to-stderr\n");
    assert_eq!(again.result.exit_code, Some(3));

    let ticker = sb.attach(ids.1).await.expect("attach ticker").collect().await.expect("output");
    assert_eq!(ticker.stdout_text(), seq(1, 60), "stdout complete and in order");
    let stderr: String = (1..=60).map(|i| format!("e{i}\n")).collect();
    assert_eq!(ticker.stderr_text(), stderr, "stderr complete and in order");
    assert_eq!(ticker.result.exit_code, Some(7));

    let flood = sb.attach(ids.2).await.expect("attach flood").collect().await.expect("output");
    assert_eq!(flood.result.exit_code, Some(0), "{:?} {}", flood.result, flood.stderr_text());
    assert!(flood.stdout_text() == seq(1, 200000), "the flood's output is not whole");

    let late = sb.attach(ids.3).await.expect("attach late").collect().await.expect("output");
    assert_eq!((late.stdout_text().as_str(), late.result.exit_code), ("late\n", Some(0)));

    // Ids go on after the kept ones; the list shows them all.
    let next = sb.exec(["echo", "next"]).await.expect("exec after restart");
    assert!(next.exec_id > ids.3, "exec ids restarted: {} after {}", next.exec_id, ids.3);
    let listed: Vec<u64> = sb.execs().await.expect("execs").iter().map(|e| e.exec_id).collect();
    for id in [ids.0, ids.1, ids.2, ids.3, next.exec_id] {
        assert!(listed.contains(&id), "{id} not in {listed:?}");
    }
    sb.destroy().await.expect("destroy");
}

/// A command's streamed stdin outlives a brigd crash: the shim keeps the pipe's write end
/// with the output's read ends, and the restarted brigd takes it back, so a client writes on
/// by exec id and closes it (the command reads end of file then, not at the crash).
#[tokio::test]
async fn streamed_stdin_survives_a_brigd_crash_and_is_written_by_id() {
    use brig_sdk::ErrorCode;
    let mut daemon = Daemon::start_with(&["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");

    let mut cat = sb.exec_stream(Cmd::new(["cat"]).stdin_stream()).await.expect("cat");
    let id = cat.exec_id();
    // Through its stream, then by id from the same client while the stream is open.
    // (Each write is echoed before the next: the two ways keep no order between them.)
    let mut seen = String::new();
    for (line, by_id) in [("one\n", false), ("two\n", true)] {
        if by_id {
            sb.write_stdin(id, line).await.expect("write by id");
        } else {
            cat.write_stdin(line.as_bytes().to_vec()).await.expect("write through the stream");
        }
        while !seen.ends_with(line) {
            match cat.next().await.expect("event").expect("cat event") {
                ExecEvent::Stdout(b) => seen.push_str(&String::from_utf8_lossy(&b)),
                other => panic!("cat: {other:?} after {seen:?}"),
            }
        }
    }
    assert_eq!(seen, "one\ntwo\n");
    // Stdin given whole, not streamed, cannot be written later.
    let given = sb.exec_stream(Cmd::new(["sleep", "30"]).stdin("x")).await.expect("sleep");
    let refused = sb.write_stdin(given.exec_id(), "y").await.expect_err("not streamed");
    assert_eq!(refused.code(), Some(ErrorCode::Conflict), "{refused}");
    let unknown = sb.write_stdin(9999, "y").await.expect_err("no such exec");
    assert_eq!(unknown.code(), Some(ErrorCode::NotFound), "{unknown}");

    let client = crash_and_restart(&mut daemon, Duration::from_millis(500)).await;
    drop(cat);
    let sb = client.sandbox(sb.id());
    // Still reading: its stdin did not end with brigd.
    let running = sb.execs().await.expect("execs");
    let info = running.iter().find(|e| e.exec_id == id).expect("cat is listed");
    assert!(info.result.is_none(), "cat ended at the crash: {info:?}");
    // The CLI's way: `brig input` writes its own stdin to the command's, then closes it.
    let mut cli = std::process::Command::new(brig_tests::binary("brig"))
        .arg("--state-dir")
        .arg(daemon.state_dir())
        .args(["input", sb.id(), &id.to_string(), "--close"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("brig input");
    {
        use std::io::Write;
        let mut to_cli = cli.stdin.take().expect("the CLI's stdin");
        to_cli.write_all(b"three\n").expect("write to the CLI");
    }
    let status = tokio::task::spawn_blocking(move || cli.wait()).await.expect("join");
    assert!(status.expect("brig input").success(), "brig input failed");
    sb.close_stdin(id).await.expect("closing twice does nothing");
    let out = output_by_id(&sb, id, "cat ends once its stdin is closed").await;
    assert_eq!(out.stdout_text(), "one\ntwo\nthree\n");
    assert_eq!(out.result.exit_code, Some(0), "{:?}", out.result);
    let closed = sb.write_stdin(id, "four\n").await.expect_err("closed");
    assert_eq!(closed.code(), Some(ErrorCode::Conflict), "{closed}");
    sb.kill(given.exec_id()).await.expect("kill sleep");
    sb.destroy().await.expect("destroy");
}

/// A client whose connection ends without ending a command's stdin (lost, or its process
/// killed) leaves that stdin open: a client that reconnects writes on and closes it by id. A
/// client that ends its input (drops its stream, which finishes it) closes it.
#[tokio::test]
async fn a_client_that_goes_away_leaves_a_streamed_stdin_open() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let mut cat = sb.exec_stream(Cmd::new(["cat"]).stdin_stream()).await.expect("cat");
    let id = cat.exec_id();
    cat.write_stdin(b"one\n".to_vec()).await.expect("write");
    match cat.next().await {
        Some(Ok(ExecEvent::Stdout(b))) if &b[..] == b"one\n" => {}
        other => panic!("cat's first event: {other:?}"),
    }
    // The connection goes, with the stream still open.
    client.close().await;
    drop(cat);
    let again = daemon.client().await.expect("reconnect");
    let sb = again.sandbox(sb.id());
    tokio::time::sleep(Duration::from_millis(300)).await;
    sb.write_stdin(id, "two\n").await.expect("write by id after the client went away");
    sb.close_stdin(id).await.expect("close by id");
    let out = output_by_id(&sb, id, "cat ends once its stdin is closed").await;
    assert_eq!(out.stdout_text(), "one\ntwo\n");
    assert_eq!(out.result.exit_code, Some(0), "{:?}", out.result);

    // Dropping the stream ends the input.
    let mut wc = sb.exec_stream(Cmd::new(["wc", "-c"]).stdin_stream()).await.expect("wc");
    wc.write_stdin(b"abc".to_vec()).await.expect("write");
    let wc_id = wc.exec_id();
    drop(wc);
    let out = output_by_id(&sb, wc_id, "wc ends once its stream is dropped").await;
    assert_eq!(out.stdout_text().trim(), "3");
    sb.destroy().await.expect("destroy");
}

/// Starts `cmd` (which waits for /tmp/go before it reads its stdin), kills and restarts brigd,
/// lets it read and returns the sandbox (through the new client) and the command's output,
/// read by id.
async fn read_after_a_crash(
    daemon: &mut Daemon,
    sb: &brig_sdk::Sandbox,
    cmd: Cmd,
) -> (brig_sdk::Sandbox, brig_sdk::ExecOutput) {
    let reader = sb.exec_stream(cmd).await.expect("start the reader");
    let id = reader.exec_id();
    let client = crash_and_restart(daemon, Duration::from_millis(300)).await;
    drop(reader);
    let sb = client.sandbox(sb.id());
    sb.exec(["touch", "/tmp/go"]).await.expect("let it read");
    let out = output_by_id(&sb, id, "the reader ends").await;
    (sb, out)
}

/// Stdin given whole (not streamed) is read whole by a command that only starts reading
/// after brigd was killed: it is a file the command holds, not a pipe brigd was still
/// filling (a pipe takes 64 KiB; the command would have read that much and then end of file).
#[tokio::test]
async fn stdin_given_whole_is_read_whole_across_a_brigd_crash() {
    let mut daemon = Daemon::start_with(&["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let input: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let want = hex::encode(Sha256::digest(&input));
    let script = "while [ ! -e /tmp/go ]; do sleep 0.05; done; sha256sum | cut -d' ' -f1";
    let cmd = Cmd::new(["sh", "-c", script]).stdin(input);
    let (sb, out) = read_after_a_crash(&mut daemon, &sb, cmd).await;
    assert_eq!(out.stdout_text(), format!("{want}\n"), "{out:?}");
    assert_eq!(out.result.exit_code, Some(0), "{:?}", out.result);
    sb.destroy().await.expect("destroy");
}

/// On a terminal, stdin given whole is typed in by a typist of the node's shim spawner, not by
/// brigd, so a crash cannot cut it: a command that reads only after brigd was killed and
/// restarted gets every line of 450 KiB, far more than a terminal buffers.
#[tokio::test]
async fn terminal_stdin_given_whole_is_typed_whole_across_a_brigd_crash() {
    let mut daemon = Daemon::start_with(&["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    // Letters, digits and spaces: nothing the terminal's line discipline acts on.
    let lines = 8_000;
    let input: String =
        (0..lines).map(|i| format!("line {i:05} {}\n", "abcdefghij".repeat(4))).collect();
    let want = hex::encode(Sha256::digest(input.as_bytes()));
    let script = format!(
        "stty -echo; while [ ! -e /tmp/go ]; do sleep 0.05; done; \
         head -n {lines} | sha256sum | cut -d' ' -f1"
    );
    let cmd = Cmd::new(["sh", "-c", &script]).stdin(input.into_bytes()).terminal(24, 80);
    let (sb, out) = read_after_a_crash(&mut daemon, &sb, cmd).await;
    assert!(out.stdout_text().ends_with(&format!("{want}\r\n")), "{out:?}");
    assert_eq!(out.result.exit_code, Some(0), "{:?}", out.result);
    sb.destroy().await.expect("destroy");
}

/// Sessions outlive a brigd crash: the shim keeps the node's ends of each shell's pipes and
/// the session's record says what runs in it, so after a `kill -9` and a restart each session
/// answers under its id with its working directory, environment and functions intact, and a
/// command that ran through the crash reports its output and status.
#[tokio::test]
async fn sessions_survive_a_brigd_crash_with_their_state() {
    let mut daemon = Daemon::start_with(&["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let long = Duration::from_secs(10);
    let idle = sb.open_session().await.expect("session");
    let setup = "mkdir -p /work && cd /work && export ROLLOUT=r7 && f() { echo fn-$1; }";
    assert_eq!(idle.run(setup, long).await.expect("setup").exit_code, Some(0));
    let busy = sb.open_session().await.expect("second session");
    let started = busy.run("cd /tmp; sleep 1.5; echo slept", Duration::from_millis(200)).await;
    assert!(started.expect("start").is_running(), "the command should still run");
    // Finishes before the crash while nobody waits: brigd has read its output and its end.
    let unwaited = sb.open_session().await.expect("third session");
    let script = "echo early; sleep 0.4; cd /etc; echo late; echo bad >&2; (exit 4)";
    let first = unwaited.run(script, Duration::from_millis(150)).await.expect("start");
    assert!(first.is_running(), "the command should still run");
    let ids = (idle.id().to_string(), busy.id().to_string(), unwaited.id().to_string());
    tokio::time::sleep(Duration::from_millis(900)).await;

    let client = crash_and_restart(&mut daemon, Duration::from_millis(300)).await;
    let sb = client.sandbox(sb.id());
    let listed = sb.sessions().await.expect("sessions");
    assert!(listed.contains(&ids.0) && listed.contains(&ids.1), "{listed:?}");

    let idle = sb.session(&ids.0);
    let out = idle.run("pwd; echo $ROLLOUT; f x", long).await.expect("run after the crash");
    assert_eq!(out.stdout_text(), "/work\nr7\nfn-x\n");
    assert_eq!((out.exit_code, out.cwd.as_str()), (Some(0), "/work"));

    let busy = sb.session(&ids.1);
    let out = busy.wait(long).await.expect("wait across the crash");
    assert_eq!(out.stdout_text(), "slept\n");
    assert_eq!((out.exit_code, out.cwd.as_str()), (Some(0), "/tmp"));

    // Its output and end were kept on disk, not only in the dead brigd's memory.
    let unwaited = sb.session(&ids.2);
    let rest = unwaited.wait(long).await.expect("wait for what nobody waited for");
    let stdout = format!("{}{}", first.stdout_text(), rest.stdout_text());
    assert_eq!(stdout, "early\nlate\n");
    assert_eq!(rest.stderr_text(), "bad\n");
    assert_eq!((rest.exit_code, rest.cwd.as_str()), (Some(4), "/etc"));
    let next = unwaited.run("pwd", long).await.expect("the next command");
    assert_eq!((next.stdout_text().as_str(), next.exit_code), ("/etc\n", Some(0)));
    // What was handed over is gone from the backlog: after one more crash, a command gets
    // its own end, not the one delivered before.
    let client = crash_and_restart(&mut daemon, Duration::ZERO).await;
    let sb = client.sandbox(sb.id());
    let again = sb.session(&ids.2).run("echo again; (exit 5)", long).await.expect("run");
    assert_eq!((again.stdout_text().as_str(), again.exit_code), ("again\n", Some(5)));

    // New sessions take ids after the kept ones; a closed one is gone for good.
    let fourth = sb.open_session().await.expect("a new session");
    assert!(
        ![&ids.0, &ids.1, &ids.2].contains(&&fourth.id().to_string()),
        "id {} reused",
        fourth.id()
    );
    // Through the client of this run of brigd (`idle` is on the one the last crash reset).
    sb.session(&ids.0).close().await.expect("close");
    assert!(!sb.sessions().await.expect("sessions").contains(&ids.0));
    sb.destroy().await.expect("destroy");
}

/// A layer served lazily from the store goes on being served to running containers through a
/// brigd crash: its FUSE server (`brig-lazyfs`) runs in a process of its own, and the restarted
/// brigd adopts it. When the server lived in brigd, every read of a page not yet fetched failed
/// with EIO after the crash. The adopted server, killed in turn, is taken over as one brigd
/// started would be: the restarted brigd copied its FUSE device when it adopted it. Last,
/// brigd and the server are killed together, and the device keeper's copy carries the mount.
#[tokio::test]
async fn store_layers_are_served_through_a_brigd_crash() {
    let mut daemon = Daemon::start_with(&["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let tmp = tempfile::tempdir().expect("tmp");
    let data: Vec<u8> =
        (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::create_dir_all(tmp.path().join("data")).expect("mkdir");
    std::fs::write(tmp.path().join("data/big.bin"), &data).expect("write");
    let want = hex::encode(Sha256::digest(&data));
    let more: Vec<u8> = data.iter().rev().map(|b| b ^ 0x5a).collect();
    std::fs::write(tmp.path().join("data/more.bin"), &more).expect("write");
    let want_more = hex::encode(Sha256::digest(&more));
    client
        .import_image("workspace/lazy", None, ImageSource::Dir(tmp.path().to_path_buf()))
        .await
        .expect("import");
    let image = format!("{}+workspace/lazy", image("busybox"));
    let sb = client.create(SandboxOptions::container(&image)).await.expect("create");
    // A first page before the crash; the rest of the file is fetched only after it.
    let head = sb.exec(["sh", "-c", "head -c 4096 /data/big.bin | wc -c"]).await.expect("exec");
    assert_eq!(head.stdout_text().trim(), "4096");

    let client = crash_and_restart(&mut daemon, Duration::from_millis(300)).await;
    let sb = client.sandbox(sb.id());
    let log = daemon.log_text();
    assert!(log.contains("lazy file system server adopted"), "not adopted:\n{log}");
    let pid = lazyfs_pid(&daemon);
    let killed = std::process::Command::new("kill").args(["-9", &pid]).status();
    assert!(killed.expect("kill").success(), "kill brig-lazyfs");

    let sum = sb.exec(["sha256sum", "/data/big.bin"]).await.expect("exec after the crash");
    assert_eq!(sum.result.exit_code, Some(0), "{}", sum.stderr_text());
    assert_eq!(sum.stdout_text().split_whitespace().next(), Some(want.as_str()));
    let log = daemon.log_text();
    assert!(log.contains("a new one took over its mount"), "not taken over:\n{log}");
    // New sandboxes read the layer as well.
    let other = client.create(SandboxOptions::container(&image)).await.expect("create after");
    let sum = other.exec(["sha256sum", "/data/big.bin"]).await.expect("exec");
    assert_eq!(sum.stdout_text().split_whitespace().next(), Some(want.as_str()));
    other.destroy().await.expect("destroy");

    // brigd and the server die together: the device keeper holds the mount's connection, and
    // the restarted brigd has a new server take it over, so a file not read yet reads whole.
    let pid = lazyfs_pid(&daemon);
    daemon.crash().expect("crash");
    let killed = std::process::Command::new("kill").args(["-9", &pid]).status();
    assert!(killed.expect("kill").success(), "kill brig-lazyfs with brigd down");
    tokio::time::sleep(Duration::from_millis(300)).await;
    daemon.start_again().expect("start");
    let client = daemon.client().await.expect("reconnect");
    let sb = client.sandbox(sb.id());
    let sum = sb.exec(["sha256sum", "/data/more.bin"]).await.expect("exec after both died");
    assert_eq!(sum.result.exit_code, Some(0), "{}", sum.stderr_text());
    assert_eq!(sum.stdout_text().split_whitespace().next(), Some(want_more.as_str()));
    let log = daemon.log_text();
    assert!(log.contains("from the device keeper"), "not taken over from the keeper:\n{log}");
    sb.destroy().await.expect("destroy");
}

/// The pid `<run>/lazyfs.pid` records.
fn lazyfs_pid(daemon: &Daemon) -> String {
    let record = std::fs::read(daemon.run_dir().join("lazyfs.pid")).expect("lazyfs.pid");
    let record: serde_json::Value = serde_json::from_slice(&record).expect("pid record");
    record["pid"].as_i64().expect("pid").to_string()
}
