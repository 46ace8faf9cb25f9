//! The node's side of the microVM tier: each sandbox is a `brig-vmm` process resumed from the
//! environment's snapshot (so every VM shares the snapshot's memory pages copy-on-write), and
//! commands reach the guest's `brig-agent` over the VMM's vsock Unix socket.
//!
//! The snapshot is made once per node: a VM boots the guest kernel and initramfs, whose init
//! starts the agent and asks for its snapshot. A VMM that dies is reaped and its socket and log
//! removed; dropping the tier kills its VMMs (each runs in its own process group).
//!
//! Each VMM also serves a control socket (`<id>.ctl`): memory statistics, the balloon, and
//! snapshots of the running VM, which pause ([`VmTier::pause`]: the VM is saved and its VMM
//! exits) and fork ([`VmTier::fork`]) are built on (see [`lifecycle`]).
//!
//! The tier is offered only where Linux guests run: hardware virtualization.
#![forbid(unsafe_code)]

mod adopt;
mod agent_link;
mod container_host;
pub use brig_vmm_api::agent::ProcessRun;
pub use brig_vmm_api::container::{
    ContainerUsage, CreateSpec as HostedContainerSpec, Failure as HostedFailure, FileEntry,
};
pub use container_host::{guest_disk, HostedContainer};
mod fullvm;
mod guest_files;
pub use fullvm::GuestAddress;
pub mod guest_exec;
pub mod hosts;
mod kept_work;
pub mod records;
pub use records::{HostedRecord, MachineRecord};
pub mod sandbox;
pub use sandbox::VmSandbox;
pub mod lifecycle;
mod pool;
mod session;
pub mod strays;
mod vmm_process;
pub use vmm_process::VmmId;
use vmm_process::VmmProcess;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use brig_hostkit::cgroup::{CgroupLimits, CgroupManager};
use brig_vmm_api::agent::AgentRequest;
use brig_vmm_api::launch::{DiskSpec, JailSpec, LaunchConfig, NetSpec, Start};
use brig_vmm_api::Virtualization;
use tokio::sync::Mutex;

use agent_link::{collect, exec_inner, request_stream, request_with_body, request_within};
pub use agent_link::{
    exec_stream, exec_stream_input, ExecEvent, ExecStream, GuestStdin, ReplyLimits, MAX_GUEST_FILE,
};
use guest_files::file_failure;
pub use lifecycle::VmStats;

/// Where the guest and the VMM are, and how big a VM is.
#[derive(Debug, Clone)]
pub struct VmTierConfig {
    /// The `brig-vmm` binary.
    pub vmm: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    pub mem_mib: usize,
    /// vCPUs per VM (each a thread of its VMM).
    pub vcpus: usize,
    /// The tier's directory: the snapshot and each VM's socket and log.
    pub dir: PathBuf,
    /// Let KSM merge identical pages across VMs (costs ksmd CPU time; off by default).
    pub ksm: bool,
    /// VMMs kept started ahead, waiting for a VM to resume (see `pool`).
    pub warm: usize,
    /// A full-VM tier: every VM boots this operating system image (its own init, kernel and
    /// initramfs from `kernel`/`initrd`) through a copy-on-write overlay of its own, instead
    /// of resuming an environment snapshot (see `fullvm`).
    pub root_image: Option<PathBuf>,
    /// How long a booting VM's init may take to start the agent (a full VM; a resumed VM gets
    /// a minute).
    pub boot_limit: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum VmTierError {
    #[error("VMs cannot run here: {0}")]
    Unavailable(String),
    /// A file transfer's path in the guest is no regular file (the agent's words).
    #[error("{0}")]
    NotRegular(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("making the environment snapshot failed (brig-vmm exit {code:?}); log: {log}")]
    Snapshot { code: Option<i32>, log: String },
    #[error("the VM did not come up within {0:?} (its agent never answered)")]
    StartTimeout(Duration),
    #[error("agent: {0}")]
    Agent(String),
    #[error("the command ran past {0:?}")]
    ExecTimeout(Duration),
    /// The guest's reply ran past the bytes the host takes in for it.
    #[error("the guest's reply is larger than the {limit}-byte limit")]
    ReplyTooLarge { limit: usize },
    /// The guest's reply did not end within its deadline.
    #[error("the guest did not finish its reply within {0:?}")]
    ReplyTimeout(Duration),
    #[error("the VMM's control socket: {0}")]
    Control(String),
    #[error("the VM is paused")]
    Paused,
    /// The VM is gone (its VMM ended), or could not be taken back after a restart.
    #[error("the VM is lost: {0}")]
    Lost(String),
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// A container request the container-host VM's agent refused.
    #[error("{message}")]
    Container { failure: brig_vmm_api::container::Failure, message: String },
    /// A request on the VM's own files its agent refused (`crate::guest_files`).
    #[error("{message}")]
    GuestFile { failure: brig_vmm_api::container::Failure, message: String },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmTierError {
    let what = what.into();
    move |source| VmTierError::Io { what, source }
}

/// What a command in a guest produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

/// One microVM: its VMM process (none while paused) and the sockets to its guest and VMM.
#[derive(Debug)]
pub struct MicroVm {
    pub id: String,
    process: Mutex<Option<VmmProcess>>,
    /// The running VMM's pid and start time (read without waiting for `process`).
    pid: std::sync::Mutex<Option<VmmId>>,
    pub uds: PathBuf,
    /// The VMM's control socket.
    control: PathBuf,
    log: PathBuf,
    /// The image's layers and the VM's own writable disk, when it runs an image.
    disks: Option<Disks>,
    /// Its network device's tap and namespace, when it has one.
    net: Option<VmNet>,
    /// The snapshot directory the VM's memory is mapped from (its environment's, or a saved
    /// one after a pause or for a fork's child).
    memory_from: std::sync::Mutex<PathBuf>,
    /// Saved to `memory_from` with no VMM running.
    paused: std::sync::atomic::AtomicBool,
    /// Set when a pause starts saving the VM, until it resumes (or the save fails): a kept
    /// command's connection that ends meanwhile is detached, not ended (see
    /// `guest_exec::KeptCommand::saving`).
    saving: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The protocol its guest's agent speaks, once asked (see [`MicroVm::agent_protocol`]).
    agent_protocol: tokio::sync::OnceCell<u32>,
}

impl MicroVm {
    /// The protocol its guest's agent speaks, asked at the first need. A VM keeps its agent
    /// for its life, across pauses; a failed ask is asked again next time.
    pub(crate) async fn agent_protocol(&self) -> Result<u32, VmTierError> {
        let ask = || agent_link::agent_protocol(&self.uds);
        self.agent_protocol.get_or_try_init(ask).await.copied()
    }

    /// Its network device's tap and namespace, if it has one.
    pub fn net(&self) -> Option<&VmNet> {
        self.net.as_ref()
    }

    /// What a kept command of this VM watches to tell a pause's hang-up from an end.
    pub(crate) fn saving_flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.saving.clone()
    }

    /// A VM named `id` with its sockets and log in `dir`, not started; `memory_from` is the
    /// snapshot it will resume from (empty: it boots).
    pub(crate) fn new(dir: &Path, id: &str, disks: Option<Disks>, memory_from: PathBuf) -> MicroVm {
        MicroVm::with_net(dir, id, disks, memory_from, None)
    }

    pub(crate) fn with_net(
        dir: &Path,
        id: &str,
        disks: Option<Disks>,
        memory_from: PathBuf,
        net: Option<VmNet>,
    ) -> MicroVm {
        MicroVm {
            id: id.to_string(),
            process: Mutex::new(None),
            pid: std::sync::Mutex::new(None),
            uds: dir.join(format!("{id}.sock")),
            control: dir.join(format!("{id}.ctl")),
            log: dir.join(format!("{id}.log")),
            disks,
            net,
            memory_from: std::sync::Mutex::new(memory_from),
            paused: Default::default(),
            saving: Default::default(),
            agent_protocol: Default::default(),
        }
    }
}

/// A VM's network device: a tap the host made in a network namespace of the VM's own; the
/// VMM joins the namespace and attaches to the tap before it jails itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmNet {
    /// The namespace (e.g. `/run/netns/<name>`).
    pub netns: PathBuf,
    pub tap: String,
}

/// A snapshot to resume VMs from: the bare guest, or the guest with an image mounted.
#[derive(Debug, Clone)]
struct Environment {
    dir: PathBuf,
    /// The image's layers and the writable disk as it was at the snapshot.
    disks: Option<Disks>,
}

/// A VM's disks: its image's read-only layers (EROFS files, base first: /dev/vda, vdb, …)
/// and a writable disk after them, which the guest's init stacks into one overlay; or, for a
/// full VM, one root disk: the OS image as a base, `writable` the VM's sparse overlay of it;
/// or, for a container-host VM, layers alone (its containers mount them).
#[derive(Debug, Clone)]
pub(crate) struct Disks {
    pub layers: Vec<PathBuf>,
    pub writable: Option<PathBuf>,
    /// The read-only base `writable` is a copy-on-write overlay of.
    pub cow_base: Option<PathBuf>,
}

impl Disks {
    /// The VMM's disks, in attach order.
    fn specs(&self) -> Vec<DiskSpec> {
        let mut specs: Vec<DiskSpec> = self.layers.iter().map(DiskSpec::read_only).collect();
        if let Some(writable) = &self.writable {
            specs.push(match &self.cow_base {
                Some(base) => DiskSpec::cow(base, writable),
                None => DiskSpec::writable(writable),
            });
        }
        specs
    }
}

/// Layers an image may stack in a microVM (each is a virtio-blk disk).
pub const MAX_LAYERS: usize = 16;

/// The cgroup every VMM of the tier in `dir` sits under: `brig-vm-<hash of dir>`, so two
/// daemons on one host never reap each other's VMMs.
fn cgroup_parent(dir: &Path) -> String {
    // Stable across builds, which a restarted daemon needs to find its predecessor's.
    format!("brig-vm-{:08x}", adopt::fnv64(&dir.to_string_lossy()) as u32)
}
/// Memory a VMM may use beyond its guest's (its own code and device buffers, and the page
/// cache of the snapshots it writes, which on a tmpfs cannot be reclaimed: as much again as the
/// guest, plus this).
const VMM_MEMORY_SLACK: u64 = 256 << 20;
/// Threads a VMM may have (vCPU, device backends, control connections).
const VMM_PIDS: u64 = 256;

/// Size of each VM's writable disk (sparse).
const SCRATCH_BYTES: u64 = 256 << 20;

fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl MicroVm {
    /// The VMM's console log.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The VMM's pid (none while paused).
    pub fn pid(&self) -> Option<u32> {
        locked(&self.pid).map(|id| id.pid)
    }

    /// Whether the VM is paused: saved to disk, no VMM running.
    pub fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How its VMM ended, once it has (none while it runs, is paused, or is busy elsewhere).
    pub fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut process = self.process.try_lock().ok()?;
        process.as_mut()?.try_exit_status()
    }

    /// Whether the VM is in order: paused, or its VMM still runs (it may have died on its own:
    /// a guest crash, an out-of-memory kill).
    pub fn is_running(&self) -> bool {
        if self.is_paused() {
            return true;
        }
        // Its pid with its start time: a later process given the same pid is not it.
        locked(&self.pid).is_some_and(|id| id.alive())
    }
}

#[derive(Debug)]
pub struct VmTier {
    cfg: VmTierConfig,
    /// Where each VMM's cgroup goes (`brig-vm/<id>`); none where the host has no cgroups.
    cgroups: Option<CgroupManager>,
    virtualization: Virtualization,
    environments: Mutex<HashMap<String, Environment>>,
    /// Saved snapshots (pauses, fork points) and how many VMs map their memory.
    saved: std::sync::Mutex<HashMap<PathBuf, usize>>,
    next_saved: std::sync::atomic::AtomicU64,
    /// Warm VMMs waiting for a VM.
    pool: std::sync::Mutex<Vec<pool::Standby>>,
    next_standby: std::sync::atomic::AtomicU64,
}

impl VmTier {
    /// The tier, if this host can run it.
    pub fn open(cfg: VmTierConfig) -> Result<VmTier, VmTierError> {
        let virtualization = Virtualization::detect();
        if !virtualization.runs_linux() {
            return Err(VmTierError::Unavailable(format!(
                "Linux guests need hardware virtualization; this host has {}",
                virtualization.as_str()
            )));
        }
        for (what, path) in [
            ("brig-vmm", &cfg.vmm),
            ("guest kernel", &cfg.kernel),
            ("guest initramfs", &cfg.initrd),
        ] {
            if !path.exists() {
                return Err(VmTierError::Unavailable(format!(
                    "{what} {} is missing",
                    path.display()
                )));
            }
        }
        if let Some(image) = &cfg.root_image {
            VmTier::check_image(image)?;
        }
        std::fs::create_dir_all(&cfg.dir).map_err(io(format!("creating {}", cfg.dir.display())))?;
        // VMs of a previous daemon stay until the node has adopted what it recorded and
        // called `remove_orphans` for the rest.
        let parent = cgroup_parent(&cfg.dir);
        let cgroups = match CgroupManager::detect(Path::new("/sys/fs/cgroup"), &parent) {
            Ok(manager) => Some(manager),
            Err(e) => {
                tracing::warn!(error = %e, "VMMs run without cgroups of their own");
                None
            }
        };
        Ok(VmTier {
            cfg,
            cgroups,
            virtualization,
            environments: Mutex::new(Default::default()),
            saved: Default::default(),
            // Saved snapshots of adopted VMs keep their names: new ones count on from now.
            next_saved: std::sync::atomic::AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0),
            ),
            pool: Default::default(),
            next_standby: Default::default(),
        })
    }

    pub fn virtualization(&self) -> Virtualization {
        self.virtualization
    }

    /// The snapshot for an image (its EROFS layer files, base first; none: the bare guest),
    /// made on first use: a VM boots with the layers as read-only disks and an empty writable
    /// disk, its init stacks them under an overlay (`brig.layers=N` on its command line) and
    /// starts the agent, and it asks to be snapshotted.
    async fn environment(&self, layers: &[PathBuf]) -> Result<Environment, VmTierError> {
        if layers.len() > MAX_LAYERS {
            return Err(VmTierError::Agent(format!("more than {MAX_LAYERS} layers")));
        }
        let key = layers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join("+");
        let mut envs = self.environments.lock().await;
        if let Some(env) = envs.get(&key) {
            return Ok(env.clone());
        }
        // Named by what it was made for, so a restarted daemon finds it again.
        let fingerprint = self.environment_fingerprint(&key);
        let name = format!("env-{:016x}", adopt::fnv64(&fingerprint));
        let dir = self.cfg.dir.join(&name);
        let writable = self.cfg.dir.join(format!("{name}.disk"));
        let marker = dir.join(adopt::ENV_MARKER);
        let whole = layers.is_empty() || writable.exists();
        if whole && std::fs::read_to_string(&marker).ok().as_deref() == Some(fingerprint.as_str()) {
            let disks = (!layers.is_empty()).then(|| Disks {
                layers: layers.to_vec(),
                writable: Some(writable),
                cow_base: None,
            });
            tracing::info!(dir = %dir.display(), image = %key, "microvm environment snapshot reused");
            self.refill();
            let env = Environment { dir, disks };
            envs.insert(key, env.clone());
            return Ok(env);
        }
        let _ = std::fs::remove_dir_all(&dir);
        let log = self.cfg.dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).map_err(io("snapshot log"))?;
        let mut cmdline = String::new();
        let disks = if layers.is_empty() {
            None
        } else {
            cmdline = format!("brig.layers={}", layers.len());
            let f = std::fs::File::create(&writable).map_err(io("writable disk"))?;
            f.set_len(SCRATCH_BYTES).map_err(io("writable disk"))?;
            Some(Disks { layers: layers.to_vec(), writable: Some(writable), cow_base: None })
        };
        let launch = LaunchConfig {
            start: self.boot_start(&cmdline, Some(dir.clone())),
            // The boot to the snapshot request gets the tier's boot limit.
            timeout_s: self.cfg.boot_limit.as_secs().max(1),
            vsock_uds: Some(self.cfg.dir.join(format!("{name}.sock"))),
            control_uds: None,
            disks: disks.as_ref().map(Disks::specs).unwrap_or_default(),
            net: None,
            ksm: false,
            jail: Some(JailSpec { writable: vec![self.cfg.dir.clone()], cgroup_procs: vec![] }),
        };
        let mut child = self.launch_vmm(&launch, log_file, true).await?;
        // The VMM ends itself at the boot limit; past it (and a margin), it is stuck.
        let limit = self.cfg.boot_limit + Duration::from_secs(60);
        let status = match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => status.map_err(io("waiting for the snapshot VMM"))?,
            Err(_) => {
                let _ = child.start_kill();
                return Err(VmTierError::StartTimeout(limit));
            }
        };
        if status.code() != Some(4) {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: String =
                text.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(VmTierError::Snapshot { code: status.code(), log: tail });
        }
        // Last: a snapshot cut short has no marker and is made again.
        std::fs::write(&marker, &fingerprint).map_err(io("environment snapshot marker"))?;
        tracing::info!(dir = %dir.display(), image = %key, "microvm environment snapshot made");
        // The first use of the tier starts its warm VMMs.
        self.refill();
        let env = Environment { dir, disks };
        envs.insert(key, env.clone());
        Ok(env)
    }

    /// A new microVM resumed from the environment snapshot for an image (its EROFS layer
    /// files, base first; none: the bare guest), with its own copy of the writable disk, its
    /// agent answering.
    pub async fn create(&self, id: &str, layers: &[PathBuf]) -> Result<MicroVm, VmTierError> {
        if self.cfg.root_image.is_some() {
            return self.create_full(id, None).await;
        }
        let env = self.environment(layers).await?;
        // The guest's mounted file system is in the snapshot: each VM starts from the disk
        // exactly as it was then.
        self.start_from(id, &env.dir, env.disks.clone(), None).await
    }

    /// A VM resumed from snapshot `dir`, its writable disk a copy of `disks`' writable one and
    /// its network device (if any) on `net`'s tap, given its own identity once its agent
    /// answers.
    pub(crate) async fn start_from(
        &self,
        id: &str,
        dir: &Path,
        disks: Option<Disks>,
        net: Option<VmNet>,
    ) -> Result<MicroVm, VmTierError> {
        let disks = match disks {
            Some(Disks { layers, writable: Some(writable), cow_base }) => {
                let own = self.cfg.dir.join(format!("{id}.disk"));
                // Hole by hole: a copy-on-write overlay's holes mean "as in the base".
                brig_vmm_api::sparse::copy_sparse(&writable, &own)
                    .map_err(io("copying the writable disk"))?;
                Some(Disks { layers, writable: Some(own), cow_base })
            }
            Some(read_only) => Some(read_only),
            None => None,
        };
        let vm = MicroVm::with_net(&self.cfg.dir, id, disks, dir.to_owned(), net);
        if let Err(e) = self.spawn_vmm(&vm).await {
            self.destroy(&vm).await;
            return Err(e);
        }
        if let Err(e) = self.give_identity(&vm).await {
            self.destroy(&vm).await;
            return Err(e);
        }
        Ok(vm)
    }

    /// Starts `vm`'s VMM, resuming it from its `memory_from` snapshot, and waits for its agent.
    /// A VM with no snapshot yet (a full VM's first start) boots instead.
    pub(crate) async fn spawn_vmm(&self, vm: &MicroVm) -> Result<(), VmTierError> {
        let dir = locked(&vm.memory_from).clone();
        let boots = dir.as_os_str().is_empty();
        let mut launch = LaunchConfig {
            start: if boots { self.boot_start("", None) } else { Start::Resume { snapshot: dir } },
            timeout_s: 31_536_000,
            vsock_uds: Some(vm.uds.clone()),
            control_uds: Some(vm.control.clone()),
            disks: vm.disks.as_ref().map(Disks::specs).unwrap_or_default(),
            net: vm.net.as_ref().map(|net| NetSpec {
                tap: net.tap.clone(),
                netns: Some(net.netns.clone()),
                mac: DEFAULT_MAC,
            }),
            ksm: self.cfg.ksm,
            jail: None,
        };
        let cgroup = match &self.cgroups {
            Some(cgroups) => {
                let limits = CgroupLimits {
                    memory_bytes: Some(2 * ((self.cfg.mem_mib as u64) << 20) + VMM_MEMORY_SLACK),
                    pids: Some(VMM_PIDS),
                    cpu_millis: None,
                };
                let cgroup = cgroups.create(&vm.id, &limits, 0).map_err(|e| VmTierError::Io {
                    what: "VMM cgroup".into(),
                    source: std::io::Error::other(e),
                })?;
                cgroup.join_files()
            }
            None => Vec::new(),
        };
        let pid_file = self.cfg.dir.join(format!("{}.pid", vm.id));
        // A warm VMM is jailed already: it cannot join a network namespace or attach a tap.
        let standby = if boots || vm.net.is_some() { None } else { self.take_standby() };
        let child = match standby {
            Some(standby) => {
                // A warm VMM: already jailed; it joins the VM's cgroup from here.
                if let Some(pid) = standby.pid() {
                    for procs in &cgroup {
                        std::fs::write(procs, pid.to_string()).map_err(io("VMM cgroup"))?;
                    }
                }
                std::fs::rename(&standby.log, &vm.log).map_err(io("VM log"))?;
                std::fs::rename(&standby.pid_file, &pid_file).map_err(io("VMM pid file"))?;
                let child = standby.resume(&launch).await?;
                self.refill();
                child
            }
            None => {
                let log_file = std::fs::File::create(&vm.log).map_err(io("VM log"))?;
                // The jail: only the tier's directory is writable; the VMM joins its cgroup.
                launch.jail =
                    Some(JailSpec { writable: vec![self.cfg.dir.clone()], cgroup_procs: cgroup });
                // Not killed when dropped: a VM the node keeps outlives the daemon.
                self.launch_vmm(&launch, log_file, false).await?
            }
        };
        let (process, id) = VmmProcess::started(child);
        if let Some(id) = id {
            // Recorded so a later daemon can adopt this VMM, or stop it, if this one dies
            // first; pid and start time prove it is the same process.
            id.write(&pid_file).map_err(io("VMM pid file"))?;
        }
        *vm.process.lock().await = Some(process);
        *locked(&vm.pid) = id;
        let limit = if boots { self.cfg.boot_limit } else { Duration::from_secs(60) };
        let started = std::time::Instant::now();
        loop {
            match self.exec(vm, "true", Duration::from_secs(10)).await {
                Ok(out) if out.exit_code == 0 => return Ok(()),
                _ if started.elapsed() > limit => return Err(VmTierError::StartTimeout(limit)),
                _ => {
                    let exited = vm.process.lock().await.as_mut().and_then(|p| p.try_exit_status());
                    if let Some(status) = exited {
                        let text = std::fs::read_to_string(&vm.log).unwrap_or_default();
                        return Err(VmTierError::Agent(format!("VMM exited ({status}): {text}")));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// How this tier's machine boots: its kernel, initramfs and command line (with `extra`
    /// appended), memory, vCPUs, rng and balloon; disks and sockets are the caller's.
    pub(crate) fn boot_start(&self, extra: &str, snapshot_to: Option<PathBuf>) -> Start {
        let c = &self.cfg;
        let cmdline =
            if extra.is_empty() { c.cmdline.clone() } else { format!("{} {extra}", c.cmdline) };
        Start::Boot {
            kernel: c.kernel.clone(),
            initrd: Some(c.initrd.clone()),
            cmdline,
            mem_mib: c.mem_mib,
            vcpus: u8::try_from(c.vcpus).unwrap_or(u8::MAX),
            rng: true,
            balloon: true,
            snapshot_to,
        }
    }

    /// Starts `brig-vmm launch` (its own process group, output to `log`) and hands it `launch`
    /// on stdin; `kill_on_drop`: the process ends when its handle is dropped.
    async fn launch_vmm(
        &self,
        launch: &LaunchConfig,
        log: std::fs::File,
        kill_on_drop: bool,
    ) -> Result<tokio::process::Child, VmTierError> {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(&self.cfg.vmm)
            .arg("launch")
            .stdin(std::process::Stdio::piped())
            .stdout(log.try_clone().map_err(io("VMM log"))?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(kill_on_drop)
            .spawn()
            .map_err(io(format!("starting {}", self.cfg.vmm.display())))?;
        let mut stdin =
            child.stdin.take().ok_or_else(|| VmTierError::Agent("no VMM stdin".into()))?;
        let line = launch.to_line();
        stdin.write_all(line.as_bytes()).await.map_err(io("handing the VMM its launch"))?;
        Ok(child)
    }

    /// Every VM resumed from one snapshot starts as the same machine: give this one its own
    /// hostname and stir fresh host entropy into its random pool.
    async fn give_identity(&self, vm: &MicroVm) -> Result<(), VmTierError> {
        let mut seed = [0u8; 32];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").map_err(io("entropy"))?,
            &mut seed,
        )
        .map_err(io("entropy"))?;
        let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
        let name: String =
            vm.id.chars().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect();
        // Part of bringing a VM up (after a fork's restore): a share of the boot limit, so
        // that a slow (emulated) host that boots within its limit also gets through this.
        let limit = (self.cfg.boot_limit / 6).max(Duration::from_secs(10));
        let hostname = ProcessRun::argv(vec!["hostname".into(), format!("brig-{name}")]);
        let named = exec_inner(&vm.uds, hostname, limit).await?;
        let reseed = request_within(&vm.uds, &AgentRequest::Seed { seed_hex: hex }, limit).await?;
        for out in [named, reseed] {
            if out.exit_code != 0 {
                return Err(VmTierError::Agent(format!(
                    "setting the VM's identity failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        Ok(())
    }

    /// Runs `command` in the guest (`/bin/sh -c`), collecting its output.
    pub async fn exec(
        &self,
        vm: &MicroVm,
        command: &str,
        timeout: Duration,
    ) -> Result<ExecOutput, VmTierError> {
        if vm.is_paused() {
            return Err(VmTierError::Paused);
        }
        exec_inner(&vm.uds, ProcessRun::shell(command), timeout).await
    }

    /// Writes `data` to the absolute guest `path` (parents created).
    pub async fn write_file(
        &self,
        vm: &MicroVm,
        path: &str,
        data: &[u8],
    ) -> Result<(), VmTierError> {
        let request = AgentRequest::Put { path: path.to_string(), len: data.len() as u64 };
        let out =
            collect(&mut request_with_body(&vm.uds, &request, data).await?, ReplyLimits::CONTROL)
                .await?;
        if out.exit_code != 0 {
            return Err(file_failure(&out));
        }
        Ok(())
    }

    /// The bytes of the absolute guest `path`, at most `max_bytes` (capped at
    /// [`MAX_GUEST_FILE`]; a larger or endless file is a [`VmTierError::ReplyTooLarge`]).
    pub async fn read_file(
        &self,
        vm: &MicroVm,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, VmTierError> {
        let request = AgentRequest::Get { path: path.to_string() };
        let mut stream = request_stream(&vm.uds, &request).await?;
        let out = collect(&mut stream, ReplyLimits::file(max_bytes)).await?;
        if out.exit_code != 0 {
            return Err(file_failure(&out));
        }
        Ok(out.stdout)
    }

    /// Stops the VM and removes what it left.
    pub async fn destroy(&self, vm: &MicroVm) {
        self.stop_vmm(vm).await;
        for path in [&vm.uds, &vm.control, &vm.log] {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_dir_all(self.sessions_dir(vm));
        if let Some(writable) = vm.disks.as_ref().and_then(|d| d.writable.as_ref()) {
            let _ = std::fs::remove_file(writable);
        }
        self.release(&locked(&vm.memory_from));
    }

    /// Kills `vm`'s VMM (if it runs) and forgets its pid and cgroup.
    pub(crate) async fn stop_vmm(&self, vm: &MicroVm) {
        if let Some(mut process) = vm.process.lock().await.take() {
            process.kill().await;
        }
        *locked(&vm.pid) = None;
        let _ = std::fs::remove_file(self.cfg.dir.join(format!("{}.pid", vm.id)));
        self.remove_cgroup(&vm.id);
    }

    /// Removes VM `id`'s cgroup (its VMM has exited).
    pub(crate) fn remove_cgroup(&self, id: &str) {
        if let Some(cgroups) = &self.cgroups {
            if let Err(e) = cgroups.attach(id).remove() {
                tracing::warn!(vm = %id, error = %e, "VMM cgroup left behind");
            }
        }
    }
}

/// The MAC of a VM's network device (each VM is alone behind its own tap).
const DEFAULT_MAC: [u8; 6] = [0x06, 0xb7, 0x16, 0x00, 0x00, 0x02];
