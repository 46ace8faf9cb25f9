//! The runtime against the real kernel: namespaces, cgroups, overlay, shim. Needs root.

use std::os::fd::AsFd;
use std::path::PathBuf;

use brig_container::cgroup::CgroupLimits;
use brig_container::runtime::{ContainerSpec, Runtime, RuntimeConfig, SpawnRequest};
use brig_container::shim_proto::ExitInfo;
use tokio::io::AsyncReadExt;

fn artifacts() -> PathBuf {
    std::env::var_os("BRIG_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../artifacts"))
}

fn runtime(run: &std::path::Path) -> Runtime {
    Runtime::new(RuntimeConfig {
        run_dir: run.to_owned(),
        shim_path: PathBuf::from(env!("CARGO_BIN_EXE_brig-shim")),
        id_base: 100_000,
        cgroup_root: "/sys/fs/cgroup".into(),
        cgroup_parent: format!("brig-test-{}", std::process::id()),
    })
    .expect("runtime")
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
    let mut p =
        c.spawn(req, [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()], &[]).await.expect("spawn");
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
