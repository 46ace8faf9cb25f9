//! envd's `process.Process` service on Brig execs. A process's pid is its pid inside the
//! sandbox (as envd's: `kill <pid>` and `ps` in the sandbox see the same process); the node
//! tells it with the exec, and a pid is turned back into its Brig exec id to be listed,
//! re-attached (`Connect`, with the output the node kept) and killed. `SendInput`,
//! `StreamInput` and `CloseStdin` write its stdin by exec id too (the node holds a streamed
//! command's stdin, across restarts). A tier that cannot tell pids uses the exec id as pid.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use brig_sdk::{Cmd, ErrorCode, ExecEvent, ExecResult, ExecStream, Sandbox, SandboxState};
use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use crate::connect::{self, Code, Codec, ConnectError};
use crate::envd::{self, brig_error, EnvdUser};
use crate::gateway::header;
use crate::pb::process as pb;
use crate::Gateway;
use pb::process_event::{data_event::Output, DataEvent, EndEvent, Event, KeepAlive, StartEvent};

/// Output a command may stream before it is stopped (the node's ceiling).
const OUTPUT_LIMIT: u64 = 1 << 30;
/// The longest a command runs when its request sets no deadline (the node caps it at its
/// `max_exec_timeout_ms`, a day by default).
const LONGEST_COMMAND: Duration = Duration::from_secs(24 * 3600);
/// Events waiting for a slow client, per stream.
const EVENT_QUEUE: usize = 64;

enum StdinOp {
    Data(Bytes),
    Close,
}

/// A process this gateway started: what it was asked to run.
struct Known {
    exec_id: u64,
    config: pb::ProcessConfig,
    tag: Option<String>,
    /// It runs on a terminal: its output is `pty` data.
    pty: bool,
}

/// The processes started through this gateway that are still running, by (sandbox, pid).
#[derive(Default)]
pub struct Processes {
    known: parking_lot::Mutex<HashMap<(String, u32), Known>>,
}

impl Processes {
    fn is_pty(&self, sandbox: &str, pid: u32) -> bool {
        self.known.lock().get(&(sandbox.to_string(), pid)).is_some_and(|k| k.pty)
    }

    fn by_tag(&self, sandbox: &str, tag: &str) -> Option<Target> {
        self.known
            .lock()
            .iter()
            .find(|((s, _), k)| s == sandbox && k.tag.as_deref() == Some(tag))
            .map(|((_, pid), k)| Target { pid: *pid, exec_id: k.exec_id })
    }

    fn by_pid(&self, sandbox: &str, pid: u32) -> Option<Target> {
        let known = self.known.lock();
        known.get(&(sandbox.to_string(), pid)).map(|k| Target { pid, exec_id: k.exec_id })
    }
}

/// A process a request names: its pid in the sandbox and its Brig exec id.
#[derive(Debug, Clone, Copy)]
struct Target {
    pid: u32,
    exec_id: u64,
}

/// The pid E2B's SDK sees for an exec: its pid in the sandbox, or (where the tier cannot
/// tell) its exec id.
fn e2b_pid(exec_id: u64, pid: Option<u32>) -> Option<u32> {
    pid.or_else(|| u32::try_from(exec_id).ok())
}

/// `POST /process.Process/{method}`.
pub async fn rpc(
    State(gw): State<Gateway>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = match method.as_str() {
        "Start" => start(&gw, &headers, body).await,
        "Connect" => connect_rpc(&gw, &headers, body).await,
        "StreamInput" => stream_input(&gw, &headers, body).await,
        "List" | "SendInput" | "CloseStdin" | "SendSignal" | "Update" => {
            return unary(&gw, &method, &headers, body).await
        }
        other => Err(ConnectError::new(Code::Unimplemented, format!("no method {other}"))),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn unary(gw: &Gateway, method: &str, headers: &HeaderMap, body: Body) -> Response {
    let codec = match Codec::unary(headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    match method {
        "List" => {
            let r = async {
                let sb = envd::sandbox(gw, headers).await?;
                connect::unary_request::<pb::ListRequest>(codec, body).await?;
                list(gw, &sb).await
            };
            connect::unary_reply(codec, r.await)
        }
        "SendInput" => {
            let r = async {
                let sb = envd::sandbox(gw, headers).await?;
                let req: pb::SendInputRequest = connect::unary_request(codec, body).await?;
                let target = selected(gw, &sb, req.process.as_ref()).await?;
                let data = input_bytes(req.input)?;
                send_stdin(&sb, target, StdinOp::Data(data)).await?;
                Ok(pb::SendInputResponse {})
            };
            connect::unary_reply(codec, r.await)
        }
        "CloseStdin" => {
            let r = async {
                let sb = envd::sandbox(gw, headers).await?;
                let req: pb::CloseStdinRequest = connect::unary_request(codec, body).await?;
                let target = selected(gw, &sb, req.process.as_ref()).await?;
                send_stdin(&sb, target, StdinOp::Close).await?;
                Ok(pb::CloseStdinResponse {})
            };
            connect::unary_reply(codec, r.await)
        }
        "SendSignal" => {
            let r = async {
                let sb = envd::sandbox(gw, headers).await?;
                let req: pb::SendSignalRequest = connect::unary_request(codec, body).await?;
                let target = selected(gw, &sb, req.process.as_ref()).await?;
                let running = sb
                    .execs()
                    .await
                    .map_err(brig_error)?
                    .iter()
                    .any(|e| e.exec_id == target.exec_id && e.result.is_none());
                if !running {
                    let pid = target.pid;
                    return Err(ConnectError::new(
                        Code::NotFound,
                        format!("process with pid {pid} not found"),
                    ));
                }
                // SIGTERM and SIGKILL both end the process tree (Brig's kill).
                sb.kill(target.exec_id).await.map_err(brig_error)?;
                Ok(pb::SendSignalResponse {})
            };
            connect::unary_reply(codec, r.await)
        }
        _ => {
            let r = async {
                let sb = envd::sandbox(gw, headers).await?;
                let req: pb::UpdateRequest = connect::unary_request(codec, body).await?;
                let target = selected(gw, &sb, req.process.as_ref()).await?;
                if let Some(size) = req.pty.and_then(|p| p.size) {
                    let (rows, cols) = terminal_size(size);
                    sb.resize_terminal(target.exec_id, rows, cols).await.map_err(brig_error)?;
                }
                Ok(pb::UpdateResponse {})
            };
            connect::unary_reply(codec, r.await)
        }
    }
}

/// The process a request's selector names in sandbox `sb`: one this gateway started (by pid
/// or tag) and still runs, else a command of the sandbox's with that pid (started before a
/// restart of brigd, or through another gateway; a running one before one that ended).
async fn selected(
    gw: &Gateway,
    sb: &Sandbox,
    selector: Option<&pb::ProcessSelector>,
) -> Result<Target, ConnectError> {
    use pb::process_selector::Selector;
    match selector.and_then(|s| s.selector.as_ref()) {
        Some(Selector::Pid(pid)) => {
            if let Some(found) = gw.inner.processes.by_pid(sb.id(), *pid) {
                return Ok(found);
            }
            // A running command with that pid, else the latest one that had it and ended
            // (`Connect` reads a just-ended command's output again).
            let execs = sb.execs().await.map_err(brig_error)?;
            let with_pid = execs.iter().filter(|e| e2b_pid(e.exec_id, e.pid) == Some(*pid));
            with_pid
                .max_by_key(|e| (e.result.is_none(), e.exec_id))
                .map(|e| Target { pid: *pid, exec_id: e.exec_id })
                .ok_or_else(|| {
                    ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
                })
        }
        Some(Selector::Tag(tag)) => gw.inner.processes.by_tag(sb.id(), tag).ok_or_else(|| {
            ConnectError::new(Code::NotFound, format!("process with tag {tag} not found"))
        }),
        None => Err(ConnectError::new(Code::InvalidArgument, "no process selector")),
    }
}

fn input_bytes(input: Option<pb::ProcessInput>) -> Result<Bytes, ConnectError> {
    use pb::process_input::Input;
    match input.and_then(|i| i.input) {
        Some(Input::Stdin(b) | Input::Pty(b)) => Ok(Bytes::from(b)),
        None => Err(ConnectError::new(Code::InvalidArgument, "no input")),
    }
}

async fn send_stdin(sb: &Sandbox, target: Target, op: StdinOp) -> Result<(), ConnectError> {
    // By exec id: the node holds a streamed command's stdin, so this reaches a process this
    // gateway started as well as one started before a restart of brigd.
    let sent = match op {
        StdinOp::Data(data) => sb.write_stdin(target.exec_id, data).await,
        StdinOp::Close => sb.close_stdin(target.exec_id).await,
    };
    let pid = target.pid;
    sent.map_err(|e| match e.code() {
        Some(brig_sdk::ErrorCode::NotFound | brig_sdk::ErrorCode::Conflict) => ConnectError::new(
            Code::NotFound,
            format!("process {pid} is not running with its stdin open (start it with stdin=True)"),
        ),
        _ => brig_error(e),
    })
}

async fn list(gw: &Gateway, sb: &Sandbox) -> Result<pb::ListResponse, ConnectError> {
    let execs = sb.execs().await.map_err(brig_error)?;
    let known = gw.inner.processes.known.lock();
    let processes = execs
        .into_iter()
        .filter(|e| e.result.is_none())
        .filter_map(|e| {
            let pid = e2b_pid(e.exec_id, e.pid)?;
            let entry = known.get(&(sb.id().to_string(), pid));
            let config = entry.map(|k| k.config.clone()).unwrap_or_else(|| pb::ProcessConfig {
                cmd: e.argv.first().cloned().unwrap_or_default(),
                args: e.argv.iter().skip(1).cloned().collect(),
                ..Default::default()
            });
            Some(pb::ProcessInfo {
                config: Some(config),
                pid,
                tag: entry.and_then(|k| k.tag.clone()),
            })
        })
        .collect();
    Ok(pb::ListResponse { processes })
}

/// `Start`: runs the command and streams its events: `start{pid}` at once, then output, then
/// `end`. Past the request's deadline the command is killed and the stream ends with
/// `deadline_exceeded`; a client that goes away leaves the command running.
async fn start(gw: &Gateway, headers: &HeaderMap, body: Body) -> Result<Response, ConnectError> {
    let codec = Codec::streaming(headers)?;
    // The token first: nobody else's body is read.
    let sb = envd::sandbox(gw, headers).await?;
    let req: pb::StartRequest = connect::single_stream_request(codec, body).await?;
    let user = EnvdUser::from_headers(headers)?;
    let config = req
        .process
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "no process to start"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "empty command"));
    }
    let argv: Vec<&str> = std::iter::once(config.cmd.as_str())
        .chain(config.args.iter().map(String::as_str))
        .collect();
    // No directory: the template's WORKDIR, else the user's home (as envd).
    let cwd = match config.cwd.as_deref() {
        Some(c) => user.resolve(c),
        None => {
            let facts = gw.inner.facts.of(&sb).await.unwrap_or_default();
            facts.workdir.unwrap_or_else(|| user.home())
        }
    };
    let envs: std::collections::BTreeMap<&String, &String> = config.envs.iter().collect();
    crate::limits::check_command(&argv, &envs, &cwd)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
    // The node's own limit on the command: the request's deadline (the gateway also ends the
    // stream then), or the longest a command may run (E2B's `timeout=0`: no limit but the
    // sandbox's).
    let deadline = connect::deadline(headers);
    let mut cmd = Cmd::new(argv)
        .cwd(&cwd)
        .output_limit(OUTPUT_LIMIT)
        .timeout(deadline.map_or(LONGEST_COMMAND, |d| d + Duration::from_secs(5)));
    if let Some(name) = user.brig_user() {
        cmd = cmd.user(&name);
    }
    for (k, v) in envs {
        cmd = cmd.env(k, v);
    }
    // A terminal always takes input (E2B's PTY start sends no `stdin`).
    let pty = req.pty.map(|p| terminal_size(p.size.unwrap_or_default()));
    if let Some((rows, cols)) = pty {
        cmd = cmd.terminal(rows, cols);
    }
    let with_stdin = pty.is_some() || req.stdin.unwrap_or(false);
    if with_stdin {
        cmd = cmd.stdin_stream();
    }
    let mut stream = sb.exec_stream(cmd).await.map_err(brig_error)?;
    let exec_id = stream.exec_id();
    let pid = e2b_pid(exec_id, stream.pid())
        .ok_or_else(|| ConnectError::new(Code::Internal, "exec id past the pid range"))?;
    let key = (sb.id().to_string(), pid);
    // Its stdin stays open while the stream does (the pump holds it until the command ends);
    // input goes to it by exec id (`send_stdin`).
    gw.inner
        .processes
        .known
        .lock()
        .insert(key.clone(), Known { exec_id, config, tag: req.tag, pty: pty.is_some() });
    let keepalive = keepalive_interval(headers);
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let gw = gw.clone();
    tokio::spawn(async move {
        let ended = pump(&sb, &mut stream, pid, pty.is_some(), &tx, deadline, keepalive).await;
        if ended == Pumped::DeadlinePassed {
            let _ = sb.kill(exec_id).await;
        }
        gw.inner.processes.known.lock().remove(&key);
    });
    Ok(connect::stream_reply(codec, receiver_stream::<pb::StartResponse>(rx)))
}

/// `Connect`: the output of a running (or just ended) process again, from what the node kept,
/// then what follows.
async fn connect_rpc(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let codec = Codec::streaming(headers)?;
    let sb = envd::sandbox(gw, headers).await?;
    let req: pb::ConnectRequest = connect::single_stream_request(codec, body).await?;
    let target = selected(gw, &sb, req.process.as_ref()).await?;
    let mut stream = sb.attach(target.exec_id).await.map_err(brig_error)?;
    let (pid, pty) = (target.pid, gw.inner.processes.is_pty(sb.id(), target.pid));
    let deadline = connect::deadline(headers);
    let keepalive = keepalive_interval(headers);
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    tokio::spawn(async move {
        pump(&sb, &mut stream, pid, pty, &tx, deadline, keepalive).await;
    });
    Ok(connect::stream_reply(codec, receiver_stream::<pb::ConnectResponse>(rx)))
}

/// `StreamInput`: a start message naming the process, then input messages, fed to its stdin
/// as they arrive; the answer is one empty message.
async fn stream_input(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    use pb::stream_input_request::Event as In;
    let codec = Codec::streaming(headers)?;
    let sb = envd::sandbox(gw, headers).await?;
    let mut reader = connect::EnvelopeReader::new(codec, body);
    let first: Option<pb::StreamInputRequest> = reader.next().await?;
    let selector = match first.and_then(|m| m.event) {
        Some(In::Start(start)) => start.process,
        _ => {
            return Err(ConnectError::new(Code::InvalidArgument, "the first message is not start"))
        }
    };
    let target = selected(gw, &sb, selector.as_ref()).await?;
    let result = async {
        while let Some(message) = reader.next::<pb::StreamInputRequest>().await? {
            match message.event {
                Some(In::Data(data)) => {
                    send_stdin(&sb, target, StdinOp::Data(input_bytes(data.input)?)).await?
                }
                Some(In::Keepalive(_)) | None => {}
                Some(In::Start(_)) => {
                    return Err(ConnectError::new(Code::InvalidArgument, "a second start message"))
                }
            }
        }
        Ok(pb::StreamInputResponse {})
    }
    .await;
    Ok(connect::stream_reply(codec, futures::stream::iter([result])))
}

/// How a pump ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pumped {
    Ended,
    DeadlinePassed,
    Failed,
}

/// Any event message of a process stream (`StartResponse`, `ConnectResponse`).
trait EventMessage: connect::Message + Send {
    fn wrap(event: Event) -> Self;
}

impl EventMessage for pb::StartResponse {
    fn wrap(event: Event) -> Self {
        pb::StartResponse { event: Some(pb::ProcessEvent { event: Some(event) }) }
    }
}

impl EventMessage for pb::ConnectResponse {
    fn wrap(event: Event) -> Self {
        pb::ConnectResponse { event: Some(pb::ProcessEvent { event: Some(event) }) }
    }
}

type EventTx = mpsc::Sender<Result<Event, ConnectError>>;

/// Moves a command's events to `tx` until it ends, the deadline passes or the stream fails. A
/// client that went away stops nothing: the pump reads on (and drops) until the command ends,
/// so what it keeps (stdin, its table entry) lives exactly as long as the command.
async fn pump(
    sb: &Sandbox,
    stream: &mut ExecStream,
    pid: u32,
    pty: bool,
    tx: &EventTx,
    deadline: Option<Duration>,
    keepalive: Option<Duration>,
) -> Pumped {
    let _ = tx.send(Ok(Event::Start(StartEvent { pid }))).await;
    let until = deadline.map(|d| tokio::time::Instant::now() + d);
    let mut attached = true;
    loop {
        let next = async {
            match keepalive {
                Some(every) => tokio::time::timeout(every, stream.next()).await.ok(),
                None => Some(stream.next().await),
            }
        };
        let event = match until {
            Some(at) => match tokio::time::timeout_at(at, next).await {
                Ok(e) => e,
                Err(_) => {
                    let _ = tx
                        .send(Err(ConnectError::new(
                            Code::DeadlineExceeded,
                            format!("process {pid} ran past the request's deadline"),
                        )))
                        .await;
                    return Pumped::DeadlinePassed;
                }
            },
            None => next.await,
        };
        let message = match event {
            None => Event::Keepalive(KeepAlive {}),
            Some(None) => return Pumped::Ended,
            Some(Some(Ok(ExecEvent::Stdout(b)))) if pty => {
                Event::Data(DataEvent { output: Some(Output::Pty(b.to_vec())) })
            }
            Some(Some(Ok(ExecEvent::Stdout(b)))) => {
                Event::Data(DataEvent { output: Some(Output::Stdout(b.to_vec())) })
            }
            // Passed on as it came: a note of the node's (output not kept for a reader that
            // attached late) is stderr text like any other, never a signal the process could
            // fake by printing it.
            Some(Some(Ok(ExecEvent::Stderr(b)))) => {
                Event::Data(DataEvent { output: Some(Output::Stderr(b.to_vec())) })
            }
            // A command killed because its sandbox went (killed, timed out) ends as envd's
            // stream does then: the sandbox "was not found", which the SDKs raise as not running.
            Some(Some(Ok(ExecEvent::Exited(result))))
                if result.exit_code.is_none() && sandbox_gone(sb).await =>
            {
                if attached {
                    let _ = tx.send(Err(ConnectError::SandboxGone(sb.id().to_string()))).await;
                }
                return Pumped::Failed;
            }
            Some(Some(Ok(ExecEvent::Exited(result)))) => Event::End(end_event(&result)),
            Some(Some(Err(e))) => {
                if attached {
                    let _ = tx.send(Err(brig_error(e))).await;
                }
                return Pumped::Failed;
            }
        };
        let last = matches!(message, Event::End(_));
        if attached && tx.send(Ok(message)).await.is_err() {
            attached = false;
        }
        if last {
            return Pumped::Ended;
        }
    }
}

/// Whether the sandbox is gone (destroyed, expired) or going.
async fn sandbox_gone(sb: &Sandbox) -> bool {
    match sb.status().await {
        Ok(info) => !matches!(info.state, SandboxState::Running | SandboxState::Paused),
        Err(e) => matches!(e.code(), Some(ErrorCode::NotFound | ErrorCode::Expired)),
    }
}

/// envd's end event for a Brig result: a signal death is exit code -1 with the signal named,
/// as envd reports it.
pub fn end_event(result: &ExecResult) -> EndEvent {
    let (exit_code, status) = match (result.exit_code, result.signal) {
        (Some(code), _) => (code, format!("exit status {code}")),
        (None, Some(signal)) => (-1, format!("signal: {}", signal_name(signal))),
        (None, None) => (-1, "unknown".to_string()),
    };
    let error = if result.timed_out {
        Some("the command ran past its timeout".to_string())
    } else if result.truncated {
        Some(format!("the command's output passed {OUTPUT_LIMIT} bytes and it was stopped"))
    } else {
        None
    };
    EndEvent { exit_code, exited: result.exit_code.is_some(), status, error }
}

fn signal_name(signal: i32) -> String {
    match signal {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        other => format!("signal {other}"),
    }
}

/// E2B's terminal size as (rows, cols), 24 × 80 where it names none.
fn terminal_size(size: pb::pty::Size) -> (u16, u16) {
    let clamp = |v: u32, default: u16| if v == 0 { default } else { v.min(1000) as u16 };
    (clamp(size.rows, 24), clamp(size.cols, 80))
}

/// `Keepalive-Ping-Interval` (seconds), when the client asked for keepalives.
fn keepalive_interval(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = header(headers, "keepalive-ping-interval")?.trim().parse().ok()?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

fn receiver_stream<M: EventMessage>(
    rx: mpsc::Receiver<Result<Event, ConnectError>>,
) -> impl Stream<Item = Result<M, ConnectError>> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item.map(M::wrap), rx))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_read_as_envd_writes_them() {
        let ok = end_event(&ExecResult { exit_code: Some(0), ..Default::default() });
        assert_eq!((ok.exit_code, ok.exited, ok.status.as_str()), (0, true, "exit status 0"));
        let killed = end_event(&ExecResult { signal: Some(9), killed: true, ..Default::default() });
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
        let json =
            serde_json::to_value(pb::StartResponse::wrap(Event::End(end_event(&ExecResult {
                exit_code: Some(3),
                ..Default::default()
            }))))
            .expect("json");
        assert_eq!(json["event"]["end"]["exitCode"], 3);
        let data = serde_json::to_value(pb::StartResponse::wrap(Event::Data(DataEvent {
            output: Some(Output::Stdout(b"hi".to_vec())),
        })))
        .expect("json");
        assert_eq!(data["event"]["data"]["stdout"], "aGk=");
    }

    #[test]
    fn the_sdks_start_request_decodes() {
        let body = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false}"#;
        let req: pb::StartRequest = Codec::Json.decode(body).expect("decode");
        let p = req.process.expect("process");
        assert_eq!(p.args, vec!["-l", "-c", "echo hi"]);
        assert_eq!(p.envs.get("A").map(String::as_str), Some("1"));
        assert_eq!(req.stdin, Some(false));
        let signal: pb::SendSignalRequest =
            Codec::Json.decode(br#"{"process":{"pid":12},"signal":"SIGNAL_SIGKILL"}"#).expect("d");
        assert_eq!(signal.signal, pb::Signal::Sigkill as i32);
    }
}
