//! `brig image pull` against a real registry (Debian's `docker-registry` on loopback, fed with
//! `skopeo` from OCI layouts built here): each image layer becomes one Brig layer, converted
//! once; whiteouts, opaque directories, hard links, setuid bits and owners stay right across the
//! stack; a second image on the same base downloads only its own layer; bad references,
//! escapes and damaged blobs are typed errors that leave nothing behind.

use brig_sdk::{ErrorCode, SandboxOptions};
use brig_tests::registry::{busybox_base, write_image, Layer, Registry};
use brig_tests::Daemon;

fn base() -> Layer {
    busybox_base()
}

fn middle() -> Layer {
    Layer::default()
        .file("etc/motd", 0o644, b"from the middle layer\n")
        .file("opt/old-a", 0o644, b"a")
        .file("opt/old-b", 0o644, b"b")
}

fn top() -> Layer {
    Layer::default()
        .file("etc/.wh.motd", 0o644, b"")
        .file("opt/.wh..wh..opq", 0o644, b"")
        .file("opt/new", 0o644, b"new\n")
        .file("bin/su-like", 0o4755, b"#!/bin/sh\n")
        .hard_link("bin/su-link", "bin/su-like")
        .owned_file("workspace/agent.txt", 0o600, 1000, b"agent's\n")
}

async fn sh(sb: &brig_sdk::Sandbox, script: &str) -> String {
    let out = sb.exec(["sh", "-c", script]).await.expect("exec");
    format!("{}{}", out.stdout_text(), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_pulled_layer_by_layer_and_run() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let a = write_image(layout.path(), "a", &[base(), middle(), top()], &["GREETING=hi"])
        .expect("image a");
    let own = Layer::default().file("etc/b-only", 0o644, b"b\n");
    let b = write_image(layout.path(), "b", &[base(), middle(), own], &[]).expect("image b");
    let ref_a = registry.push(layout.path(), "a", "brig/a").expect("push a");
    let ref_b = registry.push(layout.path(), "b", "brig/b").expect("push b");

    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");

    let mut states = Vec::new();
    let pulled = client
        .pull_image_with_progress(&ref_a, Some("test/a"), |p| states.push(p.clone()))
        .await
        .expect("pull a");
    assert_eq!(pulled.name, "test/a");
    let last = states.last().expect("progress of the pull");
    let sizes: Vec<u64> = last.layers.iter().map(|l| l.size).collect();
    assert_eq!(sizes, a.layer_sizes, "one entry per layer, bottom first");
    assert!(last.layers.iter().all(|l| l.state == brig_sdk::PullLayerState::Done), "{last:?}");
    assert_eq!(last.bytes(), (pulled.downloaded_bytes, pulled.downloaded_bytes));
    assert_eq!(pulled.layers.len(), 3);
    assert!(pulled.layers.iter().all(|l| !l.reused), "{:?}", pulled.layers);
    assert_eq!(pulled.downloaded_bytes, a.layer_sizes.iter().sum::<u64>());
    assert_eq!(pulled.env, ["GREETING=hi"]);
    for (layer, diff_id) in pulled.layers.iter().zip(&a.diff_ids) {
        assert_eq!(&layer.diff_id, diff_id);
        assert_eq!(layer.layer, format!("oci/{}", diff_id.trim_start_matches("sha256:")));
    }

    let sb = client
        .create(SandboxOptions::container("env:test/a"))
        .await
        .expect("create from the pulled image");
    assert_eq!(
        sh(&sb, "cat /etc/motd 2>&1; echo rc=$?").await.trim_end().lines().last(),
        Some("rc=1")
    );
    assert_eq!(sh(&sb, "ls /opt").await, "new\n", "the opaque directory hides the layer below");
    assert_eq!(sh(&sb, "stat -c %a /bin/su-like").await, "4755\n", "setuid kept");
    let inodes = sh(&sb, "stat -c %i /bin/su-like /bin/su-link").await;
    let inodes: Vec<&str> = inodes.lines().collect();
    assert_eq!(inodes.len(), 2);
    assert_eq!(inodes[0], inodes[1], "a hard link stays one file");
    assert_eq!(sh(&sb, "stat -c %u:%a /workspace/agent.txt").await, "1000:600\n");
    assert_eq!(sh(&sb, "echo $GREETING").await, "hi\n", "the image's Env applies");
    sb.destroy().await.expect("destroy");

    // The second image shares its two lower layers: only its own is downloaded. The CLI
    // tells so, a line per layer state when its stderr is not a terminal.
    let cli = std::process::Command::new(brig_tests::binary("brig"))
        .arg("--state-dir")
        .arg(daemon.state_dir())
        .args(["image", "pull", &ref_b])
        .output()
        .expect("brig image pull");
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert!(cli.status.success(), "brig image pull: {stderr}");
    let short = |d: &str| d[..19].to_string();
    for (i, digest) in b.layer_digests.iter().enumerate() {
        let expected = if i < 2 { "already here" } else { "done" };
        let line = format!("layer {}/3 {} ", i + 1, short(digest));
        assert!(
            stderr.lines().any(|l| l.starts_with(&line) && l.ends_with(expected)),
            "no {line}...{expected} in:\n{stderr}"
        );
    }
    let stdout = String::from_utf8_lossy(&cli.stdout);
    let name = format!("pulled/{}", ref_b.replace(':', "-"));
    let result = format!("({} bytes downloaded)", b.layer_sizes[2]);
    assert!(stdout.contains(&format!("env:{name} ")), "the result on stdout: {stdout}");
    assert!(stdout.contains(&result), "only the layer it does not share: {stdout}");
    let sb = client.create(SandboxOptions::container(&format!("env:{name}"))).await.expect("b");
    assert_eq!(sh(&sb, "cat /etc/b-only /etc/motd").await, "b\nfrom the middle layer\n");
    sb.destroy().await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pulls_are_typed_errors_that_leave_nothing() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let escape = Layer::default().file("../outside", 0o644, b"x");
    let bad = write_image(layout.path(), "escape", &[base(), escape], &[]).expect("escape");
    let ref_escape = registry.push(layout.path(), "escape", "brig/escape").expect("push");
    let damaged = Layer::default().file("etc/damaged", 0o644, &[7u8; 4096]);
    let dmg = write_image(layout.path(), "damaged", &[damaged], &[]).expect("damaged");
    let ref_damaged = registry.push(layout.path(), "damaged", "brig/damaged").expect("push");

    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let code = |r: Result<brig_proto::PulledImage, brig_sdk::Error>| match r {
        Ok(p) => panic!("pulled: {p:?}"),
        Err(e) => (e.code(), e.to_string()),
    };

    let (c, text) = code(client.pull_image("not a reference!", None).await);
    assert_eq!(c, Some(ErrorCode::BadRequest), "{text}");
    let (c, text) = code(client.pull_image(&format!("{}/brig/none:1", registry.addr), None).await);
    assert_eq!(c, Some(ErrorCode::NotFound), "{text}");
    let (c, text) =
        code(client.pull_image(&format!("{}/brig/a:missing", registry.addr), None).await);
    assert_eq!(c, Some(ErrorCode::NotFound), "{text}");
    let (c, text) = code(client.pull_image("127.0.0.1:1/brig/a:1", None).await);
    assert_eq!(c, Some(ErrorCode::Unavailable), "{text}");

    let (c, text) = code(client.pull_image(&ref_escape, None).await);
    assert_eq!(c, Some(ErrorCode::BadRequest), "{text}");
    assert!(text.contains("../outside"), "{text}");
    let escaped = format!("oci/{}", bad.diff_ids[1].trim_start_matches("sha256:"));
    assert!(client.inspect_image(&escaped).await.is_err(), "the escaping layer was stored");

    // A blob the registry serves with other bytes than its digest names.
    let blob = registry.blob_file(&dmg.layer_digests[0]);
    let mut bytes = std::fs::read(&blob).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).expect("damage");
    let (c, text) = code(client.pull_image(&ref_damaged, None).await);
    assert_eq!(c, Some(ErrorCode::DataLoss), "{text}");
    assert!(text.contains(&dmg.layer_digests[0]), "says which blob: {text}");
    let stored = format!("oci/{}", dmg.diff_ids[0].trim_start_matches("sha256:"));
    assert!(client.inspect_image(&stored).await.is_err(), "a damaged layer was stored");
    let work = daemon.state_dir().join("layers/work");
    let left: Vec<_> = std::fs::read_dir(&work).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "half layers left in {}: {left:?}", work.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_docker_media_types_and_zstd_layers_are_pulled() {
    use brig_tests::registry::{write_multi_platform, Compress};
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let amd = [base(), Layer::default().file("etc/arch", 0o644, b"amd64\n")];
    let arm = [base(), Layer::default().file("etc/arch", 0o644, b"arm64\n")];
    let images = [("arm64", &arm[..], Compress::Gzip), ("amd64", &amd[..], Compress::Zstd)];
    let written = write_multi_platform(layout.path(), "multi", &images).expect("index");
    let plain = [base(), Layer::default().file("etc/kind", 0o644, b"plain tar\n")];
    let plain_images = [("amd64", &plain[..], Compress::None)];
    write_multi_platform(layout.path(), "plain", &plain_images).expect("plain");
    let docker_layers = [base(), Layer::default().file("etc/kind", 0o644, b"docker v2\n")];
    write_image(layout.path(), "docker", &docker_layers, &[]).expect("docker");
    let ref_multi = registry.push_with(layout.path(), "multi", "brig/multi", false).expect("push");
    let ref_plain = registry.push_with(layout.path(), "plain", "brig/plain", false).expect("push");
    let ref_docker =
        registry.push_with(layout.path(), "docker", "brig/docker", true).expect("push v2s2");

    // What the registry holds: an index, whose amd64 image has zstd layers (skopeo keeps
    // compressed layers as they are; it compresses plain tar ones, which the unpack unit tests
    // cover), and a Docker v2 manifest.
    let index = registry.raw_manifest(&ref_multi).expect("index");
    assert!(index.contains("image.index.v1+json"), "{index}");
    let amd_ref = format!("{}/brig/multi@{}", registry.addr, written[1].manifest_digest);
    let amd = registry.raw_manifest(&amd_ref).expect("amd64 manifest");
    assert!(amd.contains("tar+zstd"), "{amd}");
    let docker = registry.raw_manifest(&ref_docker).expect("docker manifest");
    assert!(docker.contains("application/vnd.docker.distribution.manifest.v2+json"), "{docker}");

    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    for (reference, file, expected) in [
        (&ref_multi, "/etc/arch", "amd64\n"),
        (&ref_plain, "/etc/kind", "plain tar\n"),
        (&ref_docker, "/etc/kind", "docker v2\n"),
    ] {
        let pulled = client.pull_image(reference, None).await.expect("pull");
        let sb = client
            .create(SandboxOptions::container(&format!("env:{}", pulled.name)))
            .await
            .expect("create");
        assert_eq!(sh(&sb, &format!("cat {file}")).await, expected, "{reference}");
        sb.destroy().await.expect("destroy");
    }
    // The node's platform was chosen from the index: the amd64 image's (zstd) layer.
    let amd_top = format!("oci/{}", written[1].diff_ids[1].trim_start_matches("sha256:"));
    client.inspect_image(&amd_top).await.expect("the amd64 layer");
    let arm_top = format!("oci/{}", written[0].diff_ids[1].trim_start_matches("sha256:"));
    assert!(client.inspect_image(&arm_top).await.is_err(), "the arm64 layer was pulled too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_with_tls_and_htpasswd_takes_its_users_credentials_only() {
    let registry = Registry::start_with(Some(("alice", "s3cret"))).expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    write_image(layout.path(), "a", &[base()], &[]).expect("image");
    let reference = registry.push(layout.path(), "a", "brig/private").expect("push");
    let ca_file = registry.ca_file().expect("ca");
    let node = |user: &str, password: &str, ca: bool| {
        let mut config = format!(
            "[images.registries]\n[[images.registries.credentials]]\nregistry = \"{}\"\n\
             username = \"{user}\"\npassword = \"{password}\"\n",
            registry.addr
        );
        if ca {
            config = config.replace(
                "[images.registries]\n",
                &format!("[images.registries]\nca_files = [\"{}\"]\n", ca_file.display()),
            );
        }
        Daemon::start_with_config(&config, &[]).expect("brigd")
    };

    let good = node("alice", "s3cret", true);
    let client = good.client().await.expect("connect");
    let pulled = client.pull_image(&reference, None).await.expect("pull with the user's creds");
    assert_eq!(pulled.layers.len(), 1);
    drop(client);
    drop(good);

    for (user, password, with_ca, expected) in [
        ("alice", "wrong", true, ErrorCode::PermissionDenied),
        ("mallory", "s3cret", true, ErrorCode::PermissionDenied),
        ("alice", "s3cret", false, ErrorCode::Unavailable),
    ] {
        let daemon = node(user, password, with_ca);
        let client = daemon.client().await.expect("connect");
        let err = client.pull_image(&reference, None).await.expect_err("refused");
        assert_eq!(err.code(), Some(expected), "{user}/{password}/ca {with_ca}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_dies_mid_pull_does_not_fail_it() {
    use brig_tests::registry::{write_multi_platform, Compress};
    let mut registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    // 256 MiB in one plain tar layer: long enough on loopback to be cut in the middle.
    let mut block = vec![0u8; 1 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for b in block.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *b = state as u8;
    }
    let mut big = Layer::default().dir("data/");
    for i in 0..256 {
        block[0] = i as u8;
        big = big.file(&format!("data/f{i:03}"), 0o644, &block);
    }
    let layers = [base(), big];
    let _ = write_multi_platform(layout.path(), "big", &[("amd64", &layers[..], Compress::None)])
        .expect("image");
    let reference = registry.push(layout.path(), "big", "brig/big").expect("push");
    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");

    let pull = {
        let client = client.clone();
        let reference = reference.clone();
        tokio::spawn(async move { client.pull_image(&reference, Some("test/big")).await })
    };
    // Wait until part of the big blob is on the node, then kill the registry and bring it back.
    let work = daemon.state_dir().join("layers/work");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let partial = loop {
        let sizes: Vec<u64> = std::fs::read_dir(&work)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.path().join("blob").metadata().ok())
                    .map(|m| m.len())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(&size) = sizes.iter().find(|&&s| s > 16 << 20) {
            break size;
        }
        assert!(std::time::Instant::now() < deadline, "the download never started");
        assert!(!pull.is_finished(), "the pull finished before it could be cut");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    registry.restart().expect("restart");
    let pulled = pull.await.expect("join").expect("the pull went on after the registry came back");
    // (skopeo compressed the layers on their way into the registry: sizes are the registry's.)
    let big_blob = pulled.layers[1].downloaded_bytes;
    assert!(partial < big_blob, "cut at {partial} of {big_blob}");
    let sb = client.create(SandboxOptions::container("env:test/big")).await.expect("create");
    assert_eq!(sh(&sb, "ls /data | wc -l").await.trim(), "256");
    sb.destroy().await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_of_an_image_the_node_lacks_pull_it_once_together() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    write_image(layout.path(), "a", &[base(), middle()], &["FROM_IMAGE=yes"]).expect("image");
    let reference = registry.push(layout.path(), "a", "brig/oncreate").expect("push");
    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");

    let image = format!("oci:{reference}");
    // The first create tells how the pull goes; the others wait on the same pull.
    let states = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let creates = (0..3).map(|i| {
        let (client, image, states) = (client.clone(), image.clone(), states.clone());
        tokio::spawn(async move {
            let options = SandboxOptions::container(&image);
            if i > 0 {
                return client.create(options).await;
            }
            let seen = |p: &brig_sdk::PullProgress| states.lock().expect("lock").push(p.clone());
            client.create_with_progress(options, seen).await
        })
    });
    let mut sandboxes = Vec::new();
    for create in creates {
        sandboxes.push(create.await.expect("join").expect("create pulls what it lacks"));
    }
    let states = states.lock().expect("lock").clone();
    let last = states.last().expect("the create that pulled told of the pull");
    assert_eq!(last.reference, reference);
    let done: Vec<_> = last.layers.iter().map(|l| l.state).collect();
    assert_eq!(done, [brig_sdk::PullLayerState::Done; 2], "{states:?}");
    assert_eq!(last.bytes().0, last.bytes().1, "every byte downloaded: {last:?}");
    for sb in &sandboxes {
        assert_eq!(sh(sb, "cat /etc/motd; echo $FROM_IMAGE").await, "from the middle layer\nyes\n");
    }
    let later = client.create(SandboxOptions::container(&image)).await.expect("create again");
    let log = daemon.log_text();
    assert_eq!(log.matches("image pulled").count(), 1, "one pull for four creates:\n{log}");
    for sb in sandboxes.into_iter().chain([later]) {
        sb.destroy().await.expect("destroy");
    }
    // The E2B API creates from it by template id (the id is the image reference). Its
    // commands run as root here (`run`): this image has no E2B user.
    let api = brig_tests::hostile_http::Api::new(&daemon);
    let made = tokio::task::spawn_blocking(move || {
        let r = api.create_with(serde_json::json!({"templateID": image, "timeout": 60}))?;
        let status = r.status;
        let v = r.json();
        anyhow::ensure!(status == 201, "create: {status} {v}");
        let sb = brig_tests::hostile_http::Sbx {
            id: v["sandboxID"].as_str().unwrap_or_default().to_string(),
            token: v["envdAccessToken"].as_str().unwrap_or_default().to_string(),
        };
        let (out, exit, _) = api.run(&sb, "cat /etc/motd")?;
        api.kill(&sb);
        Ok::<_, anyhow::Error>((out, exit))
    });
    let (out, exit) = made.await.expect("join").expect("E2B create from the pulled image");
    assert_eq!((out.as_slice(), exit), (&b"from the middle layer\n"[..], Some(0)));

    // A reference no registry has is the create's typed error.
    let missing = format!("oci:{}/brig/none:1", registry.addr);
    let err = client.create(SandboxOptions::container(&missing)).await.expect_err("refused");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
}

/// Two nodes sharing one S3 blob backend (moto's server): an image pulled on one is created
/// from on the other without downloading a layer again, its data fetched chunk by chunk as it
/// is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_on_one_node_is_created_on_another_without_a_download() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let data = Layer::default().file("srv/big", 0o644, &vec![5u8; 8 << 20]);
    write_image(layout.path(), "a", &[base(), middle(), data], &[]).expect("image");
    let reference = registry.push(layout.path(), "a", "brig/shared").expect("push");
    let s3 = brig_tests::s3::Moto::start().expect("moto");
    let config =
        format!("{}[images.registries]\ninsecure = [\"{}\"]\n", s3.backend_config(), registry.addr);
    let first = Daemon::start_with_config(&config, &[]).expect("first node");
    let pulled =
        first.client().await.expect("connect").pull_image(&reference, None).await.expect("pull");
    assert!(pulled.downloaded_bytes > 0);

    let second = Daemon::start_with_config(&config, &[]).expect("second node");
    let client = second.client().await.expect("connect");
    let again = client.pull_image(&reference, None).await.expect("pull on the second node");
    assert!(again.layers.iter().all(|l| l.reused), "{:?}", again.layers);
    assert_eq!(again.downloaded_bytes, 0, "a layer was downloaded again");
    let sb = client
        .create(SandboxOptions::container(&format!("env:{}", again.name)))
        .await
        .expect("create on the second node");
    assert_eq!(sh(&sb, "cat /etc/motd").await, "from the middle layer\n");
    let fetched = client.node_status().await.expect("status").images.expect("images").fetched_bytes;
    assert!(
        fetched > 0 && fetched < 8 << 20,
        "fetched {fetched} bytes: the unread 8 MiB file too?"
    );
    sb.destroy().await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_images_directory_user_and_command_are_its_sandboxes_defaults() {
    use brig_sdk::Cmd;
    use brig_tests::registry::write_image_with;
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let app = Layer::default().dir("app/").file("app/run.sh", 0o755, b"echo ran $GREETING\n");
    let config = serde_json::json!({
        "Env": ["GREETING=hello", "PATH=/bin"],
        "WorkingDir": "/app",
        "User": "agent",
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["./run.sh; pwd; id -u"],
    });
    write_image_with(layout.path(), "app", &[base(), app], config).expect("image");
    let reference = registry.push(layout.path(), "app", "brig/app").expect("push");

    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let mut daemon = Daemon::start_with_config(&config, &["--on-exit", "keep"]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let pulled = client.pull_image(&reference, Some("test/app")).await.expect("pull");
    assert_eq!(pulled.working_dir.as_deref(), Some("/app"));
    assert_eq!(pulled.user.as_deref(), Some("agent"));
    assert_eq!(pulled.entrypoint, ["/bin/sh", "-c"]);

    let sb = client.create(SandboxOptions::container("env:test/app")).await.expect("create");
    let id = sb.id().to_string();
    assert_eq!(sh(&sb, "pwd; id -u").await, "/app\n1000\n", "WorkingDir and User apply");
    let asked = sb.exec_with(Cmd::new(["sh", "-c", "pwd; id -u"]).cwd("/tmp").user("root"));
    assert_eq!(asked.await.expect("exec").stdout_text(), "/tmp\n0\n", "the request's win");
    let own = sb.exec(Vec::<String>::new()).await.expect("the image's command");
    assert_eq!(own.stdout_text(), "ran hello\n/app\n1000\n", "no arguments: Entrypoint + Cmd");

    // The defaults are kept with the sandbox: a restarted node still applies them.
    drop(client);
    daemon.restart().expect("restart");
    let client = daemon.client().await.expect("reconnect");
    let sb = client.sandbox(&id);
    assert_eq!(sh(&sb, "pwd; id -u; echo $GREETING").await, "/app\n1000\nhello\n");
    sb.destroy().await.expect("destroy");

    // An image whose config names no WorkingDir (its `/`) or User: / and root.
    write_image(layout.path(), "plain", &[base()], &[]).expect("plain");
    let reference = registry.push(layout.path(), "plain", "brig/plain").expect("push");
    let pulled = client.pull_image(&reference, None).await.expect("pull plain");
    let sb = client
        .create(SandboxOptions::container(&format!("env:{}", pulled.name)))
        .await
        .expect("create plain");
    assert_eq!(sh(&sb, "pwd; id -u").await, "/\n0\n");
    sb.destroy().await.expect("destroy");
}

/// A layer whose root is opaque hides every layer below it, also in a later image that reuses
/// it without converting it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_layer_with_an_opaque_root_still_hides_what_is_below() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    let reset = base().file(".wh..wh..opq", 0o644, b"").file("etc/reset", 0o644, b"r\n");
    let below = base().file("etc/below", 0o644, b"b\n");
    write_image(layout.path(), "first", &[middle(), reset.clone()], &[]).expect("first");
    let own = Layer::default().file("etc/own", 0o644, b"o\n");
    write_image(layout.path(), "second", &[below, reset, own], &[]).expect("second");
    let first = registry.push(layout.path(), "first", "brig/first").expect("push");
    let second = registry.push(layout.path(), "second", "brig/second").expect("push");
    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    client.pull_image(&first, Some("test/first")).await.expect("pull first");
    let pulled = client.pull_image(&second, Some("test/second")).await.expect("pull second");
    let reused: Vec<bool> = pulled.layers.iter().map(|l| l.reused).collect();
    assert_eq!(reused, [false, true, false]);
    let envs = client.envs().await.expect("envs");
    let (_, layers) = envs.iter().find(|(n, _)| n == "test/second").expect("the env");
    assert_eq!(layers.len(), 2, "the env starts at the opaque layer: {layers:?}");
    let sb = client.create(SandboxOptions::container("env:test/second")).await.expect("create");
    let out = sh(&sb, "cat /etc/reset /etc/own; test -e /etc/below || echo hidden").await;
    assert_eq!(out, "r\no\nhidden\n");
    sb.destroy().await.expect("destroy");
}

/// `[images.registries.mirrors]`: a registry's images come from its mirrors first, in order; a
/// mirror that is down or lacks the image is passed over, down to the registry itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_serve_a_registrys_images_and_are_passed_over_when_they_cannot() {
    let upstream = Registry::start().expect("upstream");
    let mirror = Registry::start().expect("mirror");
    let layout = tempfile::tempdir().expect("layout");
    let from = |who: &str| base().file("etc/from", 0o644, format!("{who}\n").as_bytes());
    write_image(layout.path(), "mirrored", &[from("mirror")], &[]).expect("mirror's");
    write_image(layout.path(), "upstream", &[from("upstream")], &[]).expect("upstream's");
    mirror.push(layout.path(), "mirrored", "brig/app").expect("push to the mirror");
    upstream.push(layout.path(), "upstream", "brig/app").expect("push upstream");
    upstream.push(layout.path(), "upstream", "brig/only").expect("push upstream only");
    let dead = "127.0.0.1:1";
    let config = format!(
        "[images.registries]\ninsecure = [\"{u}\", \"{m}\", \"{dead}\"]\n\
         [images.registries.mirrors]\n\"{u}\" = [\"{dead}\", \"{m}\"]\n",
        u = upstream.addr,
        m = mirror.addr
    );
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    // `brig/app:mirrored` is on the mirror only; `brig/only:upstream` on the registry only.
    for (image, expected) in
        [("brig/app:mirrored", "mirror\n"), ("brig/only:upstream", "upstream\n")]
    {
        let reference = format!("{}/{image}", upstream.addr);
        let pulled = client.pull_image(&reference, None).await.expect("pull");
        let env = format!("env:{}", pulled.name);
        let sb = client.create(SandboxOptions::container(&env)).await.expect("create");
        assert_eq!(sh(&sb, "cat /etc/from").await, expected, "{reference}");
        sb.destroy().await.expect("destroy");
    }
    let log = daemon.log_text();
    assert!(log.contains("a mirror could not serve the image"), "{log}");
}

/// Token auth, the `WWW-Authenticate: Bearer` flow: the registry sends the client to its token
/// server, which grants a token for the user's Basic credentials only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_with_token_auth_takes_a_token_for_its_users_credentials() {
    let registry = Registry::start_with_token(("alice", "s3cret")).expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    write_image(layout.path(), "a", &[base(), middle()], &[]).expect("image");
    let reference = registry.push(layout.path(), "a", "brig/token").expect("push with a token");
    let node = |credentials: Option<(&str, &str)>| {
        let mut config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
        if let Some((user, password)) = credentials {
            config.push_str(&format!(
                "[[images.registries.credentials]]\nregistry = \"{}\"\nusername = \"{user}\"\n\
                 password = \"{password}\"\n",
                registry.addr
            ));
        }
        Daemon::start_with_config(&config, &[]).expect("brigd")
    };
    let good = node(Some(("alice", "s3cret")));
    let client = good.client().await.expect("connect");
    let pulled = client.pull_image(&reference, None).await.expect("pull with a token");
    let sb = client
        .create(SandboxOptions::container(&format!("env:{}", pulled.name)))
        .await
        .expect("create");
    assert_eq!(sh(&sb, "cat /etc/motd").await, "from the middle layer\n");
    sb.destroy().await.expect("destroy");
    drop(client);
    drop(good);
    for credentials in [None, Some(("alice", "wrong"))] {
        let daemon = node(credentials);
        let client = daemon.client().await.expect("connect");
        let err = client.pull_image(&reference, None).await.expect_err("no token");
        assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{credentials:?}: {err}");
    }
}
