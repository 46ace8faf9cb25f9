//! Chaos: 16 clients run a mixed load (creates, execs with streamed output, sessions, file
//! writes, pauses, forks, one-shot calls) against a release brigd while the test `kill -9`s it
//! at random moments 10 times and starts it again on the same port. Each client keeps its `Client` (the
//! SDK reconnects) and retries what a crash interrupted. Then every acknowledged create
//! exists or was destroyed by its client, every acknowledged exec's output re-read by id is
//! complete and in order with its exit status, every session answers with its cwd and
//! environment, every written file reads back, a command fed its stdin line by line through
//! all the crashes (by its stream, then by exec id) printed every acknowledged line in order,
//! the audit trail has every acknowledged exec,
//! and once everything is destroyed nothing of any sandbox is left on the host. Half of the
//! clients' sandboxes have a layer served lazily from the store, read a block at a time
//! through the crashes (its server, `brig-lazyfs`, is adopted by each restarted brigd); twice
//! the test `kill -9`s that server too, and a new one takes its mount over; once more it kills
//! the server while brigd is down, and the restarted brigd takes the mount over from the
//! device keeper.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_sdk::{AuditKind, Client, Cmd, ErrorCode, ImageSource, Sandbox, SandboxOptions};
use brig_tests::{image, Daemon};
use sha2::{Digest, Sha256};

const CLIENTS: usize = 16;
const CRASHES: usize = 10;
/// Before these crashes of brigd, the lazy file system server is killed (and taken over).
const LAZY_SERVER_KILLS: [usize; 2] = [2, 6];
/// At this crash, the lazy file system server is killed with brigd (while brigd is down).
const LAZY_SERVER_KILLED_WITH_BRIGD: usize = 4;
/// The store layer's file: 4 MiB, 1,024 blocks of 4 KiB.
const LAYER_FILE_BLOCKS: u64 = 1024;

/// A layer in the store with one file, `/data/big.bin`, and what it holds.
struct StoreLayer {
    image: String,
    data: Vec<u8>,
}

impl StoreLayer {
    async fn import(client: &Client, dir: &std::path::Path) -> StoreLayer {
        let data: Vec<u8> = (0..(LAYER_FILE_BLOCKS * 4096) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        std::fs::create_dir_all(dir.join("data")).expect("mkdir");
        std::fs::write(dir.join("data/big.bin"), &data).expect("write");
        let source = ImageSource::Dir(dir.to_path_buf());
        client.import_image("workspace/chaos", None, source).await.expect("import");
        StoreLayer { image: format!("{}+workspace/chaos", image("busybox")), data }
    }

    fn sha_of_block(&self, block: u64) -> String {
        let at = (block * 4096) as usize;
        hex::encode(Sha256::digest(&self.data[at..at + 4096]))
    }
}

/// What a client was told happened, to check against what the node says afterwards.
#[derive(Default, Debug)]
struct Acknowledged {
    sandbox: Option<String>,
    /// Exec id, expected stdout, expected exit code.
    execs: Vec<(u64, String, i32)>,
    session: Option<(String, String, String)>,
    files: Vec<(String, String)>,
    /// Fork children told to the client, and whether the client destroyed them since.
    children: Vec<(String, bool)>,
    calls: u64,
    /// Whether the sandbox has the store layer.
    store_layer: bool,
    /// The command reading its stdin through the crashes (exec id), and the last line it was
    /// sent whose write was acknowledged (lines are 1, 2, …).
    reader: Option<(u64, u64)>,
}

/// The lazy file system server `<run>/lazyfs.pid` records.
fn lazy_server_pid(daemon: &Daemon) -> Option<i64> {
    let record = std::fs::read(daemon.run_dir().join("lazyfs.pid")).unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(&record).ok().and_then(|v| v["pid"].as_i64())
}

/// `kill -9`s the lazy file system server; returns its pid.
fn kill_lazy_server_now(daemon: &Daemon) -> i64 {
    let old = lazy_server_pid(daemon).expect("lazyfs.pid");
    let killed = std::process::Command::new("kill").args(["-9", &old.to_string()]).status();
    assert!(killed.expect("kill").success(), "kill brig-lazyfs");
    old
}

/// `kill -9`s the lazy file system server and waits until brigd has put the one that took its
/// mount over on record.
async fn kill_lazy_server(daemon: &Daemon) {
    let pid_of = || lazy_server_pid(daemon);
    let old = kill_lazy_server_now(daemon);
    let deadline = Instant::now() + Duration::from_secs(20);
    while pid_of().is_none_or(|pid| pid == old) {
        assert!(Instant::now() < deadline, "brig-lazyfs {old} was not replaced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("brig-lazyfs {old} killed and taken over");
}

/// What the stdin reader prints for each line, then at end of input.
const READER: &str = "while read -r line; do echo \"got $line\"; done; echo end";

/// Writes `line` into the stream's stdin and waits (up to 5 s) for the reader to echo it.
async fn fed_by_stream(reader: &mut brig_sdk::ExecStream, line: &str) -> bool {
    if reader.write_stdin(line.as_bytes().to_vec()).await.is_err() {
        return false;
    }
    let want = format!("got {line}");
    let echoed = async {
        let mut out = Vec::new();
        while let Some(Ok(brig_sdk::ExecEvent::Stdout(b))) = reader.next().await {
            out.extend_from_slice(&b);
            if out.ends_with(want.as_bytes()) {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(5), echoed).await.unwrap_or(false)
}

/// Whether the reader's output has every acknowledged line, in order, once or (a write whose
/// reply a crash cut off was sent again) more, and then its end.
fn reader_output_is_whole(out: &str, acked: u64) -> Result<(), String> {
    let mut lines = out.lines();
    let mut last = 0u64;
    for line in lines.by_ref() {
        if line == "end" {
            break;
        }
        let n: u64 = line.strip_prefix("got ").and_then(|n| n.parse().ok()).ok_or(line)?;
        if n != last && n != last + 1 {
            return Err(format!("line {n} after {last}"));
        }
        last = n;
    }
    match (last >= acked, lines.next()) {
        (true, None) if out.ends_with("end\n") => Ok(()),
        _ => Err(format!("{last} lines of {acked} acknowledged, or no end")),
    }
}

fn counted(n: u64) -> String {
    (1..=n).map(|i| format!("{i}\n")).collect()
}

/// Retries `op` through crashes until it succeeds (or the test's patience ends).
async fn retry<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, brig_sdk::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => panic!("{what} never succeeded: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// One client's load until `stop`; returns what it was told.
async fn client_load(
    client: Client,
    n: usize,
    stop: Arc<AtomicBool>,
    layer: Arc<StoreLayer>,
) -> Acknowledged {
    let mut ack = Acknowledged { store_layer: n % 2 == 1, ..Default::default() };
    let name = if ack.store_layer { layer.image.clone() } else { image("busybox") };
    let opts = || SandboxOptions::container(&name);
    let created = retry("create", || client.create(opts())).await;
    ack.sandbox = Some(created.id().to_string());
    let sb: Sandbox = client.sandbox(created.id());
    let session = retry("open session", || sb.open_session()).await;
    // A command fed line by line through every crash: by its stream first, then by id.
    let cmd = || Cmd::shell(READER).stdin_stream().timeout(Duration::from_secs(300));
    let mut reader = retry("start the reader", || sb.exec_stream(cmd())).await;
    let reader_id = reader.exec_id();
    let mut sent = 0u64;
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let op_started = Instant::now();
        // The next line: the first through the stream (acknowledged when the command echoes
        // it), the rest by id (acknowledged by the node).
        let line = format!("{}\n", sent + 1);
        if !(round == 1 && fed_by_stream(&mut reader, &line).await) {
            retry("write the reader's stdin", || sb.write_stdin(reader_id, line.as_bytes())).await;
        }
        sent += 1;
        ack.reader = Some((reader_id, sent));
        match round % 6 {
            // A command whose output streams for a while; the stream is read a little or
            // not at all, and re-read by id at the end.
            0 | 3 => {
                let lines = 20 + (round % 7) * 10;
                let code = (round % 5) as i32;
                let script = format!(
                    "i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo $i; sleep 0.01; done; exit {code}"
                );
                if let Ok(mut stream) = sb.exec_stream(Cmd::shell(&script)).await {
                    ack.execs.push((stream.exec_id(), counted(lines), code));
                    if round.is_multiple_of(2) {
                        let _ = stream.next().await;
                    }
                }
            }
            1 => {
                let dir = format!("/w{n}-{round}");
                let cmd = format!("mkdir -p {dir} && cd {dir} && export ROUND={round}");
                let done = retry("session run", || async {
                    // A run a crash cut off may still be running (or done, unheard): wait
                    // on it before running again, as a client that reconnects does.
                    let ran = session.run(&cmd, Duration::from_secs(20)).await;
                    if ran.is_err() {
                        let _ = session.wait(Duration::from_secs(20)).await;
                    }
                    ran
                })
                .await;
                // Its own end, not an earlier command's.
                if done.exit_code.is_some() {
                    assert_eq!(done.cwd, dir, "client {n} round {round}: {done:?}");
                }
                if done.exit_code == Some(0) {
                    ack.session = Some((session.id().to_string(), dir, round.to_string()));
                }
            }
            2 => {
                let (path, text) = (format!("/data/f{round}"), format!("client {n} round {round}"));
                retry("write", || sb.write_file(&path, text.as_bytes())).await;
                ack.files.push((path, text));
                if ack.store_layer {
                    // A block of the lazily served layer not read before, most likely.
                    let block = (round * 37 + n as u64 * 101) % LAYER_FILE_BLOCKS;
                    let script = format!(
                        "dd if=/data/big.bin bs=4096 skip={block} count=1 2>/dev/null | sha256sum"
                    );
                    let read =
                        retry("read the store layer", || sb.exec(["sh", "-c", &script])).await;
                    let sum = read.stdout_text();
                    let want = layer.sha_of_block(block);
                    assert_eq!(
                        sum.split_whitespace().next(),
                        Some(want.as_str()),
                        "block {block} of the store layer in client {n}'s sandbox: {read:?}"
                    );
                }
            }
            4 => {
                retry("pause", || sb.pause()).await;
                retry("resume", || sb.resume()).await;
                if let Ok(call) = client.call("jq", r#"{"query":"$","json":1}"#).await {
                    assert!(call.is_success(), "a one-shot call failed: {call:?}");
                    ack.calls += 1;
                }
            }
            _ => {
                if round % 12 == 5 {
                    if let Ok(kids) = sb.fork(1).await {
                        for kid in kids {
                            let id = kid.id().to_string();
                            // A destroy whose reply a crash cut off is retried; "no such
                            // sandbox" then means it was done.
                            retry("destroy", || async {
                                match kid.destroy().await {
                                    Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(()),
                                    other => other,
                                }
                            })
                            .await;
                            ack.children.push((id, true));
                        }
                    }
                }
            }
        }
        if op_started.elapsed() > Duration::from_secs(5) {
            println!(
                "client {n}: round {round} (op {}) took {:?}",
                round % 6,
                op_started.elapsed()
            );
        }
        // A mixed load, not a flood: everything acknowledged is re-read at the end.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // End of its input: it prints `end` and exits 0.
    retry("close the reader's stdin", || sb.close_stdin(reader_id)).await;
    drop(reader);
    ack
}

/// Processes and freezer states on the host, for a failure's message.
fn host_state() -> String {
    let script = "ps -e -o pid,ppid,stat,wchan:24,args | grep -v ' \\[' ; \
        find /sys/fs/cgroup/freezer -path '*brig*' -name freezer.state -exec grep -H . {} +";
    std::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Checks what the node says against what the client was told.
async fn verify(client: &Client, ack: &Acknowledged, layer: &StoreLayer) {
    let Some(id) = &ack.sandbox else { return };
    let sb = client.sandbox(id);
    if let Err(e) = sb.status().await {
        panic!("acknowledged sandbox {id}: {e}");
    }
    for (exec_id, stdout, code) in &ack.execs {
        let reread = retry("attach", || async { sb.attach(*exec_id).await?.collect().await });
        let Ok(out) = tokio::time::timeout(Duration::from_secs(60), reread).await else {
            let status = sb.status().await;
            panic!(
                "exec {exec_id} of {id} never ended; sandbox: {status:?}; host: {}",
                host_state()
            );
        };
        let whole = &out.stdout_text() == stdout;
        assert!(whole, "exec {exec_id} of {id}: output not whole: {out:?}");
        assert_eq!(out.result.exit_code, Some(*code), "exec {exec_id} of {id}: {:?}", out.result);
    }
    if let Some((exec_id, acked)) = ack.reader {
        let reread = retry("attach", || async { sb.attach(exec_id).await?.collect().await });
        let Ok(out) = tokio::time::timeout(Duration::from_secs(60), reread).await else {
            panic!("the stdin reader {exec_id} of {id} never ended; host: {}", host_state());
        };
        let text = out.stdout_text();
        if let Err(e) = reader_output_is_whole(&text, acked) {
            panic!("stdin reader {exec_id} of {id}: {e}: {out:?}");
        }
        assert_eq!(out.result.exit_code, Some(0), "stdin reader {exec_id} of {id}: {out:?}");
    }
    if let Some((session, dir, round)) = &ack.session {
        let out = sb.session(session).run("pwd; echo $ROUND", Duration::from_secs(20)).await;
        let out = out.unwrap_or_else(|e| panic!("session {session} of {id}: {e}"));
        assert_eq!(
            out.stdout_text(),
            format!("{dir}\n{round}\n"),
            "session {session} of {id}: {out:?}"
        );
    }
    for (path, text) in &ack.files {
        let bytes = sb.read_file(path).await.unwrap_or_else(|e| panic!("{path} of {id}: {e}"));
        assert_eq!(String::from_utf8_lossy(&bytes), *text, "{path} of {id}");
    }
    if ack.store_layer {
        let sum = sb.exec(["sha256sum", "/data/big.bin"]).await.expect("read the store layer");
        let want = hex::encode(Sha256::digest(&layer.data));
        assert_eq!(sum.stdout_text().split_whitespace().next(), Some(want.as_str()), "{id}");
    }
    let trail = sb.audit(0).await.expect("audit");
    for (exec_id, _, _) in &ack.execs {
        let recorded = trail
            .iter()
            .any(|e| matches!(&e.kind, AuditKind::ExecStart { exec_id: x, .. } if x == exec_id));
        assert!(recorded, "exec {exec_id} of {id} is not in the audit trail");
    }
}

// Faults it found, each fixed and kept out by a narrower test: a shim that died replying to
// a dead node; pipe copies dropped before the node read the tail; a read-then-spool window;
// a freezer left FREEZING; racing session journal writes; clients waiting out the idle
// timeout; a shim that, seeing its old node hang up and a new one connect in one wake-up,
// blocked receiving on the new connection and reaped nothing (so a command's exit was never
// reported: `runtime::an_exit_during_a_reconnect_is_still_reported`); and a sandbox record's
// temporary file left by a crash mid-write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_clients_lose_nothing_through_ten_crashes() {
    // The release build, as nodes run it (its timing differs from a debug build's).
    let mut daemon =
        Daemon::start_program(brig_tests::release_brigd(), &["--on-exit", "keep"]).expect("brigd");
    let tmp = tempfile::tempdir().expect("tmp");
    let layer =
        Arc::new(StoreLayer::import(&daemon.client().await.expect("connect"), tmp.path()).await);
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    let mut workers = Vec::new();
    for n in 0..CLIENTS {
        let client = daemon.client().await.expect("connect");
        clients.push(client.clone());
        workers.push(tokio::spawn(client_load(client, n, stop.clone(), layer.clone())));
    }
    let started = Instant::now();
    for i in 0..CRASHES {
        // Random moments: 0.5 to 3 s apart.
        let nanos = u64::from(started.elapsed().subsec_nanos());
        let wait = 500 + (nanos ^ (i as u64 * 7919)) % 2500;
        if LAZY_SERVER_KILLS.contains(&i) {
            kill_lazy_server(&daemon).await;
        }
        tokio::time::sleep(Duration::from_millis(wait)).await;
        daemon.crash().expect("crash");
        if i == LAZY_SERVER_KILLED_WITH_BRIGD {
            let old = kill_lazy_server_now(&daemon);
            println!("brig-lazyfs {old} killed with brigd");
        }
        daemon.start_again().expect("start again");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let crashed_for = started.elapsed();
    let mut acks = Vec::new();
    for (n, worker) in workers.into_iter().enumerate() {
        acks.push(worker.await.expect("client task"));
        println!("client {n} done at {:?}", started.elapsed());
    }
    let execs: usize = acks.iter().map(|a| a.execs.len()).sum();
    let calls: u64 = acks.iter().map(|a| a.calls).sum();
    let lines: u64 = acks.iter().filter_map(|a| a.reader).map(|(_, sent)| sent).sum();
    println!(
        "{CRASHES} crashes in {crashed_for:?}, load over at {:?}; {execs} execs, {calls} calls \
         and {lines} stdin lines acknowledged",
        started.elapsed()
    );
    assert!(execs >= CLIENTS, "too little load ran: {execs} execs");

    // The daemon's log, for reading after a failure.
    let log = daemon.log_text();
    let _ = std::fs::write(std::env::temp_dir().join("chaos-brigd.log"), &log);
    assert!(
        log.contains("a new one took over its mount from the device keeper"),
        "the server killed with brigd was not taken over from the device keeper"
    );
    let client = &clients[0];
    futures::future::join_all(acks.iter().map(|ack| verify(client, ack, &layer))).await;
    // Everything acknowledged and not destroyed is there. A create or fork whose reply a
    // crash cut off may have made a sandbox no client heard of (the reply, not the work, was
    // lost); those are counted, and found by the client's labels in real use.
    let live: Vec<String> =
        client.list(&[]).await.expect("list").into_iter().map(|s| s.id).collect();
    for ack in &acks {
        let id = ack.sandbox.as_ref().expect("each client created one");
        assert!(live.contains(id), "{id} is missing");
        for (child, destroyed) in &ack.children {
            assert_eq!(live.contains(child), !destroyed, "fork child {child} of {id}");
        }
    }
    let unheard = live
        .iter()
        .filter(|id| {
            !acks.iter().any(|a| {
                a.sandbox.as_ref() == Some(*id) || a.children.iter().any(|(c, _)| c == *id)
            })
        })
        .count();
    println!("{unheard} sandboxes whose create or fork reply a crash cut off");
    for id in &live {
        client.sandbox(id).destroy().await.expect("destroy");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut leaks = daemon.leaks();
    while !leaks.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        leaks = daemon.leaks();
    }
    assert!(leaks.is_empty(), "left on the host: {leaks:#?}");
}
