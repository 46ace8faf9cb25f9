//! The software-emulated host Linux-guest tests run in (docs/GUEST.md section 2): QEMU TCG with an
//! emulated AMD-V CPU, booting Debian's cloud kernel with the test initramfs
//! `scripts/build-vm-guests.sh` makes; its init loads KVM with nested SVM and runs brig-vmm
//! and brigd. Emulated timings are for correctness only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A file `scripts/build-vm-guests.sh` made (`artifacts/vm/<name>`).
pub fn vm_artifact(name: &str) -> PathBuf {
    let path = crate::artifacts().join("vm").join(name);
    assert!(path.exists(), "{} is missing: run scripts/build-vm-guests.sh", path.display());
    path
}

/// The host's TSC in kHz, which the emulated host needs to skip its (flaky under TCG)
/// calibration.
pub fn tsc_khz() -> u64 {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(2_000_000, |mhz| (mhz * 1000.0) as u64)
}

/// A free UDP port on the host's loopback (for QEMU's forward to brigd in the emulated host).
pub fn free_udp_port() -> u16 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    socket.local_addr().expect("addr").port()
}

/// The emulated host's QEMU command: one vCPU, 4 GiB, console on stdout, a user-mode network
/// whose UDP `forward` port (if any) reaches brigd at 10.0.2.15:7070, `disk` (if any) as a
/// virtio-blk disk whose writes are thrown away, and `append` added to the kernel's command
/// line (the init reads `brig.l1=…` there).
pub fn qemu(forward: Option<u16>, disk: Option<&Path>, append: &str) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg,thread=multi"])
        .args(["-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on", "-cpu", "max", "-smp", "1"])
        .args(["-m", "4G", "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio"])
        .arg("-no-reboot")
        .arg("-netdev");
    match forward {
        Some(port) => cmd.arg(format!("user,id=n0,hostfwd=udp:127.0.0.1:{port}-10.0.2.15:7070")),
        None => cmd.arg("user,id=n0"),
    };
    cmd.args(["-device", "virtio-net-device,netdev=n0"]);
    if let Some(disk) = disk {
        cmd.arg("-drive")
            .arg(format!("file={},if=none,id=d0,format=raw,snapshot=on", disk.display()))
            .args(["-device", "virtio-blk-device,drive=d0"]);
    }
    cmd.arg("-kernel")
        .arg(vm_artifact("vmlinuz"))
        .arg("-initrd")
        .arg(vm_artifact("l1-initrd.gz"))
        .arg("-append")
        .arg(format!("console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz={} {append}", tsc_khz()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Kills process `pid` if it still runs after `limit` (an emulated run that hangs fails its
/// test with its log instead of holding CI); the thread ends when the process does.
pub fn watchdog(pid: u32, limit: Duration) -> std::thread::JoinHandle<()> {
    let started = Instant::now();
    std::thread::spawn(move || {
        while started.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(500));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    })
}

/// Keeps an emulated run's console as `artifacts/reports/<name>`.
pub fn keep_report(name: &str, log: &str) {
    let reports = crate::artifacts().join("reports");
    let _ = std::fs::create_dir_all(&reports);
    let _ = std::fs::write(reports.join(name), log);
}

/// What an emulated run left: its console, QEMU's exit status, and what the outside driver
/// returned.
pub struct Run<T> {
    pub log: String,
    pub status: std::process::ExitStatus,
    pub outside: Result<T, String>,
}

/// Why driving the emulated host failed, for a panic: the console's last lines, then the
/// failure itself last, so that a CI log cut in the middle still ends with it.
pub fn failure(what: &str, error: &str, log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    format!("{what}\n--- the emulated host's last console lines ---\n{tail}\n--- {what}: {error}")
}

/// Runs the emulated host `cmd` (made by [`qemu`] with the UDP `port` forwarded) under a
/// `limit` watchdog. Once its console announces brigd (`BRIG-L1-ENDPOINT pin=… token=…`, within
/// `announce`), an SDK client connects through the forward and `drive` runs with it; if the
/// driver fails, QEMU is killed at once (the emulated host would wait minutes for a marker
/// that never comes). The console is kept as `artifacts/reports/<report>`.
pub fn run_driven<T, F, Fut>(
    mut cmd: Command,
    port: u16,
    limit: Duration,
    announce: Duration,
    report: &str,
    drive: F,
) -> Run<T>
where
    F: FnOnce(brig_sdk::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    use std::io::BufRead;
    let mut child = cmd.spawn().expect("qemu-system-x86_64 (scripts/install-deps.sh installs it)");
    let watchdog = watchdog(child.id(), limit);
    let stdout = child.stdout.take().expect("stdout");
    let (endpoint_tx, endpoint_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.trim().strip_prefix("BRIG-L1-ENDPOINT ") {
                let _ = endpoint_tx.send(rest.to_string());
            }
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    let outside = match endpoint_rx.recv_timeout(announce) {
        Ok(endpoint) => connect_and_drive(port, &endpoint, drive),
        Err(_) => Err("the emulated host never announced brigd".to_string()),
    };
    if outside.is_err() {
        let _ = child.kill();
    }
    let log = reader.join().expect("console reader");
    let status = child.wait().expect("wait");
    let _ = watchdog.join();
    keep_report(report, &log);
    Run { log, status, outside }
}

/// Connects to the announced brigd through QEMU's forward on `port` and runs `drive`.
fn connect_and_drive<T, F, Fut>(port: u16, endpoint: &str, drive: F) -> Result<T, String>
where
    F: FnOnce(brig_sdk::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let field = |key: &str| {
        endpoint
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .ok_or_else(|| format!("no {key} in {endpoint:?}"))
    };
    let (pin, token) = (field("pin")?, field("token")?);
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let opts = brig_sdk::ConnectOptions::new(addr, brig_sdk::Pin::Sha256(pin), token);
        let client = brig_sdk::Client::connect(opts).await.map_err(|e| format!("connect: {e}"))?;
        drive(client).await
    })
}

/// Runs the emulated host `cmd` to its end under a `limit` watchdog; its console (kept as
/// `artifacts/reports/<report>`) and QEMU's exit status.
pub fn run(mut cmd: Command, limit: Duration, report: &str) -> (String, std::process::ExitStatus) {
    use std::io::BufRead;
    let mut child = cmd.spawn().expect("qemu-system-x86_64 (scripts/install-deps.sh installs it)");
    let watchdog = watchdog(child.id(), limit);
    let stdout = child.stdout.take().expect("stdout");
    let mut log = String::new();
    for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
    }
    let status = child.wait().expect("wait");
    let _ = watchdog.join();
    keep_report(report, &log);
    (log, status)
}

/// Waits until the emulated host has killed and restarted brigd, which it says by removing
/// `marker` once the new brigd serves; the client reconnects on every try. Fails after 15
/// minutes.
pub async fn wait_for_restart(
    client: &brig_sdk::Client,
    marker: &brig_sdk::Sandbox,
) -> Result<(), String> {
    let asked = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        client.close().await;
        match marker.status().await {
            Err(err) if err.code() == Some(brig_sdk::ErrorCode::NotFound) => return Ok(()),
            _ if asked.elapsed() > Duration::from_secs(900) => {
                return Err("brigd did not come back after its kill".into());
            }
            _ => {}
        }
    }
}

/// Run in a sandbox before brigd is killed: a file naming the shell, and a process of the
/// sandbox's own (in a session of its own); prints the file (what [`check_adopted`] wants).
const ADOPTED_SETUP: &str = "echo alive-$$ > /tmp/state; \
    setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo $! > /tmp/bg; cat /tmp/state";

/// Prepares `sb` for [`check_adopted`]; returns what it wants to see again.
pub async fn prepare_adopted(sb: &brig_sdk::Sandbox) -> Result<Vec<u8>, String> {
    let out = sb.exec(["sh", "-c", ADOPTED_SETUP]).await.map_err(|e| format!("exec: {e}"))?;
    Ok(out.stdout.to_vec())
}

/// After brigd's restart: `sb` still has the file [`prepare_adopted`] wrote (`state`) and its
/// own process still runs.
pub async fn check_adopted(sb: &brig_sdk::Sandbox, state: &[u8]) -> Result<(), String> {
    let out = sb
        .exec(["sh", "-c", "cat /tmp/state; kill -0 $(cat /tmp/bg) && echo bg-alive"])
        .await
        .map_err(|e| format!("exec after the restart: {e}"))?;
    let want = [state, b"bg-alive\n"].concat();
    if out.stdout != want {
        return Err(format!("the adopted sandbox's state: {out:?}, wanted {want:?}"));
    }
    Ok(())
}

/// After brigd's restart: `sb`, paused before it, is still paused, and its next command
/// resumes it with its memory (`cat /tmp/state` prints `state`).
pub async fn check_paused_adopted(sb: &brig_sdk::Sandbox, state: &[u8]) -> Result<(), String> {
    let status = sb.status().await.map_err(|e| format!("status of the paused sandbox: {e}"))?;
    if status.state != brig_sdk::SandboxState::Paused {
        return Err(format!("the paused sandbox came back as {:?}", status.state));
    }
    let out = sb.exec(["cat", "/tmp/state"]).await.map_err(|e| format!("exec resumes: {e}"))?;
    if out.stdout != state {
        return Err(format!("the paused sandbox after resume: {out:?}"));
    }
    Ok(())
}

/// Work started in a sandbox before a break (brigd killed and restarted, or the sandbox's VM
/// saved by a pause and resumed) that must come back after it: a command that runs through
/// the break (read again by its exec id), an idle session with state (directory, an exported
/// variable, a function) and a session whose command runs through the break. Both the command
/// and the busy session wait for `/tmp/go`, which [`check_kept_work`] makes after the break.
/// Two more commands carry stdin through it: `cat`, whose stdin a client streams (one line
/// before the break, one written by id after it), and a reader given 1 MiB of stdin whole,
/// which starts reading only after the break.
pub struct KeptWork {
    through_id: u64,
    idle: String,
    busy: String,
    /// `cat`'s stream, held so that its stdin is not ended by the client going away.
    cat: brig_sdk::ExecStream,
    whole_id: u64,
    whole_sha256: String,
    /// Started last, its stdin empty, right before the break and never read before it.
    late_id: u64,
}

/// The stdin given whole to [`KeptWork`]'s reader: 1 MiB, more than a pipe or a vsock
/// connection buffers.
fn whole_stdin() -> Vec<u8> {
    (0..1u32 << 20).map(|i| (i % 251) as u8).collect()
}

const SESSION_LIMIT: Duration = Duration::from_secs(60);

/// Starts [`KeptWork`] in `sb`.
pub async fn start_kept_work(sb: &brig_sdk::Sandbox) -> Result<KeptWork, String> {
    use brig_sdk::{Cmd, ExecEvent};
    let e = |what: &'static str| move |err: brig_sdk::Error| format!("{what}: {err}");
    let script = "echo before; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo after >&2; exit 5";
    let mut through = sb.exec_stream(Cmd::new(["sh", "-c", script])).await.map_err(e("exec"))?;
    let through_id = through.exec_id();
    match through.next().await {
        Some(Ok(ExecEvent::Stdout(b))) if &b[..] == b"before\n" => {}
        other => return Err(format!("the kept command's first event: {other:?}")),
    }
    drop(through);
    let idle = sb.open_session().await.map_err(e("open a session"))?;
    let setup = "mkdir -p /work && cd /work && export ROLLOUT=r7 && f() { echo fn-$1; }";
    let out = idle.run(setup, SESSION_LIMIT).await.map_err(e("session setup"))?;
    if out.exit_code != Some(0) {
        return Err(format!("session setup: {out:?}"));
    }
    let busy = sb.open_session().await.map_err(e("open a second session"))?;
    let waits = "cd /tmp; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo waited";
    let started = busy.run(waits, Duration::from_millis(300)).await.map_err(e("session run"))?;
    if !started.is_running() {
        return Err(format!("the session command should still run: {started:?}"));
    }
    let mut cat = sb.exec_stream(Cmd::new(["cat"]).stdin_stream()).await.map_err(e("cat"))?;
    cat.write_stdin(b"one\n".to_vec()).await.map_err(e("write to cat"))?;
    match cat.next().await {
        Some(Ok(ExecEvent::Stdout(b))) if &b[..] == b"one\n" => {}
        other => return Err(format!("cat's first event: {other:?}")),
    }
    let input = whole_stdin();
    let whole_sha256 = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&input))
    };
    let reads = "while [ ! -e /tmp/go ]; do sleep 0.1; done; sha256sum";
    let whole = sb
        .exec_stream(Cmd::new(["sh", "-c", reads]).stdin(input))
        .await
        .map_err(e("the reader of stdin given whole"))?;
    // Last, its stdin empty and its output not read: acknowledged, so the break finds it.
    let late = "while [ ! -e /tmp/go ]; do sleep 0.1; done; echo late";
    let late = sb.exec_stream(Cmd::new(["sh", "-c", late])).await.map_err(e("the last exec"))?;
    Ok(KeptWork {
        late_id: late.exec_id(),
        through_id,
        idle: idle.id().to_string(),
        busy: busy.id().to_string(),
        whole_id: whole.exec_id(),
        cat,
        whole_sha256,
    })
}

/// After the break (`after` names it: "the restart", "the pause"): both sessions are listed;
/// the idle one answers with its state; the busy one's command, let go, reports its output,
/// status and directory; a closed session is no longer listed; the command that ran through
/// the break, read again by id, has all its output and its real status; `cat` takes a line
/// written by id and ends when its stdin is closed by id; the reader read all its stdin; the
/// exec started right before the break ran to its end.
pub async fn check_kept_work(
    sb: &brig_sdk::Sandbox,
    work: KeptWork,
    after: &str,
) -> Result<(), String> {
    let e =
        |what: &'static str| move |err: brig_sdk::Error| format!("after {after}, {what}: {err}");
    let listed = sb.sessions().await.map_err(e("sessions"))?;
    if !listed.contains(&work.idle) || !listed.contains(&work.busy) {
        let wanted = (&work.idle, &work.busy);
        return Err(format!("sessions after {after}: {listed:?}, wanted {wanted:?}"));
    }
    let out = sb
        .session(&work.idle)
        .run("pwd; echo $ROLLOUT; f x", SESSION_LIMIT)
        .await
        .map_err(e("session run"))?;
    if out.stdout_text() != "/work\nr7\nfn-x\n" || out.exit_code != Some(0) {
        return Err(format!("the idle session after {after}: {out:?}"));
    }
    sb.exec(["touch", "/tmp/go"]).await.map_err(e("touch"))?;
    let busy = sb.session(&work.busy);
    let out = busy.wait(SESSION_LIMIT).await.map_err(e("session wait"))?;
    if out.stdout_text() != "waited\n" || out.exit_code != Some(0) || out.cwd != "/tmp" {
        return Err(format!("the session command that ran through {after}: {out:?}"));
    }
    busy.close().await.map_err(e("close a session"))?;
    if sb.sessions().await.map_err(e("sessions"))?.contains(&work.busy) {
        return Err("a closed session is still listed".into());
    }
    let out = sb
        .attach(work.through_id)
        .await
        .map_err(e("attach"))?
        .collect()
        .await
        .map_err(e("collect"))?;
    if out.stdout != b"before\n" || out.stderr != b"after\n" || out.result.exit_code != Some(5) {
        return Err(format!("the command that ran through {after}: {out:?}"));
    }
    let KeptWork { cat, whole_id, whole_sha256, late_id, .. } = work;
    let cat_id = cat.exec_id();
    if let Err(err) = sb.write_stdin(cat_id, "two\n").await {
        let execs = sb.execs().await;
        return Err(format!(
            "after {after}, write to cat (exec {cat_id}) by id: {err}; execs: {execs:?}"
        ));
    }
    sb.close_stdin(cat_id).await.map_err(e("close cat's stdin by id"))?;
    let collect = |id| async move {
        let read = async { sb.attach(id).await?.collect().await };
        tokio::time::timeout(SESSION_LIMIT, read)
            .await
            .map_err(|_| format!("after {after}, exec {id} did not end"))?
            .map_err(|err| format!("after {after}, attach to exec {id}: {err}"))
    };
    let out = collect(cat_id).await?;
    drop(cat);
    if out.stdout_text() != "one\ntwo\n" || out.result.exit_code != Some(0) {
        return Err(format!("cat, whose stdin was streamed through {after}: {out:?}"));
    }
    let out = collect(whole_id).await?;
    if out.stdout_text() != format!("{whole_sha256}  -\n") || out.result.exit_code != Some(0) {
        return Err(format!("the reader of stdin given whole, after {after}: {out:?}"));
    }
    let out = collect(late_id).await?;
    if out.stdout_text() != "late\n" || out.result.exit_code != Some(0) {
        return Err(format!("the exec started right before {after}: {out:?}"));
    }
    Ok(())
}
