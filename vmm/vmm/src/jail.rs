//! The VMM's jail, entered first thing, while the process has one thread (namespaces and
//! capabilities are per thread; every later thread inherits them):
//!
//! 1. join the cgroups the host made for this VM (memory and pids limits are the host's);
//! 2. a mount namespace of its own in which every mount is read-only except the directories
//!    the host names (the VM's sockets, disks and snapshots live there);
//! 3. no capabilities at all (bounding set included) and `no_new_privs`;
//! 4. a seccomp filter, on every thread, that refuses what a VMM never needs: running programs,
//!    changing namespaces or mounts, tracing other processes, sockets other than Unix ones,
//!    kernel modules, keyrings, eBPF, perf, io_uring and the like.
//!
//! A guest that takes over the VMM through a device bug is left with its own VM's files and
//! the host's read-only view, as Firecracker's jailer intends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("joining cgroup {path}: {source}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path}: {source}")]
    Mount { what: &'static str, path: PathBuf, source: nix::Error },
    #[error("capabilities: {0}")]
    Caps(String),
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// What the jail lets through.
#[derive(Debug, Clone, Default)]
pub struct JailConfig {
    /// `cgroup.procs` files to write this process into.
    pub cgroup_procs: Vec<PathBuf>,
    /// Directories that stay writable.
    pub writable: Vec<PathBuf>,
}

/// Calls a VMM never makes once it runs, refused with EPERM.
const DENIED: &[i64] = &[
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_open_by_handle_at,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_setuid,
];

fn seccomp_err(e: impl std::fmt::Display) -> JailError {
    JailError::Seccomp(e.to_string())
}

/// Enters the jail. Call before the process starts any thread.
pub fn enter(cfg: &JailConfig) -> Result<(), JailError> {
    for procs in &cfg.cgroup_procs {
        std::fs::write(procs, std::process::id().to_string())
            .map_err(|source| JailError::Cgroup { path: procs.clone(), source })?;
    }
    read_only_mounts(&cfg.writable)?;
    drop_capabilities()?;
    install_seccomp()
}

fn mount_err(what: &'static str, path: &Path) -> impl FnOnce(nix::Error) -> JailError {
    let path = path.to_owned();
    move |source| JailError::Mount { what, path, source }
}

/// A mount namespace of our own, every mount read-only but `writable` (bind-mounted onto
/// themselves first, so they are mounts of their own that keep their flags).
fn read_only_mounts(writable: &[PathBuf]) -> Result<(), JailError> {
    let root = Path::new("/");
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(mount_err("own mount namespace for", root))?;
    mount(None::<&str>, root, None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(mount_err("private propagation for", root))?;
    // (mount point, its per-mount options) from mountinfo: fields 5 and 6.
    let mut points: Vec<(PathBuf, MsFlags)> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ').skip(4);
            let point = PathBuf::from(fields.next()?.replace("\\040", " "));
            Some((point, kept_flags(fields.next()?)))
        })
        .collect();
    // Deepest first, so a remount never hides one still to do.
    points.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    points.dedup_by(|a, b| a.0 == b.0);
    for (point, kept) in &points {
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | *kept;
        // Mounts we may not remount (e.g. ones a container runtime locked) stay as they are.
        let _ = mount(None::<&str>, point, None::<&str>, flags, None::<&str>);
    }
    for dir in writable {
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
            .map_err(mount_err("bind-mounting writable", dir))?;
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(mount_err("making writable", dir))?;
    }
    Ok(())
}

/// The restrictions among a mount's options (`nosuid`, `nodev`, `noexec`, …) that a remount
/// must repeat to keep.
fn kept_flags(options: &str) -> MsFlags {
    options.split(',').fold(MsFlags::empty(), |acc, o| {
        acc | match o {
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            "noatime" => MsFlags::MS_NOATIME,
            "nodiratime" => MsFlags::MS_NODIRATIME,
            "relatime" => MsFlags::MS_RELATIME,
            _ => MsFlags::empty(),
        }
    })
}

fn drop_capabilities() -> Result<(), JailError> {
    use caps::CapSet;
    let caps_err = |e: caps::errors::CapsError| JailError::Caps(e.to_string());
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(caps_err)?;
    }
    for set in [CapSet::Ambient, CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(caps_err)?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(|e| JailError::Caps(e.to_string()))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, JailError> {
    let cond =
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(seccomp_err)?;
    SeccompRule::new(vec![cond]).map_err(seccomp_err)
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, JailError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        TargetArch::x86_64,
    )
    .map_err(seccomp_err)?;
    filter.try_into().map_err(seccomp_err)
}

fn install_seccomp() -> Result<(), JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|nr| (*nr, Vec::new())).collect();
    // Only Unix sockets (vsock backend, control socket): any other family is refused.
    rules.insert(libc::SYS_socket, vec![condition(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?]);
    // Threads yes, namespaces no.
    let namespaces = (libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWCGROUP) as u64;
    let clone_rules = (0..64)
        .map(|bit| 1u64 << bit)
        .filter(|flag| namespaces & flag != 0)
        .map(|flag| condition(0, SeccompCmpOp::MaskedEq(flag), flag))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    let main = compile(rules, libc::EPERM)?;
    // clone3 keeps its flags in memory, out of seccomp's sight: ENOSYS makes libc use clone(2).
    let clone3 = compile([(libc::SYS_clone3, Vec::new())].into_iter().collect(), libc::ENOSYS)?;
    for program in [&main, &clone3] {
        seccompiler::apply_filter_all_threads(program).map_err(seccomp_err)?;
    }
    Ok(())
}
