//! A real OCI registry for tests (Debian's `docker-registry`, the CNCF distribution server) on
//! loopback, and OCI image layouts built here and pushed to it with `skopeo`.
//!
//! ```text
//! OciImage::new().layer(..).layer(..) ─▶ write_layout(dir) ─▶ Registry::push(dir, "x:1")
//!                                                  (skopeo copy oci:DIR:TAG docker://127.0.0.1:P/x:1)
//! ```
//! The registry and its storage go when the value is dropped, also when a test fails.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// A `docker-registry serve` on 127.0.0.1, filesystem storage in a temp dir: plain HTTP, or
/// TLS with a CA of its own and htpasswd (bcrypt) users.
pub struct Registry {
    child: Child,
    /// With token auth: the token server.
    token_server: Option<Child>,
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// With TLS: the directory with `ca.crt` (skopeo's cert dir), and the CA's PEM file.
    pub cert_dir: Option<PathBuf>,
    /// With auth: the user and password that may push and pull.
    pub user: Option<(String, String)>,
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    anyhow::ensure!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// A CA and a server certificate for 127.0.0.1 signed by it, in `dir` (`ca.crt`, `srv.pem`,
/// `srv.key`).
fn make_certs(dir: &Path) -> anyhow::Result<()> {
    let p = |name: &str| dir.join(name);
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=brig-test-ca",
        ])
        .arg("-keyout")
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.crt")))?;
    run(Command::new("openssl")
        .args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"])
        .arg("-keyout")
        .arg(p("srv.key"))
        .arg("-out")
        .arg(p("srv.csr")))?;
    std::fs::write(
        p("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .arg("-in")
        .arg(p("srv.csr"))
        .arg("-CA")
        .arg(p("ca.crt"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(p("ext.cnf"))
        .arg("-out")
        .arg(p("srv.pem")))?;
    Ok(())
}

/// Starts `docker-registry serve CONFIG`; the process and the address it listens on.
fn serve(config_path: &Path) -> anyhow::Result<(Child, String)> {
    let mut child = Command::new("docker-registry")
        .arg("serve")
        .arg(config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("docker-registry (Debian's docker-registry package; scripts/install-deps.sh)")?;
    let stderr = child.stderr.take().context("registry stderr")?;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("docker-registry ended before it listened");
        };
        let line = line?;
        if let Some(at) = line.find("listening on ") {
            let rest = &line[at + "listening on ".len()..];
            let addr: String =
                rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
            break addr;
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((child, addr))
}

impl Registry {
    pub fn start() -> anyhow::Result<Registry> {
        Self::start_with(None)
    }

    /// With `user`: TLS (a CA of its own) and htpasswd auth for that one user.
    pub fn start_with(user: Option<(&str, &str)>) -> anyhow::Result<Registry> {
        let dir = tempfile::Builder::new().prefix("brig-registry-").tempdir()?;
        let mut config = format!(
            "version: 0.1\nlog: {{level: info}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  \
             delete: {{enabled: true}}\nhttp:\n  addr: 127.0.0.1:0\n  secret: brig-test\n",
            dir.path().join("store").display()
        );
        let mut cert_dir = None;
        if let Some((name, password)) = user {
            let certs = dir.path().join("certs");
            std::fs::create_dir(&certs)?;
            make_certs(&certs)?;
            config.push_str(&format!(
                "  tls: {{certificate: {}, key: {}}}\n",
                certs.join("srv.pem").display(),
                certs.join("srv.key").display()
            ));
            // bcrypt, the only hash the registry's htpasswd takes.
            let script = "import crypt,sys;print(sys.argv[1]+':'+crypt.crypt(sys.argv[2],crypt.mksalt(crypt.METHOD_BLOWFISH)))";
            let out = Command::new("python3")
                .args(["-W", "ignore", "-c", script, name, password])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "htpasswd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, &out.stdout)?;
            config.push_str(&format!(
                "auth:\n  htpasswd: {{realm: brig-test, path: {}}}\n",
                htpasswd.display()
            ));
            // skopeo's cert dir holds only the CA.
            let skopeo_dir = dir.path().join("skopeo-certs");
            std::fs::create_dir(&skopeo_dir)?;
            std::fs::copy(certs.join("ca.crt"), skopeo_dir.join("ca.crt"))?;
            cert_dir = Some(skopeo_dir);
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)?;
        let (child, addr) = serve(&config_path)?;
        let user = user.map(|(u, p)| (u.to_string(), p.to_string()));
        Ok(Registry { child, token_server: None, dir, addr, cert_dir, user })
    }

    /// Plain HTTP with token auth (the `WWW-Authenticate: Bearer` flow): a token server of
    /// this crate (`registry_token.py`) grants what `user` asks for, nothing to anyone else.
    pub fn start_with_token(user: (&str, &str)) -> anyhow::Result<Registry> {
        let dir = tempfile::Builder::new().prefix("brig-registry-").tempdir()?;
        let (key, cert) = (dir.path().join("token.key"), dir.path().join("token.crt"));
        run(Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=brig-test-token"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert))?;
        let portfile = dir.path().join("token.port");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/registry_token.py");
        let mut token_server = Command::new("python3")
            .arg(script)
            .arg(&portfile)
            .arg(&key)
            .arg(&cert)
            .args([user.0, user.1, "brig-test-issuer"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut port = None;
        for _ in 0..200 {
            if let Ok(text) = std::fs::read_to_string(&portfile) {
                port = text.trim().parse::<u16>().ok();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let Some(port) = port else {
            let _ = token_server.kill();
            let _ = token_server.wait();
            anyhow::bail!("the token server did not start");
        };
        let config = format!(
            "version: 0.1\nlog: {{level: info}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n\
             http:\n  addr: 127.0.0.1:0\n  secret: brig-test\nauth:\n  token:\n    \
             realm: http://127.0.0.1:{port}/token\n    service: brig-test\n    \
             issuer: brig-test-issuer\n    rootcertbundle: {}\n",
            dir.path().join("store").display(),
            cert.display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)?;
        let (child, addr) = match serve(&config_path) {
            Ok(pair) => pair,
            Err(e) => {
                let _ = token_server.kill();
                let _ = token_server.wait();
                return Err(e);
            }
        };
        let user = Some((user.0.to_string(), user.1.to_string()));
        Ok(Registry { child, token_server: Some(token_server), dir, addr, cert_dir: None, user })
    }

    /// Kills the registry (as a crash would) and starts it again on the same address and
    /// storage.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let config_path = self.dir.path().join("config.yml");
        let config = std::fs::read_to_string(&config_path)?;
        let config = config.replace("addr: 127.0.0.1:0", &format!("addr: {}", self.addr));
        std::fs::write(&config_path, config)?;
        let (child, addr) = serve(&config_path)?;
        anyhow::ensure!(addr == self.addr, "restarted on {addr}, not {}", self.addr);
        self.child = child;
        Ok(())
    }

    /// The CA certificate's file, with TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.cert_dir.as_ref().map(|d| d.join("ca.crt"))
    }

    /// Pushes tag `tag` of the OCI layout at `layout` as `repo:tag` here; the reference to pull.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) -> anyhow::Result<String> {
        self.push_with(layout, tag, repo, false)
    }

    /// As [`Registry::push`], every platform of an index (`--all`), and with `docker` as
    /// Docker v2 schema 2 (skopeo converts the media types).
    pub fn push_with(
        &self,
        layout: &Path,
        tag: &str,
        repo: &str,
        docker: bool,
    ) -> anyhow::Result<String> {
        let reference = format!("{}/{repo}:{tag}", self.addr);
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", "copy", "--quiet", "--all"]);
        match &self.cert_dir {
            Some(dir) => cmd.arg("--dest-cert-dir").arg(dir),
            None => cmd.arg("--dest-tls-verify=false"),
        };
        if let Some((user, password)) = &self.user {
            cmd.arg("--dest-creds").arg(format!("{user}:{password}"));
        }
        if docker {
            cmd.args(["-f", "v2s2"]);
        }
        let out = cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{reference}"))
            .output()
            .context("skopeo (scripts/install-deps.sh)")?;
        anyhow::ensure!(out.status.success(), "skopeo: {}", String::from_utf8_lossy(&out.stderr));
        Ok(reference)
    }

    /// The manifest (or index) the registry serves for `reference`, as JSON text.
    pub fn raw_manifest(&self, reference: &str) -> anyhow::Result<String> {
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", "inspect", "--raw"]);
        match &self.cert_dir {
            Some(dir) => cmd.arg("--cert-dir").arg(dir),
            None => cmd.arg("--tls-verify=false"),
        };
        let out = cmd.arg(format!("docker://{reference}")).output()?;
        anyhow::ensure!(out.status.success(), "skopeo: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The file the registry keeps blob `digest` in (to damage it).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("store/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut token_server) = self.token_server.take() {
            let _ = token_server.kill();
            let _ = token_server.wait();
        }
    }
}

/// One entry of a layer being built.
#[derive(Clone)]
pub enum Entry {
    File { path: String, mode: u32, uid: u64, data: Vec<u8> },
    Dir { path: String, mode: u32 },
    Symlink { path: String, target: String },
    HardLink { path: String, target: String },
}

/// A layer: its entries, written as a gzip tar.
#[derive(Default, Clone)]
pub struct Layer {
    pub entries: Vec<Entry>,
}

impl Layer {
    pub fn file(mut self, path: &str, mode: u32, data: &[u8]) -> Self {
        let data = data.to_vec();
        self.entries.push(Entry::File { path: path.into(), mode, uid: 0, data });
        self
    }
    pub fn owned_file(mut self, path: &str, mode: u32, uid: u64, data: &[u8]) -> Self {
        self.entries.push(Entry::File { path: path.into(), mode, uid, data: data.to_vec() });
        self
    }
    pub fn dir(mut self, path: &str) -> Self {
        self.entries.push(Entry::Dir { path: path.into(), mode: 0o755 });
        self
    }
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.entries.push(Entry::Symlink { path: path.into(), target: target.into() });
        self
    }
    pub fn hard_link(mut self, path: &str, target: &str) -> Self {
        self.entries.push(Entry::HardLink { path: path.into(), target: target.into() });
        self
    }

    /// The uncompressed tar.
    pub fn tar(&self) -> anyhow::Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        for e in &self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_mtime(1_700_000_000);
            h.set_uid(0);
            h.set_gid(0);
            let (path, data): (&str, &[u8]) = match e {
                Entry::File { path, mode, uid, data } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_uid(*uid);
                    h.set_gid(*uid);
                    (path, data)
                }
                Entry::Dir { path, mode } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    (path, &[])
                }
                Entry::Symlink { path, target } | Entry::HardLink { path, target } => {
                    let kind = match e {
                        Entry::Symlink { .. } => tar::EntryType::Symlink,
                        _ => tar::EntryType::Link,
                    };
                    h.set_entry_type(kind);
                    h.set_mode(0o777);
                    h.set_link_name(target)?;
                    (path, &[])
                }
            };
            h.set_size(data.len() as u64);
            // Raw, so a test can write what a hostile layer would (`../x`).
            let name = &mut h.as_old_mut().name;
            anyhow::ensure!(path.len() < name.len(), "path too long for the test's tar: {path}");
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, data)?;
        }
        Ok(b.into_inner()?)
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Writes `bytes` as a blob of the layout; its digest.
fn put_blob(layout: &Path, bytes: &[u8]) -> anyhow::Result<String> {
    let digest = sha256(bytes);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(digest.trim_start_matches("sha256:")), bytes)?;
    Ok(digest)
}

/// What an image layout holds of one image: its layers' blob digests and sizes (bottom first).
pub struct Written {
    /// Digest of the image's manifest.
    pub manifest_digest: String,
    pub layer_digests: Vec<String>,
    pub layer_sizes: Vec<u64>,
    pub diff_ids: Vec<String>,
}

/// How the layers of an image written here are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compress {
    Gzip,
    Zstd,
    None,
}

/// Writes an image of `layers` (gzip-compressed) with `env`/`cmd` as tag `tag` of the OCI
/// layout at `layout` (made if missing; other tags stay).
pub fn write_image(
    layout: &Path,
    tag: &str,
    layers: &[Layer],
    env: &[&str],
) -> anyhow::Result<Written> {
    let config = serde_json::json!({"Env": env, "Cmd": ["/bin/sh"], "WorkingDir": "/"});
    write_image_with(layout, tag, layers, config)
}

/// Writes an image as [`write_image`] does, with `config` as its image config's `config`
/// (`Env`, `Cmd`, `Entrypoint`, `WorkingDir`, `User`).
pub fn write_image_with(
    layout: &Path,
    tag: &str,
    layers: &[Layer],
    config: serde_json::Value,
) -> anyhow::Result<Written> {
    let (written, manifest) = write_manifest(layout, layers, config, "amd64", Compress::Gzip)?;
    add_to_index(layout, tag, "application/vnd.oci.image.manifest.v1+json", &manifest)?;
    Ok(written)
}

/// Writes an image index of one image per `(architecture, layers, compression)` as tag `tag`.
pub fn write_multi_platform(
    layout: &Path,
    tag: &str,
    images: &[(&str, &[Layer], Compress)],
) -> anyhow::Result<Vec<Written>> {
    let mut entries = Vec::new();
    let mut all = Vec::new();
    for (arch, layers, compress) in images {
        let config = serde_json::json!({"Cmd": ["/bin/sh"], "WorkingDir": "/"});
        let (written, manifest) = write_manifest(layout, layers, config, arch, *compress)?;
        let (digest, size) = manifest;
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": size,
            "platform": {"architecture": arch, "os": "linux"},
        }));
        all.push(written);
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    }))?;
    let digest = put_blob(layout, &index)?;
    add_to_index(layout, tag, "application/vnd.oci.image.index.v1+json", &(digest, index.len()))?;
    Ok(all)
}

fn add_to_index(
    layout: &Path,
    tag: &str,
    media_type: &str,
    (digest, size): &(String, usize),
) -> anyhow::Result<()> {
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value = match std::fs::read(&index_path) {
        Ok(bytes) => serde_json::from_slice(&bytes)?,
        Err(_) => serde_json::json!({"schemaVersion": 2, "manifests": []}),
    };
    let entry = serde_json::json!({
        "mediaType": media_type, "digest": digest, "size": size,
        "annotations": {"org.opencontainers.image.ref.name": tag},
    });
    index["manifests"].as_array_mut().context("index manifests")?.push(entry);
    std::fs::write(&index_path, serde_json::to_vec(&index)?)?;
    Ok(())
}

/// Writes the blobs and manifest of one image; what was written and the manifest's digest
/// and size.
fn write_manifest(
    layout: &Path,
    layers: &[Layer],
    image_config: serde_json::Value,
    arch: &str,
    compress: Compress,
) -> anyhow::Result<(Written, (String, usize))> {
    std::fs::create_dir_all(layout)?;
    std::fs::write(layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let mut written = Written {
        manifest_digest: String::new(),
        layer_digests: vec![],
        layer_sizes: vec![],
        diff_ids: vec![],
    };
    let mut descriptors = Vec::new();
    for layer in layers {
        let tar = layer.tar()?;
        written.diff_ids.push(sha256(&tar));
        let (blob, media_type) = match compress {
            Compress::Gzip => {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&tar)?;
                (gz.finish()?, "application/vnd.oci.image.layer.v1.tar+gzip")
            }
            Compress::Zstd => {
                (zstd::encode_all(&tar[..], 3)?, "application/vnd.oci.image.layer.v1.tar+zstd")
            }
            Compress::None => (tar, "application/vnd.oci.image.layer.v1.tar"),
        };
        let digest = put_blob(layout, &blob)?;
        descriptors.push(serde_json::json!({
            "mediaType": media_type, "digest": digest, "size": blob.len()
        }));
        written.layer_digests.push(digest);
        written.layer_sizes.push(blob.len() as u64);
    }
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": written.diff_ids},
    });
    let config = serde_json::to_vec(&config)?;
    let config_digest = put_blob(layout, &config)?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config.len()},
        "layers": descriptors,
    }))?;
    let manifest_digest = put_blob(layout, &manifest)?;
    written.manifest_digest = manifest_digest.clone();
    Ok((written, (manifest_digest, manifest.len())))
}

/// A runnable base layer: static busybox with a few applets, /etc and the usual directories.
pub fn busybox_base() -> Layer {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static");
    let mut layer = Layer::default();
    for d in ["bin/", "etc/", "tmp/", "proc/", "sys/", "dev/", "root/", "workspace/", "opt/"] {
        layer = layer.dir(d);
    }
    layer = layer.file("bin/busybox", 0o755, &busybox);
    let applets = [
        "sh", "cat", "ls", "stat", "echo", "test", "id", "sleep", "true", "wc", "mkdir", "chown",
        "readlink", "rm", "grep", "cut", "head", "chmod", "printf",
    ];
    for applet in applets {
        layer = layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    layer
        .file("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/:/bin/sh\n")
        .file("etc/group", 0o644, b"root:x:0:\nagent:x:1000:\n")
}
