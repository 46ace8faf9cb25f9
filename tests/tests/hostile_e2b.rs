//! The hostile suite for the E2B-compatible API: a stranger without a key, a client with a key
//! and a sandbox's access token, each trying to take the node's memory or CPU, to starve other
//! sandboxes, or to get a wrong answer. Every attack is driven over real HTTP against a real
//! brigd, and is followed (and, where it lasts, accompanied) by the checks that it was
//! contained: another sandbox's `echo ok` answers within 1 s, the API's `/health` within 1 s,
//! and brigd's resident memory stays within a stated budget.
//!
//! The HTTP client and the attacks `brig-bench hostile` measures too are in
//! `brig_tests::hostile_http`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use brig_tests::hostile_http::{
    base64_decode, closed_by_server, envelope, gzip_bomb, host_port, random_keys, read_response,
    request, rss_mib, stalled_uploads, unfinished_heads, upload, watch, Api, Sbx,
};
use brig_tests::{image, Daemon};
use serde_json::{json, Value};

/// brigd's memory growth allowed during and after one attack.
const RSS_BUDGET_MIB: u64 = 64;
/// How long a bystander's command and the health check may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// A daemon whose E2B sandboxes have a 64 MiB disk (the cap of an inflated upload).
fn daemon() -> Daemon {
    let config = format!(
        "[e2b]\ndisk_mib = 64\nmemory_mib = 256\n[e2b.templates]\nbase = {:?}\n",
        image("debian-12")
    );
    Daemon::start_with_config(&config, &[]).expect("brigd")
}

// ---------------------------------------------------------------------------------------------
// The checks after (and during) every attack.

/// brigd's CPU time so far (user + system).
fn cpu_time(daemon: &Daemon) -> Duration {
    let pid = daemon.pid().expect("brigd pid");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The bystander's `echo ok` and the API's `/health`, each within [`ANSWER_WITHIN`].
fn node_answers(api: &Api, bystander: &Sbx) -> Result<(), String> {
    let started = Instant::now();
    let health =
        request(&api.url, "GET", "/health", &[], b"").map_err(|e| format!("health: {e}"))?;
    if health.status != 200 || started.elapsed() > ANSWER_WITHIN {
        return Err(format!("/health: {} after {:?}", health.status, started.elapsed()));
    }
    let started = Instant::now();
    let (out, exit, error) =
        api.run(bystander, "echo ok").map_err(|e| format!("bystander: {e}"))?;
    let took = started.elapsed();
    if out != b"ok\n" || exit != Some(0) || error.is_some() || took > ANSWER_WITHIN {
        return Err(format!(
            "bystander: {:?} exit {exit:?} error {error:?} after {took:?}",
            String::from_utf8_lossy(&out)
        ));
    }
    Ok(())
}

/// The node answers, and brigd's memory is within budget of `baseline`.
fn contained(daemon: &Daemon, api: &Api, bystander: &Sbx, baseline: u64, when: &str) {
    if let Err(e) = node_answers(api, bystander) {
        panic!("{when}: {e}\nbrigd:\n{}", tail(daemon));
    }
    let rss = rss_mib(daemon);
    assert!(
        rss <= baseline + RSS_BUDGET_MIB,
        "{when}: brigd holds {rss} MiB, {} MiB over its {baseline} MiB (budget {RSS_BUDGET_MIB})",
        rss.saturating_sub(baseline)
    );
    println!("{when}: brigd {rss} MiB (baseline {baseline} MiB); the node answered");
}

fn tail(daemon: &Daemon) -> String {
    let log = daemon.log_text();
    let start = log.len().saturating_sub(8_000);
    log[log.floor_char_boundary(start)..].to_string()
}

/// Runs `attack` on a thread while the node is checked every second; then checks again.
fn during<T: Send + 'static>(
    daemon: &Daemon,
    api: &Api,
    bystander: &Sbx,
    baseline: u64,
    attack: impl FnOnce() -> T + Send + 'static,
) -> T {
    let handle = std::thread::spawn(attack);
    let mut peak = 0;
    while !handle.is_finished() {
        contained(daemon, api, bystander, baseline, "during the attack");
        peak = peak.max(rss_mib(daemon));
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = handle.join().expect("the attack thread");
    contained(daemon, api, bystander, baseline, "after the attack");
    println!("peak brigd RSS during the attack: {peak} MiB (baseline {baseline} MiB)");
    out
}

/// A daemon, its API, a bystander sandbox, and brigd's resident memory once warmed up.
fn setup() -> (Daemon, Api, Sbx, u64) {
    let daemon = daemon();
    let api = Api::new(&daemon);
    let bystander = api.create();
    // Warm the paths the checks take, so their first use is not counted against an attack.
    for _ in 0..3 {
        node_answers(&api, &bystander).expect("the node answers before any attack");
    }
    let baseline = rss_mib(&daemon);
    (daemon, api, bystander, baseline)
}

// ---------------------------------------------------------------------------------------------
// The attacks.

/// A stranger sends 3,000 random API keys: each is refused (401) without a connection or
/// client made for it, so brigd's memory stays put; the real key still works.
#[test]
fn unknown_api_keys_are_refused_without_allocating() {
    let (daemon, api, bystander, baseline) = setup();
    let attacker = api.clone();
    let refused = during(&daemon, &api, &bystander, baseline, move || random_keys(&attacker, 3000));
    assert_eq!(refused.get(&401), Some(&3000), "statuses: {refused:?}");
    let ok = request(&api.url, "GET", "/sandboxes", &[("X-API-Key", api.key.as_str())], b"")
        .expect("list");
    let status = ok.status;
    assert_eq!(status, 200, "the daemon's key: {}", ok.text());
}

/// 1,000 connections each send 380 KiB of a request head that never ends, and 100 more send
/// a few bytes of one and stall: the first are refused once the head passes the cap (431, the
/// connection closed), the others closed at the header deadline; brigd holds none of it.
#[test]
fn unfinished_request_heads_are_cut_off() {
    let (daemon, api, bystander, baseline) = setup();
    let addr = host_port(&api.url);
    let stalled: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut tcp = TcpStream::connect(&addr).expect("connect");
            tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ").expect("write");
            tcp
        })
        .collect();
    let opened = Instant::now();
    let attacker = api.clone();
    let big =
        during(&daemon, &api, &bystander, baseline, move || unfinished_heads(&attacker, 1000, 380));
    // Each was answered 431 or closed: none is left open by the server.
    let mut answered = std::collections::BTreeMap::new();
    for tcp in big {
        *answered.entry(closed_by_server(tcp, Duration::from_secs(20))).or_insert(0u32) += 1;
    }
    assert_eq!(answered.get("closed").copied().unwrap_or(0), 1000, "{answered:?}");
    let mut late = 0;
    for tcp in stalled {
        if closed_by_server(tcp, Duration::from_secs(30)) != "closed" {
            late += 1;
        }
    }
    assert_eq!(late, 0, "stalled heads still open {:?} after they were sent", opened.elapsed());
    contained(&daemon, &api, &bystander, baseline, "after the connections ended");
}

/// A gzip bomb (1 GiB of zeros in ~1 MiB) uploaded with `Content-Encoding: gzip` is inflated
/// as a stream and stopped at the sandbox's disk size with a 507, brigd's memory flat.
#[test]
fn a_gzip_bomb_is_stopped_at_the_disk_size() {
    let (daemon, api, bystander, baseline) = setup();
    let target = api.create();
    let body = gzip_bomb();
    let (attacker, victim) = (api.clone(), target.clone());
    let answer = during(&daemon, &api, &bystander, baseline, move || {
        upload(&attacker, &victim, "/tmp/bomb", &body, true)
    });
    assert_eq!(answer.0, 507, "the bomb's answer: {answer:?}");
    assert!(answer.1.contains("MiB"), "{answer:?}");
    // An honest gzip upload still inflates.
    let small = std::process::Command::new("sh")
        .args(["-c", "printf 'hello gzip\\n' | gzip -c"])
        .output()
        .expect("gzip");
    let (status, text) = upload(&api, &target, "/tmp/small", &small.stdout, true);
    assert_eq!(status, 200, "{text}");
    let (out, _, _) = api.run(&target, "cat /tmp/small").expect("cat");
    assert_eq!(out, b"hello gzip\n");
}

/// 40 `WatchDir` streams on a sandbox: a recursive watch of more folders than one follows
/// (10,000) is refused with a clear error; on a directory of 2,000 files, 16 are served and the rest
/// refused, while another sandbox can still watch; killing the sandbox ends its watchers.
#[test]
fn watchers_are_capped_per_sandbox_and_freed_with_it() {
    let (daemon, api, bystander, baseline) = setup();
    let target = api.create();
    let (_, exit, _) = api
        .run(
            &target,
            "mkdir -p /w && cd /w && seq 1 2000 | xargs touch && \
             mkdir -p /big && cd /big && seq 1 10001 | xargs mkdir",
        )
        .expect("files");
    assert_eq!(exit, Some(0));
    let watch = |sb: &Sbx, path: &str| watch(&api, sb, path);
    // A tree of more folders than one recursive watch follows: refused, the error says why.
    let whole = watch(&target, "/big").expect("watch /big");
    let status = whole.status;
    let mut body = whole.body;
    let mut said = String::new();
    if status == 200 {
        while let Ok(Some((flags, v))) = envelope(&mut body) {
            if flags & 2 != 0 {
                said = v.to_string();
                break;
            }
        }
    } else {
        let _ = body.read_to_string(&mut said);
    }
    assert!(
        said.contains("resource_exhausted") && said.contains("directories"),
        "watch of /big: {said}"
    );

    let cpu_before = cpu_time(&daemon);
    let started = Instant::now();
    let mut served = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        let r = watch(&target, "/w").expect("watch");
        if r.status == 200 {
            served.push(r);
        } else {
            let text = r.text();
            assert!(text.contains("resource_exhausted"), "{text}");
            refused += 1;
        }
    }
    assert_eq!((served.len(), refused), (16, 24));
    // Another sandbox still watches.
    let other = watch(&bystander, "/tmp").expect("the bystander watches");
    assert_eq!(other.status, 200);
    drop(other);
    for _ in 0..10 {
        contained(&daemon, &api, &bystander, baseline, "16 watchers running");
        std::thread::sleep(Duration::from_millis(500));
    }
    let cpu = cpu_time(&daemon) - cpu_before;
    let wall = started.elapsed();
    println!("brigd used {cpu:?} of CPU in {wall:?} with 16 watchers");
    assert!(cpu < wall, "brigd used {cpu:?} of CPU in {wall:?}");

    // Killed: every stream ends with the sandbox's "not found", within a few seconds.
    assert_eq!(api.kill(&target), 204);
    let ended = Instant::now();
    let handles: Vec<_> = served
        .into_iter()
        .map(|r| {
            std::thread::spawn(move || {
                let mut body = r.body;
                while let Ok(Some((flags, v))) = envelope(&mut body) {
                    if flags & 2 != 0 {
                        return v.to_string();
                    }
                }
                String::new()
            })
        })
        .collect();
    for h in handles {
        let last = h.join().expect("reader");
        assert!(last.contains("not found"), "a watch of the killed sandbox ended with {last:?}");
    }
    assert!(
        ended.elapsed() < Duration::from_secs(10),
        "watchers ended {:?} after the kill",
        ended.elapsed()
    );
    contained(&daemon, &api, &bystander, baseline, "after the kill");
}

/// Requests the node cannot carry out answer 400 with the limit they passed, before anything
/// is sent: a command with 1 MB of arguments or of environment, an environment name with `=`
/// or a NUL, a create with 10,000 metadata keys or a bad environment.
#[test]
fn oversized_and_malformed_requests_answer_400() {
    let (daemon, api, bystander, baseline) = setup();
    let target = api.create();
    let big = "x".repeat(1 << 20);
    let cases = [
        ("1 MB of arguments", json!({"process": {"cmd": "/bin/echo", "args": [big.clone()]}})),
        ("1 MB of env", json!({"process": {"cmd": "/bin/true", "envs": {"BIG": big.clone()}}})),
        ("= in an env name", json!({"process": {"cmd": "/bin/true", "envs": {"A=B": "1"}}})),
        ("NUL in an env value", json!({"process": {"cmd": "/bin/true", "envs": {"A": "a\u{0}b"}}})),
    ];
    for (what, message) in cases {
        let r = api.stream(&target, "/process.Process/Start", &message).expect("start");
        let status = r.status;
        let text = r.text();
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.contains("invalid_argument"), "{what}: {text}");
    }
    let (out, exit, _) = api.run(&target, "echo still").expect("run");
    assert_eq!((out.as_slice(), exit), (&b"still\n"[..], Some(0)), "later commands still run");

    let metadata: serde_json::Map<String, Value> =
        (0..10_000).map(|i| (format!("k{i}"), Value::String("v".into()))).collect();
    let creates = [
        ("10,000 metadata keys", json!({"templateID": "base", "metadata": metadata})),
        ("NUL in an env value", json!({"templateID": "base", "envVars": {"A": "a\u{0}b"}})),
        ("= in an env name", json!({"templateID": "base", "envVars": {"A=B": "1"}})),
    ];
    for (what, body) in creates {
        let r = api.create_with(body).expect("create");
        let status = r.status;
        let text = r.text();
        assert_eq!(status, 400, "{what}: {text}");
        assert!(
            text.contains("at most") || text.contains("NUL") || text.contains('='),
            "{what}: {text}"
        );
    }
    contained(&daemon, &api, &bystander, baseline, "after the requests");
}

/// A sandbox killed while a file is being uploaded into it: the upload answers 502 "… was not
/// found", what E2B's SDK reads as "not running" (never a 200 or a 500 with no message).
#[test]
fn an_upload_into_a_killed_sandbox_answers_not_running() {
    let (daemon, api, bystander, baseline) = setup();
    for user in ["root", "user"] {
        let target = api.create();
        let addr = host_port(&api.url);
        let mut tcp = TcpStream::connect(&addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        let total: u64 = 64 << 20;
        let head = format!(
            "POST /files?path=/tmp/upload&username={user} HTTP/1.1\r\nHost: {addr}\r\n\
             E2b-Sandbox-Id: {}\r\nX-Access-Token: {}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {total}\r\nConnection: close\r\n\r\n",
            target.id, target.token
        );
        tcp.write_all(head.as_bytes()).expect("head");
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..4 {
            tcp.write_all(&chunk).expect("first part");
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(api.kill(&target), 204);
        // The rest, as far as the server takes it.
        let writer = {
            let mut tcp = tcp.try_clone().expect("clone");
            std::thread::spawn(move || {
                let _ = tcp.set_write_timeout(Some(Duration::from_secs(30)));
                for _ in 4..64 {
                    if tcp.write_all(&chunk).is_err() {
                        break;
                    }
                }
            })
        };
        let r = read_response(tcp).expect("an answer");
        let status = r.status;
        let text = r.text();
        let _ = writer.join();
        assert_eq!(status, 502, "upload as {user} into a killed sandbox: {text}");
        assert!(text.contains("was not found"), "{user}: {text}");
    }
    contained(&daemon, &api, &bystander, baseline, "after the uploads");
}

/// A client that reads 40 MB of stdout slowly gets all of it and the exit code: the node holds
/// the command back (backpressure) rather than drop what the client has not read.
#[test]
fn a_slow_reader_gets_all_output() {
    let (daemon, api, bystander, baseline) = setup();
    let target = api.create();
    let total: usize = 40_000_000;
    let message = json!({"process": {"cmd": "/bin/sh", "args": ["-c", format!("head -c {total} /dev/zero")]}});
    let r = api.stream(&target, "/process.Process/Start", &message).expect("start");
    assert_eq!(r.status, 200);
    let mut body = r.body;
    let (mut got, mut exit, mut error) = (0usize, None, None);
    let mut first = true;
    while let Some((flags, v)) = envelope(&mut body).expect("an envelope") {
        if flags & 2 != 0 {
            error = v.get("error").cloned();
            break;
        }
        if let Some(data) = v["event"]["data"]["stdout"].as_str() {
            got += base64_decode(data).len();
            if first {
                // Fall far behind: the command writes everything meanwhile.
                first = false;
                std::thread::sleep(Duration::from_secs(8));
            }
        }
        if let Some(end) = v["event"].get("end") {
            exit = Some(end["exitCode"].as_i64().unwrap_or(0));
        }
    }
    println!("read {got} of {total} bytes, exit {exit:?}, error {error:?}");
    assert_eq!((got, exit, error), (total, Some(0), None));
    contained(&daemon, &api, &bystander, baseline, "after the slow read");
}

/// 600 uploads into one sandbox that send a first MiB and stall: past its share of the
/// gateway's uploads (16; of requests, 256) that sandbox hears 429, brigd holds no more than
/// its budget, and another sandbox's commands go on (before, all envd traffic shared one
/// budget: 8,400 stalled uploads made the others fail with 429).
#[test]
fn stalled_uploads_into_one_sandbox_leave_the_others_alone() {
    let (daemon, api, bystander, baseline) = setup();
    let target = api.create();
    let stalled = stalled_uploads(&api, &target, 600);
    assert_eq!(stalled.len(), 600, "every upload connected");
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..3 {
        contained(
            &daemon,
            &api,
            &bystander,
            baseline,
            "with 600 uploads stalled in another sandbox",
        );
    }
    // The attacker's own sandbox is told why (the share is its own).
    let (status, text) = upload(&api, &target, "/tmp/one-more", b"x", false);
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("uploads open"), "{text}");
    drop(stalled);
    assert_eq!(api.kill(&target), 204);
    contained(&daemon, &api, &bystander, baseline, "after the uploads ended");
}

/// 500 connections that send nothing and 500 that send `P` (a beginning of HTTP/2's preface)
/// are each closed by the server at the head deadline (10 s; before, only the 60 s idle check
/// closed them, and 8,192 of them held every connection slot); `/health` answers within 1 s
/// meanwhile.
#[test]
fn connections_that_never_tell_their_protocol_are_closed() {
    let daemon = daemon();
    let api = Api::new(&daemon);
    let addr = host_port(&api.url);
    let opened = Instant::now();
    let conns: Vec<TcpStream> = (0..1000)
        .map(|i| {
            let mut tcp = TcpStream::connect(&addr).expect("connect");
            if i % 2 == 1 {
                tcp.write_all(b"P").expect("write");
            }
            tcp
        })
        .collect();
    while opened.elapsed() < Duration::from_secs(8) {
        assert!(api.health(ANSWER_WITHIN), "/health within 1 s with 1,000 silent connections");
        std::thread::sleep(Duration::from_millis(500));
    }
    let deadline = opened + Duration::from_secs(15);
    let mut open = 0;
    for tcp in conns {
        let left = deadline.saturating_duration_since(Instant::now());
        if closed_by_server(tcp, left.max(Duration::from_millis(600))) != "closed" {
            open += 1;
        }
    }
    assert_eq!(open, 0, "connections still open {:?} after they were made", opened.elapsed());
    assert!(api.health(ANSWER_WITHIN), "/health within 1 s afterwards");
}

/// A stranger who knows a sandbox's id but not its access token sends 300 envd requests for
/// it whose bodies never arrive: each is refused (401) at once, without a place of the
/// sandbox's share (256) taken, and the sandbox's own client runs commands as before.
#[test]
fn a_stranger_cannot_use_up_a_sandboxs_share() {
    let daemon = daemon();
    let api = Api::new(&daemon);
    let victim = api.create();
    let addr = host_port(&api.url);
    let mut statuses = std::collections::BTreeMap::new();
    let mut held = Vec::new();
    for token in ["00", ""] {
        for _ in 0..150 {
            let mut tcp = TcpStream::connect(&addr).expect("connect");
            let head = format!(
                "POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {}\r\n\
                 X-Access-Token: {token}\r\nContent-Type: application/connect+json\r\n\
                 Content-Length: 1000\r\n\r\n",
                victim.id
            );
            tcp.write_all(head.as_bytes()).expect("write");
            tcp.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            let status = read_response(tcp.try_clone().expect("clone")).map_or(0, |r| r.status);
            *statuses.entry(status).or_insert(0u32) += 1;
            held.push(tcp);
        }
    }
    assert_eq!(statuses.get(&401), Some(&300), "statuses: {statuses:?}");
    let (out, exit, error) = api.run(&victim, "echo ok").expect("the owner's command");
    assert_eq!((out.as_slice(), exit, error), (&b"ok\n"[..], Some(0), None));
    // An id longer than any sandbox's is refused before its token is looked at.
    let long = "x".repeat(8 << 10);
    let r = request(&api.url, "POST", "/process.Process/List", &[("E2b-Sandbox-Id", &long)], b"")
        .expect("list");
    assert_eq!(r.status, 400);
    drop(held);
}

/// A process that prints the node's note of lost output on stderr cannot end its own stream
/// with it: the note is stderr like any other, and what follows and the exit code arrive.
#[test]
fn a_process_cannot_fake_the_note_of_lost_output() {
    let daemon = daemon();
    let api = Api::new(&daemon);
    let sb = api.create();
    let note = "[brig: 1234 bytes of earlier output were not kept]";
    let ran = api.run_all(&sb, &format!("echo '{note}' >&2; echo after; exit 3")).expect("run");
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(stderr.contains(note), "stderr: {stderr:?} ({ran:?})");
    assert_eq!(ran.stdout, b"after\n", "{ran:?}");
    assert_eq!(ran.exit, Some(3), "{ran:?}");
    assert!(ran.error.is_none(), "{ran:?}");
}
