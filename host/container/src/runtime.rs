//! Creating and destroying containers, and starting processes in them from outside.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::files::{FileError, OwnedRootDir};
use crate::rootfs::{LayerMounts, LayerSource, Rootfs, RootfsError};
use crate::shim_conn::{ShimConn, ShimConnError};
use crate::shim_proto::{ExitInfo, FromShim, SpawnSpec, ToShim};
use crate::spawner::{ShimSpawner, SpawnerError};
use brig_hostkit::cgroup::{CgroupError, CgroupLimits, CgroupManager, ContainerCgroup, ExecCgroup};

/// Host uid/gid container root maps to by default; 65536 ids are mapped from it.
pub const DEFAULT_ID_BASE: u32 = 100_000;
/// How many ids each container maps.
pub const ID_COUNT: u32 = 65_536;
/// What every process of a container has as its OOM score adjustment (`oom_score_adj`): when
/// the container's memory runs out (a full writable layer in memory, an upload), the OOM
/// killer takes one of them, not the shim (its pid 1, whose end is the container's); when the
/// host's runs out, containers go before the host's own services. The node sets it for each
/// process it starts (raising takes no privilege); the shim itself is exempt (-1000) where the
/// node has CAP_SYS_RESOURCE.
pub const PROCESS_OOM_SCORE_ADJ: &str = "500";

/// The shim's listening socket, in the container's run directory.
pub(crate) const SHIM_SOCKET: &str = "shim.sock";
/// Seconds between sweeps of a container's spools.
pub(crate) const SPOOL_SWEEP_SECS: u64 = 60;
/// How long a container may take to come up.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(20);

pub use crate::shim::security::{MASKED_PATHS, READONLY_PATHS};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Shim(#[from] ShimConnError),
    #[error(transparent)]
    Spawner(#[from] SpawnerError),
    #[error("container shim {path} cannot start")]
    ShimStart {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("container setup failed: {0}")]
    Setup(String),
    #[error("container did not start within {0:?}")]
    StartTimeout(Duration),
    #[error("I/O on {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why a container whose shim hung up is lost.
pub(crate) const SHIM_ENDED: &str = "its shim ended, and the node cannot reach it";

impl From<brig_hostkit::terminal::TerminalError> for RuntimeError {
    fn from(e: brig_hostkit::terminal::TerminalError) -> RuntimeError {
        RuntimeError::Io { what: e.what, source: e.source }
    }
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

/// Where the runtime keeps things and how it maps ids.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Scratch directory for layer mounts and per-container mounts.
    pub run_dir: PathBuf,
    /// The `brig-shim` binary.
    pub shim_path: PathBuf,
    /// Host uid and gid of container root.
    pub id_base: u32,
    /// cgroup filesystem root (normally /sys/fs/cgroup).
    pub cgroup_root: PathBuf,
    /// Parent cgroup of all containers of this runtime.
    pub cgroup_parent: String,
    /// Containers outlive the node process (their shims wait for it to reconnect).
    pub survive_node: bool,
    /// Where commands' output is spooled, a directory per container (`crate::spool`); on
    /// disk rather than in the run directory's memory. `None`: `<run_dir>/spool`.
    pub spool_dir: Option<PathBuf>,
    /// The smallest CPU quota per period a container gets: smaller quotas get longer periods
    /// ([`brig_hostkit::cgroup::cpu_period_and_quota`]).
    pub cpu_min_quota_us: u64,
    /// Destroyed containers' cgroups kept for the next creates, at most (v1 hosts;
    /// `brig_hostkit::cgroup::SpareCgroups`). 0 keeps none.
    pub spare_cgroups: usize,
    /// A spare cgroup not taken within this many seconds is removed (0: kept until shutdown).
    pub spare_cgroups_idle_secs: u64,
    /// The disk-backed store of writable layers (`crate::writable_store`), mounted at
    /// `<run_dir>/writable`. `None`, or a store that cannot be made (logged): each writable
    /// layer is a tmpfs charged to its container's memory.
    pub writable_store: Option<crate::writable_store::StoreConfig>,
}

/// A node's default [`RuntimeConfig::spare_cgroups`]: as many as the containers a node is
/// sized for (`[container] reserve_shrinker_ids_for`), so that a whole wave's cgroups wait
/// for the next wave.
pub const DEFAULT_SPARE_CGROUPS: usize = 10_000;

/// A node's default [`RuntimeConfig::spare_cgroups_idle_secs`]: longer than an RL trainer's
/// update between two waves of rollouts usually takes, short enough that a node left idle
/// gives the memory back within minutes.
pub const DEFAULT_SPARE_CGROUPS_IDLE_SECS: u64 = 300;

impl RuntimeConfig {
    pub(crate) fn spool_root(&self) -> PathBuf {
        self.spool_dir.clone().unwrap_or_else(|| self.run_dir.join("spool"))
    }
}

/// What to create.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Unique name on this node (used in paths and cgroup names).
    pub name: String,
    pub hostname: String,
    /// Layers, bottom (base) first.
    pub layers: Vec<LayerSource>,
    pub limits: CgroupLimits,
    /// Writable-layer quota.
    pub disk_bytes: u64,
    /// Start from a copy of this writable layer (forks).
    pub seed: Option<PathBuf>,
    /// Paths covered read-only or hidden.
    pub protect: crate::protect::Protections,
}

/// The most removed spool files kept for the next commands (empty: an inode each), in
/// `spool-spare` beside the spool directory.
const SPARE_SPOOLS: usize = 4096;

/// A shim serving its container: its connection, and the processes the node knows it by
/// (pid and start time, so a recycled pid is not mistaken for it).
pub(crate) struct Serving {
    pub(crate) shim: Arc<ShimConn>,
    pub(crate) shim_pid: i32,
    pub(crate) shim_start: u64,
    pub(crate) init_pid: i32,
    pub(crate) init_start: u64,
}

/// The container runtime of one node (`Runtime::create` is in `create.rs`).
pub struct Runtime {
    pub(crate) config: RuntimeConfig,
    pub(crate) cgroups: CgroupManager,
    pub(crate) layers: LayerMounts,
    pub(crate) spawner: Arc<ShimSpawner>,
    /// The read-only sysfs containers share, if it could be mounted.
    pub(crate) shared_sys: Option<crate::shared_sys::SharedSys>,
    /// Removed spools' files, for the next commands' (`brig_hostkit::spare_files`).
    pub(crate) spool_spares: Option<Arc<brig_hostkit::spare_files::SpareFiles>>,
    /// The store writable layers are made on, if the node has one.
    pub(crate) store: Option<Arc<crate::writable_store::WritableStore>>,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let cgroups = CgroupManager::detect(&config.cgroup_root, &config.cgroup_parent)?
            .with_spares(
                config.spare_cgroups,
                std::time::Duration::from_secs(config.spare_cgroups_idle_secs),
            );
        let layers = LayerMounts::new(&config.run_dir.join("layers"))?;
        // 0711: traversable without listing (shims of earlier builds reached the rootfs through
        // them as container root; a shim now clones it from here as host root).
        use std::os::unix::fs::PermissionsExt;
        for dir in [config.run_dir.clone(), config.run_dir.join("c")] {
            std::fs::create_dir_all(&dir).map_err(io_err("run directory"))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                .map_err(io_err("run directory"))?;
        }
        if let Err(e) = crate::containers_dir::mount_tmpfs(&config.run_dir.join("c")) {
            tracing::warn!(error = %e, "container directories stay on the run directory's disk");
        }
        if !config.shim_path.exists() {
            return Err(RuntimeError::ShimStart {
                path: config.shim_path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        }
        let spawner = Arc::new(ShimSpawner::new(config.shim_path.clone()));
        let shared_sys = match crate::shared_sys::mount_at(&config.run_dir.join("sys")) {
            Ok(shared) => Some(shared),
            Err(e) => {
                tracing::warn!(error = %e, "no shared sysfs; each container mounts its own");
                None
            }
        };
        let spare_dir = config.spool_root().with_file_name("spool-spare");
        let spares = brig_hostkit::spare_files::SpareFiles::open(&spare_dir, SPARE_SPOOLS);
        let spool_spares =
            spares.inspect_err(|e| tracing::warn!(error = %e, "no spare spools")).ok();
        let spool_spares = spool_spares.map(Arc::new);
        let store = config.writable_store.as_ref().and_then(|store| {
            let point = config.run_dir.join("writable");
            match crate::writable_store::WritableStore::open(store, &point) {
                Ok(store) => Some(Arc::new(store)),
                Err(e) => {
                    let error = brig_core::sandbox::chain(&e);
                    tracing::warn!(%error, "no disk-backed writable store; writable layers are tmpfs in the containers' memory");
                    None
                }
            }
        });
        Ok(Runtime { config, cgroups, layers, spawner, shared_sys, spool_spares, store })
    }

    /// The disk-backed store writable layers are made on (`None`: tmpfs layers).
    pub fn writable_store(&self) -> Option<&Arc<crate::writable_store::WritableStore>> {
        self.store.as_ref()
    }

    /// How many destroyed containers' cgroups are kept for the next creates now.
    pub fn spare_cgroups(&self) -> usize {
        self.cgroups.spare_count()
    }

    /// Releases node-wide resources (layer mounts) at shutdown, after the containers are gone.
    pub fn shutdown(&self) {
        self.layers.unmount_all();
        if let Some(sys) = &self.shared_sys {
            crate::shared_sys::unmount(&sys.path);
        }
        self.cgroups.remove_spares();
        self.cgroups.remove_parent();
        crate::containers_dir::unmount_if_empty(&self.config.run_dir.join("c"));
        if let Some(store) = &self.store {
            store.unmount_if_empty();
        }
        for dir in [
            self.config.run_dir.join("layers"),
            self.config.run_dir.join("sys"),
            self.config.run_dir.join("c"),
            self.config.run_dir.clone(),
        ] {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Kills and removes every container an earlier run left behind except those in `keep`
    /// (the ones the node has records of and re-attached).
    pub fn remove_orphans(&self, keep: &[String]) -> usize {
        let mut removed = 0;
        if let Ok(entries) = std::fs::read_dir(self.config.run_dir.join("c")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if keep.contains(&name) {
                    continue;
                }
                let cg = self.cgroups.attach(&name);
                cg.kill_all();
                let _ = cg.remove();
                let _ = Rootfs::at(&e.path()).with_store(self.store.clone()).remove();
                removed += 1;
            }
        }
        // Layers on the store whose run directory is already gone.
        if let Some(store) = &self.store {
            for name in store.names().into_iter().filter(|n| !keep.contains(n)) {
                if let Err(e) = store.remove(&name) {
                    tracing::warn!(container = name, error = %e, "cannot remove a writable layer");
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.config.spool_root()) {
            for e in entries.flatten() {
                if !keep.contains(&e.file_name().to_string_lossy().into_owned()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        removed += self.cgroups.remove_all_except(keep);
        if removed > 0 {
            tracing::info!(removed, "removed containers left by an earlier run");
        }
        removed
    }

    /// Reconnects to a container an earlier run of the node started (its shim kept it alive).
    /// A paused container is thawed for the moment it takes its shim to answer (the shim shares
    /// the container's freezer), then frozen again.
    pub async fn attach(&self, name: &str) -> Result<Container, RuntimeError> {
        let cgroup = self.cgroups.attach(name);
        let frozen = cgroup.is_frozen();
        if frozen {
            cgroup.set_frozen(false)?;
        }
        let attached = self.reconnect(name).await;
        if frozen {
            cgroup.set_frozen(true)?;
        }
        attached
    }

    async fn reconnect(&self, name: &str) -> Result<Container, RuntimeError> {
        let dir = self.config.run_dir.join("c").join(name);
        let socket = dir.join(SHIM_SOCKET);
        let sock = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| io_err("shim socket")(e.into()))?;
        let addr = nix::sys::socket::UnixAddr::new(&socket)
            .map_err(|e| io_err("shim socket path")(e.into()))?;
        nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&sock), &addr)
            .map_err(|e| io_err(format!("connect {}", socket.display()))(e.into()))?;
        let shim_pid =
            nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)
                .map_err(|e| io_err("shim credentials")(e.into()))?
                .pid();
        let shim_start = process_start_time(shim_pid)
            .ok_or_else(|| RuntimeError::Setup(format!("container shim {shim_pid} is gone")))?;
        let shim = ShimConn::new(sock)?;
        let (report, fds) = tokio::time::timeout(START_TIMEOUT, shim.recv_with_fds())
            .await
            .map_err(|_| RuntimeError::StartTimeout(START_TIMEOUT))??;
        let rootfs = Rootfs::at(&dir).with_store(self.store.clone());
        let (init_pid, running, next_exec_id, rootfs, kept) = match report {
            FromShim::ReattachedKeeping { init_pid, running, next_exec_id, upper_fd, kept } => {
                let upper = upper_link(shim_pid, upper_fd);
                (init_pid, running, next_exec_id, rootfs.with_upper_link(upper), Some(kept))
            }
            // Shims from earlier versions keep no output descriptors.
            FromShim::ReattachedAt { init_pid, running, next_exec_id, upper_fd } => {
                let upper = upper_link(shim_pid, upper_fd);
                (init_pid, running, next_exec_id, rootfs.with_upper_link(upper), None)
            }
            FromShim::Reattached { init_pid, running, next_exec_id } => {
                let Some(upper) = fds.into_iter().next() else {
                    return Err(RuntimeError::Setup("shim sent no upper directory".into()));
                };
                (init_pid, running, next_exec_id, rootfs.with_upper(upper), None)
            }
            other => return Err(RuntimeError::Setup(format!("unexpected shim message {other:?}"))),
        };
        let keeps_output = kept.is_some();
        let kept = crate::kept::receive(&shim, kept.unwrap_or_default()).await?;
        if !running.is_empty() {
            tracing::info!(
                container = name,
                running = running.len(),
                "processes from before the restart keep running"
            );
        }
        let init_start = process_start_time(init_pid)
            .ok_or_else(|| RuntimeError::Setup(format!("container init {init_pid} is gone")))?;
        let serving = Serving { shim, shim_pid, shim_start, init_pid, init_start };
        let cgroup = self.cgroups.attach(name);
        Ok(self.container(
            name,
            rootfs,
            cgroup,
            serving,
            next_exec_id,
            keeps_output.then_some(kept),
        ))
    }

    /// The node's record of a container its shim serves, just created or re-attached.
    /// `kept` is the output the shim keeps of its commands; `None` for a shim that keeps none.
    pub(crate) fn container(
        &self,
        name: &str,
        rootfs: Rootfs,
        cgroup: ContainerCgroup,
        serving: Serving,
        next_exec: u64,
        kept: Option<std::collections::HashMap<u64, crate::kept::KeptOutput>>,
    ) -> Container {
        let Serving { shim, shim_pid, shim_start, init_pid, init_start } = serving;
        let dispatcher = tokio::spawn(shim.clone().dispatch());
        Container {
            name: name.to_string(),
            id_base: self.config.id_base,
            rootfs,
            cgroup,
            shim,
            shim_pid,
            shim_start,
            dispatcher,
            init_pid,
            init_start,
            next_exec: AtomicU64::new(next_exec),
            exec_cgroups: Arc::default(),
            oom_seen: AtomicU64::new(0),
            keeps_output: kept.is_some(),
            spool_dir: self.config.spool_root().join(name),
            spool_swept: AtomicU64::new(0),
            finished_spools: crate::spool::FinishedSpools::new(self.spool_spares.clone()),
            kept: parking_lot::Mutex::new(kept.unwrap_or_default()),
            spawner: self.spawner.clone(),
        }
    }

    pub fn cgroup_version(&self) -> brig_hostkit::cgroup::Version {
        self.cgroups.version()
    }
}

/// The upper directory through the shim's descriptor of it.
pub(crate) fn upper_link(shim_pid: i32, upper_fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{shim_pid}/fd/{upper_fd}"))
}

/// When process `pid` started (clock ticks after boot; field 22 of /proc/<pid>/stat), which
/// tells it from a later process given the same pid.
pub fn process_start_time(pid: i32) -> Option<u64> {
    stat_field(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?, 22)
}

/// Process `host_pid`'s pid in its innermost pid namespace (the last `NSpid` of its
/// `/proc/<pid>/status`): what it is inside its sandbox.
pub fn pid_in_namespace(host_pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    innermost_pid(&status)
}

fn innermost_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Numeric field `n` (from 1, as proc(5) counts) of a `/proc/<pid>/stat` text, from field 3 on.
pub(crate) fn stat_field(stat: &str, n: usize) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain anything: skip past it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n.checked_sub(3)?)?.parse().ok()
}

/// A running container.
pub struct Container {
    pub(crate) name: String,
    id_base: u32,
    rootfs: Rootfs,
    pub(crate) cgroup: ContainerCgroup,
    pub(crate) shim: Arc<ShimConn>,
    /// The shim's host pid (alive while its control socket is open) and start time. The
    /// container's init since the shim became it; a separate process in containers started
    /// by earlier builds and re-attached.
    shim_pid: i32,
    shim_start: u64,
    dispatcher: tokio::task::JoinHandle<()>,
    init_pid: i32,
    /// Start time of init (see [`process_start_time`]), checked whenever its root is opened.
    init_start: u64,
    next_exec: AtomicU64,
    pub(crate) exec_cgroups: ExecCgroupPool,
    oom_seen: AtomicU64,
    /// Its shim holds output descriptors for a reconnecting node (shims from before
    /// `SpawnKeeping` do not).
    keeps_output: bool,
    spool_dir: PathBuf,
    /// When its spools were last swept (seconds on the monotonic clock since the node began).
    pub(crate) spool_swept: AtomicU64,
    /// Its finished commands' spools, bounded (`crate::spool::FinishedSpools`).
    pub(crate) finished_spools: crate::spool::FinishedSpools,
    /// Commands from an earlier run of the node, handed back by the shim, until claimed.
    pub(crate) kept: parking_lot::Mutex<std::collections::HashMap<u64, crate::kept::KeptOutput>>,
    /// The node's spawner, which also starts typists (`crate::exec`).
    pub(crate) spawner: Arc<ShimSpawner>,
}

/// Empty exec cgroups kept for reuse per container: creating and removing one per exec costs
/// two cgroupfs operations on the exec path.
const EXEC_CGROUP_POOL: usize = 8;

pub(crate) type ExecCgroupPool = Arc<parking_lot::Mutex<Vec<ExecCgroup>>>;

/// A process started in a container.
pub struct Process {
    pub exec_id: u64,
    /// Host pid.
    pub pid: i32,
    pub(crate) exit: oneshot::Receiver<ExitInfo>,
    pub(crate) cgroup: ExecCgroup,
    pub(crate) pool: ExecCgroupPool,
    /// The shim keeps its output descriptors (`crate::kept`) until told to let go.
    pub(crate) keeper: Option<Arc<ShimConn>>,
}

impl Process {
    /// Waits for the process itself to exit (its children may live on).
    pub async fn wait(&mut self) -> Option<ExitInfo> {
        (&mut self.exit).await.ok()
    }

    /// Tells the shim to close the output descriptors it kept for this process: the node has
    /// all of its output (or wants no more).
    pub fn release_kept(&self) {
        if let Some(shim) = &self.keeper {
            let (shim, exec_id) = (shim.clone(), self.exec_id);
            tokio::spawn(async move {
                let _ = shim.send(&ToShim::ReleaseKept { exec_id }).await;
            });
        }
    }

    /// Its exec cgroup's name (`e<n>`), by which [`Container::reclaim_process`] finds it again.
    pub fn cgroup_name(&self) -> String {
        self.cgroup.name()
    }

    /// Kills the process and everything it started.
    pub fn kill_tree(&self) {
        self.cgroup.kill();
    }

    /// A closure that kills the tree, for use from another task.
    pub fn tree_killer(&self) -> impl FnOnce() + Send + 'static {
        let cgroup = self.cgroup.clone();
        move || cgroup.kill()
    }

    /// Host pids in this process's tree.
    pub fn tree_pids(&self) -> Vec<i32> {
        self.cgroup.pids()
    }

    /// Returns its cgroup for reuse if nothing is left in it (background jobs keep it). A
    /// cgroup that was killed is never reused: a kill loop may still be sweeping it.
    pub fn cleanup(&self, reusable: bool) -> bool {
        if !self.cgroup.pids().is_empty() {
            return false;
        }
        if !reusable {
            return self.cgroup.remove_if_empty();
        }
        let mut pool = self.pool.lock();
        if pool.len() < EXEC_CGROUP_POOL {
            pool.push(self.cgroup.clone());
            true
        } else {
            self.cgroup.remove_if_empty()
        }
    }
}

/// A spawn request, without descriptors.
#[derive(Debug, Clone, Default)]
pub struct SpawnRequest {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub user: Option<String>,
    /// Its stdin is a terminal that becomes its controlling terminal.
    pub terminal: bool,
}

impl Container {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Host pid of the container's init.
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// Opens the container's root directory (as init sees it), for confined file access.
    /// Opened per use rather than held: one descriptor fewer per live container.
    pub fn root_dir(&self) -> Result<OwnedRootDir, FileError> {
        use rustix::fs::{open, Mode, OFlags};
        let failed = |source: std::io::Error| FileError::Io { path: "/".into(), source };
        let path = format!("/proc/{}/root", self.init_pid);
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = open(path.as_str(), flags, Mode::empty()).map_err(|e| failed(e.into()))?;
        // Checked after the open: if init is still the process that started, the descriptor is
        // its root, not that of a later process that took its pid.
        if process_start_time(self.init_pid) != Some(self.init_start) {
            return Err(failed(std::io::Error::from_raw_os_error(libc::ESRCH)));
        }
        Ok(OwnedRootDir::new(fd, self.id_base))
    }

    /// Host uid that container root maps to.
    pub fn id_base(&self) -> u32 {
        self.id_base
    }

    pub fn cgroup(&self) -> &ContainerCgroup {
        &self.cgroup
    }

    /// The container's writable layer (host-side path valid in this process); `None` if it
    /// has none or its shim is gone. The path may run through the shim's descriptor: use it
    /// while the container is frozen (the shim, in the container's cgroups, cannot exit then,
    /// so its pid cannot pass to another process).
    pub fn upper_path(&self) -> Option<PathBuf> {
        if process_start_time(self.shim_pid) != Some(self.shim_start) {
            return None;
        }
        self.rootfs.upper_path()
    }

    /// Freezes or thaws every process of the container (blocking; run off the async runtime).
    pub fn set_frozen(&self, frozen: bool) -> Result<(), RuntimeError> {
        Ok(self.cgroup.set_frozen(frozen)?)
    }

    /// CPU time used so far (ns) and memory charged now (bytes).
    pub fn usage(&self) -> (u64, u64) {
        (self.cgroup.cpu_usage_ns().unwrap_or(0), self.cgroup.memory_bytes().unwrap_or(0))
    }

    /// Pushes reclaimable memory out (blocking); returns the bytes freed.
    pub fn reclaim(&self) -> u64 {
        self.cgroup.reclaim()
    }

    /// Ends every process of the container but its init and shim (blocking): what a command
    /// started, sessions and background jobs alike. The files stay.
    pub fn end_processes(&self) -> Result<(), RuntimeError> {
        Ok(self.cgroup.kill_all_but(&[self.init_pid, self.shim_pid])?)
    }

    /// Writes the writable layer's dirty pages to its disk (blocking), so that its page cache
    /// can be given back. Best effort: a container without a layer of its own has none.
    pub fn sync_files(&self) {
        let Some(upper) = self.upper_path() else { return };
        let flags = rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::CLOEXEC;
        if let Ok(dir) = rustix::fs::open(&upper, flags, rustix::fs::Mode::empty()) {
            let _ = rustix::fs::syncfs(&dir);
        }
    }

    /// OOM kills in the container since the last call (the kernel's counter only grows).
    pub fn new_oom_kills(&self) -> u64 {
        let now = self.cgroup.oom_kills();
        now.saturating_sub(self.oom_seen.swap(now, Ordering::Relaxed))
    }

    /// Whether the container's init is still alive.
    pub fn is_alive(&self) -> bool {
        self.death().is_none()
    }

    /// Why the container is gone, if it is: its init ended, or its shim (without which the
    /// node cannot reach it) did.
    pub fn death(&self) -> Option<String> {
        if let Some(status) = self.shim.init_died() {
            return Some(format!("its init ended ({status:?})"));
        }
        self.dispatcher.is_finished().then(|| SHIM_ENDED.into())
    }

    /// Starts a process with `stdio` (stdin, stdout, stderr) and `extra` descriptors (which
    /// become fds 3, 4, … in the process). `keep`: the node's read ends of its output, which
    /// the shim holds so the process outlives the node ([`crate::kept`]), where it can, and
    /// `keep_input` the node's write end of its stdin, held with them.
    pub async fn spawn(
        &self,
        request: SpawnRequest,
        stdio: [BorrowedFd<'_>; 3],
        extra: &[BorrowedFd<'_>],
        keep: &[BorrowedFd<'_>],
        keep_input: Option<BorrowedFd<'_>>,
    ) -> Result<Process, RuntimeError> {
        let exec_id = self.next_exec.fetch_add(1, Ordering::Relaxed);
        let pooled = self.exec_cgroups.lock().pop();
        let cgroup = match pooled {
            Some(cg) => cg,
            None => self.cgroup.create_exec(exec_id, self.id_base)?,
        };
        let procs = cgroup.open_procs()?;
        let spec = SpawnSpec {
            exec_id,
            argv: request.argv,
            env: request.env,
            cwd: if request.cwd.is_empty() { "/".into() } else { request.cwd },
            user: request.user,
            terminal: request.terminal,
            extra_fds: u8::try_from(extra.len())
                .map_err(|_| RuntimeError::Setup("too many fds".into()))?,
            cgroup_fds: 1,
        };
        let mut fds: Vec<BorrowedFd<'_>> = stdio.to_vec();
        fds.extend_from_slice(extra);
        fds.push(procs.as_fd());
        let keep = if self.keeps_output { keep } else { &[] };
        fds.extend_from_slice(keep);
        let keeps_input = !keep.is_empty() && keep_input.is_some();
        fds.extend(keep_input.filter(|_| keeps_input));
        let keep_fds = u8::try_from(keep.len() + usize::from(keeps_input))
            .map_err(|_| RuntimeError::Setup("too many fds".into()))?;
        let (pid, exit) = self.shim.spawn(spec, &fds, keep_fds, keeps_input).await?;
        // Raising a score takes no privilege, but the process cannot do it itself before it
        // execs (it is not dumpable then, so its /proc files are host root's).
        let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), PROCESS_OOM_SCORE_ADJ);
        let keeper = (keep_fds > 0).then(|| self.shim.clone());
        Ok(Process { exec_id, pid, exit, cgroup, pool: self.exec_cgroups.clone(), keeper })
    }

    /// Where its commands' output is spooled (`crate::spool`); removed with it.
    pub fn spool_dir(&self) -> PathBuf {
        self.spool_dir.clone()
    }

    /// Kills everything and removes the container's mounts, cgroups and directories.
    /// Processes still referring to the container see it gone.
    pub async fn destroy(&self) -> Result<(), RuntimeError> {
        if process_start_time(self.init_pid) == Some(self.init_start) {
            let init = nix::unistd::Pid::from_raw(self.init_pid);
            let _ = nix::sys::signal::kill(init, nix::sys::signal::Signal::SIGKILL);
        }
        let cgroup = self.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.kill_all())
            .await
            .map_err(|e| RuntimeError::Setup(format!("cleanup task: {e}")))?;
        // The shim exits when init does, which ends the dispatcher (its connection).
        for _ in 0..500 {
            if self.dispatcher.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let shim_alive = process_start_time(self.shim_pid) == Some(self.shim_start);
        if !self.dispatcher.is_finished() && shim_alive {
            let shim = nix::unistd::Pid::from_raw(self.shim_pid);
            let _ = nix::sys::signal::kill(shim, nix::sys::signal::Signal::SIGKILL);
        }
        self.dispatcher.abort();
        let cgroup = self.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.release())
            .await
            .map_err(|e| RuntimeError::Setup(format!("cleanup task: {e}")))??;
        // Off the async workers: a writable layer on disk may hold gigabytes.
        tokio::task::spawn_blocking(self.rootfs.remover())
            .await
            .map_err(|e| RuntimeError::Setup(format!("cleanup task: {e}")))??;
        if let Err(e) = self.finished_spools.remove_dir(&self.spool_dir) {
            tracing::warn!(dir = %self.spool_dir.display(), error = %e, "cannot remove spools");
        }
        Ok(())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // Closes the node's end of the control socket: a shim that is not to outlive the node
        // takes its container down, one that is waits to be re-attached.
        self.dispatcher.abort();
    }
}

/// Finds `brig-shim` next to the running executable.
pub fn default_shim_path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("brig-shim")))
        .unwrap_or_else(|| Path::new("/usr/local/bin/brig-shim").to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pid_inside_its_namespace_is_the_last_nspid() {
        let status = "Name:\tbash\nTgid:\t4242\nNSpid:\t4242\t17\nNSpgid:\t4242\t17\n";
        assert_eq!(super::innermost_pid(status), Some(17));
        assert_eq!(super::innermost_pid("NSpid:\t99\n"), Some(99));
        assert_eq!(super::innermost_pid("Name:\tx\n"), None);
        assert!(super::pid_in_namespace(std::process::id() as i32).is_some());
    }
}
