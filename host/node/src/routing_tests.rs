//! The node's routing through the sandbox interface, with a fake tier: refusals come from
//! capabilities as typed errors, what a tier answers reaches the client, and the node's own
//! state (sessions, usage, placement) is kept the same way for every tier.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use brig_core::files::{Entry, EntryKind};
use brig_core::sandbox::{
    ready, BoxFuture, Capabilities, ExecControl, ExecEvent, ExecExit, FileAccess, ForkKind,
    KeptWork, Op, PauseKind, Persistence, RecoveredExec, RunningExec, Sandbox, SandboxError,
    Session, SessionEvent, SessionSpec, Usage,
};
use brig_core::{IdleAction, QosClass, SandboxId, SandboxSpec, Tier};
use brig_proto::{
    ErrorCode, ExecOp, FileOp, Reply, Request, SandboxOp, SandboxState, SessionOp, ToolOp,
};
use tokio::sync::mpsc;

use crate::host::clock::now_unix_ms;
use crate::table::sandboxes::{Gone, SandboxEntry};
use crate::{Node, NodeConfig, NodeError};

/// What the fake tier saw, and what it gives back after a resume.
#[derive(Default)]
struct Seen {
    paused: AtomicUsize,
    sessions_closed: AtomicUsize,
    destroyed: AtomicBool,
    /// Handed to the node by `recover_kept` (once).
    kept: std::sync::Mutex<Option<KeptWork>>,
}

struct FakeSandbox {
    caps: Capabilities,
    seen: Arc<Seen>,
    lost: Option<String>,
}

struct FakeSession(Arc<Seen>);

impl Session for FakeSession {
    fn run<'a>(
        &'a self,
        command: &'a str,
        _timeout: Duration,
        sink: mpsc::Sender<SessionEvent>,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            let _ = sink.send(SessionEvent::Stdout(command.to_string().into())).await;
            let _ = sink.send(SessionEvent::Done { exit_code: 0, cwd: "/".into() }).await;
            Ok(())
        })
    }
    fn wait(
        &self,
        _timeout: Duration,
        _sink: mpsc::Sender<SessionEvent>,
    ) -> BoxFuture<'_, Result<(), SandboxError>> {
        ready(Err(SandboxError::BadRequest("no command is running".into())))
    }
    fn input<'a>(&'a self, _data: &'a [u8]) -> BoxFuture<'a, Result<(), SandboxError>> {
        ready(Err(SandboxError::Conflict("busy".into())))
    }
    fn interrupt(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        ready(Ok(()))
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.0.sessions_closed.fetch_add(1, Ordering::SeqCst);
        ready(())
    }
}

impl Sandbox for FakeSandbox {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    fn lost(&self) -> Option<String> {
        self.lost.clone()
    }
    fn placement(&self) -> Option<String> {
        Some("vm:fake".into())
    }
    fn open_session(
        &self,
        _: SessionSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Session>, SandboxError>> {
        ready(Ok(Box::new(FakeSession(self.seen.clone())) as Box<dyn Session>))
    }
    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        if path == "/missing" {
            return ready(Err(SandboxError::Io {
                kind: std::io::ErrorKind::NotFound,
                message: "/missing: not found".into(),
            }));
        }
        ready(Ok(Entry {
            path: path.to_string(),
            kind: EntryKind::File,
            size: 3,
            mode: 0o644,
            modified_unix_ms: 0,
            uid: 0,
            gid: 0,
            metadata: Default::default(),
        }))
    }
    fn pause(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        self.seen.paused.fetch_add(1, Ordering::SeqCst);
        ready(Ok(4096))
    }
    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        self.seen.destroyed.store(true, Ordering::SeqCst);
        ready(Ok(()))
    }
    fn usage(&self) -> BoxFuture<'_, Option<Usage>> {
        ready(Some(Usage { cpu_ns: 7, memory_bytes: 11 }))
    }
    fn recover_kept(&self) -> BoxFuture<'_, KeptWork> {
        let kept = self.seen.kept.lock().expect("kept").take();
        ready(kept.unwrap_or_default())
    }
}

/// A VM-like tier: sessions, files through a guest, pause as a snapshot; no exec.
const FAKE_CAPS: Capabilities = Capabilities::new(
    &[Op::Sessions, Op::Files, Op::Pause],
    FileAccess::Guest,
    PauseKind::Snapshot,
    ForkKind::No,
    Persistence::Ephemeral,
);

async fn node() -> (Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = NodeConfig::default();
    config.container.enabled = false;
    config.images.enabled = false;
    let node = Node::open(config, dir.path()).await.expect("node");
    (node, dir)
}

fn add(node: &Node, caps: Capabilities, lost: Option<String>) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let sandbox = Arc::new(FakeSandbox { caps, seen: seen.clone(), lost });
    let id = SandboxId::generate(node.inner.config.node_id());
    let spec = SandboxSpec {
        tier: Tier::Microvm,
        image: None,
        labels: Vec::new(),
        idle_ttl: Duration::from_secs(600),
        idle_action: IdleAction::Destroy,
        paused_ttl: None,
        max_lifetime: None,
        egress: None,
        net_slot: None,
        qos: QosClass::default(),
        volumes: Vec::new(),
    };
    node.inner.sandboxes.insert(SandboxEntry::new(id, spec, now_unix_ms(), sandbox));
    (id.to_string(), seen)
}

fn code(e: &NodeError) -> ErrorCode {
    e.to_wire().code
}

#[tokio::test]
async fn what_a_tier_cannot_do_is_a_typed_refusal_naming_the_operation() {
    let (node, _dir) = node().await;
    let (id, _) = add(&node, FAKE_CAPS, None);
    let kill = node.handle(Request::Exec(ExecOp::Kill { sandbox: id.clone(), exec_id: 1 })).await;
    let e = kill.expect_err("no exec in this tier");
    assert_eq!(code(&e), ErrorCode::BadRequest);
    assert_eq!(
        e.to_string(),
        format!("sandbox {id} is a microvm sandbox; exec needs another tier")
    );
    let fork = Request::Sandbox(SandboxOp::Fork {
        sandbox: id.clone(),
        count: 2,
        labels: vec![],
        evaluation: false,
    });
    let e = node.handle(fork).await.expect_err("no fork in this tier");
    assert!(e.to_string().contains("fork needs another tier"), "{e}");
    let call = brig_proto::CallRequest { tool: "jq".into(), ..Default::default() };
    let e = node
        .handle(Request::Tool(ToolOp::CallIn { sandbox: id, call }))
        .await
        .expect_err("no tools");
    assert!(e.to_string().contains("tool calls needs another tier"), "{e}");
}

#[tokio::test]
async fn file_answers_keep_their_kind() {
    let (node, _dir) = node().await;
    let (id, _) = add(&node, FAKE_CAPS, None);
    let stat = Request::File(FileOp::Stat { sandbox: id.clone(), path: "/etc/x".into() });
    match node.handle(stat).await.expect("stat") {
        Some(Reply::Stat(e)) => assert_eq!(e.size, 3),
        other => panic!("{other:?}"),
    }
    let missing = Request::File(FileOp::Stat { sandbox: id, path: "/missing".into() });
    let e = node.handle(missing).await.expect_err("missing");
    assert_eq!(code(&e), ErrorCode::NotFound);
}

#[tokio::test]
async fn a_snapshot_pause_leaves_sessions_to_the_tier_and_destroy_ends_them() {
    let (node, _dir) = node().await;
    let (id, seen) = add(&node, FAKE_CAPS, None);
    let open = brig_proto::SessionOpenRequest { sandbox: id.clone(), ..Default::default() };
    let Some(Reply::Session { session }) =
        node.handle(Request::Session(SessionOp::Open(open))).await.expect("open")
    else {
        panic!("no session id")
    };
    let listed =
        node.handle(Request::Session(SessionOp::List { sandbox: id.clone() })).await.expect("list");
    assert!(matches!(listed, Some(Reply::Sessions(ids)) if ids == vec![session.clone()]));
    let input =
        Request::Session(SessionOp::Input { sandbox: id.clone(), session, data: b"x".to_vec() });
    let e = node.handle(input).await.expect_err("busy");
    assert_eq!(code(&e), ErrorCode::Conflict);
    let paused = node
        .handle(Request::Sandbox(SandboxOp::Pause(brig_proto::Target::Sandbox(id.clone()))))
        .await;
    assert!(paused.is_ok(), "{paused:?}");
    assert_eq!(seen.paused.load(Ordering::SeqCst), 1);
    // The saved guest keeps its shells; the node lists what the tier gives back at the resume
    // (this one, none).
    assert_eq!(seen.sessions_closed.load(Ordering::SeqCst), 0);
    let listed =
        node.handle(Request::Session(SessionOp::List { sandbox: id.clone() })).await.expect("list");
    assert!(matches!(listed, Some(Reply::Sessions(ids)) if ids.is_empty()));
    let status = node
        .handle(Request::Sandbox(SandboxOp::Status { sandbox: id.clone() }))
        .await
        .expect("status");
    let Some(Reply::Sandbox(info)) = status else { panic!("no status") };
    assert_eq!(info.state, SandboxState::Paused);
    assert_eq!(info.placement.as_deref(), Some("vm:fake"));
    assert_eq!(info.usage.map(|u| (u.cpu_ns, u.memory_bytes)), Some((7, 11)));
    node.handle(Request::Sandbox(SandboxOp::Destroy { sandbox: id })).await.expect("destroy");
    assert!(seen.destroyed.load(Ordering::SeqCst));
}

#[tokio::test]
async fn requests_to_a_sandbox_whose_vm_is_gone_say_why() {
    let (node, _dir) = node().await;
    let (id, _) = add(&node, FAKE_CAPS, Some("container-host VM chost-0 stopped".into()));
    let stat = Request::File(FileOp::Stat { sandbox: id.clone(), path: "/".into() });
    let e = node.handle(stat).await.expect_err("lost");
    assert_eq!(code(&e), ErrorCode::SandboxLost);
    assert_eq!(e.to_string(), format!("sandbox {id} is gone: container-host VM chost-0 stopped"));
}

#[tokio::test]
async fn a_record_saved_as_its_sandbox_is_destroyed_does_not_outlive_it() {
    let (node, dir) = node().await;
    let caps = Capabilities::new(
        &[Op::Sessions, Op::Files, Op::Pause],
        FileAccess::Guest,
        PauseKind::Snapshot,
        ForkKind::No,
        Persistence::Spec,
    );
    let (id, _) = add(&node, caps, None);
    let parsed: SandboxId = id.parse().expect("id");
    let entry = node.inner.sandboxes.get(&id).expect("live");
    node.inner.sandboxes.save(&entry).expect("save");
    let records = || {
        let entries = std::fs::read_dir(dir.path().join("sandboxes")).expect("records");
        entries.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json")).count()
    };
    assert_eq!(records(), 1);
    // The reaper's clock save holds the entry it collected while destroy removes it: its
    // late write must not bring the record back.
    node.inner.sandboxes.remove(&parsed, Gone::Destroyed).expect("removed");
    node.inner.sandboxes.save(&entry).expect("late save");
    assert_eq!(records(), 0, "a record outlived its sandbox");
}

#[tokio::test]
async fn a_destroyed_sandboxs_record_file_is_taken_by_the_next_sandbox() {
    use std::os::unix::fs::MetadataExt;
    let (node, dir) = node().await;
    let caps = Capabilities::new(
        &[Op::Sessions],
        FileAccess::Guest,
        PauseKind::Snapshot,
        ForkKind::No,
        Persistence::Spec,
    );
    let records = dir.path().join("sandboxes");
    let save = |id: &str| {
        let entry = node.inner.sandboxes.get(id).expect("live");
        node.inner.sandboxes.save(&entry).expect("save");
        std::fs::metadata(records.join(format!("{id}.json"))).expect("record").ino()
    };
    let (first, _) = add(&node, caps, None);
    let inode = save(&first);
    node.inner.sandboxes.remove(&first.parse().expect("id"), Gone::Destroyed).expect("removed");
    assert!(!records.join(format!("{first}.json")).exists());
    let (second, _) = add(&node, caps, None);
    // No inode made or freed: on ext4 without a journal that churn is what costs.
    assert_eq!(save(&second), inode, "the record file was not reused");
    let saved = node.inner.sandboxes.saved_records();
    let ids: Vec<String> = saved.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(ids, [second], "a restart reads the live record only, not what was spare");
}

/// A kept command's control, for the fake tier.
struct NoControl;

impl ExecControl for NoControl {
    fn kill(&self) {}
}

fn output(text: &str) -> ExecEvent {
    ExecEvent::Stdout(bytes::Bytes::copy_from_slice(text.as_bytes()))
}

#[tokio::test]
async fn commands_and_sessions_a_pause_detached_go_on_after_the_resume() {
    let (node, _dir) = node().await;
    let caps = Capabilities::new(
        &[Op::Exec, Op::Sessions, Op::Files, Op::Pause],
        FileAccess::Guest,
        PauseKind::Snapshot,
        ForkKind::No,
        Persistence::Ephemeral,
    );
    let (id, seen) = add(&node, caps, None);
    let entry = node.inner.sandboxes.get(&id).expect("live");
    // Two running commands, as the tier serves them; the pause detaches both.
    let mut senders = Vec::new();
    let mut hubs = Vec::new();
    for exec_id in [1, 2] {
        let (tx, rx) = mpsc::channel(8);
        let hub =
            entry.execs.insert_with(exec_id, vec!["cmd".into()], None, Box::new(|| {}), None, None);
        let recorder = node.recorder(&entry);
        tokio::spawn(crate::serve::exec::pump(
            rx,
            hub.clone(),
            exec_id,
            recorder,
            Default::default(),
        ));
        senders.push(tx);
        hubs.push(hub);
    }
    senders[0].send(output("one\n")).await.expect("send");
    senders[0].send(ExecEvent::Stderr("warn\n".into())).await.expect("send");
    senders[0].send(output("tw")).await.expect("send");
    let open = brig_proto::SessionOpenRequest { sandbox: id.clone(), ..Default::default() };
    node.handle(Request::Session(SessionOp::Open(open))).await.expect("open");
    let pause = Request::Sandbox(SandboxOp::Pause(brig_proto::Target::Sandbox(id.clone())));
    node.handle(pause).await.expect("pause");
    for tx in &senders {
        tx.send(ExecEvent::Detached("the VMM stopped".into())).await.expect("send");
    }
    drop(senders);

    // After the resume the tier reads command 1 again from its first byte, and has a session
    // and no command 2 (a guest that lost it).
    let (tx, rx) = mpsc::channel(8);
    for event in [output("one\n"), ExecEvent::Stderr("warn\n".into()), output("two\n")] {
        tx.send(event).await.expect("send");
    }
    tx.send(ExecEvent::Exited(ExecExit { exit_code: Some(3), ..Default::default() }))
        .await
        .expect("send");
    let running =
        RunningExec { events: rx, control: Arc::new(NoControl), pid: None, archive: None };
    let kept = KeptWork {
        execs: vec![RecoveredExec {
            exec_id: 1,
            argv: vec!["cmd".into()],
            output: Vec::new(),
            gap: false,
            running: Some(running),
            exit: None,
            stdin: None,
            archive: None,
        }],
        sessions: vec![("s1".into(), Box::new(FakeSession(seen.clone())) as Box<dyn Session>)],
    };
    *seen.kept.lock().expect("kept") = Some(kept);
    let resume = Request::Sandbox(SandboxOp::Resume(brig_proto::Target::Sandbox(id.clone())));
    node.handle(resume).await.expect("resume");
    assert_eq!(seen.sessions_closed.load(Ordering::SeqCst), 0, "the pause closed a session");

    // Command 1 goes on where its clients were: nothing twice, nothing missing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while hubs[0].kept_output().2.is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (stdout, stderr, result) = hubs[0].kept_output();
    assert_eq!(stdout, "one\ntwo\n");
    assert_eq!(stderr, "warn\n");
    assert_eq!(result.expect("ended").exit_code, Some(3));
    // Command 2 did not come back: it ends, saying so.
    let (_, stderr, result) = hubs[1].kept_output();
    assert!(stderr.contains("was not in the VM when it resumed"), "{stderr}");
    assert_eq!(result.expect("ended").exit_code, None);
    let listed =
        node.handle(Request::Session(SessionOp::List { sandbox: id.clone() })).await.expect("list");
    assert!(matches!(listed, Some(Reply::Sessions(ids)) if ids == vec!["s1".to_string()]));
    // A kill reaches command 1's new control (it ended: nothing to do, but no error).
    node.handle(Request::Exec(ExecOp::Kill { sandbox: id, exec_id: 1 })).await.expect("kill");
}

#[test]
fn output_seen_already_is_skipped_across_chunk_boundaries() {
    use crate::execs::hub::Seen as Had;
    let out = |s: &str| Reply::Output { stream: brig_proto::OutputStream::Stdout, data: s.into() };
    let mut had = Had { stdout: 5, stderr: 0 };
    assert!(had.skip(out("abc")).is_none());
    assert!(matches!(had.skip(out("defg")), Some(Reply::Output { data, .. }) if data == b"fg"));
    assert!(matches!(had.skip(out("h")), Some(Reply::Output { data, .. }) if data == b"h"));
    let err = Reply::Output { stream: brig_proto::OutputStream::Stderr, data: b"e".to_vec() };
    assert!(had.skip(err).is_some());
}

#[tokio::test]
async fn a_streaming_request_without_an_exchange_is_refused_naming_its_kind() {
    let (node, _dir) = node().await;
    let (id, _) = add(&node, FAKE_CAPS, None);
    let read = brig_proto::FileReadRequest {
        sandbox: id.clone(),
        path: "/a".into(),
        offset: 0,
        len: None,
    };
    let e = node.handle(Request::File(FileOp::Read(read))).await.expect_err("needs a stream");
    assert!(matches!(e, NodeError::NeedsStream(_)), "{e}");
    assert_eq!(code(&e), ErrorCode::BadRequest);
    let attach = Request::Exec(ExecOp::Attach { sandbox: id, exec_id: 1 });
    let e = node.handle(attach).await.expect_err("needs a stream");
    assert!(e.to_string().contains("streams its reply"), "{e}");
}
