//! The runtime against the real kernel: namespaces, cgroups, overlay, shim. Needs root.

use std::os::fd::AsFd;
use std::path::PathBuf;

use brig_container::runtime::{ContainerSpec, Runtime, RuntimeConfig, SpawnRequest};
use brig_container::shim_proto::ExitInfo;
use brig_hostkit::cgroup::CgroupLimits;
use tokio::io::AsyncReadExt;

fn artifacts() -> PathBuf {
    std::env::var_os("BRIG_ARTIFACTS").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("../../artifacts")
    })
}

fn runtime(run: &std::path::Path) -> Runtime {
    runtime_named(run, "rt", false)
}

fn runtime_named(run: &std::path::Path, tag: &str, survive_node: bool) -> Runtime {
    let spares = brig_container::runtime::DEFAULT_SPARE_CGROUPS;
    runtime_with_spares(run, tag, survive_node, spares)
}

fn runtime_with_spares(run: &std::path::Path, tag: &str, survive: bool, spares: usize) -> Runtime {
    runtime_with_idle_spares(run, tag, survive, spares, 0)
}

fn runtime_with_idle_spares(
    run: &std::path::Path,
    tag: &str,
    survive: bool,
    spares: usize,
    spare_cgroups_idle_secs: u64,
) -> Runtime {
    let survive_node = survive;
    Runtime::new(RuntimeConfig {
        run_dir: run.to_owned(),
        shim_path: PathBuf::from(env!("CARGO_BIN_EXE_brig-shim")),
        id_base: 100_000,
        cgroup_root: "/sys/fs/cgroup".into(),
        cgroup_parent: format!("brig-test-{tag}-{}", std::process::id()),
        survive_node,
        spool_dir: None,
        cpu_min_quota_us: brig_hostkit::cgroup::DEFAULT_CPU_MIN_QUOTA_US,
        spare_cgroups: spares,
        spare_cgroups_idle_secs,
        writable_store: None,
    })
    .expect("runtime")
}

fn busybox_spec(name: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        hostname: "sandbox".into(),
        layers: vec![brig_container::rootfs::LayerSource::image(
            artifacts().join("images/busybox.erofs"),
        )],
        limits: CgroupLimits { memory_bytes: Some(256 << 20), pids: Some(128), cpu_millis: None },
        disk_bytes: 64 << 20,
        seed: None,
        protect: Default::default(),
    }
}

async fn run_capture(
    c: &brig_container::runtime::Container,
    argv: &[&str],
) -> (Option<ExitInfo>, String, String) {
    let (in_r, in_w) = nix::unistd::pipe().expect("pipe");
    let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
    let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
    let req =
        SpawnRequest { argv: argv.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let mut p = c
        .spawn(req, [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()], &[], &[], None)
        .await
        .expect("spawn");
    drop((in_r, in_w, out_w, err_w));
    let mut out = String::new();
    let mut err = String::new();
    tokio::fs::File::from_std(std::fs::File::from(out_r))
        .read_to_string(&mut out)
        .await
        .expect("read");
    tokio::fs::File::from_std(std::fs::File::from(err_r))
        .read_to_string(&mut err)
        .await
        .expect("read");
    (p.wait().await, out, err)
}

#[tokio::test]
async fn busybox_container_runs_commands() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime(run.path());
    let spec = ContainerSpec {
        name: "t1".into(),
        hostname: "sandbox".into(),
        layers: vec![brig_container::rootfs::LayerSource::image(
            artifacts().join("images/busybox.erofs"),
        )],
        limits: CgroupLimits {
            memory_bytes: Some(256 << 20),
            pids: Some(128),
            cpu_millis: Some(1000),
        },
        disk_bytes: 64 << 20,
        seed: None,
        protect: Default::default(),
    };
    let started = std::time::Instant::now();
    let c = rt.create(&spec).await.expect("create");
    eprintln!("create took {:?}", started.elapsed());
    let started = std::time::Instant::now();
    let (status, out, err) =
        run_capture(&c, &["sh", "-c", "echo hi; id; hostname; cat /proc/1/cmdline; ls /"]).await;
    eprintln!("exec took {:?}\n{out}\n{err}", started.elapsed());
    assert_eq!(status, Some(ExitInfo::Code(0)));
    assert!(out.starts_with("hi\nuid=0(root)"), "{out}");
    let (status, _, err) = run_capture(&c, &["cat", "/proc/kpagecgroup"]).await;
    assert_ne!(status, Some(ExitInfo::Code(0)), "{err}");
    let (status, _, err) = run_capture(&c, &["mount", "-t", "tmpfs", "x", "/tmp"]).await;
    assert_ne!(status, Some(ExitInfo::Code(0)), "{err}");
    c.destroy().await.expect("destroy");
    rt.shutdown();
}

/// The shim is the container's pid 1 and its only process at rest. Processes in the
/// container see it but cannot open its descriptors, trace it or signal it, and the pid the
/// node is told for a command is the host's.
#[tokio::test]
async fn the_shim_is_pid_1_and_out_of_the_containers_reach() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "pid1", false);
    let c = rt.create(&busybox_spec("pid1")).await.expect("create");
    assert_eq!(c.cgroup().tree_pids(), vec![c.init_pid()], "one process per idle container");
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", c.init_pid())).expect("comm");
    assert_eq!(comm.trim(), "brig-shim");
    let script = "cat /proc/1/comm; \
        ls /proc/1/fd/ >/dev/null 2>&1 && echo fds-listed; \
        cat /proc/1/environ >/dev/null 2>&1 && echo environ-read; \
        ls /proc/1/root/ >/dev/null 2>&1 && echo root-opened; \
        for s in KILL TERM INT HUP USR1 CHLD STOP; do kill -$s 1; done; echo signalled";
    let (status, out, err) = run_capture(&c, &["sh", "-c", script]).await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    assert_eq!(out, "brig-shim\nsignalled\n", "{err}");

    // It still serves (not killed, not stopped), and reports the host's pid.
    let null = std::fs::File::open("/dev/null").expect("null");
    let req = SpawnRequest {
        argv: ["sleep", "30"].iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let spawned = c.spawn(req, [null.as_fd(), null.as_fd(), null.as_fd()], &[], &[], None);
    let mut p = tokio::time::timeout(std::time::Duration::from_secs(10), spawned)
        .await
        .expect("the shim answers after the signals")
        .expect("spawn");
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).expect("status");
    let nspid: Vec<i32> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .expect("NSpid")
        .split_whitespace()
        .map(|n| n.parse().expect("pid"))
        .collect();
    assert_eq!(nspid.len(), 2, "{nspid:?}");
    assert_eq!(nspid[0], p.pid, "the reported pid is the host's");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid)).expect("cmdline");
    assert_eq!(cmdline, b"sleep\x0030\x00");
    tokio::task::spawn_blocking(p.tree_killer()).await.expect("kill");
    assert_eq!(p.wait().await, Some(ExitInfo::Signal(libc::SIGKILL)));
    c.destroy().await.expect("destroy");
    rt.shutdown();
}

/// Container root may chroot (CAP_SYS_CHROOT, as in Docker), and a chroot can be escaped
/// from: the container is entered with `chroot`, not `pivot_root`, so what lies outside its
/// rootfs is its mount namespace's root, the node's template. There is nothing of the host
/// there: an empty read-only tmpfs whose mount points are empty or the container's own root.
#[tokio::test]
async fn a_process_that_escapes_the_chroot_finds_nothing_of_the_host() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "escape", false);
    let mut spec = busybox_spec("escape");
    spec.layers = vec![brig_container::rootfs::LayerSource::image(
        artifacts().join("images/debian-12.erofs"),
    )];
    let c = rt.create(&spec).await.expect("create");
    // The classic escape: chroot into a subdirectory without entering it, climb out of it
    // with `..`, and chroot to where that leads.
    let escape = "import os
os.mkdir('/jail'); os.chroot('/jail'); os.chdir('../../../../..'); os.chroot('.')
top = sorted(os.listdir('/'))
print('root:', ' '.join(top))
for d in top:
    if d != 'c':
        print(d, len(os.listdir('/' + d)))
print('own root:', os.path.exists('/c/etc/debian_version'))
try:
    open('/made', 'w')
except OSError as e:
    print('write:', e.strerror)
";
    let (status, out, err) = run_capture(&c, &["python3", "-c", escape]).await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{out}\n{err}");
    let want = "root: c d e p s v y\nd 0\ne 0\np 0\ns 0\nv 0\ny 0\nown root: True\n\
                write: Read-only file system\n";
    assert_eq!(out, want, "{err}");
    c.destroy().await.expect("destroy");
    rt.shutdown();
}

#[tokio::test]
async fn a_surviving_container_is_taken_back_by_a_new_runtime() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "survive", true);
    let c = rt.create(&busybox_spec("keeper")).await.expect("create");
    let (status, _, err) = run_capture(
        &c,
        &["sh", "-c", "echo kept > /state; (sleep 600 </dev/null >/dev/null 2>&1 &) ; true"],
    )
    .await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    let init_pid = c.init_pid();
    // The node goes away: its end of the control socket closes.
    drop(c);
    drop(rt);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(std::path::Path::new(&format!("/proc/{init_pid}")).exists(), "init died with the node");

    let rt = runtime_named(run.path(), "survive", true);
    let c = rt.attach("keeper").await.expect("attach");
    assert_eq!(c.init_pid(), init_pid);
    let (status, out, err) =
        run_capture(&c, &["sh", "-c", "cat /state; pidof sleep | wc -w"]).await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    assert_eq!(out, "kept\n1\n");
    assert_eq!(rt.remove_orphans(&["keeper".to_string()]), 0);
    c.destroy().await.expect("destroy");
    rt.shutdown();
}

#[tokio::test]
async fn a_container_dies_with_its_node_unless_asked_to_survive() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "mortal", false);
    let c = rt.create(&busybox_spec("mortal")).await.expect("create");
    let init_pid = c.init_pid();
    drop(c);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{init_pid}")).exists() {
        assert!(std::time::Instant::now() < deadline, "init outlived its node");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(rt.attach("mortal").await.is_err());
    rt.remove_orphans(&[]);
    rt.shutdown();
}

/// A kill sent the instant a spawn returns reaches the command: the process is in its exec
/// cgroup before the spawn answers (the child also joins by itself, but possibly later).
#[tokio::test]
async fn a_kill_right_after_spawn_is_never_missed() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "killrace", false);
    let c = rt.create(&busybox_spec("killrace")).await.expect("create");
    for round in 0..40 {
        let req = SpawnRequest {
            argv: ["sh", "-c", "sleep 300"].iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let null = std::fs::File::open("/dev/null").expect("null");
        let mut p = c
            .spawn(req, [null.as_fd(), null.as_fd(), null.as_fd()], &[], &[], None)
            .await
            .expect("spawn");
        tokio::task::spawn_blocking(p.tree_killer()).await.expect("kill");
        let status = tokio::time::timeout(std::time::Duration::from_secs(10), p.wait())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the command outlived its kill"));
        assert_eq!(status, Some(ExitInfo::Signal(libc::SIGKILL)), "round {round}");
    }
    c.destroy().await.expect("destroy");
    rt.shutdown();
}

/// A node that reconnects while the shim has yet to notice its predecessor hang up (both show
/// in one wake-up of the shim) still hears the exit of a command started before: the shim
/// must not wait on the new connection, reaping nothing, until the new node speaks.
#[tokio::test]
async fn an_exit_during_a_reconnect_is_still_reported() {
    use nix::sys::signal::{kill, Signal};
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "reconnect", true);
    let c = rt.create(&busybox_spec("reconnect")).await.expect("create");
    let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
    let null = std::fs::File::open("/dev/null").expect("null");
    let req = SpawnRequest {
        argv: ["sh", "-c", "sleep 1; echo done"].iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let p = c
        .spawn(req, [null.as_fd(), out_w.as_fd(), null.as_fd()], &[], &[out_r.as_fd()], None)
        .await
        .expect("spawn");
    drop((out_w, out_r));
    let (spawn_id, cgroup) = (p.exec_id, p.cgroup_name());
    // The shim is the container's pid 1.
    let shim = nix::unistd::Pid::from_raw(c.init_pid());
    // The shim is held still while the node hangs up and a new one connects, so it sees
    // both at once when it goes on.
    kill(shim, Signal::SIGSTOP).expect("stop the shim");
    drop(p);
    drop(c);
    drop(rt);
    let rt = runtime_named(run.path(), "reconnect", true);
    let attach = tokio::spawn(async move {
        let c = rt.attach("reconnect").await;
        (rt, c)
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    kill(shim, Signal::SIGCONT).expect("continue the shim");
    let (rt, c) = attach.await.expect("attach task");
    let c = c.expect("attach");
    let (mut p, _fds, _) = c.reclaim_process(spawn_id, &cgroup).expect("the command was kept");
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), p.wait())
        .await
        .expect("the exit of a command that ended during the reconnect was never reported");
    assert_eq!(status, Some(ExitInfo::Code(0)));
    c.destroy().await.expect("destroy");
    rt.shutdown();
}

/// Container directories are on a tmpfs of the node's own, not the run directory's disk (ext4
/// on this machine's `/run` and `/tmp`); the node unmounts it at shutdown once no container
/// is left. A directory still holding containers of an earlier build is left where it is.
#[tokio::test]
async fn container_directories_are_on_a_tmpfs_of_the_nodes_own() {
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    use std::os::unix::fs::MetadataExt;
    let on_tmpfs =
        |p: &std::path::Path| statfs(p).expect("statfs").filesystem_type() == TMPFS_MAGIC;
    let dev = |p: &std::path::Path| std::fs::metadata(p).expect("stat").dev();
    let run = tempfile::tempdir().expect("tmp");
    let disk = !on_tmpfs(run.path());
    let rt = runtime_named(run.path(), "cdir", false);
    let dirs = run.path().join("c");
    assert!(on_tmpfs(&dirs), "the container directory is not on a tmpfs");
    let c = rt.create(&busybox_spec("cdir-1")).await.expect("create");
    let (status, out, _) = run_capture(&c, &["cat", "/proc/1/comm"]).await;
    assert_eq!((status, out.trim()), (Some(ExitInfo::Code(0)), "brig-shim"));
    assert_eq!(dev(&dirs.join("cdir-1")), dev(&dirs), "the container's directory is elsewhere");
    c.destroy().await.expect("destroy");
    rt.shutdown();
    if disk {
        assert!(!dirs.exists(), "the container directory outlived the node's shutdown");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(!mounts.contains(&dirs.display().to_string()), "still mounted:\n{mounts}");
    }

    // An earlier build's containers keep their paths: no tmpfs over them.
    let earlier = tempfile::tempdir().expect("tmp");
    let kept = earlier.path().join("c/from-an-earlier-build");
    std::fs::create_dir_all(&kept).expect("mkdir");
    let rt = runtime_named(earlier.path(), "cdir2", false);
    assert!(kept.exists(), "an earlier build's container directory was hidden");
    assert_eq!(on_tmpfs(&kept), !disk);
    rt.shutdown();
}

/// A destroyed container's cgroups are kept, emptied and reset, and the next create takes
/// them (the same kernel cgroups, renamed) with its own limits, whatever the last container's
/// were; one that had an OOM kill is removed instead; spares are no container's strays, and
/// go at shutdown.
#[tokio::test]
async fn a_destroyed_containers_cgroups_are_reset_and_taken_by_the_next_create() {
    use std::os::unix::fs::MetadataExt;
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_named(run.path(), "spare", false);
    let parent = format!("brig-test-spare-{}", std::process::id());
    let dir = |controller: &str, name: &str| {
        PathBuf::from("/sys/fs/cgroup").join(controller).join(&parent).join(name)
    };
    let read = |controller: &str, name: &str, file: &str| {
        let path = dir(controller, name).join(file);
        let text = std::fs::read_to_string(&path);
        text.unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_string()
    };
    let inode = |name: &str| std::fs::metadata(dir("memory", name)).expect("cgroup").ino();
    let controllers = ["memory", "pids", "cpu", "cpuacct", "freezer"];
    let has_burst = |name: &str| dir("cpu", name).join("cpu.cfs_burst_us").exists();

    let mut spec = busybox_spec("first");
    spec.limits =
        CgroupLimits { memory_bytes: Some(64 << 20), pids: Some(64), cpu_millis: Some(1000) };
    let c = rt.create(&spec).await.expect("create");
    // 24 MiB through the container's memory (its upper tmpfs), and some CPU.
    let script = "head -c 25165824 /dev/zero > /big && rm /big && i=0 && \
                  while [ $i -lt 3000 ]; do i=$((i+1)); done";
    let (status, _, err) = run_capture(&c, &["sh", "-c", script]).await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    let peak: u64 = read("memory", "first", "memory.max_usage_in_bytes").parse().expect("peak");
    assert!(peak >= 24 << 20, "peak {peak}");
    let first = inode("first");
    c.destroy().await.expect("destroy");

    assert_eq!(rt.spare_cgroups(), 1);
    for controller in controllers {
        assert!(!dir(controller, "first").exists(), "{controller}: the old name is gone");
        assert_eq!(read(controller, "spare-0", "cgroup.procs"), "", "{controller}");
        let children = std::fs::read_dir(dir(controller, "spare-0")).expect("spare");
        let children = children.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir()));
        assert_eq!(children.count(), 0, "{controller}: exec cgroups are gone");
    }
    let peak: u64 = read("memory", "spare-0", "memory.max_usage_in_bytes").parse().expect("peak");
    assert!(peak < 24 << 20, "the peak is reset: {peak}");
    assert_eq!(read("cpuacct", "spare-0", "cpuacct.usage"), "0");
    assert_eq!(read("memory", "spare-0", "memory.failcnt"), "0");
    let live = std::collections::HashSet::new();
    let strays = rt.stray_containers(&live, std::time::Duration::ZERO);
    assert!(strays.is_empty(), "a spare is no stray: {strays:?}");

    // The next create takes it, with limits of its own: a smaller CPU quota than the burst
    // the spare holds (the burst goes first), no pids limit.
    let mut spec = busybox_spec("second");
    spec.limits = CgroupLimits { memory_bytes: Some(32 << 20), pids: None, cpu_millis: Some(10) };
    let c = rt.create(&spec).await.expect("create from the spare");
    assert_eq!(inode("second"), first, "the same kernel cgroup");
    assert_eq!(rt.spare_cgroups(), 0);
    assert!(!dir("memory", "spare-0").exists());
    assert_eq!(read("memory", "second", "memory.limit_in_bytes"), (32u64 << 20).to_string());
    assert_eq!(read("pids", "second", "pids.max"), "max");
    assert_eq!(read("cpu", "second", "cpu.cfs_period_us"), "500000");
    assert_eq!(read("cpu", "second", "cpu.cfs_quota_us"), "5000");
    if has_burst("second") {
        assert_eq!(read("cpu", "second", "cpu.cfs_burst_us"), "5000");
    }
    let (status, out, err) = run_capture(&c, &["echo", "ok"]).await;
    assert_eq!((status, out.as_str()), (Some(ExitInfo::Code(0)), "ok\n"), "{err}");
    c.destroy().await.expect("destroy");

    // Again, by a container with no CPU limit: the quota goes.
    let mut spec = busybox_spec("third");
    spec.limits = CgroupLimits { memory_bytes: Some(32 << 20), pids: Some(64), cpu_millis: None };
    let c = rt.create(&spec).await.expect("create from the spare");
    assert_eq!(inode("third"), first, "the same kernel cgroup");
    assert_eq!(read("cpu", "third", "cpu.cfs_quota_us"), "-1");
    assert_eq!(read("cpu", "third", "cpu.shares"), "1024");
    assert_eq!(read("pids", "third", "pids.max"), "64");

    // An OOM kill: the cgroup that had it is removed, not kept.
    let (status, _, _) = run_capture(&c, &["sh", "-c", "x=a; while true; do x=$x$x; done"]).await;
    assert_eq!(status, Some(ExitInfo::Signal(libc::SIGKILL)));
    c.destroy().await.expect("destroy");
    assert_eq!(rt.spare_cgroups(), 0, "a cgroup with an OOM kill is not kept");
    for controller in controllers {
        assert!(!dir(controller, "third").exists(), "{controller}");
    }

    // Kept again, then removed with the node.
    let c = rt.create(&busybox_spec("fourth")).await.expect("create");
    c.destroy().await.expect("destroy");
    assert_eq!(rt.spare_cgroups(), 1);
    rt.shutdown();
    for controller in controllers {
        let parent_dir = PathBuf::from("/sys/fs/cgroup").join(controller).join(&parent);
        assert!(!parent_dir.exists(), "{controller}: {}", parent_dir.display());
    }
}

/// No more spares are kept than the bound, even when containers are destroyed at once; the
/// rest are removed.
#[tokio::test]
async fn spare_cgroups_stay_within_their_bound() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_with_spares(run.path(), "bound", false, 2);
    let parent = format!("brig-test-bound-{}", std::process::id());
    let mut made = Vec::new();
    for i in 0..4 {
        made.push(rt.create(&busybox_spec(&format!("b{i}"))).await.expect("create"));
    }
    let destroys = made.iter().map(|c| c.destroy());
    for done in futures::future::join_all(destroys).await {
        done.expect("destroy");
    }
    assert_eq!(rt.spare_cgroups(), 2);
    let memory = PathBuf::from("/sys/fs/cgroup/memory").join(&parent);
    let left = child_cgroups("memory", &parent);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|n| n.starts_with("spare-")), "{left:?}");
    drop(made);
    rt.shutdown();
    assert!(!memory.exists());
}

/// Names of the cgroups under the test runtime's `parent` in the v1 `controller` hierarchy,
/// sorted (none if the parent is gone).
fn child_cgroups(controller: &str, parent: &str) -> Vec<String> {
    let dir = PathBuf::from("/sys/fs/cgroup").join(controller).join(parent);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A spare not taken within the idle time is removed by the node's trim thread, in every
/// hierarchy; one taken in time serves its create as before.
#[tokio::test]
async fn spare_cgroups_left_idle_are_removed() {
    let run = tempfile::tempdir().expect("tmp");
    let rt = runtime_with_idle_spares(run.path(), "idle", false, 8, 2);
    let parent = format!("brig-test-idle-{}", std::process::id());
    let first = rt.create(&busybox_spec("i0")).await.expect("create");
    first.destroy().await.expect("destroy");
    assert_eq!(rt.spare_cgroups(), 1);
    // Taken within the idle time: the next create gets it.
    let second = rt.create(&busybox_spec("i1")).await.expect("create");
    assert_eq!(rt.spare_cgroups(), 0, "the spare was taken");
    second.destroy().await.expect("destroy");
    let spares = child_cgroups("memory", &parent);
    assert!(spares.len() == 1 && spares[0].starts_with("spare-"), "{spares:?}");
    // Left idle: gone within the idle time and a tick or two, in every hierarchy.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rt.spare_cgroups() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(rt.spare_cgroups(), 0, "an idle spare is still kept after 10 s");
    for controller in ["memory", "cpu", "pids", "freezer"] {
        let left = child_cgroups(controller, &parent);
        assert!(!left.iter().any(|n| n.starts_with("spare-")), "{controller}: {left:?}");
    }
    drop((first, second));
    rt.shutdown();
}
