//! `brig-vmm`: one VM per process. Commands:
//!
//! - `launch`: read a launch configuration (`brig_vmm_api::launch`) on stdin and run it: how
//!   brig-vmtier starts every VMM. `boot` and `resume` build the same configuration from flags;
//!   `standby` creates a VM ahead and waits for its configuration; `exec` runs a shell command
//!   through a guest's agent.
//!
//! With the `test-guest` feature (tests and benchmarks only):
//! - `snapshot --out DIR`: boot the test guest, let it answer once, pause and save it.
//! - `restore --snapshot DIR`: a fresh VM restored from DIR answers a first request, then
//!   serves requests (one number per stdin line, one answer per stdout line) until EOF.
//! - `pool --mem-mib N`: pre-create a VM, print `ready`, wait for `restore DIR` on stdin, then
//!   as `restore`.
//!
//! The first stdout line of `restore` and `pool` is JSON: the first answer and timings.
#![forbid(unsafe_code)]

#[cfg(feature = "test-guest")]
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use brig_vmm::linux::{Ending, LinuxVm};
use brig_vmm::virtio::{balloon::Balloon, blk::Block, mmio::MmioTransport, rng::Rng, vsock::Vsock};
#[cfg(feature = "test-guest")]
use brig_vmm::{Snapshot, Vm};
use brig_vmm_api::launch::{DiskSpec, JailSpec, LaunchConfig, NetSpec, Start};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "brig-vmm", version, about = "Brig VMM: one KVM VM per process")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot the purpose-built test guest, let it answer once, pause and save it.
    #[cfg(feature = "test-guest")]
    Snapshot {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 64)]
        mem_mib: usize,
        /// Memory the guest writes at boot (ends up in the snapshot).
        #[arg(long, default_value_t = 16)]
        touch_mib: u64,
    },
    /// Restore the test guest from a snapshot, answer a first request, then serve requests.
    #[cfg(feature = "test-guest")]
    Restore {
        #[arg(long)]
        snapshot: PathBuf,
        /// Check the memory file's digest first (reads it whole).
        #[arg(long)]
        verify: bool,
        /// After the first answer, read every guest page, as a guest that touches all its
        /// memory would (for memory measurements).
        #[arg(long)]
        touch_all: bool,
        /// After the first answer, write this much of the top of guest memory with contents
        /// that are the same in every VM (as guests running the same program would), making
        /// those pages the VM's own copies.
        #[arg(long, default_value_t = 0)]
        dirty_mib: usize,
        /// Let KSM merge identical pages of this VM's memory (MADV_MERGEABLE).
        #[arg(long)]
        ksm: bool,
        #[command(flatten)]
        jail: JailOptions,
    },
    /// Pre-create a test-guest VM, print `ready`, wait for `restore DIR` on stdin.
    #[cfg(feature = "test-guest")]
    Pool {
        #[arg(long, default_value_t = 64)]
        mem_mib: usize,
    },
    /// Read one launch configuration (`brig_vmm_api::launch::LaunchConfig`, a JSON line) on
    /// stdin and run it: how brig-vmtier starts a VMM. Exits as `boot`.
    Launch,
    /// Boot a Linux bzImage; the console goes to stdout (bounded). Exit status 0 when the guest
    /// shuts down, 2 when KVM cannot run it, 3 on timeout.
    Boot {
        #[arg(long)]
        kernel: PathBuf,
        #[arg(long)]
        initrd: Option<PathBuf>,
        #[arg(long, default_value = "console=ttyS0 reboot=t panic=-1 quiet")]
        cmdline: String,
        #[arg(long, default_value_t = 256)]
        mem_mib: usize,
        /// vCPUs (each on its own thread; the guest starts the others itself).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
        vcpus: u8,
        #[arg(long, default_value_t = 120)]
        timeout_s: u64,
        /// When the guest writes the snapshot trigger address, save the VM here and exit 4.
        #[arg(long)]
        snapshot_to: Option<PathBuf>,
        /// Give the guest a virtio-rng device (virtio-mmio, described in ACPI).
        #[arg(long)]
        rng: bool,
        /// Give the guest a virtio-vsock device (CID 3) reached through this Unix socket.
        #[arg(long)]
        vsock_uds: Option<PathBuf>,
        /// A virtio-blk disk: `PATH` (writable), `PATH:ro`, or `BASE:cow:OVERLAY` (a
        /// copy-on-write disk over a read-only base; repeatable; /dev/vda, vdb… in this order).
        #[arg(long = "disk", value_parser = DiskSpec::parse)]
        disks: Vec<DiskSpec>,
        /// Give the guest a virtio-balloon device with free-page reporting.
        #[arg(long)]
        balloon: bool,
        #[command(flatten)]
        net: NetOptions,
        #[command(flatten)]
        host: HostOptions,
        #[command(flatten)]
        jail: JailOptions,
    },
    /// Resume a Linux VM from a snapshot taken by `boot --snapshot-to`; exits as `boot`.
    Resume {
        #[arg(long)]
        snapshot: PathBuf,
        #[arg(long, default_value_t = 120)]
        timeout_s: u64,
        /// The Unix socket for the restored guest's vsock device, if it has one.
        #[arg(long)]
        vsock_uds: Option<PathBuf>,
        /// The disks the snapshot's VM had, in the same order as at boot.
        #[arg(long = "disk", value_parser = DiskSpec::parse)]
        disks: Vec<DiskSpec>,
        /// The tap the snapshot's network device goes on (as at boot).
        #[command(flatten)]
        net: NetOptions,
        #[command(flatten)]
        host: HostOptions,
        #[command(flatten)]
        jail: JailOptions,
    },
    /// Wait as a warm VMM: enter the jail and create the KVM VM ahead, then read one launch
    /// configuration on stdin (as `launch`; it resumes a snapshot, with no tap) and resume
    /// that snapshot into the waiting VM.
    Standby {
        #[arg(long, default_value_t = 256)]
        mem_mib: usize,
        /// vCPUs to create ahead (a snapshot with more gets the rest at restore).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
        vcpus: u8,
        #[command(flatten)]
        jail: JailOptions,
    },
    /// Run a shell command in a guest through its agent (vsock port 1024 by default); prints
    /// its output and exits with its status.
    Exec {
        #[arg(long)]
        uds: PathBuf,
        #[arg(long, default_value_t = 1024)]
        port: u32,
        /// The command (joined with spaces, run by /bin/sh -c in the guest).
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
}

/// How the host steers a running Linux VM.
#[derive(clap::Args)]
struct HostOptions {
    /// Serve the control socket here (stats, balloon, snapshot, pause; see `control`).
    #[arg(long)]
    control_uds: Option<PathBuf>,
    /// Let the kernel's same-page merging (KSM) scan this VM's memory (MADV_MERGEABLE).
    #[arg(long)]
    ksm: bool,
}

/// A virtio-net device on a tap the host made (in the sandbox's network namespace).
#[derive(clap::Args)]
struct NetOptions {
    /// Attach a virtio-net device to this existing tap (opened before the jail).
    #[arg(long)]
    tap: Option<String>,
    /// Join this network namespace first (where the tap is), e.g. `/run/netns/NAME`.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// The device's MAC address.
    #[arg(long, default_value = "06:b7:16:00:00:02", value_parser = parse_mac)]
    mac: [u8; 6],
}

impl NetOptions {
    fn spec(self) -> Option<NetSpec> {
        let tap = self.tap?;
        Some(NetSpec { tap, netns: self.netns, mac: self.mac })
    }
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC {s:?}")))
        .collect::<Result<_, _>>()?;
    parts.try_into().map_err(|_| format!("a MAC has six parts: {s:?}"))
}

/// The jail (see `brig_vmm::jail`): entered before anything else when `--jail` is given.
#[derive(clap::Args)]
struct JailOptions {
    /// Confine this process: own mount namespace with everything read-only but
    /// `--jail-writable`, no capabilities, a seccomp filter.
    #[arg(long)]
    jail: bool,
    /// A directory left writable in the jail (repeatable).
    #[arg(long = "jail-writable")]
    writable: Vec<PathBuf>,
    /// A `cgroup.procs` file to join first (repeatable).
    #[arg(long = "jail-cgroup")]
    cgroup_procs: Vec<PathBuf>,
}

impl JailOptions {
    fn spec(self) -> Option<JailSpec> {
        self.jail.then_some(JailSpec { writable: self.writable, cgroup_procs: self.cgroup_procs })
    }
}

fn enter_jail(jail: Option<&JailSpec>) -> anyhow::Result<()> {
    if let Some(jail) = jail {
        let cfg = brig_vmm::jail::JailConfig {
            cgroup_procs: jail.cgroup_procs.clone(),
            writable: jail.writable.clone(),
        };
        brig_vmm::jail::enter(&cfg).context("entering the jail")?;
    }
    Ok(())
}

/// Joins the tap's network namespace and opens the tap (needs CAP_NET_ADMIN: before the jail).
fn open_net(net: &NetSpec) -> anyhow::Result<(std::sync::Arc<std::fs::File>, [u8; 6])> {
    if let Some(path) = &net.netns {
        let ns = std::fs::File::open(path)
            .with_context(|| format!("network namespace {}", path.display()))?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("joining the network namespace {}", path.display()))?;
    }
    let tap = brig_vmm::virtio::net::open_tap(&net.tap)?;
    Ok((std::sync::Arc::new(tap), net.mac))
}

/// The launch configuration `boot` and `resume` describe with flags.
fn from_flags(
    start: Start,
    timeout_s: u64,
    vsock_uds: Option<PathBuf>,
    disks: Vec<DiskSpec>,
    net: NetOptions,
    host: HostOptions,
    jail: JailOptions,
) -> LaunchConfig {
    LaunchConfig {
        start,
        timeout_s,
        vsock_uds,
        control_uds: host.control_uds,
        disks,
        net: net.spec(),
        ksm: host.ksm,
        jail: jail.spec(),
    }
}

/// The host's side of a running VM: KSM and the control socket.
fn apply_host(cfg: &LaunchConfig, vm: &LinuxVm) -> anyhow::Result<()> {
    if cfg.ksm {
        vm.memory().set_mergeable().context("MADV_MERGEABLE")?;
    }
    if let Some(path) = &cfg.control_uds {
        brig_vmm::control::serve(path, vm.control_handles())
            .with_context(|| format!("control socket {}", path.display()))?;
    }
    Ok(())
}

/// Runs the VM `cfg` describes; `waiting` is a VM a standby VMM created ahead (already
/// jailed, so it cannot attach a tap).
fn launch(cfg: LaunchConfig, waiting: Option<LinuxVm>, started: Instant) -> anyhow::Result<()> {
    let net = match (&cfg.net, &waiting) {
        (Some(_), Some(_)) => anyhow::bail!("a warm VMM cannot attach a tap; resume afresh"),
        (Some(net), None) => Some(open_net(net)?),
        (None, _) => None,
    };
    if waiting.is_none() {
        enter_jail(cfg.jail.as_ref())?;
    }
    watchdog(cfg.timeout_s);
    match &cfg.start {
        Start::Boot { .. } if waiting.is_some() => {
            anyhow::bail!("a warm VMM resumes snapshots; it does not boot")
        }
        Start::Boot { .. } => boot(&cfg, net, started),
        Start::Resume { snapshot } => {
            let side = brig_vmm::linux_snapshot::HostSide {
                vsock_uds: cfg.vsock_uds.clone(),
                guest_cid: GUEST_CID,
                disks: cfg.disks.clone(),
                net,
            };
            let (mut vm, into) = match waiting {
                Some(vm) => (
                    brig_vmm::linux_snapshot::restore_into(vm, snapshot, &side)?,
                    " into a waiting VM",
                ),
                None => (brig_vmm::linux_snapshot::restore(snapshot, true, &side)?, ""),
            };
            apply_host(&cfg, &vm)?;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            eprintln!("brig-vmm: restored{into} in {ms:.3} ms");
            let limit = std::time::Duration::from_secs(cfg.timeout_s);
            let ending = brig_vmm::control::run(&mut vm, limit, &cfg.writable_disks());
            finish(&vm, &ending, started)
        }
    }
}

/// Boots a Linux guest as `cfg` says.
fn boot(
    cfg: &LaunchConfig,
    net: Option<(std::sync::Arc<std::fs::File>, [u8; 6])>,
    started: Instant,
) -> anyhow::Result<()> {
    let Start::Boot { kernel, initrd, cmdline, mem_mib, vcpus, rng, balloon, snapshot_to } =
        &cfg.start
    else {
        anyhow::bail!("not a boot");
    };
    let mut devices = Vec::new();
    if *rng {
        devices.push(MmioTransport::new(Box::new(Rng::default())));
    }
    for spec in &cfg.disks {
        let id =
            spec.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let disk = Block::from_spec(spec, &id).with_context(|| format!("disk {}", spec.arg()))?;
        devices.push(MmioTransport::new(Box::new(disk)));
    }
    let mut balloon_handle = None;
    if *balloon {
        let (dev, shared) = Balloon::new();
        balloon_handle = Some((devices.len(), shared));
        devices.push(MmioTransport::new(Box::new(dev)));
    }
    let mut backends: Vec<(Box<dyn brig_vmm::virtio::Backend>, usize)> = Vec::new();
    if let Some(path) = &cfg.vsock_uds {
        let (dev, b) = Vsock::new(GUEST_CID, path)?;
        backends.push((Box::new(b), devices.len()));
        devices.push(MmioTransport::new(Box::new(dev)));
    }
    if let Some((tap, mac)) = net {
        let (dev, b) = brig_vmm::virtio::net::Net::new(mac, tap);
        backends.push((Box::new(b), devices.len()));
        devices.push(MmioTransport::new(Box::new(dev)));
    }
    let mut vm = LinuxVm::boot(
        *mem_mib,
        usize::from(*vcpus),
        kernel,
        initrd.as_deref(),
        cmdline,
        true,
        devices,
    )?;
    for (b, index) in backends {
        vm.start_backend(b, index);
    }
    vm.balloon = balloon_handle;
    apply_host(cfg, &vm)?;
    vm.snapshot_trigger = snapshot_to.is_some();
    let limit = std::time::Duration::from_secs(cfg.timeout_s);
    let ending = brig_vmm::control::run(&mut vm, limit, &cfg.writable_disks());
    if let (Ending::SnapshotRequested, Some(dir)) = (&ending, snapshot_to) {
        brig_vmm::linux_snapshot::save(&vm, dir)?;
        eprintln!(
            "brig-vmm: snapshot saved to {} after {:.2} s; devices (type, requests served) {:?}",
            dir.display(),
            started.elapsed().as_secs_f64(),
            vm.device_stats()
        );
        std::process::exit(4);
    }
    finish(&vm, &ending, started)
}

/// The guest's vsock context id.
const GUEST_CID: u64 = 3;

/// The request a restored VM answers first.
#[cfg(feature = "test-guest")]
const FIRST_REQUEST: u32 = 1000;

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        #[cfg(feature = "test-guest")]
        Command::Snapshot { out, mem_mib, touch_mib } => {
            let started = Instant::now();
            let mut vm = Vm::create(mem_mib << 20)?;
            vm.boot_test_guest(touch_mib)?;
            let reply = vm.request(1)?;
            let boot_ms = started.elapsed().as_secs_f64() * 1000.0;
            vm.pause()?;
            Snapshot::save(&vm, &out)?;
            println!(r#"{{"reply":{reply},"boot_ms":{boot_ms:.3}}}"#);
            Ok(())
        }
        #[cfg(feature = "test-guest")]
        Command::Restore { snapshot, verify, touch_all, dirty_mib, ksm, jail } => {
            let started = Instant::now();
            enter_jail(jail.spec().as_ref())?;
            let snap = Snapshot::load(&snapshot)?;
            if verify {
                snap.verify_memory()?;
            }
            let mut vm = Vm::create(snap.memory_size as usize)?;
            first_answer(&mut vm, &snap, started)?;
            if ksm {
                vm.memory().set_mergeable().context("MADV_MERGEABLE")?;
            }
            if touch_all {
                vm.memory().touch_all();
            }
            dirty_same_everywhere(vm.memory_mut(), dirty_mib << 20)?;
            serve(&mut vm)
        }
        Command::Launch => {
            let started = Instant::now();
            let cfg = LaunchConfig::read_line(&mut std::io::stdin().lock())
                .context("the launch configuration on stdin")?;
            launch(cfg, None, started)
        }
        Command::Boot {
            kernel,
            initrd,
            cmdline,
            mem_mib,
            vcpus,
            timeout_s,
            snapshot_to,
            rng,
            vsock_uds,
            disks,
            balloon,
            net,
            host,
            jail,
        } => {
            let start =
                Start::Boot { kernel, initrd, cmdline, mem_mib, vcpus, rng, balloon, snapshot_to };
            let cfg = from_flags(start, timeout_s, vsock_uds, disks, net, host, jail);
            launch(cfg, None, Instant::now())
        }
        Command::Resume { snapshot, timeout_s, vsock_uds, disks, net, host, jail } => {
            let start = Start::Resume { snapshot };
            let cfg = from_flags(start, timeout_s, vsock_uds, disks, net, host, jail);
            launch(cfg, None, Instant::now())
        }
        Command::Standby { mem_mib, vcpus, jail } => {
            enter_jail(jail.spec().as_ref())?;
            let vm = LinuxVm::create(mem_mib, usize::from(vcpus), true)?;
            let cfg = LaunchConfig::read_line(&mut std::io::stdin().lock())
                .context("the launch configuration on stdin")?;
            // Already jailed: the launch's own jail is not entered again.
            launch(cfg, Some(vm), Instant::now())
        }
        Command::Exec { uds, port, command } => {
            let code = brig_vmm::agent_client::exec(&uds, port, &command.join(" "))?;
            std::process::exit(code);
        }
        #[cfg(feature = "test-guest")]
        Command::Pool { mem_mib } => {
            let mut vm = Vm::create(mem_mib << 20)?;
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "ready")?;
            stdout.flush()?;
            drop(stdout);
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            let started = Instant::now();
            let dir = line.trim().strip_prefix("restore ").context("expected `restore DIR`")?;
            let snap = Snapshot::load(std::path::Path::new(dir))?;
            first_answer(&mut vm, &snap, started)?;
            serve(&mut vm)
        }
    }
}

/// Writes the top `bytes` of guest memory page by page with contents that depend only on the
/// page's address, so every VM doing this holds identical private pages (what KSM can merge).
#[cfg(feature = "test-guest")]
fn dirty_same_everywhere(
    memory: &mut brig_vmm::memory::GuestMemory,
    bytes: usize,
) -> anyhow::Result<()> {
    let size = memory.size();
    let start = size.saturating_sub(bytes) / 4096 * 4096;
    let mut page = [0u8; 4096];
    for addr in (start..size).step_by(4096) {
        let seed = (addr / 4096) as u64;
        for (i, chunk) in page.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(
                &(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64).to_le_bytes(),
            );
        }
        memory.write(addr as u64, &page)?;
    }
    Ok(())
}

/// Stops the process if the guest is still running after `secs`.
fn watchdog(secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        eprintln!("brig-vmm: guest still running after {secs} s; stopping it");
        std::process::exit(3);
    });
}

/// Reports how a Linux guest's run ended and exits with its status.
fn finish(vm: &LinuxVm, ending: &Ending, started: Instant) -> ! {
    let console = vm.console.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let log = console.writer();
    eprintln!(
        "brig-vmm: {ending:?} after {:.2} s; console {} bytes kept, {} dropped; devices (type, requests served) {:?}",
        started.elapsed().as_secs_f64(),
        log.kept.len(),
        log.dropped,
        vm.device_stats()
    );
    std::process::exit(match ending {
        Ending::Shutdown => 0,
        Ending::Failed(_) | Ending::SnapshotRequested | Ending::ControlRequest => 2,
        Ending::TimedOut => 3,
    })
}

#[cfg(feature = "test-guest")]
fn first_answer(vm: &mut Vm, snap: &Snapshot, started: Instant) -> anyhow::Result<()> {
    snap.restore_into(vm)?;
    let restored_us = started.elapsed().as_micros();
    let reply = vm.request(FIRST_REQUEST)?;
    let total_us = started.elapsed().as_micros();
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        r#"{{"reply":{reply},"create_us":{},"restored_us":{restored_us},"replied_us":{total_us}}}"#,
        vm.create_micros
    )?;
    stdout.flush()?;
    Ok(())
}

/// Answers one request per stdin line until EOF.
#[cfg(feature = "test-guest")]
fn serve(vm: &mut Vm) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let request: u32 = line.trim().parse().with_context(|| format!("bad request {line:?}"))?;
        writeln!(stdout, "{}", vm.request(request)?)?;
        stdout.flush()?;
    }
    Ok(())
}
