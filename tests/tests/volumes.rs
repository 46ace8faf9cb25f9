//! Volumes through the native SDK: made, written without a sandbox, mounted into several
//! containers at once (read-write and read-only), held to their quota by the kernel, kept
//! across a daemon restart, refused to delete while mounted, and confined (a link or a FIFO a
//! sandbox plants in a volume never reaches the host or hangs the node).

use brig_sdk::{ErrorCode, Sandbox, SandboxOptions, VolumeAttrs};
use brig_tests::{image, Daemon};

async fn shell(sb: &Sandbox, script: &str) -> brig_sdk::ExecOutput {
    sb.exec(["sh", "-c", script]).await.expect("exec")
}

fn volume_mounts(daemon: &Daemon) -> Vec<String> {
    let prefix = format!("{}/", daemon.run_dir().join("volumes").display());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_shared_by_sandboxes_held_to_its_quota_and_outlives_them() {
    let mut daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");

    let made = client.create_volume("shared", Some(32)).await.expect("create");
    assert!(made.id.starts_with("vol-"), "{made:?}");
    assert_eq!(made.quota_bytes, 32 << 20);
    let again = client.create_volume("shared", None).await.expect_err("same name");
    assert_eq!(again.code(), Some(ErrorCode::AlreadyExists), "{again:?}");
    for bad in ["", "a/b", ".hidden"] {
        let e = client.create_volume(bad, None).await.expect_err("bad name");
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{bad:?}: {e:?}");
    }
    let e = client.create_volume("huge", Some(1 << 30)).await.expect_err("bad quota");
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e:?}");

    // Written with no sandbox, owned as asked.
    let vol = client.volume("shared");
    let attrs = VolumeAttrs { mode: Some(0o640), uid: Some(1000), gid: Some(1000) };
    let entry = vol.upload("/in/seed.txt", &b"seeded\n"[..], attrs).await.expect("write");
    assert_eq!((entry.size, entry.mode, entry.uid, entry.gid), (7, 0o640, 1000, 1000));
    let listed = vol.list("/", 2).await.expect("list");
    let paths: Vec<&str> = listed.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"/in") && paths.contains(&"/in/seed.txt"), "{paths:?}");

    // Two sandboxes at once: one writes, one only reads.
    let image = image("busybox");
    let writer = client
        .create(SandboxOptions::container(&image).volume("shared", "/data", false))
        .await
        .expect("create the writer");
    let reader = client
        .create(SandboxOptions::container(&image).volume(&made.id, "/mnt/ro", true))
        .await
        .expect("create the reader");
    let seen = shell(&writer, "cat /data/in/seed.txt; stat -c %u:%g:%a /data/in/seed.txt").await;
    assert_eq!(seen.stdout_text(), "seeded\n1000:1000:640\n");
    shell(&writer, "echo from-writer > /data/out.txt").await;
    let read = shell(&reader, "cat /mnt/ro/out.txt").await;
    assert_eq!(read.stdout_text(), "from-writer\n");
    let refused = shell(&reader, "echo x > /mnt/ro/nope.txt").await;
    assert_ne!(refused.result.exit_code, Some(0), "a read-only mount took a write");
    assert_eq!(vol.read_file("/out.txt").await.expect("read"), b"from-writer\n");
    assert_eq!(vol.stat("/out.txt").await.expect("stat").uid, 0, "the sandbox's root");
    let status = writer.status().await.expect("status");
    assert_eq!(status.volumes.len(), 1);
    assert_eq!(status.volumes[0].volume, made.id);

    // The quota is the kernel's: a writer in a sandbox runs out at it.
    let full = shell(&writer, "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1").await;
    assert_ne!(full.result.exit_code, Some(0), "wrote past the quota");
    assert!(full.stdout_text().contains("No space left"), "{}", full.stdout_text());
    let info = client.volume_info("shared").await.expect("info");
    assert!(info.used_bytes <= info.quota_bytes, "{info:?}");
    assert_eq!(info.mounted_by.len(), 2, "{info:?}");
    shell(&writer, "rm /data/big").await;

    // Planted by an agent: a link out of the volume and a FIFO. The volume's file operations
    // resolve inside it and open regular files only.
    shell(&writer, "ln -s /etc/hostname /data/link; mkfifo /data/fifo").await;
    let link = vol.read_file("/link").await.expect_err("a link out of the volume");
    assert_eq!(link.code(), Some(ErrorCode::NotFound), "{link:?}");
    let fifo = tokio::time::timeout(std::time::Duration::from_secs(10), vol.read_file("/fifo"))
        .await
        .expect("a FIFO answers at once")
        .expect_err("a FIFO is not a file");
    assert_eq!(fifo.code(), Some(ErrorCode::BadRequest), "{fifo:?}");
    assert_eq!(vol.stat("/link").await.expect("stat").target.as_deref(), Some("/etc/hostname"));

    // In use: not deleted, and the refusal names who mounts it.
    let busy = client.delete_volume("shared").await.expect_err("in use");
    assert_eq!(busy.code(), Some(ErrorCode::Conflict), "{busy:?}");
    assert!(busy.to_string().contains(writer.id()), "{busy}");

    // Only the container tier on the node's kernel mounts volumes.
    let wrong = client
        .create(SandboxOptions::fncall().volume("shared", "/data", false))
        .await
        .expect_err("fncall with a volume");
    assert_eq!(wrong.code(), Some(ErrorCode::BadRequest), "{wrong:?}");
    let missing = client
        .create(SandboxOptions::container(&image).volume("nope", "/data", false))
        .await
        .expect_err("no such volume");
    assert_eq!(missing.code(), Some(ErrorCode::NotFound), "{missing:?}");

    // A restarted daemon still has the volume and its files.
    writer.destroy().await.expect("destroy");
    reader.destroy().await.expect("destroy");
    daemon.restart().expect("restart");
    let client = daemon.client().await.expect("reconnect");
    assert_eq!(
        client.volume("shared").read_file("/out.txt").await.expect("kept"),
        b"from-writer\n"
    );
    let list = client.volumes().await.expect("list");
    assert_eq!(list.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["shared"]);
    let third = client
        .create(SandboxOptions::container(&image).volume("shared", "/data", false))
        .await
        .expect("mount after the restart");
    assert_eq!(shell(&third, "cat /data/in/seed.txt").await.stdout_text(), "seeded\n");
    third.destroy().await.expect("destroy");

    client.delete_volume("shared").await.expect("delete");
    let gone = client.volume_info("shared").await.expect_err("deleted");
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone:?}");
    assert!(volume_mounts(&daemon).is_empty(), "{:?}", volume_mounts(&daemon));
    let images = std::fs::read_dir(daemon.state_dir().join("volumes")).expect("dir").count();
    assert_eq!(images, 0, "a deleted volume's image and record go");

    // A volume a sandbox never mounted is unmounted when the daemon stops.
    client.create_volume("left", None).await.expect("create");
    client.volume("left").write_file("/x", b"x").await.expect("write");
    assert_eq!(volume_mounts(&daemon).len(), 1);
    daemon.stop().expect("stop");
    assert!(volume_mounts(&daemon).is_empty(), "{:?}", volume_mounts(&daemon));
}

fn brig(daemon: &Daemon, args: &[&str]) -> String {
    let out = std::process::Command::new(brig_tests::binary("brig"))
        .arg("--state-dir")
        .arg(daemon.state_dir())
        .args(args)
        .output()
        .expect("brig");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "brig {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_makes_fills_mounts_and_deletes_a_volume() {
    let daemon = Daemon::start().expect("brigd");
    let id = brig(&daemon, &["volume", "create", "cli-vol", "--quota-mib", "64"]);
    assert!(id.trim().starts_with("vol-"), "{id}");
    let local = tempfile::NamedTempFile::new().expect("temp");
    std::fs::write(local.path(), b"from the cli\n").expect("write");
    let path = local.path().to_str().expect("utf-8");
    brig(&daemon, &["volume", "put", "cli-vol", path, "/docs/a.txt", "--mode", "600"]);
    assert_eq!(brig(&daemon, &["volume", "get", "cli-vol", "/docs/a.txt"]), "from the cli\n\n");
    let files = brig(&daemon, &["volume", "files", "cli-vol", "/", "--depth", "2"]);
    assert!(files.contains("600\t0:0\t13\t/docs/a.txt"), "{files}");
    let sandbox = brig(
        &daemon,
        &[
            "create",
            "--tier",
            "container",
            "--image",
            &image("busybox"),
            "--volume",
            "cli-vol:/v:ro",
        ],
    );
    let client = daemon.client().await.expect("connect");
    let sb = client.sandbox(sandbox.trim());
    assert_eq!(shell(&sb, "cat /v/docs/a.txt").await.stdout_text(), "from the cli\n");
    let listed = brig(&daemon, &["volume", "ls"]);
    assert!(listed.contains("cli-vol") && listed.contains("1 mounted"), "{listed}");
    sb.destroy().await.expect("destroy");
    brig(&daemon, &["volume", "rm", "cli-vol"]);
    assert!(!brig(&daemon, &["volume", "ls"]).contains("cli-vol"));
}
