//! Test harness: start real `brigd` processes on loopback with private state directories, and
//! find the guest artifacts the build scripts made.
//!
//! The binaries come from the same target directory as the test executable, so run
//! `cargo build --workspace --bins` before the tests (`scripts/test.sh` does).
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use brig_sdk::{Client, ConnectOptions};

pub mod behaviour;
pub mod cluster;
pub mod emulated;
pub mod hostile;
pub mod hostile_http;
pub mod layering;
pub mod net;
pub mod registry;
pub mod rooms;
pub mod s3;

/// Repository root. The test runner's `CARGO_MANIFEST_DIR` first: a test binary built from a
/// clone elsewhere (a shared target directory) still has that clone's path compiled in.
pub fn repo_root() -> PathBuf {
    manifest_dir().join("..")
}

/// This crate's directory, as the runner sees it now (else as the compiler saw it).
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// Where the build scripts put guest artifacts (`$BRIG_ARTIFACTS` or `<repo>/artifacts`).
pub fn artifacts() -> PathBuf {
    std::env::var_os("BRIG_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("artifacts"))
}

/// A guest component built by scripts/build-guests.sh, e.g. `tools/jq.wasm`.
pub fn guest(rel: &str) -> PathBuf {
    let path = artifacts().join("guests").join(rel);
    assert!(path.exists(), "{} is missing: run scripts/build-guests.sh", path.display());
    path
}

/// A container layer image built by scripts/build-images.sh, e.g. `busybox`.
pub fn image(name: &str) -> String {
    let path = artifacts().join("images").join(format!("{name}.erofs"));
    assert!(path.exists(), "{} is missing: run scripts/build-images.sh", path.display());
    name.to_string()
}

/// A binary of this workspace from the running executable's target directory: beside it (a
/// benchmark in `target/release`) or one level up (a test in `target/<profile>/deps`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let beside = exe.parent().map(|d| d.join(name));
    let above = exe.parent().and_then(Path::parent).map(|d| d.join(name));
    match [beside, above].into_iter().flatten().find(|p| p.exists()) {
        Some(path) => path,
        None => panic!(
            "{name} is missing next to {}: run `cargo build --workspace --bins` first",
            exe.display()
        ),
    }
}

/// The brigd tests run: this profile's, or `BRIGD_BIN` (another build, e.g. a baseline in an
/// A/B benchmark).
fn default_brigd() -> PathBuf {
    std::env::var_os("BRIGD_BIN").map_or_else(|| binary("brigd"), PathBuf::from)
}

/// brigd of the release build (`cargo build --release -p brigd -p brig-container -p
/// brig-images`), in the `release` directory beside this test's profile directory.
pub fn release_brigd() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> → target/release/brigd
    let target = exe.ancestors().nth(3).expect("target directory");
    let brigd = target.join("release").join("brigd");
    for name in ["brigd", "brig-shim", "brig-lazyfs"] {
        let path = target.join("release").join(name);
        assert!(
            path.exists(),
            "{} is missing: run `cargo build --release -p brigd -p brig-container -p brig-images \
             --bins` first",
            path.display()
        );
    }
    brigd
}

/// A running brigd with its own state directory; killed on drop.
pub struct Daemon {
    /// The brigd binary (a restart runs the same one).
    program: PathBuf,
    child: Option<Child>,
    pub state: tempfile::TempDir,
    extra_args: Vec<String>,
    log: PathBuf,
    /// A configuration file's directory, dropped after the daemon (fields drop in order).
    config_dir: Option<tempfile::TempDir>,
    /// Where brigd listens: any free port at first, then the same one on every restart, so
    /// clients reconnect to it as to a production node.
    listen: String,
    /// The state directory is a tmpfs of its own (unmounted after the daemon stops).
    state_mounted: bool,
    /// Killed by [`Daemon::crash`] and not started since: what it ran is still on the host.
    crashed: bool,
}

impl Daemon {
    /// Starts brigd with the built-in tools registered.
    pub fn start() -> anyhow::Result<Daemon> {
        Self::start_with(&[])
    }

    /// Starts brigd with extra arguments (e.g. `--config file`). Containers die with the
    /// daemon (`--on-exit destroy`) unless the arguments say `--on-exit keep`.
    pub fn start_with(extra_args: &[&str]) -> anyhow::Result<Daemon> {
        let state = tempfile::Builder::new().prefix("brigd-test-").tempdir()?;
        Self::start_in(default_brigd(), state, false, extra_args)
    }

    /// As [`Daemon::start_with`], running `program` (e.g. [`release_brigd`]).
    pub fn start_program(program: PathBuf, extra_args: &[&str]) -> anyhow::Result<Daemon> {
        let state = tempfile::Builder::new().prefix("brigd-test-").tempdir()?;
        Self::start_in(program, state, false, extra_args)
    }

    fn start_in(
        program: PathBuf,
        state: tempfile::TempDir,
        state_mounted: bool,
        extra_args: &[&str],
    ) -> anyhow::Result<Daemon> {
        let log = state.path().join("brigd.log");
        // Which test each daemon served, so what a run leaves on the host (named by the
        // daemon's tag, a hash of its state directory) can be traced to its test.
        let args: Vec<String> = std::env::args().skip(1).collect();
        let test = format!("{} {}", std::thread::current().name().unwrap_or("?"), args.join(" "));
        let ledger = std::env::temp_dir().join("brig-test-daemons.log");
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(ledger) {
            let _ = writeln!(f, "{} {test}", state.path().display());
        }
        let mut extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        if !extra_args.iter().any(|a| a == "--on-exit") {
            extra_args.extend(["--on-exit".to_string(), "destroy".to_string()]);
        }
        if !extra_args.iter().any(|a| a == "--metrics") {
            extra_args.extend(["--metrics".to_string(), "127.0.0.1:0".to_string()]);
        }
        if !extra_args.iter().any(|a| a == "--e2b-listen") {
            extra_args.extend(["--e2b-listen".to_string(), "127.0.0.1:0".to_string()]);
        }
        let listen = "127.0.0.1:0".to_string();
        let mut daemon = Daemon {
            program,
            child: None,
            state,
            extra_args,
            log,
            config_dir: None,
            listen,
            state_mounted,
            crashed: false,
        };
        daemon.spawn()?;
        Ok(daemon)
    }

    /// Starts brigd with its state directory on a tmpfs of `bytes`, so a test can fill it.
    pub fn start_on_small_disk(bytes: u64, extra_args: &[&str]) -> anyhow::Result<Daemon> {
        let state = tempfile::Builder::new().prefix("brigd-test-").tempdir()?;
        let size = format!("size={bytes}");
        let point = state.path().to_str().context("state path is not UTF-8")?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "brigd-state", point])
            .status()?;
        anyhow::ensure!(mounted.success(), "mounting a tmpfs on {point}");
        Self::start_in(default_brigd(), state, true, extra_args)
    }

    /// Starts brigd with a node configuration file (TOML) kept in its state directory, so it
    /// lives exactly as long as the daemon (a restart in `Drop` still finds it).
    pub fn start_with_config(config: &str, extra_args: &[&str]) -> anyhow::Result<Daemon> {
        let dir = tempfile::Builder::new().prefix("brigd-config-").tempdir()?;
        let path = dir.path().join("brigd.toml");
        std::fs::write(&path, config)?;
        let path_text = path.to_str().context("config path is not UTF-8")?.to_string();
        let mut args = vec!["--config", path_text.as_str()];
        args.extend_from_slice(extra_args);
        let mut daemon = Self::start_with(&args)?;
        daemon.config_dir = Some(dir);
        Ok(daemon)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let endpoint = self.state.path().join("endpoint.json");
        let _ = std::fs::remove_file(&endpoint);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let child = Command::new(&self.program)
            .arg("--state-dir")
            .arg(self.state.path())
            .arg("--listen")
            .arg(&self.listen)
            .arg("--tools-dir")
            .arg(artifacts().join("guests/tools"))
            .arg("--images-dir")
            .arg(artifacts().join("images"))
            .args(&self.extra_args)
            // BRIG_TEST_LOG overrides the daemon's log filter, e.g. to add
            // `brig_container::exec=debug` while chasing a test failure.
            .env(
                "BRIG_LOG",
                std::env::var("BRIG_TEST_LOG").unwrap_or_else(|_| {
                    "info,brig_node=debug,brig_container::session=debug".into()
                }),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning brigd")?;
        self.child = Some(child);
        self.crashed = false;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !endpoint.exists() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("brigd exited with {status}:\n{}", self.log_text());
            }
            if Instant::now() > deadline {
                bail!("brigd did not start within 60 s:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Ok(options) = self.connect_options() {
            self.listen = options.addr.to_string();
        }
        // A restart serves the E2B API where it was, as a node's does.
        if let (Some(i), Ok(url)) =
            (self.extra_args.iter().position(|a| a == "--e2b-listen"), self.e2b_url())
        {
            if let Some(addr) = self.extra_args.get_mut(i + 1).filter(|a| a.ends_with(":0")) {
                *addr = url.trim_start_matches("http://").to_string();
            }
        }
        Ok(())
    }

    /// What is left on the host of this daemon's sandboxes, each as a line naming it:
    /// container cgroups, mounts and run directories, sandbox records, spools and intents. A
    /// node with no sandboxes must have none.
    pub fn leaks(&self) -> Vec<String> {
        let state = self.state.path();
        let tag = self.tag();
        let run = self.run_dir();
        let mut found = Vec::new();
        let mut children = |dir: &Path, what: &str| {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            for e in entries.flatten() {
                // Destroyed sandboxes' record files kept for the next ones: the node's, bounded.
                if what == "sandbox record" && e.file_name() == "spare" {
                    continue;
                }
                // Destroyed containers' cgroups kept for the next creates: the node's, bounded,
                // removed at its shutdown.
                if what == "cgroup" && e.file_name().to_string_lossy().starts_with("spare-") {
                    continue;
                }
                let dir_only = what == "cgroup";
                if !dir_only || e.file_type().is_ok_and(|t| t.is_dir()) {
                    found.push(format!("{what} {}", e.path().display()));
                }
            }
        };
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in controllers.flatten() {
                children(&c.path().join(format!("brig-0-{tag}")), "cgroup");
            }
        }
        children(&run.join("c"), "run directory");
        for (dir, what) in [("sandboxes", "sandbox record"), ("spool", "spool"), ("ops", "intent")]
        {
            children(&state.join(dir), what);
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", run.join("c").display());
        for line in mounts.lines() {
            if let Some(point) = line.split(' ').nth(4).filter(|p| p.starts_with(&prefix)) {
                found.push(format!("mount {point}"));
            }
        }
        found
    }

    /// What names this daemon's run directory, cgroups and network (from its state directory).
    pub fn tag(&self) -> String {
        let state = self.state.path().as_os_str().as_encoded_bytes();
        hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(state)[..4])
    }

    /// Its run directory (`/run/brig/<tag>`).
    pub fn run_dir(&self) -> PathBuf {
        Path::new("/run/brig").join(self.tag())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// The E2B-compatible API's base URL (`http://127.0.0.1:PORT`), from `endpoint.json`.
    pub fn e2b_url(&self) -> anyhow::Result<String> {
        let text = std::fs::read_to_string(self.state.path().join("endpoint.json"))?;
        let endpoint: serde_json::Value = serde_json::from_str(&text)?;
        let addr = endpoint["e2b"].as_str().context("brigd serves no E2B API")?;
        Ok(format!("http://{addr}"))
    }

    /// The daemon's first access token (what `E2B_API_KEY` carries).
    pub fn access_token(&self) -> anyhow::Result<String> {
        Ok(brig_sdk::read_token(&self.state.path().join("access-token"))?)
    }

    pub fn connect_options(&self) -> anyhow::Result<ConnectOptions> {
        Ok(ConnectOptions::from_state_dir(self.state.path())?)
    }

    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(self.connect_options()?).await?)
    }

    /// The daemon's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops with SIGTERM (clean shutdown) and waits.
    pub fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let Some(mut child) = self.child.take() else { bail!("not running") };
        // SIGTERM through the kill(1) binary keeps this crate free of unsafe code.
        Command::new("kill").arg("-TERM").arg(child.id().to_string()).status()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                child.kill()?;
                bail!("brigd ignored SIGTERM for 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops and starts again on the same state directory.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.spawn()
    }

    /// Kills brigd with SIGKILL (a crash: no cleanup at all) and waits for it.
    pub fn crash(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else { bail!("not running") };
        child.kill()?;
        child.wait()?;
        self.crashed = true;
        Ok(())
    }

    /// Starts again on the same state directory after [`Daemon::stop`] or [`Daemon::crash`].
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        self.spawn()
    }

    fn keeps_containers(&self) -> bool {
        self.extra_args.windows(2).any(|w| w[0] == "--on-exit" && w[1] == "keep")
    }
}

impl Drop for Daemon {
    /// Stops cleanly (SIGTERM: mounts released), killing if that fails. A daemon that keeps its
    /// containers across exits, or one left crashed, is started once more with
    /// `--on-exit destroy` to remove them.
    fn drop(&mut self) {
        // A failing test's daemon log outlives its state directory, for reading afterwards.
        if std::thread::panicking() {
            let name = self.state.path().file_name().map(|n| n.to_string_lossy().into_owned());
            let kept = std::env::temp_dir().join(format!("{}.log", name.unwrap_or_default()));
            if std::fs::copy(&self.log, &kept).is_ok() {
                eprintln!("brigd's log is kept at {}", kept.display());
            }
        }
        if self.keeps_containers() || (self.crashed && self.child.is_none()) {
            if self.child.is_some() {
                let _ = self.stop();
            }
            if let Some(i) = self.extra_args.iter().position(|a| a == "--on-exit") {
                self.extra_args[i + 1] = "destroy".to_string();
            }
            if let Err(e) = self.spawn() {
                eprintln!("brigd did not start again to clean up: {e}");
            }
        }
        if self.child.is_some() && self.stop().is_err() {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if self.state_mounted {
            let _ = Command::new("umount").arg("-l").arg(self.state.path()).status();
        }
    }
}
