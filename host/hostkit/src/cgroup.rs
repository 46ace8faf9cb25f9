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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod bandwidth;
mod spares;
use bandwidth::write_if_changed;
pub use bandwidth::{
    cpu_period_and_quota, lower_bandwidth_slice, restore_bandwidth_slice, DEFAULT_CPU_MIN_QUOTA_US,
};
pub use spares::{is_spare_name, SpareCgroups, SPARE_PREFIX};

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

/// Creates and finds container cgroups.
#[derive(Debug, Clone)]
pub struct CgroupManager {
    version: Version,
    root: PathBuf,
    parent: String,
    /// Destroyed containers' cgroups kept for the next creates (v1; `spares`).
    spares: Option<Arc<SpareCgroups>>,
}

impl CgroupManager {
    /// Detects the version mounted at `root` (normally `/sys/fs/cgroup`); containers go under
    /// `<parent>`.
    pub fn detect(root: &Path, parent: &str) -> Result<CgroupManager, CgroupError> {
        let version =
            if root.join("cgroup.controllers").exists() { Version::V2 } else { Version::V1 };
        let manager = CgroupManager {
            version,
            root: root.to_owned(),
            parent: parent.to_string(),
            spares: None,
        };
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

    /// Keeps up to `cap` destroyed containers' cgroups for the next creates (`spares`): on v1
    /// only (v2 cannot rename a cgroup), and none for a `cap` of 0. A spare not taken within
    /// `idle` is removed (never, for a zero `idle`).
    pub fn with_spares(mut self, cap: usize, idle: std::time::Duration) -> CgroupManager {
        self.spares =
            (self.version == Version::V1 && cap > 0).then(|| Arc::new(SpareCgroups::new(cap)));
        if let (Some(spares), false) = (&self.spares, idle.is_zero()) {
            SpareCgroups::start_trimming(spares, idle);
        }
        self
    }

    /// How many spare cgroups are kept now.
    pub fn spare_count(&self) -> usize {
        self.spares.as_ref().map_or(0, |s| s.len())
    }

    /// Removes the spare cgroups (at shutdown, before [`CgroupManager::remove_parent`]).
    pub fn remove_spares(&self) {
        if let Some(spares) = &self.spares {
            spares.remove_all();
        }
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

    /// Names of the container cgroups under the parent, in any controller (spares are not
    /// containers').
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
                    .map(|n| n.to_string_lossy().into_owned())
                    .filter(|n| !is_spare_name(n)),
            );
        }
        names
    }

    /// The cgroup of an existing container, by name.
    pub fn attach(&self, name: &str) -> ContainerCgroup {
        ContainerCgroup {
            version: self.version,
            dirs: self.dirs(name),
            spares: self.spares.clone(),
        }
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

    /// Creates the cgroup of container `name` with the memory and pids parts of `limits`, from
    /// a spare where one is kept. `owner` is the host uid of container root (v2 delegation).
    /// The CPU quota is set by [`ContainerCgroup::limit_cpu`] once the container has started:
    /// setting up namespaces and mounts is the node's work, and a small quota charged with it
    /// throttled each create for hundreds of milliseconds.
    pub fn create(
        &self,
        name: &str,
        limits: &CgroupLimits,
        owner: u32,
    ) -> Result<ContainerCgroup, CgroupError> {
        let dirs = self.dirs(name);
        let spares = self.spares.clone();
        if let Some(taken) = spares.as_ref().and_then(|s| s.take(&dirs)) {
            let cg = ContainerCgroup { version: self.version, dirs: taken, spares: spares.clone() };
            match cg.write_limits(limits, true).and_then(|()| cg.reset_cpu(limits)) {
                Ok(()) => return Ok(cg),
                Err(e) => {
                    tracing::warn!(container = name, error = %e, "cannot reuse a spare cgroup");
                    let _ = cg.remove();
                }
            }
        }
        let cg = ContainerCgroup { version: self.version, dirs, spares };
        for (_, dir) in &cg.dirs {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        cg.write_limits(limits, false)?;
        if self.version == Version::V2 {
            chown(&cg.dirs[0].1.join("cgroup.procs"), owner)?;
        }
        Ok(cg)
    }
}

impl ContainerCgroup {
    /// Writes the memory and pids parts of `limits`; with `unset_too`, a part `limits` leaves
    /// out is written as unlimited (a spare's last container may have had one).
    fn write_limits(&self, limits: &CgroupLimits, unset_too: bool) -> Result<(), CgroupError> {
        let (memory_file, unlimited_memory) = match self.version {
            Version::V1 => ("memory.limit_in_bytes", "-1"),
            Version::V2 => ("memory.max", "max"),
        };
        let parts = [
            ("memory", memory_file, limits.memory_bytes, unlimited_memory),
            ("pids", "pids.max", limits.pids, "max"),
        ];
        for (controller, file, value, unlimited) in parts {
            let value = match value {
                Some(n) => n.to_string(),
                None if unset_too => unlimited.to_string(),
                None => continue,
            };
            if let Some(d) = self.dir(controller) {
                let file = d.join(file);
                std::fs::write(&file, value).map_err(io("write", &file))?;
            }
        }
        Ok(())
    }
}

fn chown(path: &Path, owner: u32) -> Result<(), CgroupError> {
    std::os::unix::fs::chown(path, Some(owner), Some(owner)).map_err(io("chown", path))
}

/// The cgroup(s) of one container.
#[derive(Debug, Clone)]
pub struct ContainerCgroup {
    version: Version,
    dirs: Vec<(&'static str, PathBuf)>,
    /// Where [`ContainerCgroup::release`] keeps it, if the node keeps spares.
    spares: Option<Arc<SpareCgroups>>,
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

    /// Kills every process of the container but those of `keep` (its init and shim), which
    /// hold its namespaces: frozen first, so nothing forks between a look and a kill, then
    /// killed (kills queue on frozen tasks) and thawed, then swept until none is left.
    pub fn kill_all_but(&self, keep: &[i32]) -> Result<(), CgroupError> {
        let others =
            || -> Vec<i32> { self.tree_pids().into_iter().filter(|p| !keep.contains(p)).collect() };
        let sigkill = |pids: Vec<i32>| {
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        };
        self.set_frozen(true)?;
        sigkill(others());
        self.set_frozen(false)?;
        for _ in 0..500 {
            let left = others();
            if left.is_empty() {
                return Ok(());
            }
            sigkill(left);
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
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

    /// Once the container is destroyed and its processes killed: keeps its cgroups as a spare
    /// for a later create where the node keeps spares and they qualify (`spares`), removes
    /// them otherwise.
    pub fn release(&self) -> Result<(), CgroupError> {
        if self.spares.as_ref().is_some_and(|s| s.keep(self)) {
            return Ok(());
        }
        self.remove()
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
