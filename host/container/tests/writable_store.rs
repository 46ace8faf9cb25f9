//! Writable layers on the node's disk-backed store (an XFS image with project quotas) against
//! the real kernel: a full disk is ENOSPC for the writer, not an OOM kill of the container,
//! and a layer is known again after a restart and gone after a destroy. Needs root, loop
//! devices and `mkfs.xfs` (a kernel with XFS quotas) or `mkfs.ext4` (an image per layer).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use brig_container::runtime::{ContainerSpec, Runtime, RuntimeConfig, SpawnRequest};
use brig_container::shim_proto::ExitInfo;
use brig_container::writable_store::{StoreConfig, StoreKind};
use brig_hostkit::cgroup::CgroupLimits;
use tokio::io::AsyncReadExt;

fn artifacts() -> PathBuf {
    std::env::var_os("BRIG_ARTIFACTS").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("../../artifacts")
    })
}

/// Detaches the store's mount when the test ends, passed or not (its loop device goes with
/// the last user of the file system).
struct StoreMount(PathBuf);

impl Drop for StoreMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0.join("writable"), nix::mount::MntFlags::MNT_DETACH);
        let _ = nix::mount::umount2(&self.0.join("c"), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Removes a test's cgroup parent (`brig-test-<tag>-<pid>`) from every hierarchy when the test
/// ends, passed or not: a container's cgroups may still be on their way out when the runtime's
/// shutdown tries to remove its parent.
struct TestCgroups(String);

impl TestCgroups {
    fn new(tag: &str) -> TestCgroups {
        TestCgroups(format!("brig-test-{tag}-{}", std::process::id()))
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
        for hierarchy in hierarchies.flatten() {
            let dir = hierarchy.path().join(&self.0);
            for _ in 0..50 {
                if !dir.exists() || remove_cgroup_tree(&dir).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

/// Removes a cgroup and its children, deepest first (a cgroup directory goes with `rmdir`).
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}

fn runtime(run: &Path, tag: &str, survive_node: bool) -> Runtime {
    let rt = Runtime::new(RuntimeConfig {
        run_dir: run.to_owned(),
        shim_path: PathBuf::from(env!("CARGO_BIN_EXE_brig-shim")),
        id_base: 100_000,
        cgroup_root: "/sys/fs/cgroup".into(),
        cgroup_parent: format!("brig-test-{tag}-{}", std::process::id()),
        survive_node,
        spool_dir: None,
        cpu_min_quota_us: brig_hostkit::cgroup::DEFAULT_CPU_MIN_QUOTA_US,
        spare_cgroups: 0,
        spare_cgroups_idle_secs: 0,
        writable_store: Some(StoreConfig {
            image: run.join("state/writable.xfs"),
            size_bytes: 2 << 30,
            images_fallback: true,
        }),
    })
    .expect("runtime");
    assert!(rt.writable_store().is_some(), "the store is mounted (mkfs.xfs, loop devices, root)");
    rt
}

fn spec(name: &str, memory: u64, disk: u64) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        hostname: "sandbox".into(),
        layers: vec![brig_container::rootfs::LayerSource::image(
            artifacts().join("images/busybox.erofs"),
        )],
        limits: CgroupLimits { memory_bytes: Some(memory), pids: Some(128), cpu_millis: None },
        disk_bytes: disk,
        seed: None,
        protect: Default::default(),
    }
}

async fn run_capture(
    c: &brig_container::runtime::Container,
    script: &str,
) -> (Option<ExitInfo>, String, String) {
    let (in_r, in_w) = nix::unistd::pipe().expect("pipe");
    let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
    let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
    let argv = ["sh", "-c", script].iter().map(|s| s.to_string()).collect();
    let req = SpawnRequest { argv, ..Default::default() };
    let mut p = c
        .spawn(req, [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()], &[], &[], None)
        .await
        .expect("spawn");
    drop((in_r, in_w, out_w, err_w));
    let (mut out, mut err) = (String::new(), String::new());
    let mut out_r = tokio::fs::File::from_std(std::fs::File::from(out_r));
    let mut err_r = tokio::fs::File::from_std(std::fs::File::from(err_r));
    let (o, e) = tokio::join!(out_r.read_to_string(&mut out), err_r.read_to_string(&mut err));
    o.expect("stdout");
    e.expect("stderr");
    (p.wait().await, out, err)
}

/// A disk twice the memory limit, filled: the writer gets ENOSPC, the container lives on with
/// its earlier file intact, `df` shows the disk's size; the destroy takes the layer and its
/// quota.
#[tokio::test]
async fn a_full_disk_is_enospc_not_an_oom_kill() {
    let _cgroups = TestCgroups::new("wsfull");
    let run = tempfile::tempdir().expect("tmp");
    let _mount = StoreMount(run.path().to_owned());
    let rt = runtime(run.path(), "wsfull", false);
    let store = rt.writable_store().expect("store").clone();
    let c = rt.create(&spec("full", 32 << 20, 64 << 20)).await.expect("create");
    let quota = store.kind() == StoreKind::ProjectQuota;
    eprintln!("store: {:?}", store.kind());
    let id = store.project_of("full");
    if quota {
        let (limit, _) = store.quota_of(id.expect("an id")).expect("quota").expect("a quota");
        assert_eq!(limit, 64 << 20);
    }

    let (status, _, err) = run_capture(&c, "echo intact > /keep.txt && sync").await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    let (status, out, err) =
        run_capture(&c, "dd if=/dev/zero of=/big bs=1M count=200; echo rc=$?").await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "the writer lives: {out} {err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!out.contains("rc=0"), "{out}");
    assert_eq!(c.new_oom_kills(), 0, "no OOM kill");
    let (status, out, err) = run_capture(&c, "cat /keep.txt; df -k / | tail -1").await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("intact"));
    let total_kib: u64 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("df's size");
    // The quota, or the image's size less ext4's metadata.
    assert!(total_kib <= 64 << 10 && total_kib > 56 << 10, "df shows the disk's size: {out}");
    // Room again after a remove.
    let (status, _, err) = run_capture(&c, "rm /big && echo more > /more.txt").await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    assert!(c.is_alive());

    let layer = store.dir_of("full");
    assert!(layer.exists());
    c.destroy().await.expect("destroy");
    assert!(!layer.exists(), "the layer is removed");
    assert_eq!(store.project_of("full"), None);
    if let Some(id) = id {
        let quota = store.quota_of(id).expect("quota");
        assert!(quota.is_none_or(|(limit, _)| limit == 0), "the quota is cleared: {quota:?}");
    }
    let point = store.point().to_owned();
    drop(store);
    rt.shutdown();
    assert!(!point.exists(), "the empty store is unmounted and removed");
}

/// A kept container's layer survives the node's restart with its project id (the store is
/// found mounted); an orphan's layer and quota are removed; ids of layers from before are not
/// handed out again.
#[tokio::test]
async fn layers_are_known_again_after_a_restart() {
    let _cgroups = TestCgroups::new("wsrestart");
    let run = tempfile::tempdir().expect("tmp");
    let _mount = StoreMount(run.path().to_owned());
    let rt = runtime(run.path(), "wsrestart", true);
    let keeper = rt.create(&spec("keeper", 64 << 20, 32 << 20)).await.expect("create");
    let orphan = rt.create(&spec("orphan", 64 << 20, 32 << 20)).await.expect("create");
    let store = rt.writable_store().expect("store").clone();
    let (keeper_id, orphan_id) = (store.project_of("keeper"), store.project_of("orphan"));
    let (status, _, err) = run_capture(&keeper, "echo kept > /state").await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    drop((keeper, orphan, store));
    drop(rt);

    let rt = runtime(run.path(), "wsrestart", true);
    let store = rt.writable_store().expect("store").clone();
    assert_eq!(store.project_of("keeper"), keeper_id, "the id is read back");
    assert_eq!(store.project_of("orphan"), orphan_id);
    assert_eq!(rt.remove_orphans(&["keeper".to_string()]), 1);
    assert!(!store.dir_of("orphan").exists());
    if let Some(id) = orphan_id {
        let quota = store.quota_of(id).expect("quota");
        assert!(quota.is_none_or(|(limit, _)| limit == 0), "{quota:?}");
    }
    let keeper = rt.attach("keeper").await.expect("attach");
    let (status, out, err) = run_capture(&keeper, "cat /state").await;
    assert_eq!(status, Some(ExitInfo::Code(0)), "{err}");
    assert_eq!(out, "kept\n");
    let fresh = rt.create(&spec("fresh", 64 << 20, 32 << 20)).await.expect("create");
    if store.kind() == StoreKind::ProjectQuota {
        assert!(store.project_of("fresh") != keeper_id, "ids do not collide");
    }
    fresh.destroy().await.expect("destroy");
    keeper.destroy().await.expect("destroy");
    assert!(store.names().is_empty(), "{:?}", store.names());
    drop(store);
    rt.shutdown();
}

/// The stray scan finds a layer no live container claims, and removing the stray takes it.
#[tokio::test]
async fn a_stray_containers_layer_is_found_and_removed() {
    let _cgroups = TestCgroups::new("wsstray");
    let run = tempfile::tempdir().expect("tmp");
    let _mount = StoreMount(run.path().to_owned());
    let rt = runtime(run.path(), "wsstray", true);
    let c = rt.create(&spec("stray", 64 << 20, 32 << 20)).await.expect("create");
    let store = rt.writable_store().expect("store").clone();
    let layer = store.dir_of("stray");
    drop(c);
    drop(rt);

    let rt = runtime(run.path(), "wsstray", true);
    let strays = rt.stray_containers(&Default::default(), std::time::Duration::ZERO);
    let found = strays.iter().find(|s| s.name == "stray").expect("the stray is found");
    let line = format!("writable layer {}", layer.display());
    assert!(found.parts.contains(&line), "{found:?}");
    rt.remove_stray_container("stray");
    assert!(!layer.exists(), "the stray's layer is removed");
    let store = rt.writable_store().expect("store").clone();
    assert!(store.names().is_empty(), "{:?}", store.names());
    drop(store);
    rt.shutdown();
}
