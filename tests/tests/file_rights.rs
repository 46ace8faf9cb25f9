//! The files API acts with the sandbox's rights, not the node's: a container's file
//! operations run in a process of the container (its user namespace, cgroups, root and
//! confinement), so what its own root may not do cannot be done through the API, and an
//! upload's memory is the sandbox's.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use brig_sdk::{ErrorCode, Sandbox, SandboxOptions};
use brig_tests::{image, Daemon};

async fn shell(sb: &Sandbox, script: &str) -> brig_sdk::ExecOutput {
    sb.exec(["sh", "-c", script]).await.expect("exec")
}

/// The host path of `path` inside `sb`: through the root of a process of the sandbox, found by
/// a marker file only this sandbox has.
async fn host_path(sb: &Sandbox, path: &str) -> String {
    let marker = format!("marker-{}", sb.id());
    shell(sb, &format!("echo {marker} > /tmp/.marker; sleep 60 >/dev/null 2>&1 &")).await;
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let root = entry.path().join("root");
        let found = std::fs::read_to_string(root.join("tmp/.marker"));
        if found.is_ok_and(|text| text.trim() == marker) {
            return format!("{}{path}", root.display());
        }
    }
    panic!("no process of sandbox {} found", sb.id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_its_own_root_may_not_read_cannot_be_read_through_the_api() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let sb = client.create(SandboxOptions::container(&image("busybox"))).await.expect("create");
    sb.write_file("/workspace/mine.txt", b"ours\n").await.expect("write");

    // A file owned by a host user the sandbox's user namespace does not map (as a host
    // volume's file could be), mode 0600: container root has no capability over it.
    let secret = host_path(&sb, "/workspace/secret.txt").await;
    std::fs::write(&secret, b"host only\n").expect("plant");
    std::os::unix::fs::chown(&secret, Some(4242), Some(4242)).expect("chown");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    let inside = shell(&sb, "cat /workspace/secret.txt").await;
    assert_ne!(
        inside.result.exit_code,
        Some(0),
        "the sandbox's root read it: {}",
        inside.stdout_text()
    );

    let read = sb.read_file("/workspace/secret.txt").await.expect_err("read through the API");
    assert_eq!(read.code(), Some(ErrorCode::PermissionDenied), "{read:?}");
    let write = sb.write_file("/workspace/secret.txt", b"x").await.expect_err("write");
    assert_eq!(write.code(), Some(ErrorCode::PermissionDenied), "{write:?}");
    assert_eq!(std::fs::read(&secret).expect("still there"), b"host only\n");

    // What the sandbox owns still moves both ways, and new files are container root's.
    assert_eq!(sb.read_file("/workspace/mine.txt").await.expect("read"), b"ours\n");
    let owner = shell(&sb, "stat -c %u:%g /workspace/mine.txt").await;
    assert_eq!(owner.stdout_text().trim(), "0:0");
    let mine = host_path(&sb, "/workspace/mine.txt").await;
    assert_ne!(std::fs::metadata(&mine).expect("stat").uid(), 0, "owned by host root");
    sb.destroy().await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_is_charged_to_the_sandbox_and_a_full_disk_leaves_it_running() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let opts = SandboxOptions::container(&image("busybox")).memory_mib(192).disk_mib(1024);
    let sb = client.create(opts).await.expect("create");
    sb.write_file("/workspace/keep.txt", b"intact\n").await.expect("write");
    let before = sb.status().await.expect("status").usage.expect("usage").memory_bytes;

    let mib = vec![7u8; 1 << 20];
    let data: Vec<u8> = mib.repeat(64);
    sb.write_file("/workspace/64m.bin", &data).await.expect("64 MiB upload");
    let after = sb.status().await.expect("status").usage.expect("usage").memory_bytes;
    // Pages of a file on a writable layer in memory, or page cache of one on disk: either
    // way the sandbox's, not the node's.
    assert!(after >= before + (48 << 20), "upload not charged: {before} -> {after}");

    // More than the sandbox's memory: on a writable layer in memory that is refused (a typed
    // error); on disk it fits. Either way the sandbox goes on and its other files are intact.
    let big: Vec<u8> = mib.repeat(320);
    match sb.write_file("/workspace/320m.bin", &big).await {
        Ok(n) => assert_eq!(n, big.len() as u64),
        Err(e) => assert!(
            matches!(e.code(), Some(ErrorCode::Unavailable | ErrorCode::ResourceExhausted)),
            "{e:?}"
        ),
    }
    // The sandbox filling its disk itself: the writer gets ENOSPC, nothing is killed.
    let fill = shell(&sb, "dd if=/dev/zero of=/workspace/fill bs=1M 2>&1; echo rc=$?").await;
    let text = fill.stdout_text();
    assert!(text.contains("No space left") && !text.contains("rc=0"), "{text}");
    let alive = shell(&sb, "cat /workspace/keep.txt").await;
    assert_eq!(alive.stdout_text(), "intact\n", "{alive:?}");
    sb.destroy().await.expect("destroy");
}
