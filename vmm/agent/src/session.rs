//! Sessions: a shell running the host's session driver, with its descriptors 0-4 carried
//! over one connection, in the protocol of `brig_vmm_api::agent`: the host's IN_STDIN and
//! IN_COMMAND frames become the script's fd 0 and fd 3, its stdout, stderr and fd 4 come back
//! as STDOUT, STDERR and SESSION_DONE frames, IN_INTERRUPT sends SIGINT to its process group,
//! and EXIT ends the connection when the script ends. A host hang-up kills the script and
//! everything it started.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use brig_vmm_api::agent::{self, ProcessRun};

/// Makes `fd` the child's descriptor `target` (in the forked child, before exec). Copies it
/// above the low numbers first, so wiring one descriptor never clobbers the other.
fn wire(fd: i32, target: i32) -> std::io::Result<()> {
    // SAFETY: fcntl(F_DUPFD) and dup2 are async-signal-safe and only create descriptors in
    // this (forked, single-threaded) child; `fd` is open, the parent keeps it until spawn
    // returns.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
    if high < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; dup2 onto `target` clears close-on-exec for the copy the script keeps
    // (the high copy closes at exec).
    if unsafe { libc::dup2(high, target) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A session shell just started: the child, its process group, and the agent's ends of its
/// descriptors.
pub struct Shell {
    pub child: std::process::Child,
    pub group: nix::unistd::Pid,
    pub relay: Relay,
    /// How `/proc/<pid>/fd/N` names its command pipe (to tell when it waits for a command).
    pub commands_pipe: String,
}

/// Starts `process` (a shell and the host's driver script) with fds 0-4 on pipes.
pub fn spawn(process: &ProcessRun) -> std::io::Result<Shell> {
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from);
    let (cmd_r, cmd_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    let (cmd_fd, done_fd) = (cmd_r.as_raw_fd(), done_w.as_raw_fd());
    let commands_pipe = brig_container::session_journal::pipe_name(&cmd_w)
        .ok_or_else(|| std::io::Error::other("cannot name the command pipe"))?;
    let mut command = crate::command(process)?;
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only `wire`
    // (async-signal-safe fcntl and dup2) on descriptors that stay open until spawn returns.
    unsafe {
        command.pre_exec(move || {
            wire(cmd_fd, 3)?;
            wire(done_fd, 4)
        })
    };
    let mut child = command.spawn()?;
    drop((cmd_r, done_w));
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let relay = Relay {
        stdin: File::from(OwnedFd::from(child.stdin.take().ok_or(std::io::ErrorKind::BrokenPipe)?)),
        commands: File::from(cmd_w),
        stdout: File::from(OwnedFd::from(
            child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?,
        )),
        stderr: File::from(OwnedFd::from(
            child.stderr.take().ok_or(std::io::ErrorKind::BrokenPipe)?,
        )),
        done: File::from(done_r),
    };
    Ok(Shell { child, group, relay, commands_pipe })
}

/// Runs `process` (a shell and the host's driver script) as a session: its fds 0-4 carried
/// over this connection; a hang-up ends it.
pub fn serve(
    reader: BufReader<File>,
    out: Arc<Mutex<File>>,
    process: &ProcessRun,
) -> std::io::Result<()> {
    let Shell { mut child, group, relay, .. } = spawn(process)?;
    relay.run(reader, &out, group, move || {
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    });
    let status = child.wait()?;
    crate::frame(&out, agent::EXIT, &crate::exit_code(status).to_le_bytes())
}

/// A session shell's descriptors on the agent's side.
pub struct Relay {
    /// Its fd 0, fd 3 (commands); its fd 1, fd 2 and fd 4 (completion reports).
    pub stdin: File,
    pub commands: File,
    pub stdout: File,
    pub stderr: File,
    pub done: File,
}

impl Relay {
    /// Carries the shell's descriptors over the connection until the shell closes them: host
    /// frames become its input, commands and interrupts (SIGINT to `group`); its output comes
    /// back as frames. A host hang-up calls `kill`, which ends the shell and all it started.
    pub fn run(
        self,
        mut reader: BufReader<File>,
        out: &Arc<Mutex<File>>,
        group: nix::unistd::Pid,
        kill: impl FnOnce() + Send + 'static,
    ) {
        let Relay { mut stdin, mut commands, stdout, stderr, done } = self;
        std::thread::spawn(move || {
            while let Ok((kind, data)) = agent::read_frame(&mut reader) {
                let written = match kind {
                    agent::IN_STDIN => stdin.write_all(&data),
                    agent::IN_COMMAND => commands.write_all(&data),
                    agent::IN_INTERRUPT => {
                        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGINT);
                        Ok(())
                    }
                    _ => Ok(()),
                };
                if written.is_err() {
                    break;
                }
            }
            kill();
        });
        let pipes: Vec<(u8, Box<dyn Read + Send>)> = vec![
            (agent::STDOUT, Box::new(stdout)),
            (agent::STDERR, Box::new(stderr)),
            (agent::SESSION_DONE, Box::new(done)),
        ];
        crate::pump(pipes, out, None);
    }
}
