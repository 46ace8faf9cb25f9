//! The container tier end to end: a real brigd, real namespaces and cgroups, driven by brig-sdk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_sdk::{Client, Cmd, ErrorCode, ExecEvent, Sandbox, SandboxOptions};
use brig_tests::{image, Daemon};
use sha2::{Digest, Sha256};

/// A container that keeps answering `echo` while the test abuses its neighbours.
struct Bystander {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64, Duration)>,
}

impl Bystander {
    async fn start(client: &Client) -> Bystander {
        let sb = client
            .create(SandboxOptions::container(&image("busybox")).label("role", "bystander"))
            .await
            .expect("create");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
            let mut worst = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                let started = Instant::now();
                match sb.exec(["echo", "alive"]).await {
                    Ok(out) if out.stdout == b"alive\n" => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                worst = worst.max(started.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = sb.destroy().await;
            (ok.into_inner(), failed.into_inner(), worst)
        });
        Bystander { stop, task }
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let (ok, failed, worst) = self.task.await.expect("bystander");
        assert_eq!(failed, 0, "bystander failed {failed} times");
        assert!(ok >= 5, "bystander answered only {ok} times");
        assert!(worst < Duration::from_secs(5), "bystander stalled for {worst:?}");
    }
}

async fn shell(sb: &Sandbox, script: &str) -> brig_sdk::ExecOutput {
    sb.exec_with(Cmd::shell(script).timeout(Duration::from_secs(60))).await.expect("exec")
}

#[tokio::test]
async fn debian_base_runs_python_and_git() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("debian-12"))).await.expect("create");
    let out = sb
        .exec(["python3", "-c", "import sys, json; print(json.dumps({'v': sys.version_info[0]}))"])
        .await
        .expect("python");
    assert!(out.success(), "{}", out.stderr_text());
    assert_eq!(out.stdout_text().trim(), r#"{"v": 3}"#);
    let out = shell(&sb, "cd /workspace && git init -q repo && cd repo && git config user.email a@b && git config user.name a && echo x > f && git add f && git commit -qm init && git log --oneline | wc -l").await;
    assert!(out.success(), "{}", out.stderr_text());
    assert_eq!(out.stdout_text().trim(), "1");
    let out = sb
        .exec_with(
            Cmd::new(["sh", "-c", "id -un; pwd; echo $GREETING"])
                .user("nobody")
                .cwd("/tmp")
                .env("GREETING", "hi"),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout_text(), "nobody\n/tmp\nhi\n");
    sb.destroy().await.expect("destroy");
}

#[tokio::test]
async fn sessions_keep_state_and_survive_interactive_programs() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("debian-12"))).await.expect("create");
    let s = sb.open_session().await.expect("session");
    let t = Duration::from_secs(20);
    assert_eq!(s.run("cd /tmp && export GREETING=hello", t).await.expect("run").exit_code, Some(0));
    let out = s.run("echo $GREETING from $(pwd); f() { echo fn $1; }", t).await.expect("run");
    assert_eq!((out.stdout_text(), out.cwd.as_str()), ("hello from /tmp\n".to_string(), "/tmp"));
    assert_eq!(s.run("f works", t).await.expect("run").stdout_text(), "fn works\n");
    s.run("sleep 300 & echo $! > /tmp/bg.pid", t).await.expect("bg");
    let out =
        s.run("kill -0 $(cat /tmp/bg.pid) && echo background-alive; false", t).await.expect("run");
    assert_eq!((out.stdout_text(), out.exit_code), ("background-alive\n".to_string(), Some(1)));
    // An interactive program waits for input instead of eating the next command.
    let out = s.run("read line; echo got:$line", Duration::from_millis(500)).await.expect("read");
    assert!(out.is_running());
    assert!(s.run("echo no", t).await.is_err_and(|e| e.code() == Some(ErrorCode::Conflict)));
    s.input(b"typed\n").await.expect("input");
    let out = s.wait(t).await.expect("wait");
    assert_eq!((out.stdout_text(), out.exit_code), ("got:typed\n".to_string(), Some(0)));
    // A program that never returns is interrupted; the shell carries on.
    let out = s
        .run(
            "python3 -c 'import time; print(\"start\", flush=True); time.sleep(600)'",
            Duration::from_millis(1500),
        )
        .await
        .expect("run");
    assert!(out.is_running());
    assert_eq!(out.stdout_text(), "start\n");
    s.interrupt().await.expect("interrupt");
    let out = s.wait(t).await.expect("wait");
    assert_ne!(out.exit_code, Some(0));
    assert_eq!(s.run("echo $GREETING", t).await.expect("run").stdout_text(), "hello\n");
    // Several sessions per sandbox, each with its own state.
    let other = sb.open_session().await.expect("second session");
    assert_eq!(other.run("pwd", t).await.expect("run").stdout_text(), "/\n");
    other.close().await.expect("close");
    s.close().await.expect("close");
}

#[tokio::test]
async fn output_streams_and_limits_hold() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let bystander = Bystander::start(&client).await;
    let sb = client
        .create(SandboxOptions::container(&image("busybox")).memory_mib(128).pids(64).disk_mib(32))
        .await
        .expect("create");

    // stdout arrives while the command is still running.
    let started = Instant::now();
    let mut stream =
        sb.exec_stream(Cmd::shell("echo first; sleep 2; echo second")).await.expect("stream");
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(b))) => assert_eq!(&b[..], b"first\n"),
        other => panic!("expected first output, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "first line came after {:?}",
        started.elapsed()
    );
    let rest = stream.collect().await.expect("rest");
    assert!(rest.success());

    // A timeout kills the whole tree, daemons included.
    let out = sb
        .exec_with(
            Cmd::shell("(sleep 600 &) ; setsid sleep 601 & sleep 602")
                .timeout(Duration::from_millis(700)),
        )
        .await
        .expect("timeout");
    assert!(out.result.timed_out, "{:?}", out.result);
    let ps = sb.exec(["ps", "-o", "args"]).await.expect("ps").stdout_text();
    assert!(!ps.contains("sleep 60"), "process tree survived its timeout:\n{ps}");

    // Output cap: `yes` is truncated, the result says so.
    let out = sb
        .exec_with(Cmd::new(["yes"]).output_limit(100_000).timeout(Duration::from_secs(2)))
        .await
        .expect("yes");
    assert!(out.result.truncated);
    assert_eq!(out.stdout.len(), 100_000);
    assert!(out.result.stdout_bytes > 100_000);

    // Disk quota: ENOSPC for the sandbox, nothing for the host.
    let host_free = fs2_free("/");
    let out = shell(&sb, "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; echo rc=$?").await;
    assert!(
        out.stdout_text().contains("No space left") && out.stdout_text().contains("rc=1"),
        "{}",
        out.stdout_text()
    );
    assert!(fs2_free("/") + (64 << 20) > host_free, "host disk shrank");
    shell(&sb, "rm /tmp/fill").await;

    // Fork bomb: stopped at the pids limit; the sandbox still answers afterwards.
    let out = sb
        .exec_with(
            Cmd::shell("bomb() { bomb | bomb & }; bomb; sleep 2; echo done")
                .timeout(Duration::from_secs(5)),
        )
        .await
        .expect("fork bomb");
    assert!(
        !out.success() || out.stderr_text().contains("can't fork") || out.result.timed_out,
        "{:?}",
        out.result
    );
    let out = sb.exec(["echo", "after bomb"]).await.expect("after");
    assert_eq!(out.stdout_text(), "after bomb\n");

    // Memory bomb: the cgroup's OOM killer ends it.
    let out = sb
        .exec_with(Cmd::shell("x=a; while true; do x=$x$x; done").timeout(Duration::from_secs(30)))
        .await
        .expect("memory bomb");
    assert!(out.result.oom_killed, "{:?} {}", out.result, out.stderr_text());

    // Kernel-crash and escape paths are closed.
    let out = sb.exec(["cat", "/proc/kpagecgroup"]).await.expect("kpagecgroup");
    assert!(!out.success(), "kpagecgroup readable");
    let out = shell(&sb, "mount -t tmpfs none /mnt; echo rc=$?").await;
    assert!(
        out.stdout_text().contains("rc=1") || out.stdout_text().contains("rc=255"),
        "{}",
        out.stdout_text()
    );
    let out = shell(&sb, "unshare -U -r true; echo rc=$?").await;
    assert!(!out.stdout_text().contains("rc=0"), "unshare worked: {}", out.stdout_text());

    bystander.finish().await;
}

/// Free bytes on the filesystem holding `path`.
fn fs2_free(path: &str) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail", path])
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn files_round_trip_and_stay_inside() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client
        // An upload is the sandbox's: on a writable layer in memory (this host's default) its
        // bytes count against the sandbox's memory.
        .create(SandboxOptions::container(&image("busybox")).disk_mib(1200).memory_mib(1536))
        .await
        .expect("create");
    sb.write_file("/workspace/src/app.py", b"print('hi')\n").await.expect("write");
    let out = sb.exec(["cat", "/workspace/src/app.py"]).await.expect("cat");
    assert_eq!(out.stdout, b"print('hi')\n");
    let out = shell(&sb, "stat -c %U /workspace/src/app.py; echo x > /workspace/made-inside").await;
    assert_eq!(
        out.stdout_text(),
        "root\n",
        "files written through the API belong to container root"
    );
    assert_eq!(sb.read_file("/workspace/made-inside").await.expect("read"), b"x\n");
    let names: Vec<String> =
        sb.list_dir("/workspace").await.expect("ls").into_iter().map(|e| e.path).collect();
    assert_eq!(names, ["/workspace/made-inside", "/workspace/src"]);
    sb.mkdir("/workspace/a/b", true).await.expect("mkdir");
    sb.remove("/workspace/a", true).await.expect("rm");

    // Symlinks resolve inside the container, never on the host.
    shell(&sb, "ln -s /etc/passwd /workspace/pw; ln -s ../../../../../etc/shadow /workspace/up")
        .await;
    let pw = String::from_utf8(sb.read_file("/workspace/pw").await.expect("read")).expect("utf8");
    assert!(pw.starts_with("root:x:0:0:root:/root:/bin/sh"), "read the host's passwd: {pw}");
    let err = sb.read_file("/workspace/up").await.expect_err("no shadow in busybox");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    assert!(sb.read_file("/../../../etc/hostname").await.is_ok_and(|b| b.starts_with(b"sandbox-")));

    // A 1 GiB streamed upload, and back, byte-exact.
    let size: usize = 1 << 30;
    let chunk: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 + 3) as u8).collect();
    let mut expected = Sha256::new();
    for i in 0..(size / chunk.len()) {
        let mut c = chunk.clone();
        c[0] = i as u8;
        expected.update(&c);
    }
    let expected = expected.finalize();
    let reader = ChunkReader { chunk, left: size / (1 << 20), index: 0, pos: 0 };
    let written = sb.upload("/workspace/big.bin", reader).await.expect("upload");
    assert_eq!(written, size as u64);
    let out = sb.exec(["sha256sum", "/workspace/big.bin"]).await.expect("sha");
    assert!(out.stdout_text().starts_with(&hex::encode(expected)), "{}", out.stdout_text());
    let mut hasher = HashingWriter(Sha256::new(), 0);
    sb.download("/workspace/big.bin", &mut hasher).await.expect("download");
    assert_eq!(hasher.1, size as u64);
    assert_eq!(hasher.0.finalize(), expected);
    sb.destroy().await.expect("destroy");
}

/// Generates the 1 GiB test file on the fly: chunk i is the base chunk with byte 0 = i.
struct ChunkReader {
    chunk: Vec<u8>,
    left: usize,
    index: usize,
    pos: usize,
}

impl tokio::io::AsyncRead for ChunkReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.left == 0 {
            return std::task::Poll::Ready(Ok(()));
        }
        let this = &mut *self;
        this.chunk[0] = this.index as u8;
        let n = buf.remaining().min(this.chunk.len() - this.pos);
        buf.put_slice(&this.chunk[this.pos..this.pos + n]);
        this.pos += n;
        if this.pos == this.chunk.len() {
            this.pos = 0;
            this.index += 1;
            this.left -= 1;
        }
        std::task::Poll::Ready(Ok(()))
    }
}

struct HashingWriter(Sha256, u64);

impl tokio::io::AsyncWrite for HashingWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.0.update(buf);
        self.1 += buf.len() as u64;
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// The checks a container in a container-host VM passes too (`tests/container_host.rs`).
#[tokio::test]
async fn a_host_kernel_container_passes_the_shared_container_checks() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let options = SandboxOptions::container(&image("busybox"));
    let pace = brig_tests::behaviour::Pace { slow: 1 };
    let (placement, passed) =
        brig_tests::behaviour::check_container(&client, options, pace).await.expect("checks");
    assert_eq!(placement, "host-kernel");
    assert!(passed.len() >= 15, "{passed:?}");
}

/// This host has no hardware virtualization: a container asked for in a VM is refused with
/// the reason, and the node keeps serving host-kernel containers.
#[tokio::test]
async fn a_container_in_a_vm_is_refused_where_no_container_host_vm_can_run() {
    let config = format!(
        "[container_host]\nkernel = \"{0}\"\ninitrd = \"{0}\"\n",
        brig_tests::binary("brigd").display()
    );
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let vm = SandboxOptions::container(&image("busybox")).placement(brig_sdk::Placement::Vm);
    let err = client.create(vm).await.expect_err("no container-host VMs on this host");
    assert_eq!(err.code(), Some(ErrorCode::Unavailable), "{err}");
    assert!(err.to_string().contains("container-host"), "{err}");
    let host =
        SandboxOptions::container(&image("busybox")).placement(brig_sdk::Placement::HostKernel);
    let sb = client.create(host).await.expect("on the node's kernel");
    assert_eq!(sb.status().await.expect("status").placement.as_deref(), Some("host-kernel"));
    sb.destroy().await.expect("destroy");
}

#[tokio::test]
async fn wrong_tier_and_bad_images_get_typed_errors() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    for bad in ["no-such-image", "../etc", "a+", ""] {
        let err = client.create(SandboxOptions::container(bad)).await.expect_err(bad);
        assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{bad}: {err}");
    }
    let fn_sb = client.create(SandboxOptions::fncall()).await.expect("fncall");
    let err = fn_sb.exec(["true"]).await.expect_err("exec on fncall");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let c = client.create(SandboxOptions::container(&image("busybox"))).await.expect("container");
    let err = c.call("jq", "{}").await.expect_err("tool call on container");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let out = c.exec(["no-such-command"]).await.expect("exec");
    assert_eq!(out.result.exit_code, Some(127));
    assert!(out.stderr_text().contains("no-such-command"), "{}", out.stderr_text());
    // What the child of the shim cannot set up is its exit status and one line on its stderr,
    // as from a shell; the container carries on.
    for (cmd, code, says) in [
        (Cmd::new(["true"]).user("no-such-user"), 126, "brig: no user \"no-such-user\""),
        (
            Cmd::new(["true"]).cwd("/no/such/dir"),
            126,
            "cannot enter working directory /no/such/dir",
        ),
        (Cmd::new(["/tmp"]), 126, "brig: /tmp: Permission denied"),
        (Cmd::new(["/no/such/program"]), 127, "brig: /no/such/program: No such file"),
    ] {
        let out = c.exec_with(cmd).await.expect("exec");
        assert_eq!(out.result.exit_code, Some(code), "{says}: {}", out.stderr_text());
        assert!(out.stderr_text().contains(says), "{says}: {}", out.stderr_text());
    }
    let err = c.exec_with(Cmd::new(["true"]).env("BAD", "a\0b")).await.expect_err("NUL");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    let out =
        c.exec_with(Cmd::new(["sh", "-c", "id -u; pwd"]).user("65534:65534").cwd("/tmp")).await;
    assert_eq!(out.expect("exec").stdout_text(), "65534\n/tmp\n");
    c.destroy().await.expect("destroy");
    assert_eq!(c.exec(["true"]).await.expect_err("gone").code(), Some(ErrorCode::NotFound));
}

#[tokio::test]
async fn layers_stack_and_execs_can_be_killed_and_fed() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    // Two more layers on the busybox base: a workspace from a directory, a toolkit from a tar.
    let scratch = tempfile::tempdir().expect("tmp");
    let ws = scratch.path().join("ws");
    std::fs::create_dir_all(ws.join("workspace/project")).expect("mkdir");
    std::fs::write(ws.join("workspace/project/README"), "workspace layer\n").expect("write");
    std::fs::write(ws.join("workspace/project/VERSION"), "1\n").expect("write");
    let tk = scratch.path().join("tk");
    std::fs::create_dir_all(tk.join("workspace/project")).expect("mkdir");
    std::fs::create_dir_all(tk.join("opt/harness")).expect("mkdir");
    std::fs::write(tk.join("workspace/project/VERSION"), "2\n").expect("write");
    std::fs::write(tk.join("opt/harness/run.sh"), "echo harness\n").expect("write");
    let tar = scratch.path().join("tk.tar");
    let status = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&tk)
        .arg(".")
        .status()
        .expect("tar");
    assert!(status.success());
    let images = daemon.state_dir().join("extra-images");
    std::fs::create_dir_all(&images).expect("mkdir");
    let mkimage = brig_tests::binary("brig-mkimage");
    for args in [
        vec![
            "dir".to_string(),
            ws.display().to_string(),
            images.join("ws.erofs").display().to_string(),
        ],
        vec![
            "tar".to_string(),
            tar.display().to_string(),
            images.join("tk.erofs").display().to_string(),
        ],
    ] {
        let st = std::process::Command::new(&mkimage).args(&args).status().expect("mkimage");
        assert!(st.success(), "{args:?}");
    }
    for name in ["ws", "tk"] {
        std::fs::copy(
            images.join(format!("{name}.erofs")),
            brig_tests::artifacts()
                .join(format!("images/test-{name}-{}.erofs", std::process::id())),
        )
        .expect("copy");
    }
    let stack = format!("busybox+test-ws-{0}+test-tk-{0}", std::process::id());
    let sb = client.create(SandboxOptions::container(&stack)).await.expect("create");
    let out = shell(&sb, "cat /workspace/project/README /workspace/project/VERSION; sh /opt/harness/run.sh; ls /bin/busybox").await;
    assert_eq!(
        out.stdout_text(),
        "workspace layer\n2\nharness\n/bin/busybox\n",
        "{}",
        out.stderr_text()
    );

    // Kill a running exec by id.
    let mut stream = sb.exec_stream(Cmd::shell("echo started; sleep 600")).await.expect("stream");
    assert!(matches!(stream.next().await, Some(Ok(ExecEvent::Stdout(_)))));
    sb.kill(stream.exec_id()).await.expect("kill");
    let rest = stream.collect().await.expect("collect");
    assert!(rest.result.killed && rest.result.signal == Some(9), "{:?}", rest.result);

    // Stream stdin into a command.
    let mut stream = sb.exec_stream(Cmd::new(["wc", "-c"]).stdin_stream()).await.expect("stream");
    for _ in 0..4 {
        stream.write_stdin(vec![b'x'; 1000]).await.expect("stdin");
    }
    stream.close_stdin().expect("close");
    assert_eq!(stream.collect().await.expect("collect").stdout_text().trim(), "4000");
    sb.destroy().await.expect("destroy");
    for name in ["ws", "tk"] {
        let _ = std::fs::remove_file(
            brig_tests::artifacts()
                .join(format!("images/test-{name}-{}.erofs", std::process::id())),
        );
    }
}

/// An exec on a terminal: the shell sees a tty of the asked size, takes typed input (^C
/// interrupts its foreground job), follows a resize, and an exec without a terminal cannot be
/// resized.
#[tokio::test]
async fn a_shell_on_a_terminal_takes_input_and_follows_resizes() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("client");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    let mut shell = sb
        .exec_stream(Cmd::new(["sh", "-i"]).terminal(24, 80).stdin_stream())
        .await
        .expect("a shell on a terminal");
    let id = shell.exec_id();
    let mut screen = Vec::new();
    async fn shows(shell: &mut brig_sdk::ExecStream, screen: &mut Vec<u8>, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !String::from_utf8_lossy(screen).contains(text) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, shell.next()).await {
                Ok(Some(Ok(ExecEvent::Stdout(b)))) => screen.extend_from_slice(&b),
                Ok(Some(Ok(ExecEvent::Stderr(b)))) => panic!("stderr on a terminal: {b:?}"),
                other => panic!(
                    "{text:?} never appeared ({other:?}): {}",
                    String::from_utf8_lossy(screen)
                ),
            }
        }
    }
    shell
        .write_stdin(&b"test -t 0 && test -t 2 && echo on-a-tty; stty size; echo m-$((6*7))\n"[..])
        .await
        .expect("type");
    shows(&mut shell, &mut screen, "m-42").await;
    let text = String::from_utf8_lossy(&screen).to_string();
    assert!(text.contains("on-a-tty") && text.contains("24 80"), "{text}");
    sb.resize_terminal(id, 50, 132).await.expect("resize");
    shell.write_stdin(&b"stty size\n"[..]).await.expect("type");
    shows(&mut shell, &mut screen, "50 132").await;
    shell.write_stdin(&b"sleep 100\n"[..]).await.expect("type");
    tokio::time::sleep(Duration::from_millis(300)).await;
    shell.write_stdin(&b"\x03echo after-interrupt\n"[..]).await.expect("^C");
    shows(&mut shell, &mut screen, "after-interrupt").await;
    shell.write_stdin(&b"exit 7\n"[..]).await.expect("type");
    let out = shell.collect().await.expect("the shell ends");
    assert_eq!(out.result.exit_code, Some(7), "{:?}", out.result);
    let plain = sb.exec_stream(Cmd::new(["sleep", "5"])).await.expect("exec");
    let err = sb.resize_terminal(plain.exec_id(), 10, 10).await.expect_err("no terminal");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    sb.destroy().await.expect("destroy");
}
