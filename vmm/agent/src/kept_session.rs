//! Sessions kept for the host: started with `keep` (the host's session id), a session outlives
//! the connection that started it, so a host that restarts takes it back with its shell's
//! state (directory, environment, background jobs) intact.
//!
//! The shell's output is read by three pumps that live as long as the session. Each hands
//! what it read to the connection attached now; while none is, it holds the bytes and waits,
//! and the shell blocks on its full pipe (nothing is dropped, nothing piles up in the guest).
//! A write that fails detaches that connection and the bytes go to the next one. Commands,
//! input and interrupts come from the attached connection; IN_CLOSE (or `session_close`)
//! ends the shell and everything in its process group. When the shell ends, its EXIT goes to
//! the attached connection and the session is forgotten.
//!
//! Sessions are kept by scope and id, as commands are (`kept`): a container's name, or empty
//! for the VM's own.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use brig_vmm_api::agent::{self, ProcessRun, SessionProbe, MAX_KEPT_SESSIONS, MAX_SESSION_ID};
use nix::sys::signal::{kill, Signal};

type Out = Arc<Mutex<File>>;

/// One kept session.
pub struct KeptSession {
    /// Its key in the table (scope and id, see [`key`]).
    key: String,
    /// Tells this entry from a later one under the same id.
    serial: u64,
    /// Its process group, negated (for `kill`).
    group: nix::unistd::Pid,
    shell_pid: i32,
    commands_pipe: String,
    stdin: Mutex<File>,
    commands: Mutex<File>,
    link: Mutex<Link>,
    changed: Condvar,
}

#[derive(Default)]
struct Link {
    /// The attached connection, by the number its attach got.
    out: Option<(u64, Out)>,
    attaches: u64,
    /// Ended by the host: output is dropped from now on.
    closed: bool,
}

fn table() -> &'static Mutex<HashMap<String, Arc<KeptSession>>> {
    static TABLE: OnceLock<Mutex<HashMap<String, Arc<KeptSession>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

/// A session's key in the table: `id` alone in the empty scope, else `scope/id` (an id has no
/// `/`, so keys of different scopes never meet).
fn key(scope: &str, id: &str) -> String {
    if scope.is_empty() {
        id.to_string()
    } else {
        format!("{scope}/{id}")
    }
}

/// A session shell just started, as a kept session holds it: how to wait for its end (its
/// exit status), its process group, its pid and command pipe (for the probe) and the agent's
/// ends of its descriptors.
pub struct KeptShell {
    pub wait: Box<dyn FnOnce() -> i32 + Send>,
    pub group: nix::unistd::Pid,
    pub shell_pid: i32,
    pub commands_pipe: String,
    pub relay: crate::session::Relay,
}

impl From<crate::session::Shell> for KeptShell {
    fn from(shell: crate::session::Shell) -> KeptShell {
        let crate::session::Shell { mut child, group, relay, commands_pipe } = shell;
        KeptShell {
            shell_pid: i32::try_from(child.id()).unwrap_or(-1),
            wait: Box::new(move || child.wait().map_or(-1, crate::exit_code)),
            group,
            commands_pipe,
            relay,
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SESSION_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Starts a kept session `id` of the VM (a shell running `process`) and serves it on this
/// connection.
pub fn start(
    id: String,
    process: &ProcessRun,
    reader: BufReader<File>,
    out: Out,
) -> std::io::Result<()> {
    start_with("", &id, || crate::session::spawn(process).map(KeptShell::from), reader, out)
}

/// Starts a kept session `id` in `scope` with the shell `spawn` starts, and serves it on this
/// connection.
pub fn start_with(
    scope: &str,
    id: &str,
    spawn: impl FnOnce() -> std::io::Result<KeptShell>,
    reader: BufReader<File>,
    out: Out,
) -> std::io::Result<()> {
    if !valid_id(id) {
        return Err(invalid(format!("session id {id:?} (1-{MAX_SESSION_ID} of [A-Za-z0-9_-])")));
    }
    let key = key(scope, id);
    // The table stays locked while the shell starts, so two starts cannot both take the id.
    let mut table = lock(table());
    if table.contains_key(&key) {
        return Err(invalid(format!("a session {id:?} is kept already")));
    }
    // Per scope: one container's sessions do not refuse another's.
    if table.keys().filter(|k| id_in(scope, k).is_some()).count() >= MAX_KEPT_SESSIONS {
        return Err(invalid(format!("{MAX_KEPT_SESSIONS} sessions are kept already")));
    }
    let KeptShell { wait, group, shell_pid, commands_pipe, relay } = spawn()?;
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let session = Arc::new(KeptSession {
        key: key.clone(),
        serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        group,
        shell_pid,
        commands_pipe,
        stdin: Mutex::new(relay.stdin),
        commands: Mutex::new(relay.commands),
        link: Mutex::default(),
        changed: Condvar::new(),
    });
    table.insert(key, session.clone());
    drop(table);
    let pipes: Vec<(u8, File)> = vec![
        (agent::STDOUT, relay.stdout),
        (agent::STDERR, relay.stderr),
        (agent::SESSION_DONE, relay.done),
    ];
    {
        let session = session.clone();
        std::thread::spawn(move || session.run(wait, pipes));
    }
    session.serve(reader, out);
    Ok(())
}

/// Serves kept session `id` of `scope` on this connection (the one it had is detached).
pub fn attach(scope: &str, id: &str, reader: BufReader<File>, out: Out) -> std::io::Result<()> {
    let Some(session) = lock(table()).get(&key(scope, id)).cloned() else {
        crate::frame(
            &out,
            agent::STDERR,
            format!("brig-agent: no kept session {id:?}\n").as_bytes(),
        )?;
        return crate::frame(&out, agent::EXIT, &1i32.to_le_bytes());
    };
    session.serve(reader, out);
    Ok(())
}

/// Whether kept session `id`'s shell waits for its next command; `None`: no such session.
pub fn probe(scope: &str, id: &str) -> Option<SessionProbe> {
    let session = lock(table()).get(&key(scope, id)).cloned()?;
    let idle = brig_container::session_journal::shell_waits_for_command(
        session.shell_pid,
        &session.commands_pipe,
        2,
    );
    Some(SessionProbe { idle })
}

/// The ids of the sessions kept in `scope`, sorted.
pub fn list(scope: &str) -> Vec<String> {
    let mut ids: Vec<String> = lock(table()).keys().filter_map(|k| id_in(scope, k)).collect();
    ids.sort();
    ids
}

/// The id a key has in `scope`, if it is of that scope.
fn id_in(scope: &str, key: &str) -> Option<String> {
    if scope.is_empty() {
        return (!key.contains('/')).then(|| key.to_string());
    }
    key.strip_prefix(scope)?.strip_prefix('/').map(str::to_string)
}

/// Ends kept session `id` of `scope`; whether the agent kept it.
pub fn close(scope: &str, id: &str) -> bool {
    let Some(session) = lock(table()).get(&key(scope, id)).cloned() else { return false };
    session.close();
    true
}

/// Ends every session kept in `scope` (its container is destroyed).
pub fn close_scope(scope: &str) {
    let sessions: Vec<Arc<KeptSession>> = lock(table())
        .iter()
        .filter(|(k, _)| id_in(scope, k).is_some())
        .map(|(_, s)| s.clone())
        .collect();
    for session in sessions {
        session.close();
    }
}

impl KeptSession {
    /// Pumps the shell's output to whoever is attached until its pipes close, then reports
    /// its end and forgets it.
    fn run(self: Arc<Self>, wait: Box<dyn FnOnce() -> i32 + Send>, pipes: Vec<(u8, File)>) {
        let pumps: Vec<_> = pipes
            .into_iter()
            .map(|(kind, mut pipe)| {
                let session = self.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 << 10];
                    while let Ok(n @ 1..) = pipe.read(&mut buf) {
                        session.deliver(kind, &buf[..n]);
                    }
                })
            })
            .collect();
        for pump in pumps {
            let _ = pump.join();
        }
        let status = wait();
        {
            let mut table = lock(table());
            if table.get(&self.key).is_some_and(|s| s.serial == self.serial) {
                table.remove(&self.key);
            }
        }
        let attached = lock(&self.link).out.clone();
        if let Some((_, out)) = attached {
            let _ = crate::frame(&out, agent::EXIT, &status.to_le_bytes());
        }
    }

    /// Sends one frame to the attached connection, waiting for one while none is; dropped once
    /// the session is closed.
    fn deliver(&self, kind: u8, data: &[u8]) {
        loop {
            let target = {
                let mut link = lock(&self.link);
                loop {
                    if link.closed {
                        return;
                    }
                    if let Some(out) = link.out.clone() {
                        break out;
                    }
                    link = self
                        .changed
                        .wait_timeout(link, Duration::from_secs(5))
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            };
            let (attach, out) = target;
            if crate::frame(&out, kind, data).is_ok() {
                return;
            }
            self.detach(attach);
        }
    }

    /// Attaches this connection, feeds the shell what the host sends on it, and detaches it
    /// when the host hangs up.
    fn serve(&self, mut reader: BufReader<File>, out: Out) {
        let attach = {
            let mut link = lock(&self.link);
            link.attaches += 1;
            link.out = Some((link.attaches, out));
            link.attaches
        };
        self.changed.notify_all();
        while let Ok((kind, data)) = agent::read_frame(&mut reader) {
            // A failed write means the shell is gone; its EXIT follows.
            match kind {
                agent::IN_STDIN => {
                    let _ = lock(&self.stdin).write_all(&data);
                }
                agent::IN_COMMAND => {
                    let _ = lock(&self.commands).write_all(&data);
                }
                agent::IN_INTERRUPT => {
                    let _ = kill(self.group, Signal::SIGINT);
                }
                agent::IN_CLOSE => {
                    self.close();
                    break;
                }
                _ => {}
            }
        }
        self.detach(attach);
    }

    /// Detaches the connection of attach number `attach`, unless a later one replaced it.
    fn detach(&self, attach: u64) {
        let mut link = lock(&self.link);
        if link.out.as_ref().is_some_and(|(n, _)| *n == attach) {
            link.out = None;
        }
    }

    /// Ends the shell and everything in its process group; its output is dropped from now on.
    fn close(&self) {
        lock(&self.link).closed = true;
        self.changed.notify_all();
        let _ = kill(self.group, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::path::Path;
    use std::time::Instant;

    /// A connection as the agent sees one: the host's end, and the agent's reader and writer.
    fn connection() -> (UnixStream, BufReader<File>, Out) {
        let (host, agent_end) = UnixStream::pair().expect("socketpair");
        host.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let reader = BufReader::new(File::from(std::os::fd::OwnedFd::from(
            agent_end.try_clone().expect("clone"),
        )));
        let out = Arc::new(Mutex::new(File::from(std::os::fd::OwnedFd::from(agent_end))));
        (host, reader, out)
    }

    /// Sends command `nonce` and reads its result.
    fn run(host: &mut UnixStream, nonce: &str, command: &str) -> (String, String) {
        let message = format!("{nonce}\0{command}\0");
        agent::write_frame(host, agent::IN_COMMAND, message.as_bytes()).expect("command");
        result(host, nonce)
    }

    /// Reads frames until command `nonce`'s report and its stdout marker (the two come in
    /// either order); returns its stdout (without the marker) and the report line.
    fn result(host: &mut UnixStream, nonce: &str) -> (String, String) {
        let marker = format!("\x1e{nonce}\x1e");
        let (mut stdout, mut report) = (String::new(), Vec::new());
        while !report.ends_with(b"\n") || !stdout.contains(&marker) {
            let (kind, data) = agent::read_frame(host).expect("a frame");
            match kind {
                agent::STDOUT => stdout.push_str(&String::from_utf8_lossy(&data)),
                agent::SESSION_DONE => report.extend_from_slice(&data),
                _ => {}
            }
        }
        (stdout.replace(&marker, ""), String::from_utf8_lossy(&report).trim().to_string())
    }

    fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A kept session's shell outlives the connection that started it (its output meanwhile
    /// waits in its pipe), a new connection takes it over with its state, the probe tells
    /// when it waits for a command, and IN_CLOSE ends it for good.
    #[test]
    fn a_kept_session_outlives_its_connection_and_is_attached_again() {
        let Some(shell) =
            ["/bin/bash", "/usr/bin/bash"].into_iter().find(|p| Path::new(p).exists())
        else {
            panic!("bash is needed for the session driver");
        };
        let process = ProcessRun {
            argv: vec![shell.into(), "-c".into(), brig_container::session::DRIVER.into()],
            env: Vec::new(),
            cwd: Some("/".into()),
        };
        let (mut host, reader, out) = connection();
        std::thread::spawn(move || start("t-kept".into(), &process, reader, out));
        let (_, report) = run(&mut host, "n1", "export ROLLOUT=r7; cd /tmp");
        assert_eq!(report, "n1 0 /tmp");
        // A command that prints after the connection is gone.
        let late = "n2\0sleep 0.3; echo late-$ROLLOUT\0";
        agent::write_frame(&mut host, agent::IN_COMMAND, late.as_bytes()).expect("command");
        drop(host);
        assert!(list("").contains(&"t-kept".to_string()), "{:?}", list(""));
        std::thread::sleep(Duration::from_millis(600));

        let (mut host, reader, out) = connection();
        std::thread::spawn(move || attach("", "t-kept", reader, out));
        let (stdout, report) = result(&mut host, "n2");
        assert_eq!((stdout.as_str(), report.as_str()), ("late-r7\n", "n2 0 /tmp"));
        eventually("the shell waits for a command", || probe("", "t-kept").is_some_and(|p| p.idle));
        let (stdout, report) = run(&mut host, "n3", "echo $ROLLOUT $PWD");
        assert_eq!((stdout.as_str(), report.as_str()), ("r7 /tmp\n", "n3 0 /tmp"));

        agent::write_frame(&mut host, agent::IN_CLOSE, &[]).expect("close");
        eventually("the closed session is forgotten", || !list("").contains(&"t-kept".to_string()));
        assert!(probe("", "t-kept").is_none());
        let (mut host, reader, out) = connection();
        attach("", "t-kept", reader, out).expect("attach");
        let (kind, data) = agent::read_frame(&mut host).expect("refusal");
        assert_eq!(kind, agent::STDERR, "{}", String::from_utf8_lossy(&data));
    }

    #[test]
    fn session_ids_are_short_plain_names() {
        assert!(valid_id("s-1_a"));
        assert!(valid_id(&"a".repeat(MAX_SESSION_ID)));
        for bad in ["", "a/b", "../x", "a b", "é"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
        assert!(!valid_id(&"a".repeat(MAX_SESSION_ID + 1)));
    }

    #[test]
    fn each_container_has_its_own_session_ids() {
        assert_eq!(key("", "s-1"), "s-1");
        assert_eq!(key("sb-a", "s-1"), "sb-a/s-1");
        assert_eq!(id_in("sb-a", "sb-a/s-1").as_deref(), Some("s-1"));
        assert_eq!(id_in("sb-a", "sb-ab/s-1"), None);
        assert_eq!(id_in("", "sb-a/s-1"), None);
        assert_eq!(id_in("", "s-1").as_deref(), Some("s-1"));
    }
}
