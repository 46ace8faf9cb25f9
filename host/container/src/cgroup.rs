//! cgroups for containers, on v1 (one hierarchy per controller, as on this host) or v2 (the
//! unified tree).
//!
//! ```text
//! v1: /sys/fs/cgroup/{memory,pids,cpu,freezer}/<parent>/<container>     limits, shim + init
//!     /sys/fs/cgroup/pids/<parent>/<container>/e<exec>                    one per exec (kill tree)
//! v2: /sys/fs/cgroup/<parent>/<container>                                 limits, shim + init
//!     /sys/fs/cgroup/<parent>/<container>/e<exec>                         one per exec
//! ```
//! Every exec gets its own child cgroup so a timeout can kill the whole process tree it grew,
//! including daemons that left its session. On v2 the container's `cgroup.procs` and each exec
//! cgroup are delegated to container root, so a process can move itself into its exec cgroup
//! from inside the user namespace (v1 allows writing "0" to an already-open file).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where cgroups live and which version the host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no cgroup hierarchy for {0} under {1}")]
    MissingController(&'static str, PathBuf),
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io { what, path: path.to_owned(), source }
}

/// How long a freeze or thaw may take before it is an error (a loaded node can take seconds).
const FREEZER_DEADLINE: Duration = Duration::from_secs(5);
/// Polls (1 ms apart) of the freezer state between two writes of the target state.
const FREEZER_POLLS_PER_WRITE: u32 = 10;
/// A v1 freeze still FREEZING after this many writes is thawed for a moment and tried again.
const FREEZER_THAW_EVERY: u32 = 50;

/// v1 controllers a container uses (each its own hierarchy).
const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
/// The v1 hierarchy exec cgroups live in.
const V1_EXEC_CONTROLLER: &str = "pids";

/// Resource limits of one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a core (1000 = one full core).
    pub cpu_millis: Option<u64>,
}

/// Where the kernel keeps the CFS bandwidth slice (a host-wide setting).
const BANDWIDTH_SLICE: &str = "/proc/sys/kernel/sched_cfs_bandwidth_slice_us";

/// Lowers the host's CFS bandwidth slice to at most `us` microseconds; returns the previous
/// value if it changed. A CPU takes runtime from its group's quota a slice at a time (5 ms by
/// default), so with a quota of a millisecond or two the first CPU takes it all and a process
/// woken on the other CPU (the child of every exec) waits for the next 100 ms period; with a
/// slice below the quota, both CPUs get their share.
pub fn lower_bandwidth_slice(us: u64) -> Result<Option<u64>, CgroupError> {
    let path = Path::new(BANDWIDTH_SLICE);
    let current: u64 = match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().unwrap_or(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CgroupError::Io { what: "read", path: path.into(), source }),
    };
    if us == 0 || current <= us {
        return Ok(None);
    }
    std::fs::write(path, us.to_string()).map_err(io("write", path))?;
    Ok(Some(current))
}

/// Puts the host's CFS bandwidth slice back to `us` (what [`lower_bandwidth_slice`] found).
pub fn restore_bandwidth_slice(us: u64) {
    let _ = std::fs::write(BANDWIDTH_SLICE, us.to_string());
}

/// Creates and finds container cgroups.
#[derive(Debug, Clone)]
pub struct CgroupManager {
    version: Version,
    root: PathBuf,
    parent: String,
}

impl CgroupManager {
    /// Detects the version mounted at `root` (normally `/sys/fs/cgroup`); containers go under
    /// `<parent>`.
    pub fn detect(root: &Path, parent: &str) -> Result<CgroupManager, CgroupError> {
        let version =
            if root.join("cgroup.controllers").exists() { Version::V2 } else { Version::V1 };
        let manager = CgroupManager { version, root: root.to_owned(), parent: parent.to_string() };
        match version {
            Version::V1 => {
                for ctrl in V1_CONTROLLERS {
                    if !root.join(ctrl).join("cgroup.procs").exists() {
                        return Err(CgroupError::MissingController(ctrl, root.to_owned()));
                    }
                    let dir = root.join(ctrl).join(parent);
                    std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
                }
            }
            Version::V2 => {
                let dir = root.join(parent);
                std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
                let available = std::fs::read_to_string(root.join("cgroup.subtree_control"))
                    .unwrap_or_default();
                let wanted: Vec<String> = ["memory", "pids", "cpu"]
                    .iter()
                    .filter(|c| available.split_whitespace().any(|a| a == **c))
                    .map(|c| format!("+{c}"))
                    .collect();
                if !wanted.is_empty() {
                    let ctl = dir.join("cgroup.subtree_control");
                    std::fs::write(&ctl, wanted.join(" "))
                        .map_err(io("enable controllers in", &ctl))?;
                }
            }
        }
        Ok(manager)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// Removes the (empty) parent cgroups.
    pub fn remove_parent(&self) {
        let parents: Vec<PathBuf> = match self.version {
            Version::V1 => {
                V1_CONTROLLERS.iter().map(|c| self.root.join(c).join(&self.parent)).collect()
            }
            Version::V2 => vec![self.root.join(&self.parent)],
        };
        for parent in parents {
            let _ = std::fs::remove_dir(parent);
        }
    }

    /// Names of the container cgroups under the parent, in any controller.
    pub fn names(&self) -> std::collections::BTreeSet<String> {
        let parents: Vec<PathBuf> = match self.version {
            Version::V1 => {
                V1_CONTROLLERS.iter().map(|c| self.root.join(c).join(&self.parent)).collect()
            }
            Version::V2 => vec![self.root.join(&self.parent)],
        };
        let mut names = std::collections::BTreeSet::new();
        for parent in parents {
            names.extend(
                child_cgroups(&parent)
                    .iter()
                    .filter_map(|d| d.file_name())
                    .map(|n| n.to_string_lossy().into_owned()),
            );
        }
        names
    }

    /// The cgroup of an existing container, by name.
    pub fn attach(&self, name: &str) -> ContainerCgroup {
        ContainerCgroup { version: self.version, dirs: self.dirs(name) }
    }

    /// Kills and removes every container cgroup under the parent except those named in `keep`.
    pub fn remove_all_except(&self, keep: &[String]) -> usize {
        let parents: Vec<PathBuf> = match self.version {
            Version::V1 => {
                V1_CONTROLLERS.iter().map(|c| self.root.join(c).join(&self.parent)).collect()
            }
            Version::V2 => vec![self.root.join(&self.parent)],
        };
        let mut removed = 0;
        for parent in parents {
            for dir in child_cgroups(&parent) {
                if keep.iter().any(|k| dir.file_name().is_some_and(|n| n == k.as_str())) {
                    continue;
                }
                kill_tree(&dir);
                if remove_tree(&dir).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    fn dirs(&self, name: &str) -> Vec<(&'static str, PathBuf)> {
        match self.version {
            Version::V1 => V1_CONTROLLERS
                .iter()
                .map(|c| (*c, self.root.join(c).join(&self.parent).join(name)))
                .collect(),
            Version::V2 => vec![("unified", self.root.join(&self.parent).join(name))],
        }
    }

    /// Creates the cgroup of container `name` with the memory and pids parts of `limits`.
    /// `owner` is the host uid of container root (v2 delegation). The CPU quota is set by
    /// [`ContainerCgroup::limit_cpu`] once the container has started: setting up namespaces
    /// and mounts is the node's work, and a small quota charged with it throttled each create
    /// for hundreds of milliseconds.
    pub fn create(
        &self,
        name: &str,
        limits: &CgroupLimits,
        owner: u32,
    ) -> Result<ContainerCgroup, CgroupError> {
        let cg = ContainerCgroup { version: self.version, dirs: self.dirs(name) };
        for (_, dir) in &cg.dirs {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        let write =
            |file: PathBuf, value: String| std::fs::write(&file, value).map_err(io("write", &file));
        match self.version {
            Version::V1 => {
                let dir = |c: &str| cg.dir(c).map(Path::to_path_buf);
                if let (Some(bytes), Some(d)) = (limits.memory_bytes, dir("memory")) {
                    write(d.join("memory.limit_in_bytes"), bytes.to_string())?;
                }
                if let (Some(n), Some(d)) = (limits.pids, dir("pids")) {
                    write(d.join("pids.max"), n.to_string())?;
                }
            }
            Version::V2 => {
                let d = cg.dirs[0].1.clone();
                if let Some(bytes) = limits.memory_bytes {
                    write(d.join("memory.max"), bytes.to_string())?;
                }
                if let Some(n) = limits.pids {
                    write(d.join("pids.max"), n.to_string())?;
                }
                chown(&d.join("cgroup.procs"), owner)?;
            }
        }
        Ok(cg)
    }
}

/// The CFS period and quota, in µs, that cap a container at `millis` thousandths of a core.
/// The period is the usual 100 ms unless its quota would be under `min_quota_us`; then it is
/// as long as needed for that quota, up to the kernel's limit of 1 s. The rate is the same
/// either way; what changes is how much CPU a quiet container may use at once. A quota of
/// 1 ms per 100 ms (10 millicores) is less than one `exec true` costs on a loaded node, so
/// every such exec would wait for the next period; 5 ms per 500 ms holds it.
pub fn cpu_period_and_quota(millis: u64, min_quota_us: u64) -> (u64, u64) {
    const DEFAULT_PERIOD_US: u64 = 100_000;
    const MAX_PERIOD_US: u64 = 1_000_000;
    /// The kernel refuses quotas under 1 ms.
    const MIN_QUOTA_US: u64 = 1_000;
    let millis = millis.max(1);
    let period =
        min_quota_us.saturating_mul(1000).div_ceil(millis).clamp(DEFAULT_PERIOD_US, MAX_PERIOD_US);
    (period, (millis.saturating_mul(period) / 1000).max(MIN_QUOTA_US))
}

/// Default of [`cpu_period_and_quota`]'s `min_quota_us` (node config
/// `[container] cpu_min_quota_us`).
pub const DEFAULT_CPU_MIN_QUOTA_US: u64 = 5_000;

impl ContainerCgroup {
    /// Caps the container at `millis` thousandths of a core, with a burst of one more quota:
    /// an idle container answers a short exec at once instead of waiting for the next period.
    /// The period is 100 ms, or longer when that would leave a quota under `min_quota_us`
    /// (see [`cpu_period_and_quota`]).
    pub fn limit_cpu(&self, millis: u64, min_quota_us: u64) -> Result<(), CgroupError> {
        let Some(d) = self.dir("cpu") else { return Ok(()) };
        let (period, quota) = cpu_period_and_quota(millis, min_quota_us);
        let (period, quota) = (period.to_string(), quota.to_string());
        let write = |name: &str, value: &str| {
            let file = d.join(name);
            std::fs::write(&file, value).map_err(io("write", &file))
        };
        // The burst is optional (kernels before 5.14 have none).
        match self.version {
            Version::V1 => {
                write_if_changed(&d.join("cpu.cfs_period_us"), &period)?;
                write("cpu.cfs_quota_us", &quota)?;
                if d.join("cpu.cfs_burst_us").exists() {
                    write("cpu.cfs_burst_us", &quota)?;
                }
            }
            // No cpu.max: the cpu controller is not delegated to this subtree.
            Version::V2 if !d.join("cpu.max").exists() => {
                tracing::warn!(cgroup = %d.display(), "no cpu controller: CPU limit not applied");
            }
            Version::V2 => {
                write("cpu.max", &format!("{quota} {period}"))?;
                if d.join("cpu.max.burst").exists() {
                    write("cpu.max.burst", &quota)?;
                }
            }
        }
        Ok(())
    }

    /// CPU QoS: best-effort gets the smallest weight and, where the kernel has `cpu.idle`, the
    /// idle scheduling policy for the whole group (it runs only on CPU nobody else wants);
    /// latency-sensitive gets the default weight.
    pub fn set_best_effort(&self, best_effort: bool) -> Result<(), CgroupError> {
        let Some(d) = self.dir("cpu") else { return Ok(()) };
        let (weight_file, weight) = match (self.version, best_effort) {
            (Version::V1, true) => ("cpu.shares", "2"),
            (Version::V1, false) => ("cpu.shares", "1024"),
            (Version::V2, true) => ("cpu.weight", "1"),
            (Version::V2, false) => ("cpu.weight", "100"),
        };
        // An idle group refuses weight changes: leave idle first, enter it last.
        let (path, idle) = (d.join(weight_file), d.join("cpu.idle"));
        let set_idle = |on: bool| -> Result<(), CgroupError> {
            if idle.exists() {
                std::fs::write(&idle, if on { "1" } else { "0" }).map_err(io("write", &idle))?;
            }
            Ok(())
        };
        set_idle(false)?;
        std::fs::write(&path, weight).map_err(io("write", &path))?;
        if best_effort {
            set_idle(true)?;
        }
        Ok(())
    }
}

/// Writes `value` to the cgroup file `file` unless it already reads so; says whether it wrote.
/// Every write of a CFS bandwidth file (`cpu.cfs_period_us`, `cpu.cfs_quota_us`,
/// `cpu.cfs_burst_us`, `cpu.max`) walks every task group on the host to check the hierarchy's
/// quotas (`tg_set_bandwidth` → `__cfs_schedulable`), so with thousands of containers each one
/// costs in proportion to them; reading costs nothing of the kind. A new cgroup's period is
/// already the usual 100 ms, so a container of a core or more skips that write; its quota (-1)
/// and burst (0) never hold what [`ContainerCgroup::limit_cpu`] writes, so those are not read.
fn write_if_changed(file: &Path, value: &str) -> Result<bool, CgroupError> {
    /// Cgroup files of one value are a few dozen bytes.
    const READ_CAP: u64 = 256;
    let mut current = String::new();
    let read =
        std::fs::File::open(file).and_then(|f| f.take(READ_CAP).read_to_string(&mut current));
    if read.is_ok() && current.trim() == value {
        return Ok(false);
    }
    std::fs::write(file, value).map_err(io("write", file))?;
    Ok(true)
}

fn chown(path: &Path, owner: u32) -> Result<(), CgroupError> {
    std::os::unix::fs::chown(path, Some(owner), Some(owner)).map_err(io("chown", path))
}

/// The cgroup(s) of one container.
#[derive(Debug, Clone)]
pub struct ContainerCgroup {
    version: Version,
    dirs: Vec<(&'static str, PathBuf)>,
}

impl ContainerCgroup {
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| *c == controller || *c == "unified")
            .map(|(_, d)| d.as_path())
    }

    /// Its directories that exist (one per controller).
    pub fn existing_dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.clone()).filter(|d| d.is_dir()).collect()
    }

    /// Host pids of every process in its tree (its exec cgroups too), each once.
    pub fn tree_pids(&self) -> Vec<i32> {
        let mut pids = std::collections::BTreeSet::new();
        let mut stack = self.existing_dirs();
        while let Some(d) = stack.pop() {
            pids.extend(read_pids(&d));
            stack.extend(child_cgroups(&d));
        }
        pids.into_iter().collect()
    }

    /// `cgroup.procs` files a process writes to join this container.
    pub fn join_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(_, d)| d.join("cgroup.procs")).collect()
    }

    /// Creates the cgroup of one exec. `owner`: host uid of container root.
    pub fn create_exec(&self, exec_id: u64, owner: u32) -> Result<ExecCgroup, CgroupError> {
        let parent = match self.version {
            Version::V1 => self.dir(V1_EXEC_CONTROLLER),
            Version::V2 => self.dir("unified"),
        }
        .ok_or(CgroupError::MissingController(V1_EXEC_CONTROLLER, PathBuf::new()))?;
        let dir = parent.join(format!("e{exec_id}"));
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        if self.version == Version::V2 {
            chown(&dir.join("cgroup.procs"), owner)?;
        }
        Ok(ExecCgroup { dir })
    }

    /// The existing exec cgroup `name` (`e<n>`, from [`ExecCgroup::name`]).
    pub fn exec_named(&self, name: &str) -> Option<ExecCgroup> {
        let digits = name.strip_prefix('e')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let parent = match self.version {
            Version::V1 => self.dir(V1_EXEC_CONTROLLER),
            Version::V2 => self.dir("unified"),
        }?;
        let dir = parent.join(name);
        dir.is_dir().then_some(ExecCgroup { dir })
    }

    /// Bytes of memory charged to the container now.
    pub fn memory_bytes(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => self.dir("memory")?.join("memory.usage_in_bytes"),
            Version::V2 => self.dir("unified")?.join("memory.current"),
        };
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// CPU time used by every process of the container so far, in nanoseconds.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        match self.version {
            Version::V1 => {
                let file = self.dir("cpuacct")?.join("cpuacct.usage");
                std::fs::read_to_string(file).ok()?.trim().parse().ok()
            }
            Version::V2 => {
                let text = std::fs::read_to_string(self.dir("unified")?.join("cpu.stat")).ok()?;
                let usec: u64 = text.lines().find_map(|l| {
                    l.strip_prefix("usage_usec ").and_then(|n| n.trim().parse().ok())
                })?;
                Some(usec.saturating_mul(1000))
            }
        }
    }

    /// How many processes the kernel's OOM killer has killed in this container.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V1 => self.dir("memory").map(|d| d.join("memory.oom_control")),
            Version::V2 => self.dir("unified").map(|d| d.join("memory.events")),
        };
        let Some(text) = file.and_then(|f| std::fs::read_to_string(f).ok()) else { return 0 };
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// Freezes (`true`) or thaws the whole container and waits until the kernel is done.
    pub fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError> {
        let (file, value, done) = match self.version {
            Version::V1 => {
                let d = self
                    .dir("freezer")
                    .ok_or(CgroupError::MissingController("freezer", PathBuf::new()))?;
                (
                    d.join("freezer.state"),
                    if frozen { "FROZEN" } else { "THAWED" },
                    if frozen { "FROZEN" } else { "THAWED" },
                )
            }
            Version::V2 => {
                let d = self
                    .dir("unified")
                    .ok_or(CgroupError::MissingController("unified", PathBuf::new()))?;
                (
                    d.join("cgroup.freeze"),
                    if frozen { "1" } else { "0" },
                    if frozen { "frozen 1" } else { "frozen 0" },
                )
            }
        };
        let check = match self.version {
            Version::V1 => file.clone(),
            Version::V2 => file.with_file_name("cgroup.events"),
        };
        // A v1 freezer that meets a task it cannot freeze yet (in an uninterruptible sleep, or
        // forked while freezing) stays FREEZING until the state is written again, so the target
        // is re-written every few milliseconds; a freeze that still hangs is thawed for a moment
        // now and then, which lets such a task reach a point where it can be frozen (what runc
        // does too). Writing the same value again is harmless on either version.
        let started = Instant::now();
        let mut turn = 0u32;
        loop {
            std::fs::write(&file, value).map_err(io("write", &file))?;
            for _ in 0..FREEZER_POLLS_PER_WRITE {
                let state = std::fs::read_to_string(&check).unwrap_or_default();
                if state.lines().any(|l| l.trim() == done) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if started.elapsed() > FREEZER_DEADLINE {
                return Err(CgroupError::Io {
                    what: "reach freezer state in",
                    path: check,
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, value),
                });
            }
            turn += 1;
            if frozen && self.version == Version::V1 && turn.is_multiple_of(FREEZER_THAW_EVERY) {
                std::fs::write(&file, "THAWED").map_err(io("write", &file))?;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Pushes the container's reclaimable memory (page cache; anonymous memory too where there
    /// is swap) out of RAM; returns the bytes freed. Never OOM-kills: on v1 the limit is lowered
    /// step by step until the kernel refuses (EBUSY), then restored.
    pub fn reclaim(&self) -> u64 {
        let before = self.memory_bytes().unwrap_or(0);
        match self.version {
            Version::V2 => {
                if let Some(d) = self.dir("unified") {
                    let _ = std::fs::write(d.join("memory.reclaim"), before.to_string());
                }
            }
            Version::V1 => {
                let Some(d) = self.dir("memory") else { return 0 };
                let limit_file = d.join("memory.limit_in_bytes");
                let Ok(original) = std::fs::read_to_string(&limit_file) else { return 0 };
                let step: u64 = 4 << 20;
                for _ in 0..4096 {
                    let usage = self.memory_bytes().unwrap_or(0);
                    if usage <= step {
                        break;
                    }
                    if std::fs::write(&limit_file, (usage - step).to_string()).is_err() {
                        break;
                    }
                }
                let _ = std::fs::write(&limit_file, original.trim());
            }
        }
        before.saturating_sub(self.memory_bytes().unwrap_or(before))
    }

    /// Kills every process of the container (all exec cgroups included).
    pub fn kill_all(&self) {
        // Frozen (paused) tasks act on SIGKILL only once thawed: queue the kill first, so they
        // die the moment they thaw instead of running on.
        for (_, dir) in &self.dirs {
            signal_tree(dir);
        }
        if self.is_frozen() {
            let _ = self.set_frozen(false);
        }
        for (_, dir) in &self.dirs {
            kill_tree(dir);
        }
    }

    /// Whether the container is frozen (paused) or being frozen: a node that died while
    /// freezing it can leave v1's freezer in FREEZING, whose tasks answer nothing.
    pub fn is_frozen(&self) -> bool {
        let (file, frozen): (_, &[&str]) = match self.version {
            Version::V1 => {
                (self.dir("freezer").map(|d| d.join("freezer.state")), &["FROZEN", "FREEZING"])
            }
            Version::V2 => (self.dir("unified").map(|d| d.join("cgroup.freeze")), &["1"]),
        };
        let state = file.and_then(|f| std::fs::read_to_string(f).ok());
        state.is_some_and(|s| frozen.contains(&s.trim()))
    }

    /// Removes the container's cgroups; processes must be gone (retries briefly while the
    /// kernel finishes tearing them down).
    pub fn remove(&self) -> Result<(), CgroupError> {
        for (_, dir) in &self.dirs {
            remove_tree(dir)?;
        }
        Ok(())
    }
}

/// The cgroup of one exec.
#[derive(Debug, Clone)]
pub struct ExecCgroup {
    dir: PathBuf,
}

impl ExecCgroup {
    /// Its directory's name, `e<n>`.
    pub fn name(&self) -> String {
        self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// Opens `cgroup.procs` for writing, to hand to the process that joins.
    pub fn open_procs(&self) -> Result<std::fs::File, CgroupError> {
        let path = self.dir.join("cgroup.procs");
        std::fs::OpenOptions::new().write(true).open(&path).map_err(io("open", &path))
    }

    /// Host pids of the processes in this exec's tree.
    pub fn pids(&self) -> Vec<i32> {
        read_pids(&self.dir)
    }

    /// SIGKILLs every process in the tree until none is left.
    pub fn kill(&self) {
        kill_tree(&self.dir);
    }

    /// Removes the cgroup if it is empty; `false` if processes (background jobs) remain.
    pub fn remove_if_empty(&self) -> bool {
        std::fs::remove_dir(&self.dir).is_ok()
    }
}

fn read_pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Kills every process in `dir` and its descendants, repeating while a fork bomb races us
/// (bounded by pids.max, since killed processes cannot fork).
fn kill_tree(dir: &Path) {
    // cgroup v2's one-write kill (no such file under v1: opening it fails).
    let kill = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.kill"));
    if kill.and_then(|mut f| std::io::Write::write_all(&mut f, b"1")).is_ok() {
        return;
    }
    for _ in 0..200 {
        if !signal_tree(dir) {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGKILLs every process in `dir` and its descendants once; `false` if there were none.
fn signal_tree(dir: &Path) -> bool {
    let mut found = false;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for pid in read_pids(&d) {
            found = true;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        stack.extend(child_cgroups(&d));
    }
    found
}

/// The cgroups directly under `dir`: its subdirectories, told from its control files by the
/// type `getdents` reports (cgroup file systems fill it in), not by a `stat` of each of the
/// dozens of files a cgroup directory holds.
fn child_cgroups(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    for child in child_cgroups(dir) {
        remove_tree(&child)?;
    }
    let mut last = None;
    for _ in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                last = Some(e);
                kill_tree(dir);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    Err(CgroupError::Io {
        what: "remove",
        path: dir.to_owned(),
        source: last.unwrap_or_else(|| std::io::Error::other("busy")),
    })
}

#[cfg(test)]
mod tests {
    use super::{cpu_period_and_quota, write_if_changed};

    #[test]
    fn a_bandwidth_file_that_already_holds_the_value_is_not_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cpu.cfs_period_us");
        // The kernel's files end in a newline.
        std::fs::write(&file, "100000\n").expect("seed");
        assert!(!write_if_changed(&file, "100000").expect("same"));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "100000\n");
        assert!(write_if_changed(&file, "500000").expect("changed"));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "500000");
        // v2's one file of two values.
        let max = dir.path().join("cpu.max");
        std::fs::write(&max, "max 100000\n").expect("seed");
        assert!(write_if_changed(&max, "5000 500000").expect("changed"));
        assert!(!write_if_changed(&max, "5000 500000").expect("same"));
        // A file that cannot be read or written is the write's typed error.
        let missing = dir.path().join("gone").join("cpu.cfs_quota_us");
        assert!(write_if_changed(&missing, "5000").is_err());
    }

    #[test]
    fn small_quotas_get_longer_periods_at_the_same_rate() {
        // A core or more: the usual 100 ms period.
        assert_eq!(cpu_period_and_quota(1000, 5_000), (100_000, 100_000));
        assert_eq!(cpu_period_and_quota(2500, 5_000), (100_000, 250_000));
        assert_eq!(cpu_period_and_quota(50, 5_000), (100_000, 5_000));
        // 10 millicores: 5 ms per 500 ms instead of 1 ms per 100 ms.
        assert_eq!(cpu_period_and_quota(10, 5_000), (500_000, 5_000));
        assert_eq!(cpu_period_and_quota(30, 5_000), (166_667, 5_000));
        // The kernel's longest period, then its smallest quota.
        assert_eq!(cpu_period_and_quota(2, 5_000), (1_000_000, 2_000));
        assert_eq!(cpu_period_and_quota(0, 5_000), (1_000_000, 1_000));
        // 0 keeps 100 ms periods, never under the kernel's 1 ms quota.
        assert_eq!(cpu_period_and_quota(10, 0), (100_000, 1_000));
        assert_eq!(cpu_period_and_quota(3, 0), (100_000, 1_000));
        for millis in [1, 7, 10, 33, 99, 100, 101, 999, 16_000] {
            let (period, quota) = cpu_period_and_quota(millis, 5_000);
            assert!((100_000..=1_000_000).contains(&period), "{millis}: {period}");
            // The rate asked for, to within the rounding of one µs per period.
            let rate = quota as f64 * 1000.0 / period as f64;
            assert!((rate - millis as f64).abs() <= millis as f64 * 0.01 + 1.0, "{millis}: {rate}");
        }
    }
}
