//! The layer store end to end through brig-sdk: OCI import with whiteouts, three-layer
//! environments, independent versions, damage detection, S3, and checkpoints.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use brig_sdk::{Client, Cmd, ErrorCode, ImageSource, SandboxOptions};
use brig_tests::{artifacts, Daemon};
use sha2::{Digest, Sha256};

fn write(dir: &Path, rel: &str, bytes: &[u8]) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, bytes).expect("write");
}

fn run(cmd: &mut Command) {
    let status = cmd.status().expect("spawn");
    assert!(status.success(), "{cmd:?}");
}

/// A gzipped layer tarball of `dir`; returns (path, sha256 hex).
fn layer_tar(dir: &Path, out: &Path) -> String {
    run(Command::new("tar").arg("-czf").arg(out).arg("-C").arg(dir).arg("."));
    hex::encode(Sha256::digest(std::fs::read(out).expect("read")))
}

/// Builds an image whose second layer deletes `a/gone` (whiteout) and empties `b` (opaque),
/// as both an OCI layout archive and a `docker save` archive.
fn oci_archives(tmp: &Path) -> (PathBuf, PathBuf) {
    let l1 = tmp.join("l1");
    write(&l1, "a/keep", b"keep\n");
    write(&l1, "a/gone", b"gone\n");
    write(&l1, "b/old", b"old\n");
    write(&l1, "bin/hello", b"#!/bin/sh\necho hello from oci\n");
    let l2 = tmp.join("l2");
    write(&l2, "a/.wh.gone", b"");
    write(&l2, "b/.wh..wh..opq", b"");
    write(&l2, "b/new", b"new\n");
    // OCI image layout.
    let oci = tmp.join("oci");
    std::fs::create_dir_all(oci.join("blobs/sha256")).expect("mkdir");
    let d1 = layer_tar(&l1, &tmp.join("l1.tgz"));
    let d2 = layer_tar(&l2, &tmp.join("l2.tgz"));
    std::fs::copy(tmp.join("l1.tgz"), oci.join("blobs/sha256").join(&d1)).expect("copy");
    std::fs::copy(tmp.join("l2.tgz"), oci.join("blobs/sha256").join(&d2)).expect("copy");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{d1}"), "size": 0 },
        "layers": [
            { "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": format!("sha256:{d1}"), "size": 0 },
            { "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": format!("sha256:{d2}"), "size": 0 },
        ]
    });
    let mbytes = serde_json::to_vec(&manifest).expect("json");
    let md = hex::encode(Sha256::digest(&mbytes));
    std::fs::write(oci.join("blobs/sha256").join(&md), &mbytes).expect("write");
    std::fs::write(oci.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [{ "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{md}"), "size": mbytes.len() }] });
    std::fs::write(oci.join("index.json"), serde_json::to_vec(&index).expect("json"))
        .expect("write");
    let oci_tar = tmp.join("image-oci.tar");
    run(Command::new("tar").arg("-cf").arg(&oci_tar).arg("-C").arg(&oci).arg("."));
    // docker save.
    let docker = tmp.join("docker");
    for (id, src) in [("l1", "l1.tgz"), ("l2", "l2.tgz")] {
        std::fs::create_dir_all(docker.join(id)).expect("mkdir");
        std::fs::copy(tmp.join(src), docker.join(id).join("layer.tar")).expect("copy");
    }
    std::fs::write(
        docker.join("manifest.json"),
        br#"[{"Config":"c.json","RepoTags":["t:1"],"Layers":["l1/layer.tar","l2/layer.tar"]}]"#,
    )
    .expect("write");
    let docker_tar = tmp.join("image-docker.tar");
    run(Command::new("tar").arg("-cf").arg(&docker_tar).arg("-C").arg(&docker).arg("."));
    (oci_tar, docker_tar)
}

async fn busybox_base(client: &Client, name: &str) -> String {
    let layer = client
        .import_image(name, None, ImageSource::Erofs(artifacts().join("images/busybox.erofs")))
        .await
        .expect("import busybox");
    format!("{}@{}", layer.name, layer.version)
}

async fn sh(client: &Client, image: &str, script: &str) -> (String, Option<i32>) {
    let sb = client.create(SandboxOptions::container(image)).await.expect("create");
    let out =
        sb.exec_with(Cmd::shell(script).timeout(Duration::from_secs(30))).await.expect("exec");
    sb.destroy().await.expect("destroy");
    (out.stdout_text() + &out.stderr_text(), out.result.exit_code)
}

#[tokio::test]
async fn oci_imports_layers_compose_and_versions_move_independently() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let tmp = tempfile::tempdir().expect("tmp");
    let base = busybox_base(&client, "base/busybox").await;

    let (oci_tar, docker_tar) = oci_archives(tmp.path());
    for (name, archive) in [("workspace/oci", oci_tar), ("workspace/docker", docker_tar)] {
        let layer =
            client.import_image(name, None, ImageSource::Oci(archive)).await.expect("import oci");
        let image = format!("{base}+{}@{}", layer.name, layer.version);
        let (out, code) = sh(&client, &image, "ls /a /b; sh /bin/hello").await;
        assert_eq!(code, Some(0), "{out}");
        assert_eq!(
            out, "/a:\nkeep\n\n/b:\nnew\nhello from oci\n",
            "whiteouts not honoured for {name}"
        );
    }

    // Three independently versioned layers, composed through an environment.
    let ws = tmp.path().join("ws");
    write(&ws, "workspace/repo/app.py", b"print('app v1')\n");
    write(&ws, "workspace/repo/data.bin", &vec![7u8; 600_000]);
    let tk1 = tmp.path().join("tk1");
    write(&tk1, "opt/harness/VERSION", b"1\n");
    write(&tk1, "workspace/repo/app.py", b"print('patched by toolkit')\n");
    let ws_layer =
        client.import_image("workspace/flask", None, ImageSource::Dir(ws)).await.expect("ws");
    let tk_layer =
        client.import_image("toolkit/harness", None, ImageSource::Dir(tk1)).await.expect("tk");
    client
        .create_env("flask-task", &[&base, "workspace/flask@1", "toolkit/harness@1"])
        .await
        .expect("env");
    let (out, _) = sh(&client, "env:flask-task", "cat /opt/harness/VERSION /workspace/repo/app.py; wc -c < /workspace/repo/data.bin; ls /bin/busybox").await;
    assert_eq!(out, "1\nprint('patched by toolkit')\n600000\n/bin/busybox\n");

    // Bumping the toolkit: a new layer version; base and workspace are untouched.
    let tk2 = tmp.path().join("tk2");
    write(&tk2, "opt/harness/VERSION", b"2\n");
    let tk2_layer =
        client.import_image("toolkit/harness", None, ImageSource::Dir(tk2)).await.expect("tk2");
    assert_eq!(tk2_layer.version, 2);
    assert!(tk2_layer.new_chunks <= tk2_layer.chunks);
    client
        .create_env("flask-task", &[&base, "workspace/flask@1", "toolkit/harness@2"])
        .await
        .expect("env v2");
    let (out, _) =
        sh(&client, "env:flask-task", "cat /opt/harness/VERSION /workspace/repo/app.py").await;
    assert_eq!(out, "2\nprint('app v1')\n");
    let layers = client.images().await.expect("ls");
    let digest_of = |name: &str, v: u32| {
        layers.iter().find(|l| l.name == name && l.version == v).map(|l| l.digest.clone())
    };
    assert_eq!(digest_of("workspace/flask", 1), Some(ws_layer.digest.clone()));
    assert_eq!(digest_of("toolkit/harness", 1), Some(tk_layer.digest.clone()));
    assert_ne!(tk_layer.digest, tk2_layer.digest);
    // Re-importing the same workspace stores no new data chunk.
    let again = client
        .import_image("workspace/flask", None, ImageSource::Dir(tmp.path().join("ws")))
        .await
        .expect("again");
    assert_eq!((again.version, again.new_chunks), (2, 0), "an identical layer stored new chunks");

    // Removing a layer in use is refused; afterwards it goes, and GC frees its data.
    let holder = client.create(SandboxOptions::container("env:flask-task")).await.expect("create");
    let err = client.remove_image("toolkit/harness@2").await.expect_err("in use");
    assert_eq!(err.code(), Some(ErrorCode::Conflict));
    holder.destroy().await.expect("destroy");
    client.remove_image("toolkit/harness@1").await.expect("remove");
    let gc = client.gc_images().await.expect("gc");
    assert!(gc.removed_layers >= 1, "{gc:?}");
    let err = client
        .create(SandboxOptions::container(&format!("{base}+toolkit/harness@1")))
        .await
        .expect_err("gone");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
}

#[tokio::test]
async fn damaged_and_missing_chunks_are_never_served() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let tmp = tempfile::tempdir().expect("tmp");
    let base = busybox_base(&client, "base/busybox").await;
    let data = tmp.path().join("data");
    let payload: Vec<u8> =
        (0..400_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    write(&data, "payload.bin", &payload);
    let layer = client
        .import_image("workspace/payload", None, ImageSource::Dir(data))
        .await
        .expect("import");
    client.verify_image("workspace/payload").await.expect("intact");
    // Corrupt every chunk of that layer in the (local) backend.
    let chunks_dir = daemon.state_dir().join("blobs/chunks");
    let mut corrupted = 0;
    for e in std::fs::read_dir(&chunks_dir).expect("chunks").flatten() {
        let bytes = std::fs::read(e.path()).expect("read");
        if bytes.len() >= 4096 && payload.windows(64).take(1).any(|w| bytes.starts_with(w)) {
            let mut b = bytes.clone();
            b[10] ^= 0x55;
            std::fs::write(e.path(), b).expect("write");
            corrupted += 1;
        }
    }
    assert!(corrupted >= 1, "found no chunk of the payload");
    client.drop_image_cache().await.expect("drop cache");
    let err = client.verify_image("workspace/payload").await.expect_err("must detect");
    assert_eq!(err.code(), Some(ErrorCode::DataLoss), "{err}");
    assert!(err.to_string().contains("corrupt"), "{err}");
    let (out, code) = sh(
        &client,
        &format!("{base}+workspace/payload@{}", layer.version),
        "cat /payload.bin > /dev/null",
    )
    .await;
    assert_ne!(code, Some(0), "a corrupt chunk was served: {out}");
    let status = client.node_status().await.expect("status");
    assert!(status.images.expect("images").corrupt_chunks >= 1);
    // A missing chunk: a clear error naming it.
    for e in std::fs::read_dir(&chunks_dir).expect("chunks").flatten() {
        std::fs::remove_file(e.path()).expect("rm");
    }
    client.drop_image_cache().await.expect("drop cache");
    let err = client.verify_image("workspace/payload").await.expect_err("missing");
    assert_eq!(err.code(), Some(ErrorCode::DataLoss));
    assert!(err.to_string().contains("missing"), "{err}");
}

#[tokio::test]
async fn checkpoint_to_layer_boots_without_scrubbed_paths() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let base = busybox_base(&client, "base/busybox").await;
    let sb = client.create(SandboxOptions::container(&base)).await.expect("create");
    let out = sb
        .exec_with(Cmd::shell("mkdir -p /workspace/app && echo built > /workspace/app/build.txt && echo 42 > /workspace/answer.txt && rm /bin/vi && echo ok"))
        .await
        .expect("exec");
    assert_eq!(out.stdout_text(), "ok\n", "{}", out.stderr_text());
    let layer = sb
        .checkpoint("workspace/built-by-agent", None, &["/workspace/answer.txt"])
        .await
        .expect("checkpoint");
    assert!(layer.source.starts_with("checkpoint of sb-"), "{layer:?}");
    sb.destroy().await.expect("destroy");
    let image = format!("{base}+{}@{}", layer.name, layer.version);
    let (out, code) = sh(&client, &image, "cat /workspace/app/build.txt; ls /workspace; test -e /bin/vi && echo vi-present || echo vi-deleted").await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out, "built\napp\nvi-deleted\n");
}

#[tokio::test]
async fn s3_backend_serves_layers() {
    let moto = brig_tests::s3::Moto::start().expect("moto");
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(config.path(), moto.backend_config()).expect("write");
    let daemon =
        Daemon::start_with(&["--config", config.path().to_str().expect("utf8")]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let status = client.node_status().await.expect("status");
    assert_eq!(status.images.expect("images").backend, "s3");
    let base = busybox_base(&client, "base/busybox").await;
    let tmp = tempfile::tempdir().expect("tmp");
    write(tmp.path(), "srv/greeting", b"from s3\n");
    let layer = client
        .import_image("workspace/s3", None, ImageSource::Dir(tmp.path().to_path_buf()))
        .await
        .expect("import");
    client.drop_image_cache().await.expect("drop");
    let (out, code) =
        sh(&client, &format!("{base}+workspace/s3@{}", layer.version), "cat /srv/greeting").await;
    assert_eq!((out.as_str(), code), ("from s3\n", Some(0)));
    let fetched = client.node_status().await.expect("status").images.expect("images").fetched_bytes;
    assert!(fetched > 0, "nothing was fetched from S3");
}
