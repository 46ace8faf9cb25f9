//! Container-host VMs: where the node has hardware virtualization, container sandboxes can run
//! inside a VM shared by the node's in-VM containers instead of on the node's kernel, so a
//! kernel bug an agent triggers (DSec saw `grep -r /` crash a kernel through
//! `/proc/kpagecgroup`) takes down that VM, not the node. The guest runs the node's own
//! container runtime through brig-agent (`brig_vmtier::HostedContainer`), so the SDK surface is
//! the same: exec with streamed output and stdin, sessions, files, pause and resume.
//!
//! ```text
//! create(container, placement vm) ─▶ ContainerHosts::place(layers)
//!     a live VM that has the image's layers as disks, or a new one booted with every local
//!     layer image (at most `max_vms`) ─▶ HostedSandbox { host: Arc<HostVm>, name }
//! reaper tick ─▶ ContainerHosts::sweep: a VM whose VMM died, or whose agent missed three
//!     pings in a row, is marked lost (its sandboxes report `failed`, requests to them
//!     `sandbox_lost` with the reason), stopped, and replaced
//! ```
//! Placement: the create's `placement`, else `[container_host] placement` (`host` or `vm`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use brig_container::session::SessionTable;
use brig_core::{SandboxId, Tier};
use brig_vmtier::{HostedContainer, MicroVm, VmTier, VmTierConfig, VmTierError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::ContainerConfig;
use crate::exec_hub::ExecTable;
use crate::NodeError;

/// Where containers go when a create does not say.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// The node's kernel.
    #[default]
    Host,
    /// A container-host VM.
    Vm,
}

/// `[container_host]` in the node configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerHostConfig {
    /// Guest kernel and initramfs; the initramfs's init starts brig-agent's container service
    /// when the command line says `brig.role=container-host` (scripts/build-vm-guests.sh
    /// builds one). Without them the node has no container-host VMs.
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    /// Memory of each container-host VM; 0 sizes it by the node: a quarter of its memory.
    pub mem_mib: usize,
    /// vCPUs of each; 0: as many as the node has.
    pub vcpus: usize,
    /// Most container-host VMs at once.
    pub max_vms: usize,
    /// Where a container goes when its create does not say.
    pub placement: PlacementPolicy,
    /// The brig-vmm binary; default: beside the running daemon.
    pub vmm: Option<PathBuf>,
}

impl Default for ContainerHostConfig {
    fn default() -> Self {
        ContainerHostConfig {
            kernel: None,
            initrd: None,
            cmdline: "console=ttyS0 reboot=t panic=-1 quiet initcall_blacklist=i8042_init \
                      pci=off brig.role=container-host"
                .into(),
            mem_mib: 0,
            vcpus: 0,
            max_vms: 2,
            placement: PlacementPolicy::Host,
            vmm: None,
        }
    }
}

/// The node's container-host VMs.
pub(crate) struct ContainerHosts {
    tier: Arc<VmTier>,
    max_vms: usize,
    /// Where the local layer images (`<name>.erofs`) are.
    images_dir: PathBuf,
    vms: tokio::sync::Mutex<Vec<Arc<HostVm>>>,
    next: AtomicU64,
    /// A VM was asked for: keep one running (a crashed one is replaced at once).
    wanted: AtomicBool,
    /// A replacement is booting.
    replacing: AtomicBool,
}

/// One container-host VM.
pub(crate) struct HostVm {
    pub name: String,
    vm: MicroVm,
    /// Its disks, in order: the layer images its containers can use.
    layers: Vec<PathBuf>,
    /// Why it is gone, once it is.
    lost: OnceLock<String>,
    hosted: AtomicUsize,
    /// Liveness of its agent: when it last answered a ping, how many pings in a row it
    /// missed, and whether one is out.
    last_answer: Mutex<Instant>,
    missed: AtomicU32,
    pinging: AtomicBool,
}

/// How often a container-host VM's agent is asked whether it still answers, how long it has
/// for each answer, and how many misses in a row mean the VM hangs (a hung guest kernel
/// never exits on its own).
const PING_EVERY: Duration = Duration::from_secs(10);
const PING_LIMIT: Duration = Duration::from_secs(20);
const PINGS_MISSED: u32 = 3;

impl HostVm {
    /// Why the VM is gone, if it is (its VMM died: a guest kernel crash, an OOM kill, a kill).
    pub fn lost(&self) -> Option<String> {
        if let Some(why) = self.lost.get() {
            return Some(why.clone());
        }
        if self.vm.is_running() {
            return None;
        }
        let how = match self.vm.exit_status() {
            Some(status) => format!("brig-vmm ended: {status}"),
            None => "brig-vmm is gone".to_string(),
        };
        // The console's last lines say why, when the guest's kernel crashed.
        let log = std::fs::read_to_string(self.vm.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        let why = format!(
            "container-host VM {} stopped ({how}; console: {tail:?}); its containers are gone",
            self.name
        );
        tracing::error!(vm = %self.name, hosted = self.hosted.load(Ordering::Relaxed), "container-host VM lost");
        Some(self.lost.get_or_init(|| why).clone())
    }

    /// Asks the agent whether it answers (once every [`PING_EVERY`], in the background); after
    /// [`PINGS_MISSED`] misses in a row the VM counts as lost, and the next sweep stops it.
    fn check_liveness(self: &Arc<Self>, tier: &Arc<VmTier>) {
        if self.last_answer.lock().elapsed() < PING_EVERY
            || self.pinging.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let (vm, tier) = (self.clone(), tier.clone());
        tokio::spawn(async move {
            match tier.exec(&vm.vm, "true", PING_LIMIT).await {
                Ok(out) if out.exit_code == 0 => {
                    vm.missed.store(0, Ordering::Relaxed);
                    *vm.last_answer.lock() = Instant::now();
                }
                _ => {
                    let missed = vm.missed.fetch_add(1, Ordering::Relaxed) + 1;
                    *vm.last_answer.lock() = Instant::now();
                    if missed >= PINGS_MISSED {
                        let why = format!(
                            "container-host VM {} stopped answering ({missed} pings missed in a \
                             row: a hung guest kernel?); its containers are gone",
                            vm.name
                        );
                        tracing::error!(vm = %vm.name, "container-host VM hangs");
                        let _ = vm.lost.set(why);
                    }
                }
            }
            vm.pinging.store(false, Ordering::SeqCst);
        });
    }

    /// The guest's device for a layer image, if this VM has it.
    fn disk_of(&self, layer: &Path) -> Option<String> {
        self.layers.iter().position(|l| l == layer).and_then(brig_vmtier::guest_disk)
    }
}

/// The container tier's view of a container in a container-host VM.
pub(crate) struct HostedSandbox {
    pub host: Arc<HostVm>,
    pub name: String,
    /// Environment every command starts with.
    pub env: Vec<(String, String)>,
    pub shell: String,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub execs: ExecTable,
    pub sessions: SessionTable,
}

impl HostedSandbox {
    /// The agent's handle on the container.
    pub fn guest(&self) -> HostedContainer<'_> {
        HostedContainer::new(&self.host.vm, &self.name)
    }

    /// Fails with why the container is gone when its VM is.
    pub fn check(&self, id: &str) -> Result<(), NodeError> {
        match self.host.lost() {
            Some(why) => Err(NodeError::HostVmLost { id: id.to_string(), why }),
            None => Ok(()),
        }
    }

    /// Where it runs, as `SandboxInfo::placement` says it.
    pub fn placement(&self) -> String {
        format!("vm:{}", self.host.name)
    }

    /// Removes the container from its VM (nothing to do once the VM is gone).
    pub async fn destroy(&self) {
        self.sessions.close_all().await;
        self.host.hosted.fetch_sub(1, Ordering::Relaxed);
        if self.host.lost().is_none() {
            if let Err(e) = self.guest().destroy().await {
                tracing::warn!(container = %self.name, error = %e, "removing an in-VM container failed");
            }
        }
    }
}

/// The container-host VMs, or why the node has none.
pub(crate) fn open(
    cfg: &ContainerHostConfig,
    containers: &ContainerConfig,
    state_dir: &Path,
) -> Result<Arc<ContainerHosts>, String> {
    let (Some(kernel), Some(initrd)) = (&cfg.kernel, &cfg.initrd) else {
        return Err(
            "no guest kernel and initramfs configured ([container_host] kernel, initrd)".into()
        );
    };
    let (node_mib, node_cpus) = node_size();
    let tier = VmTier::open(VmTierConfig {
        vmm: crate::microvm::vmm_binary(cfg.vmm.as_ref()),
        kernel: kernel.clone(),
        initrd: initrd.clone(),
        cmdline: cfg.cmdline.clone(),
        mem_mib: if cfg.mem_mib == 0 { (node_mib / 4).max(512) } else { cfg.mem_mib },
        vcpus: if cfg.vcpus == 0 { node_cpus } else { cfg.vcpus }.clamp(1, 64),
        dir: state_dir.join("container-host"),
        ksm: false,
        warm: 0,
        root_image: None,
        boot_limit: std::time::Duration::from_secs(180),
    });
    let tier = crate::microvm::offered(Tier::Container, tier)?;
    let images_dir = containers.images_dir.clone().unwrap_or_else(|| state_dir.join("images"));
    Ok(Arc::new(ContainerHosts {
        tier,
        max_vms: cfg.max_vms.max(1),
        images_dir,
        vms: Default::default(),
        next: AtomicU64::new(0),
        wanted: AtomicBool::new(false),
        replacing: AtomicBool::new(false),
    }))
}

/// The node's memory (MiB) and CPUs.
fn node_size() -> (usize, usize) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(4 << 20);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (kib >> 10, cpus)
}

impl ContainerHosts {
    /// The local layer files of `image` (`a+b+c`, base first).
    pub fn layers(&self, image: &str) -> Result<Vec<PathBuf>, NodeError> {
        let bad = |why: String| NodeError::BadImage(image.to_string(), why);
        let parts: Vec<&str> = image.split('+').collect();
        if parts.len() > brig_vmtier::MAX_LAYERS {
            return Err(bad(format!("more than {} layers", brig_vmtier::MAX_LAYERS)));
        }
        parts
            .into_iter()
            .map(|name| {
                let path = local_layer(&self.images_dir, name).map_err(&bad)?;
                path.canonicalize().map_err(|e| bad(format!("{}: {e}", path.display())))
            })
            .collect()
    }

    /// Every local layer image, `needed` first, as many as a VM takes disks.
    fn disk_set(&self, needed: &[PathBuf]) -> Vec<PathBuf> {
        let mut set: Vec<PathBuf> = needed.to_vec();
        let mut others: Vec<PathBuf> = std::fs::read_dir(&self.images_dir)
            .map(|dir| {
                dir.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "erofs") && p.is_file())
                    .filter_map(|p| p.canonicalize().ok())
                    .collect()
            })
            .unwrap_or_default();
        others.sort();
        for layer in others {
            if set.len() >= brig_vmtier::MAX_LAYERS {
                break;
            }
            if !set.contains(&layer) {
                set.push(layer);
            }
        }
        set
    }

    /// A live VM with all of `layers` as disks: one already running, or a new one.
    async fn place(&self, layers: &[PathBuf]) -> Result<Arc<HostVm>, NodeError> {
        self.wanted.store(true, Ordering::Relaxed);
        let mut vms = self.vms.lock().await;
        vms.retain(|vm| vm.lost().is_none());
        let fits = |vm: &&Arc<HostVm>| layers.iter().all(|l| vm.layers.contains(l));
        if let Some(vm) = vms.iter().filter(fits).min_by_key(|vm| vm.hosted.load(Ordering::Relaxed))
        {
            return Ok(vm.clone());
        }
        if vms.len() >= self.max_vms {
            return Err(NodeError::Overcommitted(format!(
                "all {} container-host VMs booted before this image's layers existed; they take \
                 new layers when they are replaced",
                vms.len()
            )));
        }
        let name = format!("chost-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let disks = self.disk_set(layers);
        let vm = self.tier.boot_container_host(&name, &disks).await.map_err(host_error)?;
        let host = Arc::new(HostVm {
            name,
            vm,
            layers: disks,
            lost: OnceLock::new(),
            hosted: AtomicUsize::new(0),
            last_answer: Mutex::new(Instant::now()),
            missed: AtomicU32::new(0),
            pinging: AtomicBool::new(false),
        });
        vms.push(host.clone());
        Ok(host)
    }

    /// Creates sandbox `id`'s container in a container-host VM.
    pub async fn create(
        &self,
        id: &SandboxId,
        req: &brig_proto::CreateRequest,
        cfg: &ContainerConfig,
    ) -> Result<HostedSandbox, NodeError> {
        let image = req.image.as_deref().ok_or_else(|| {
            NodeError::BadImage(String::new(), "a container needs an image".into())
        })?;
        let refuse = |op| NodeError::WrongTier { id: id.to_string(), tier: Tier::Container, op };
        if req.egress.is_some() {
            return Err(refuse("egress rules (not yet for containers in a container-host VM)"));
        }
        if !req.protected.is_empty() {
            return Err(refuse("protected paths (not yet for containers in a container-host VM)"));
        }
        let layers = self.layers(image)?;
        let host = self.place(&layers).await?;
        let devices =
            layers.iter().map(|l| host.disk_of(l)).collect::<Option<Vec<String>>>().ok_or_else(
                || NodeError::BadImage(image.into(), "a layer is not on the VM".into()),
            )?;
        let (memory_bytes, cpu_millis) = crate::container::requested(cfg, &req.limits);
        let l = &req.limits;
        let name = id.to_string();
        let spec = brig_vmtier::HostedContainerSpec {
            name: name.clone(),
            hostname: crate::container::hostname(id),
            layers: devices,
            memory_bytes: Some(memory_bytes),
            pids: Some(crate::container::pick(l.pids, cfg.default_pids, cfg.max_pids)),
            cpu_millis: Some(cpu_millis),
            disk_bytes: crate::container::pick(l.disk_mib, cfg.default_disk_mib, cfg.max_disk_mib)
                << 20,
        };
        let guest = HostedContainer::new(&host.vm, &name);
        guest.create(spec).await.map_err(host_error)?;
        host.hosted.fetch_add(1, Ordering::Relaxed);
        let shell = match guest.stat("/bin/bash").await {
            Ok(_) => "/bin/bash",
            Err(_) => "/bin/sh",
        };
        Ok(HostedSandbox {
            host,
            name,
            env: req.env.clone(),
            shell: shell.into(),
            memory_bytes,
            cpu_millis,
            execs: ExecTable::default(),
            sessions: SessionTable::default(),
        })
    }

    /// Notices VMs that died, forgets them, and boots a replacement once a VM was wanted.
    /// Skipped while a VM boots (the reaper that calls it must not wait for a boot).
    pub async fn sweep(self: &Arc<Self>) {
        let lost: Vec<Arc<HostVm>> = {
            let Ok(mut vms) = self.vms.try_lock() else { return };
            let (lost, live): (Vec<_>, Vec<_>) = vms.drain(..).partition(|vm| vm.lost().is_some());
            *vms = live;
            for vm in vms.iter() {
                vm.check_liveness(&self.tier);
            }
            let need = self.wanted.load(Ordering::Relaxed) && vms.is_empty() && !lost.is_empty();
            if need && !self.replacing.swap(true, Ordering::SeqCst) {
                let hosts = self.clone();
                tokio::spawn(async move {
                    match hosts.place(&[]).await {
                        Ok(vm) => tracing::info!(vm = %vm.name, "container-host VM replaced"),
                        Err(e) => tracing::warn!(error = %e, "cannot replace a container-host VM"),
                    }
                    hosts.replacing.store(false, Ordering::SeqCst);
                });
            }
            lost
        };
        for vm in lost {
            tracing::warn!(vm = %vm.name, why = %vm.lost().unwrap_or_default(), "removing a lost container-host VM");
            self.tier.destroy(&vm.vm).await;
        }
    }

    /// Stops every container-host VM (the node is shutting down).
    pub async fn shutdown(&self) {
        let vms: Vec<_> = self.vms.lock().await.drain(..).collect();
        for vm in vms {
            self.tier.destroy(&vm.vm).await;
        }
    }
}

/// A local layer file `<dir>/<name>.erofs`, the name checked first.
pub(crate) fn local_layer(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b));
    if !ok {
        return Err("VM layers are local layer files named by `+` (no store references yet)".into());
    }
    let path = dir.join(format!("{name}.erofs"));
    if !path.is_file() {
        return Err(format!("no layer file {}", path.display()));
    }
    Ok(path)
}

/// A container-host VM's failure as the node reports it: the agent's refusals keep their
/// kind (a missing file is `not_found`), the rest says what broke.
pub(crate) fn host_error(e: VmTierError) -> NodeError {
    match e {
        VmTierError::Container { failure, message } => match failure.io_kind() {
            Some(kind) => NodeError::HostedFile { kind, message },
            None => NodeError::HostedContainer(message),
        },
        VmTierError::Unavailable(why) => NodeError::TierUnavailable { tier: Tier::Container, why },
        e @ VmTierError::ReplyTooLarge { .. } => NodeError::GuestReplyTooLarge(e.to_string()),
        e @ VmTierError::ReplyTimeout(_) => NodeError::GuestReplyTimeout(e.to_string()),
        other => NodeError::HostedContainer(crate::error::chain(&other)),
    }
}
