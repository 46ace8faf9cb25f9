//! Commands in container sandboxes: one-off execs with streamed output, and persistent shell
//! sessions.

use std::time::Duration;

use brig_proto::{
    ExecOp, ExecRequest, ExecResult, OutputStream, Reply, Request, SessionOp, SessionOpenRequest,
    StdinMode,
};
use brig_transport::ClientExchange;
use bytes::Bytes;

use crate::client::{expect_done, unexpected};
use crate::{Error, Sandbox};

/// A command to run: argv plus options.
#[derive(Debug, Clone, Default)]
pub struct Cmd {
    request: ExecRequest,
}

impl Cmd {
    /// `argv[0]` is looked up on the sandbox's PATH.
    pub fn new<S: AsRef<str>>(argv: impl IntoIterator<Item = S>) -> Cmd {
        let argv = argv.into_iter().map(|s| s.as_ref().to_string()).collect();
        Cmd { request: ExecRequest { argv, ..Default::default() } }
    }

    /// `sh -c script`.
    pub fn shell(script: &str) -> Cmd {
        Cmd::new(["sh", "-c", script])
    }

    pub fn env(mut self, key: &str, value: &str) -> Cmd {
        self.request.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn cwd(mut self, dir: &str) -> Cmd {
        self.request.cwd = dir.to_string();
        self
    }

    /// User name or `uid[:gid]` (default root).
    pub fn user(mut self, user: &str) -> Cmd {
        self.request.user = Some(user.to_string());
        self
    }

    /// Feeds these bytes on stdin.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Cmd {
        self.request.stdin = StdinMode::Bytes(bytes.into());
        self
    }

    /// Stdin will be written through [`ExecStream::write_stdin`].
    pub fn stdin_stream(mut self) -> Cmd {
        self.request.stdin = StdinMode::Stream;
        self
    }

    /// Kill the command (and everything it started) after this long.
    /// Runs the command on a terminal of `rows` × `cols` (an interactive shell): its output
    /// (stdout and stderr as one) arrives as stdout, streamed stdin is typed into it, and
    /// [`Sandbox::resize_terminal`] changes its size. Containers on the node's kernel only.
    pub fn terminal(mut self, rows: u16, cols: u16) -> Cmd {
        self.request.terminal = Some(brig_proto::TerminalSize { rows, cols });
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Cmd {
        self.request.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Cap on stdout + stderr returned; past it output is dropped and the result says so.
    pub fn output_limit(mut self, bytes: u64) -> Cmd {
        self.request.output_limit_bytes = Some(bytes);
        self
    }
}

/// Output of a finished command.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub exec_id: u64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub result: ExecResult,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.result.success()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// One event of a streamed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    Exited(ExecResult),
}

/// A running command whose output arrives as it is produced.
pub struct ExecStream {
    exchange: ClientExchange,
    exec_id: u64,
    pid: Option<u32>,
    done: bool,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream").field("exec_id", &self.exec_id).finish()
    }
}

impl ExecStream {
    /// Waits for `ExecStarted` on a request stream.
    pub(crate) async fn started(
        mut exchange: ClientExchange,
        request: &'static str,
    ) -> Result<ExecStream, Error> {
        match exchange.reply().await? {
            Reply::ExecStarted { exec_id, pid } => {
                Ok(ExecStream { exchange, exec_id, pid, done: false })
            }
            Reply::Error(e) => Err(e.into()),
            other => Err(unexpected(request, &other)),
        }
    }

    /// Id for [`Sandbox::kill`].
    pub fn exec_id(&self) -> u64 {
        self.exec_id
    }

    /// The command's pid inside the sandbox (its pid namespace), where the tier knows it.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The next event; `None` after `Exited`.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        if self.done {
            return None;
        }
        let reply = match self.exchange.next_reply().await {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                self.done = true;
                return Some(Err(Error::Transport(brig_transport::TransportError::NoReply)));
            }
            Err(e) => {
                self.done = true;
                return Some(Err(e.into()));
            }
        };
        Some(match reply {
            Reply::Output { stream: OutputStream::Stdout, data } => {
                Ok(ExecEvent::Stdout(data.into()))
            }
            Reply::Output { stream: OutputStream::Stderr, data } => {
                Ok(ExecEvent::Stderr(data.into()))
            }
            Reply::Exited(result) => {
                self.done = true;
                Ok(ExecEvent::Exited(result))
            }
            Reply::Error(e) => {
                self.done = true;
                Err(e.into())
            }
            other => {
                self.done = true;
                Err(unexpected("exec", &other))
            }
        })
    }

    /// Writes to the command's stdin (needs [`Cmd::stdin_stream`]).
    pub async fn write_stdin(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        Ok(self.exchange.send_raw(bytes.into()).await?)
    }

    /// Ends the command's stdin.
    pub fn close_stdin(&mut self) -> Result<(), Error> {
        Ok(self.exchange.finish_upload()?)
    }

    /// Takes the command's stdin off the stream (once, with [`Cmd::stdin_stream`]), so one task
    /// can feed it while another reads the output. `None` if it was taken already.
    pub fn take_stdin(&mut self) -> Option<ExecStdin> {
        self.exchange.take_upload().map(|upload| ExecStdin { upload })
    }

    /// Reads everything to the end.
    pub async fn collect(mut self) -> Result<ExecOutput, Error> {
        let mut out = ExecOutput { exec_id: self.exec_id, ..Default::default() };
        while let Some(event) = self.next().await {
            match event? {
                ExecEvent::Stdout(b) => out.stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => out.stderr.extend_from_slice(&b),
                ExecEvent::Exited(result) => out.result = result,
            }
        }
        Ok(out)
    }
}

/// A running command's stdin, taken off its [`ExecStream`]. Dropping it without
/// [`ExecStdin::close`] leaves the input open until the stream ends.
pub struct ExecStdin {
    upload: brig_transport::ClientUpload,
}

impl std::fmt::Debug for ExecStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStdin").finish_non_exhaustive()
    }
}

impl ExecStdin {
    /// Writes to the command's stdin.
    pub async fn write(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        Ok(self.upload.send_raw(bytes.into()).await?)
    }

    /// Ends the command's stdin (it reads end of file).
    pub fn close(&mut self) -> Result<(), Error> {
        Ok(self.upload.finish()?)
    }
}

impl Sandbox {
    /// Runs a command and collects its output.
    pub async fn exec<S: AsRef<str>>(
        &self,
        argv: impl IntoIterator<Item = S>,
    ) -> Result<ExecOutput, Error> {
        self.exec_with(Cmd::new(argv)).await
    }

    /// Runs a command with options and collects its output.
    pub async fn exec_with(&self, cmd: Cmd) -> Result<ExecOutput, Error> {
        self.exec_stream(cmd).await?.collect().await
    }

    /// Starts a command; its output streams as it is produced.
    pub async fn exec_stream(&self, cmd: Cmd) -> Result<ExecStream, Error> {
        let mut request = cmd.request;
        request.sandbox = self.id().to_string();
        let streaming = request.stdin == StdinMode::Stream;
        let mut exchange = self.client().open(&Request::Exec(ExecOp::Start(request))).await?;
        if !streaming {
            exchange.finish_upload()?;
        }
        ExecStream::started(exchange, "exec").await
    }

    /// Sets the window size of a command running on a terminal ([`Cmd::terminal`]).
    pub async fn resize_terminal(&self, exec_id: u64, rows: u16, cols: u16) -> Result<(), Error> {
        let request = Request::Exec(ExecOp::Resize {
            sandbox: self.id().to_string(),
            exec_id,
            size: brig_proto::TerminalSize { rows, cols },
        });
        expect_done("exec_resize", self.client().request(&request).await?)
    }

    /// Writes `data` to the stdin of a running command started with streamed stdin
    /// ([`Cmd::stdin_stream`]) or on a terminal, by its exec id: from any client, and after the
    /// node restarted. A command that does not read for 30 s makes this fail.
    pub async fn write_stdin(&self, exec_id: u64, data: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.stdin_request(exec_id, data.into(), false).await
    }

    /// Ends a running command's stdin by its exec id (it reads end of file); closing a
    /// closed stdin does nothing.
    pub async fn close_stdin(&self, exec_id: u64) -> Result<(), Error> {
        self.stdin_request(exec_id, Vec::new(), true).await
    }

    async fn stdin_request(&self, exec_id: u64, data: Vec<u8>, close: bool) -> Result<(), Error> {
        let sandbox = self.id().to_string();
        let request = Request::Exec(ExecOp::Input { sandbox, exec_id, data, close });
        expect_done("exec_input", self.client().request(&request).await?)
    }

    /// Kills a running command and everything it started.
    pub async fn kill(&self, exec_id: u64) -> Result<(), Error> {
        let request = Request::Exec(ExecOp::Kill { sandbox: self.id().to_string(), exec_id });
        expect_done("exec_kill", self.client().request(&request).await?)
    }

    /// Opens a persistent shell session (bash if the image has it, else sh).
    pub async fn open_session(&self) -> Result<ShellSession, Error> {
        self.open_session_with(SessionOpenRequest::default()).await
    }

    /// Opens a session with a given shell, environment, directory or user.
    pub async fn open_session_with(
        &self,
        mut options: SessionOpenRequest,
    ) -> Result<ShellSession, Error> {
        options.sandbox = self.id().to_string();
        match self.client().request(&Request::Session(SessionOp::Open(options))).await? {
            Reply::Session { session } => Ok(ShellSession { sandbox: self.clone(), id: session }),
            other => Err(unexpected("session_open", &other)),
        }
    }

    /// A handle to a session by id (after reconnecting).
    pub fn session(&self, id: &str) -> ShellSession {
        ShellSession { sandbox: self.clone(), id: id.to_string() }
    }
}

/// What a session command produced by the time its call returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// `None` while the command is still running (the call's timeout passed).
    pub exit_code: Option<i32>,
    /// The shell's working directory after the command.
    pub cwd: String,
}

impl SessionOutput {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    pub fn is_running(&self) -> bool {
        self.exit_code.is_none()
    }
}

/// A persistent shell: `cd`, `export` and background jobs survive between commands.
#[derive(Debug, Clone)]
pub struct ShellSession {
    sandbox: Sandbox,
    id: String,
}

impl ShellSession {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs `command`; returns when it finishes or `timeout` passes (then it keeps running and
    /// [`ShellSession::wait`] picks it up).
    pub async fn run(&self, command: &str, timeout: Duration) -> Result<SessionOutput, Error> {
        self.run_with(command, timeout, |_, _| {}).await
    }

    /// Like [`ShellSession::run`], calling `on_output(is_stdout, bytes)` as output arrives.
    pub async fn run_with(
        &self,
        command: &str,
        timeout: Duration,
        on_output: impl FnMut(bool, &[u8]),
    ) -> Result<SessionOutput, Error> {
        let request = Request::Session(SessionOp::Run {
            sandbox: self.sandbox.id().to_string(),
            session: self.id.clone(),
            command: command.to_string(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        });
        self.stream(request, on_output).await
    }

    /// Waits for a command that outlived its `run`, with its output since then.
    pub async fn wait(&self, timeout: Duration) -> Result<SessionOutput, Error> {
        let request = Request::Session(SessionOp::Wait {
            sandbox: self.sandbox.id().to_string(),
            session: self.id.clone(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        });
        self.stream(request, |_, _| {}).await
    }

    async fn stream(
        &self,
        request: Request,
        mut on_output: impl FnMut(bool, &[u8]),
    ) -> Result<SessionOutput, Error> {
        let mut exchange = self.sandbox.client().open(&request).await?;
        exchange.finish_upload()?;
        let mut out = SessionOutput::default();
        loop {
            match exchange.reply().await? {
                Reply::Output { stream, data } => {
                    let is_stdout = stream == OutputStream::Stdout;
                    on_output(is_stdout, &data);
                    if is_stdout { &mut out.stdout } else { &mut out.stderr }
                        .extend_from_slice(&data);
                }
                Reply::SessionDone { exit_code, cwd } => {
                    out.exit_code = Some(exit_code);
                    out.cwd = cwd;
                    return Ok(out);
                }
                Reply::SessionPending => return Ok(out),
                Reply::Error(e) => return Err(e.into()),
                other => return Err(unexpected("session_run", &other)),
            }
        }
    }

    /// Sends input to the running command (an interactive program).
    pub async fn input(&self, bytes: &[u8]) -> Result<(), Error> {
        let request = Request::Session(SessionOp::Input {
            sandbox: self.sandbox.id().to_string(),
            session: self.id.clone(),
            data: bytes.to_vec(),
        });
        expect_done("session_input", self.sandbox.client().request(&request).await?)
    }

    /// Interrupts the running command (like Ctrl-C); the shell survives.
    pub async fn interrupt(&self) -> Result<(), Error> {
        let request = Request::Session(SessionOp::Interrupt {
            sandbox: self.sandbox.id().to_string(),
            session: self.id.clone(),
        });
        expect_done("session_interrupt", self.sandbox.client().request(&request).await?)
    }

    /// Ends the session and everything it started.
    pub async fn close(&self) -> Result<(), Error> {
        let request = Request::Session(SessionOp::Close {
            sandbox: self.sandbox.id().to_string(),
            session: self.id.clone(),
        });
        expect_done("session_close", self.sandbox.client().request(&request).await?)
    }
}
