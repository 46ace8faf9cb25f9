//! A small HTTP/1.1 client for the E2B API's hostile suite and `brig-bench hostile`, written
//! out over `std::net` so an attack can do what no library client would: stop mid-header,
//! stall a body, read a stream slowly. It speaks E2B's API as the SDK does (JSON on the
//! control API, Connect's JSON envelopes on envd's), and holds the attacks both run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::Daemon;

// ---------------------------------------------------------------------------------------------
// A small HTTP/1.1 client.

/// An answer: its status and its body (chunked bodies decoded as they are read).
pub struct Response {
    pub status: u16,
    pub body: Box<dyn Read + Send>,
}

impl Response {
    pub fn text(mut self) -> String {
        let mut out = Vec::new();
        let _ = self.body.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn json(self) -> Value {
        let text = self.text();
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }
}

/// A chunked body, decoded as it is read.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            if line.trim().is_empty() {
                // The CRLF after the previous chunk.
                line.clear();
                self.inner.read_line(&mut line)?;
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|e| std::io::Error::other(format!("chunk size {line:?}: {e}")))?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let want = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= n;
        Ok(n)
    }
}

pub fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_string()
}

/// Sends one request (`Connection: close`) and reads the answer's head.
pub fn request(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let addr = host_port(url);
    let mut tcp = TcpStream::connect(&addr).with_context(|| format!("connecting to {addr}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    tcp.write_all(head.as_bytes())?;
    tcp.write_all(body)?;
    read_response(tcp)
}

pub fn read_response(tcp: TcpStream) -> anyhow::Result<Response> {
    let mut reader = BufReader::new(tcp);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 =
        line.split_whitespace().nth(1).with_context(|| format!("status line {line:?}"))?.parse()?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let body: Box<dyn Read + Send> =
        if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            Box::new(Chunked { inner: reader, left: 0, done: false })
        } else if let Some(len) = find("content-length").and_then(|v| v.parse::<u64>().ok()) {
            Box::new(reader.take(len))
        } else {
            Box::new(reader)
        };
    Ok(Response { status, body })
}

// ---------------------------------------------------------------------------------------------
// E2B's API, as the SDK speaks it.

/// E2B's API at `url` with API key `key`.
#[derive(Clone)]
pub struct Api {
    pub url: String,
    pub key: String,
}

/// A sandbox made through the API, with its envd access token.
#[derive(Clone)]
pub struct Sbx {
    pub id: String,
    pub token: String,
}

impl Api {
    /// `/health` answered 200 within `within`.
    pub fn health(&self, within: Duration) -> bool {
        let started = Instant::now();
        let answered =
            request(&self.url, "GET", "/health", &[], b"").is_ok_and(|r| r.status == 200);
        answered && started.elapsed() <= within
    }

    pub fn new(daemon: &Daemon) -> Api {
        Api {
            url: daemon.e2b_url().expect("E2B API address"),
            key: daemon.access_token().expect("token"),
        }
    }

    pub fn create_with(&self, body: Value) -> anyhow::Result<Response> {
        let key = self.key.clone();
        request(
            &self.url,
            "POST",
            "/sandboxes",
            &[("X-API-Key", key.as_str()), ("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    pub fn create(&self) -> Sbx {
        let r = self.create_with(json!({"templateID": "base", "timeout": 900})).expect("create");
        let status = r.status;
        let v = r.json();
        assert_eq!(status, 201, "create: {v}");
        Sbx {
            id: v["sandboxID"].as_str().expect("id").to_string(),
            token: v["envdAccessToken"].as_str().expect("token").to_string(),
        }
    }

    pub fn kill(&self, sb: &Sbx) -> u16 {
        request(
            &self.url,
            "DELETE",
            &format!("/sandboxes/{}", sb.id),
            &[("X-API-Key", self.key.as_str())],
            b"",
        )
        .map(|r| r.status)
        .unwrap_or(0)
    }

    /// A Connect streaming call to sandbox `sb`'s envd.
    pub fn stream(&self, sb: &Sbx, path: &str, message: &Value) -> anyhow::Result<Response> {
        let mut body = vec![0u8];
        let payload = message.to_string();
        body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        body.extend_from_slice(payload.as_bytes());
        request(
            &self.url,
            "POST",
            path,
            &[
                ("E2b-Sandbox-Id", sb.id.as_str()),
                ("X-Access-Token", sb.token.as_str()),
                ("Content-Type", "application/connect+json"),
                ("Connect-Protocol-Version", "1"),
                ("Authorization", "Basic cm9vdDo="),
            ],
            &body,
        )
    }

    /// Runs `script` as root in `sb`: (stdout, exit code, the stream's error if any).
    pub fn run(
        &self,
        sb: &Sbx,
        script: &str,
    ) -> anyhow::Result<(Vec<u8>, Option<i64>, Option<Value>)> {
        let ran = self.run_all(sb, script)?;
        Ok((ran.stdout, ran.exit, ran.error))
    }

    /// Runs `script` as root in `sb`: everything its `Start` stream carried.
    pub fn run_all(&self, sb: &Sbx, script: &str) -> anyhow::Result<Ran> {
        let message = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
        let r = self.stream(sb, "/process.Process/Start", &message)?;
        if r.status != 200 {
            let status = r.status;
            bail!("start answered {status}: {}", r.text());
        }
        let mut body = r.body;
        let mut ran = Ran::default();
        while let Some((flags, v)) = envelope(&mut body)? {
            if flags & 2 != 0 {
                ran.error = v.get("error").cloned();
                break;
            }
            let event = &v["event"];
            if let Some(data) = event["data"]["stdout"].as_str() {
                ran.stdout.extend(base64_decode(data));
            }
            if let Some(data) = event["data"]["stderr"].as_str() {
                ran.stderr.extend(base64_decode(data));
            }
            if let Some(end) = event.get("end") {
                ran.exit = Some(end["exitCode"].as_i64().unwrap_or(0));
            }
        }
        Ok(ran)
    }
}

/// What a command's `Start` stream carried: its output, exit code, and the stream's error.
#[derive(Debug, Default)]
pub struct Ran {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: Option<i64>,
    pub error: Option<Value>,
}

/// One Connect envelope: (flags, its JSON), `None` at the end of the body.
pub fn envelope(body: &mut impl Read) -> anyhow::Result<Option<(u8, Value)>> {
    let mut head = [0u8; 5];
    match body.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut payload = vec![0u8; len];
    body.read_exact(&mut payload)?;
    Ok(Some((head[0], serde_json::from_slice(&payload)?)))
}

/// Standard base64 (as Connect's JSON carries bytes), empty if malformed.
pub fn base64_decode(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(text).unwrap_or_default()
}

/// brigd's resident memory, in MiB.
pub fn rss_mib(daemon: &Daemon) -> u64 {
    let pid = daemon.pid().expect("brigd pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib / 1024)
}

/// A number no two calls share (for keys nobody has).
pub fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

/// Waits up to `within` for the server to end the connection (an answer then EOF, or a
/// reset): "closed", or "open".
pub fn closed_by_server(mut tcp: TcpStream, within: Duration) -> &'static str {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let _ = tcp.set_read_timeout(Some(Duration::from_millis(500)));
        match tcp.read(&mut buf) {
            Ok(0) => return "closed",
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return "closed",
        }
    }
    "open"
}

/// 1 GiB of zeros, gzipped (about 1 MiB): a bomb for `Content-Encoding: gzip` uploads.
pub fn gzip_bomb() -> Vec<u8> {
    let bomb = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, zlib\n\
             c = zlib.compressobj(9, zlib.DEFLATED, 31)\n\
             z = bytes(1 << 20)\n\
             out = sys.stdout.buffer\n\
             for _ in range(1024): out.write(c.compress(z))\n\
             out.write(c.flush())\n",
        ])
        .output()
        .expect("python3 makes the bomb");
    assert!(bomb.status.success() && bomb.stdout.len() < 4 << 20, "bomb {}", bomb.stdout.len());
    bomb.stdout
}

/// `POST /files?path=PATH&username=root` into `sb`, gzip-encoded if `gzip`: (status, body).
pub fn upload(api: &Api, sb: &Sbx, path: &str, body: &[u8], gzip: bool) -> (u16, String) {
    let mut headers = vec![
        ("E2b-Sandbox-Id", sb.id.as_str()),
        ("X-Access-Token", sb.token.as_str()),
        ("Content-Type", "application/octet-stream"),
    ];
    if gzip {
        headers.push(("Content-Encoding", "gzip"));
    }
    let target = format!("/files?path={path}&username=root");
    match request(&api.url, "POST", &target, &headers, body) {
        Ok(r) => {
            let status = r.status;
            (status, r.text())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// `n` requests with keys nobody has: how many answered each status.
pub fn random_keys(api: &Api, n: u32) -> std::collections::BTreeMap<u16, u32> {
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..n {
        let key = format!("{:016x}{i:08x}", rand_u64());
        let status = request(&api.url, "GET", "/sandboxes", &[("X-API-Key", key.as_str())], b"")
            .map_or(0, |r| r.status);
        *statuses.entry(status).or_insert(0u32) += 1;
    }
    statuses
}

/// `n` connections, each sending `kib` KiB of a request head that never ends.
pub fn unfinished_heads(api: &Api, n: usize, kib: usize) -> Vec<TcpStream> {
    let addr = host_port(&api.url);
    let line = format!("X-Filler: {}\r\n", "a".repeat(1000));
    let mut conns = Vec::new();
    for _ in 0..n {
        let Ok(mut tcp) = TcpStream::connect(&addr) else { continue };
        let _ = tcp.set_write_timeout(Some(Duration::from_secs(5)));
        let _ = tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n");
        for _ in 0..kib {
            if tcp.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
        conns.push(tcp);
    }
    conns
}

/// `n` uploads into `sb` that send their head and a first MiB of a 64 MiB body, then stall
/// (those refused at once keep what they could send).
pub fn stalled_uploads(api: &Api, sb: &Sbx, n: usize) -> Vec<TcpStream> {
    let addr = host_port(&api.url);
    let chunk = vec![b'a'; 1 << 20];
    (0..n)
        .filter_map(|i| {
            let mut tcp = TcpStream::connect(&addr).ok()?;
            let head = format!(
                "POST /files?path=/tmp/stalled-{i}&username=root HTTP/1.1\r\nHost: {addr}\r\n\
                 E2b-Sandbox-Id: {}\r\nX-Access-Token: {}\r\n\
                 Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
                sb.id,
                sb.token,
                64 << 20
            );
            tcp.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
            tcp.write_all(head.as_bytes()).ok()?;
            // One past the sandbox's share is answered 429 at once and closed, which may reset
            // this write: it was made all the same.
            let _ = tcp.write_all(&chunk);
            Some(tcp)
        })
        .collect()
}

/// `WatchDir` of `path` in `sb`, recursive.
pub fn watch(api: &Api, sb: &Sbx, path: &str) -> anyhow::Result<Response> {
    api.stream(sb, "/filesystem.Filesystem/WatchDir", &json!({"path": path, "recursive": true}))
}

/// An attack on the E2B API for `brig-bench hostile`: what it saw, in a few words.
pub type Attack = fn(&Api) -> String;

/// The E2B API's attacks `brig-bench hostile` measures (the hostile suite checks each).
pub const ATTACKS: [(&str, Attack); 5] = [
    ("e2b_random_keys", |api| format!("statuses {:?}", random_keys(api, 3000))),
    ("e2b_unfinished_heads", |api| {
        let conns = unfinished_heads(api, 1000, 380);
        let closed = conns
            .into_iter()
            .filter(|tcp| {
                closed_by_server(tcp.try_clone().expect("clone"), Duration::from_secs(20))
                    == "closed"
            })
            .count();
        format!("{closed}/1000 closed by the server")
    }),
    ("e2b_gzip_bomb", |api| {
        let target = api.create();
        let (status, text) = upload(api, &target, "/tmp/bomb", &gzip_bomb(), true);
        api.kill(&target);
        format!("{status} {}", text.chars().take(60).collect::<String>())
    }),
    ("e2b_watchers", |api| {
        let target = api.create();
        let _ = api.run(&target, "mkdir -p /w && cd /w && seq 1 2000 | xargs touch");
        let served: Vec<_> = (0..40)
            .filter_map(|_| watch(api, &target, "/w").ok().filter(|r| r.status == 200))
            .collect();
        let whole = watch(api, &target, "/").map(|r| r.status).unwrap_or(0);
        std::thread::sleep(Duration::from_secs(5));
        let n = served.len();
        api.kill(&target);
        format!("{n}/40 watches of 2,000 files served, a watch of / answered {whole}")
    }),
    ("e2b_stalled_uploads", |api| {
        let target = api.create();
        let stalled = stalled_uploads(api, &target, 600);
        std::thread::sleep(Duration::from_secs(2));
        let other = api.create();
        let (out, _, _) = api.run(&other, "echo ok").unwrap_or_default();
        let n = stalled.len();
        drop(stalled);
        api.kill(&target);
        api.kill(&other);
        format!(
            "{n} uploads stalled in one sandbox; another's echo: {:?}",
            String::from_utf8_lossy(&out)
        )
    }),
];
