//! Container-host VMs: container sandboxes inside a VM shared by the node's in-VM containers
//! instead of on the node's kernel, so a kernel bug an agent triggers (DSec saw `grep -r /`
//! crash a kernel through `/proc/kpagecgroup`) takes down that VM, not the node. The guest runs
//! the node's own container runtime through brig-agent ([`HostedContainer`]), so the sandbox
//! serves what a container does: exec with streamed output and stdin, sessions, files, pause
//! and resume.
//!
//! ```text
//! create ─▶ ContainerHosts::place(layers)
//!     a live VM that has the image's layers as disks, or a new one booted with every local
//!     layer image (at most `max_vms`) ─▶ HostedSandbox { host: Arc<HostVm>, name }
//! sweep (the node's reaper tick): a VM whose VMM died, or whose agent missed three pings in
//!     a row, is marked lost (its sandboxes report failed, requests to them the reason),
//!     stopped, and replaced
//! restart: each container's record names its VM and the VM's disks; the restarted node
//!     adopts the VM (`VmTier::adopt`: pid file, start time, control socket) and takes the
//!     container back if its init still runs, with the commands and sessions the agent kept
//!     for it (started with `keep`, under the container's name; sessions recorded in
//!     `<tier dir>/<sandbox id>.sessions/`); VMs no record claims are stopped
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use brig_container::sandbox::merged_env;
use brig_core::files::{Entry, EntryKind};
use brig_core::sandbox::{
    BoxFuture, Capabilities, Condition, ExecSpec, FileAccess, ForkKind, KeptWork, Op, PauseKind,
    Persistence, ReadSource, Requested, RunningExec, Sandbox, SandboxError, Session, SessionSpec,
    Stdin, Usage, WriteOptions,
};
use brig_core::{QosClass, SandboxId, Tier};

use crate::guest_exec::{serve_kept, KeptCommand};
use crate::records::{HostedRecord, MachineRecord};
use crate::{locked, HostedContainer, MicroVm, VmTier};

/// A container to make in a container-host VM, its limits chosen by the node.
#[derive(Debug, Clone)]
pub struct HostedCreate {
    pub id: SandboxId,
    /// `a+b+c`: local layer files, base first.
    pub image: String,
    /// Environment every command starts with.
    pub env: Vec<(String, String)>,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub pids: u64,
    pub disk_bytes: u64,
}

fn bad_image(image: &str, why: impl std::fmt::Display) -> SandboxError {
    SandboxError::BadRequest(format!("image {image:?} is not valid: {why}"))
}

/// The node's container-host VMs.
pub struct ContainerHosts {
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
pub struct HostVm {
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
    fn new(name: String, vm: MicroVm, layers: Vec<PathBuf>) -> Arc<HostVm> {
        Arc::new(HostVm {
            name,
            vm,
            layers,
            lost: OnceLock::new(),
            hosted: AtomicUsize::new(0),
            last_answer: Mutex::new(Instant::now()),
            missed: AtomicU32::new(0),
            pinging: AtomicBool::new(false),
        })
    }

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
        if locked(&self.last_answer).elapsed() < PING_EVERY
            || self.pinging.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let (vm, tier) = (self.clone(), tier.clone());
        tokio::spawn(async move {
            match tier.exec(&vm.vm, "true", PING_LIMIT).await {
                Ok(out) if out.exit_code == 0 => {
                    vm.missed.store(0, Ordering::Relaxed);
                    *locked(&vm.last_answer) = Instant::now();
                }
                _ => {
                    let missed = vm.missed.fetch_add(1, Ordering::Relaxed) + 1;
                    *locked(&vm.last_answer) = Instant::now();
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
        self.layers.iter().position(|l| l == layer).and_then(crate::guest_disk)
    }
}

/// The container tier's view of a container in a container-host VM.
pub struct HostedSandbox {
    pub host: Arc<HostVm>,
    pub name: String,
    /// Where its sessions are recorded (in the container-host tier's directory).
    pub sessions_dir: PathBuf,
    /// Environment every command starts with.
    pub env: Vec<(String, String)>,
    pub shell: String,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

impl HostedSandbox {
    /// The agent's handle on the container.
    pub fn guest(&self) -> HostedContainer<'_> {
        HostedContainer::new(&self.host.vm, &self.name)
    }

    /// Fails with why the container is gone when its VM is.
    fn check(&self) -> Result<(), SandboxError> {
        match self.host.lost() {
            Some(why) => Err(SandboxError::Lost(why)),
            None => Ok(()),
        }
    }
}

/// What a container in a container-host VM serves (for now: no terminal, fork, egress, QoS or
/// protected paths).
pub const HOSTED_CAPS: Capabilities = Capabilities::new(
    &[
        Op::Exec,
        Op::ExecAsUser,
        Op::Sessions,
        Op::SessionAsUser,
        Op::Files,
        Op::FileAppend,
        Op::Pause,
    ],
    FileAccess::Guest,
    PauseKind::Freeze,
    ForkKind::No,
    Persistence::Hosted,
);

impl Sandbox for HostedSandbox {
    fn tier(&self) -> Tier {
        Tier::Container
    }

    fn capabilities(&self) -> Capabilities {
        HOSTED_CAPS
    }

    fn condition(&self) -> Condition {
        match self.host.lost() {
            Some(_) => Condition::Failed,
            None => Condition::Running,
        }
    }

    fn lost(&self) -> Option<String> {
        self.host.lost()
    }

    fn placement(&self) -> Option<String> {
        Some(format!("vm:{}", self.host.name))
    }

    fn exec(&self, spec: ExecSpec) -> BoxFuture<'_, Result<RunningExec, SandboxError>> {
        Box::pin(async move {
            if spec.terminal.is_some() {
                return Err(SandboxError::Unsupported { op: Op::Terminal, note: None });
            }
            // The agent keeps the command under the node's id: it outlives a node restart.
            let keep = crate::guest_exec::keep_for(&spec, self.host.vm.agent_protocol().await?);
            let env = merged_env(&self.env, spec.env);
            let cwd = spec.cwd.unwrap_or_default();
            let stdin = !matches!(spec.stdin, Stdin::Empty);
            let guest = self.guest();
            let (stream, input) =
                guest.exec(spec.argv, env, &cwd, spec.user, stdin, Some(keep)).await?;
            let kept = KeptCommand {
                uds: self.host.vm.uds.clone(),
                id: spec.exec_id,
                container: Some(self.name.clone()),
                ran_for: Duration::ZERO,
                saving: None,
            };
            let (timeout, limit) = (spec.timeout, spec.output_limit);
            let (stream, input, stdin) =
                crate::guest_exec::until_started(stream, input, spec.stdin, &keep).await?;
            Ok(serve_kept(stream, input, stdin, timeout, limit, Some(kept)))
        })
    }

    fn open_session(
        &self,
        spec: SessionSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Session>, SandboxError>> {
        Box::pin(async move {
            let cwd = spec.start_dir();
            let shell = spec.shell.unwrap_or_else(|| self.shell.clone());
            let env = merged_env(&self.env, spec.env);
            // Kept in the guest and recorded, so a restarted node takes it back.
            let keep = (!spec.id.is_empty()).then(|| brig_container::session::SessionKeep {
                dir: self.sessions_dir.clone(),
                session_id: spec.id.clone(),
            });
            let session = self.guest().open_session(&shell, env, &cwd, spec.user, keep).await?;
            Ok(Box::new(session) as Box<dyn Session>)
        })
    }

    fn read<'a>(
        &'a self,
        path: &'a str,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<ReadSource, SandboxError>> {
        Box::pin(async move {
            let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
            Ok(ReadSource::Bytes(self.guest().get(path, limit).await?))
        })
    }

    fn put<'a>(
        &'a self,
        path: &'a str,
        options: WriteOptions,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            let guest = self.guest();
            if !options.parents {
                // As on the node's kernel: without `parents` the directory must exist.
                if let Some((dir, _)) = path.trim_end_matches('/').rsplit_once('/') {
                    if !dir.is_empty() {
                        guest.stat(dir).await?;
                    }
                }
            }
            Ok(guest.put(path, &data, options.append, options.mode).await?)
        })
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        Box::pin(async move { Ok(entry_from_guest(self.guest().stat(path).await?)) })
    }

    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        Box::pin(async move {
            Ok(self.guest().list(path).await?.into_iter().map(entry_from_guest).collect())
        })
    }

    fn mkdir<'a>(
        &'a self,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.guest().mkdir(path, parents).await?) })
    }

    fn remove<'a>(
        &'a self,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.guest().remove(path, recursive).await?) })
    }

    /// Freezes the container's processes in its VM (sessions survive).
    fn pause(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        Box::pin(async move {
            self.check()?;
            self.guest().set_frozen(true).await?;
            Ok(0)
        })
    }

    fn resume(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move {
            self.check()?;
            Ok(self.guest().set_frozen(false).await?)
        })
    }

    fn freeze(&self, frozen: bool) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move {
            self.check()?;
            Ok(self.guest().set_frozen(frozen).await?)
        })
    }

    fn record(
        &self,
    ) -> Result<Option<brig_core::records::TierRecord>, brig_core::records::RecordError> {
        let record = HostedRecord {
            vm: self.host.name.clone(),
            vm_layers: self.host.layers.clone(),
            env: self.env.clone(),
            shell: self.shell.clone(),
            memory_bytes: self.memory_bytes,
            cpu_millis: self.cpu_millis,
        };
        record.to_tier().map(Some)
    }

    /// Removes the container from its VM (nothing to do once the VM is gone) and its session
    /// records.
    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move {
            self.host.hosted.fetch_sub(1, Ordering::Relaxed);
            if self.host.lost().is_none() {
                if let Err(e) = self.guest().destroy().await {
                    tracing::warn!(container = %self.name, error = %e, "removing an in-VM container failed");
                }
            }
            let _ = std::fs::remove_dir_all(&self.sessions_dir);
            Ok(())
        })
    }

    /// The commands and sessions the VM's agent kept for this container while the node was
    /// down.
    fn recover_kept(&self) -> BoxFuture<'_, KeptWork> {
        Box::pin(async move {
            if self.host.lost().is_some() {
                return KeptWork::default();
            }
            let (uds, name) = (&self.host.vm.uds, self.name.as_str());
            crate::kept_work::recover(uds, Some(name), &self.sessions_dir, name, None).await
        })
    }

    fn usage(&self) -> BoxFuture<'_, Option<Usage>> {
        Box::pin(async move {
            if self.host.lost().is_some() {
                return None;
            }
            let u = self.guest().usage().await.ok()?;
            Some(Usage { cpu_ns: u.cpu_ns, memory_bytes: u.memory_bytes })
        })
    }

    fn requested(&self) -> Option<Requested> {
        Some(Requested { memory_bytes: self.memory_bytes, cpu_millis: self.cpu_millis })
    }

    fn set_qos(&self, _class: QosClass) -> Result<(), SandboxError> {
        Err(SandboxError::unsupported(Op::Qos, "not yet for containers in a container-host VM"))
    }
}

/// A file entry as the guest's agent reported it, as the node's file API reports entries.
pub(crate) fn entry_from_guest(e: crate::FileEntry) -> Entry {
    let kind = match e.kind.as_str() {
        "file" => EntryKind::File,
        "dir" => EntryKind::Dir,
        "symlink" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    // The guest's entries do not carry owners.
    let (uid, gid) = (0, 0);
    Entry {
        path: e.path,
        kind,
        size: e.size,
        mode: e.mode,
        modified_unix_ms: e.modified_unix_ms,
        uid,
        gid,
        metadata: Default::default(),
    }
}

impl ContainerHosts {
    /// The pool of VMs `tier` boots (at most `max_vms`), with the layer images of `images_dir`.
    pub fn new(tier: Arc<VmTier>, max_vms: usize, images_dir: PathBuf) -> ContainerHosts {
        ContainerHosts {
            tier,
            max_vms: max_vms.max(1),
            images_dir,
            vms: Default::default(),
            next: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            replacing: AtomicBool::new(false),
        }
    }

    /// The local layer files of `image` (`a+b+c`, base first).
    pub fn layers(&self, image: &str) -> Result<Vec<PathBuf>, SandboxError> {
        let bad = |why: String| bad_image(image, why);
        let parts: Vec<&str> = image.split('+').collect();
        if parts.len() > crate::MAX_LAYERS {
            return Err(bad(format!("more than {} layers", crate::MAX_LAYERS)));
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
            if set.len() >= crate::MAX_LAYERS {
                break;
            }
            if !set.contains(&layer) {
                set.push(layer);
            }
        }
        set
    }

    /// A live VM with all of `layers` as disks: one already running, or a new one.
    async fn place(&self, layers: &[PathBuf]) -> Result<Arc<HostVm>, SandboxError> {
        self.wanted.store(true, Ordering::Relaxed);
        let mut vms = self.vms.lock().await;
        vms.retain(|vm| vm.lost().is_none());
        let fits = |vm: &&Arc<HostVm>| layers.iter().all(|l| vm.layers.contains(l));
        if let Some(vm) = vms.iter().filter(fits).min_by_key(|vm| vm.hosted.load(Ordering::Relaxed))
        {
            return Ok(vm.clone());
        }
        if vms.len() >= self.max_vms {
            return Err(SandboxError::Exhausted(format!(
                "all {} container-host VMs booted before this image's layers existed; they take \
                 new layers when they are replaced",
                vms.len()
            )));
        }
        let name = format!("chost-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let disks = self.disk_set(layers);
        let vm = self.tier.boot_container_host(&name, &disks).await?;
        let host = HostVm::new(name, vm, disks);
        vms.push(host.clone());
        Ok(host)
    }

    /// The VM tier its VMs run on (its directory holds their files and the containers'
    /// session records).
    pub fn vm_tier(&self) -> &Arc<VmTier> {
        &self.tier
    }

    /// Takes back container `id` an earlier run of the node recorded: its VM adopted (once,
    /// for all its containers) and the container found running in it.
    pub async fn adopt(
        &self,
        id: &str,
        record: &HostedRecord,
    ) -> Result<HostedSandbox, SandboxError> {
        let host = {
            let mut vms = self.vms.lock().await;
            match vms.iter().find(|vm| vm.name == record.vm) {
                Some(host) => host.clone(),
                None => {
                    let machine = MachineRecord {
                        memory_from: PathBuf::new(),
                        layers: record.vm_layers.clone(),
                        writable: None,
                        cow_base: None,
                        net: None,
                        paused: false,
                    };
                    let vm = self.tier.adopt(&record.vm, &machine).await?;
                    // New VMs are named after the adopted ones.
                    if let Some(n) =
                        record.vm.strip_prefix("chost-").and_then(|n| n.parse::<u64>().ok())
                    {
                        self.next.fetch_max(n + 1, Ordering::Relaxed);
                    }
                    self.wanted.store(true, Ordering::Relaxed);
                    let host = HostVm::new(record.vm.clone(), vm, record.vm_layers.clone());
                    tracing::info!(vm = %host.name, "container-host VM adopted");
                    vms.push(host.clone());
                    host
                }
            }
        };
        let usage = HostedContainer::new(&host.vm, id).usage().await?;
        if !usage.alive {
            return Err(SandboxError::Lost(format!(
                "its container in {} no longer runs",
                host.name
            )));
        }
        host.hosted.fetch_add(1, Ordering::Relaxed);
        Ok(HostedSandbox {
            host,
            name: id.to_string(),
            sessions_dir: self.tier.sessions_dir_named(id),
            env: record.env.clone(),
            shell: record.shell.clone(),
            memory_bytes: record.memory_bytes,
            cpu_millis: record.cpu_millis,
        })
    }

    /// After restore: stops every container-host VM of an earlier run that no record claimed
    /// (or that could not be adopted) and removes its files, and in the adopted ones destroys
    /// the containers not in `claimed` (made just before a crash, with no record yet, or whose
    /// record could not be read). Returns how many VMs and containers it removed.
    pub async fn remove_orphans(&self, claimed: &[String]) -> usize {
        let vms: Vec<Arc<HostVm>> = self.vms.lock().await.clone();
        let names: Vec<String> = vms.iter().map(|vm| vm.name.clone()).collect();
        let mut removed = self.tier.remove_orphans(&names);
        for vm in vms {
            let listed = match HostedContainer::names(&vm.vm).await {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::warn!(vm = %vm.name, error = %e, "cannot list a container-host VM's containers");
                    continue;
                }
            };
            for name in listed.iter().filter(|n| !claimed.contains(n)) {
                tracing::warn!(vm = %vm.name, container = %name, "destroying a container no record claims");
                match HostedContainer::new(&vm.vm, name).destroy().await {
                    Ok(()) => removed += 1,
                    Err(e) => tracing::warn!(container = %name, error = %e, "cannot destroy it"),
                }
            }
        }
        removed
    }

    /// Creates a container in a container-host VM.
    pub async fn create(&self, req: HostedCreate) -> Result<HostedSandbox, SandboxError> {
        let layers = self.layers(&req.image)?;
        let host = self.place(&layers).await?;
        let devices = layers
            .iter()
            .map(|l| host.disk_of(l))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| bad_image(&req.image, "a layer is not on the VM"))?;
        let name = req.id.to_string();
        let spec = crate::HostedContainerSpec {
            name: name.clone(),
            hostname: brig_container::sandbox::hostname(&req.id),
            layers: devices,
            memory_bytes: Some(req.memory_bytes),
            pids: Some(req.pids),
            cpu_millis: Some(req.cpu_millis),
            disk_bytes: req.disk_bytes,
        };
        let guest = HostedContainer::new(&host.vm, &name);
        guest.create(spec).await?;
        host.hosted.fetch_add(1, Ordering::Relaxed);
        let shell = match guest.stat("/bin/bash").await {
            Ok(_) => "/bin/bash",
            Err(_) => "/bin/sh",
        };
        Ok(HostedSandbox {
            host,
            sessions_dir: self.tier.sessions_dir_named(&name),
            name,
            env: req.env,
            shell: shell.into(),
            memory_bytes: req.memory_bytes,
            cpu_millis: req.cpu_millis,
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
pub fn local_layer(dir: &Path, name: &str) -> Result<PathBuf, String> {
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
