//! `brig exec` and `brig sh`.

use std::io::{BufRead, Write};
use std::time::Duration;

use brig_sdk::{Client, Cmd, ExecEvent, ExecStream};
use tokio::io::AsyncReadExt;

use crate::ExecArgs;

/// Streams a command's output to this terminal; returns its exit status (128+signal if killed).
pub async fn exec(client: &Client, args: ExecArgs, json: bool) -> anyhow::Result<i32> {
    let mut cmd = Cmd::new(&args.argv);
    if let Some(cwd) = &args.cwd {
        cmd = cmd.cwd(cwd);
    }
    if let Some(user) = &args.user {
        cmd = cmd.user(user);
    }
    for (k, v) in &args.env {
        cmd = cmd.env(k, v);
    }
    if let Some(ms) = args.timeout_ms {
        cmd = cmd.timeout(Duration::from_millis(ms));
    }
    if let Some(limit) = args.output_limit {
        cmd = cmd.output_limit(limit);
    }
    if args.interactive {
        cmd = cmd.stdin_stream();
    }
    let stream = client.sandbox(&args.id).exec_stream(cmd).await?;
    if args.detach {
        let id = stream.exec_id();
        crate::output::line(json, &serde_json::json!({ "exec_id": id }), &id.to_string());
        return Ok(0);
    }
    follow(stream, args.interactive, json).await
}

/// Prints a command's output as it comes (forwarding our stdin if `stdin_open`) and returns
/// its exit status as ours: the code, or 128 + signal.
pub async fn follow(
    mut stream: ExecStream,
    mut stdin_open: bool,
    json: bool,
) -> anyhow::Result<i32> {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 << 10];
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let (mut collected_out, mut collected_err) = (Vec::new(), Vec::new());
    loop {
        tokio::select! {
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(0) | Err(_) => {
                    stdin_open = false;
                    stream.close_stdin()?;
                }
                Ok(n) => stream.write_stdin(buf[..n].to_vec()).await?,
            },
            event = stream.next() => match event {
                None => anyhow::bail!("stream ended without an exit status"),
                Some(event) => match event? {
                    ExecEvent::Stdout(b) if json => collected_out.extend_from_slice(&b),
                    ExecEvent::Stderr(b) if json => collected_err.extend_from_slice(&b),
                    ExecEvent::Stdout(b) => { out.write_all(&b)?; out.flush()?; }
                    ExecEvent::Stderr(b) => { err.write_all(&b)?; err.flush()?; }
                    ExecEvent::Exited(r) => {
                        if json {
                            println!("{}", serde_json::json!({
                                "exec_id": stream.exec_id(),
                                "exit_code": r.exit_code, "signal": r.signal,
                                "timed_out": r.timed_out, "killed": r.killed,
                                "truncated": r.truncated, "oom_killed": r.oom_killed,
                                "duration_us": r.duration_us,
                                "stdout": String::from_utf8_lossy(&collected_out),
                                "stderr": String::from_utf8_lossy(&collected_err),
                            }));
                        } else {
                            for (flag, text) in [(r.timed_out, "timed out"), (r.truncated, "output truncated at the cap"), (r.oom_killed, "killed by the memory limit"), (r.killed, "killed on request")] {
                                if flag {
                                    eprintln!("brig: {text}");
                                }
                            }
                        }
                        return Ok(r.exit_code.unwrap_or_else(|| 128 + r.signal.unwrap_or(0)));
                    }
                },
            },
        }
    }
}

/// A line-by-line shell over a persistent session.
pub async fn interactive(client: &Client, id: &str, timeout: Duration) -> anyhow::Result<i32> {
    let session = client.sandbox(id).open_session().await?;
    let stdin = std::io::stdin();
    let mut cwd = String::from("/");
    let mut last = 0;
    loop {
        eprint!("{cwd}$ ");
        std::io::stderr().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end();
        if line == "exit" {
            break;
        }
        if line.is_empty() {
            continue;
        }
        let result = session
            .run_with(line, timeout, |is_stdout, bytes| {
                let _ = if is_stdout {
                    std::io::stdout().write_all(bytes)
                } else {
                    std::io::stderr().write_all(bytes)
                };
            })
            .await?;
        match result.exit_code {
            Some(code) => {
                last = code;
                cwd = result.cwd;
            }
            None => eprintln!("brig: still running after {timeout:?}; it continues in the background of this session"),
        }
    }
    session.close().await?;
    Ok(last)
}
