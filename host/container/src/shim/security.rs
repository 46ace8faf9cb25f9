//! What every process in a container gives up before it runs: capabilities beyond a small
//! documented set (also after a setuid exec: the bounding set), and the system calls in
//! [`denied_syscalls`].
//!
//! Capabilities kept for container root (all scoped to the container's user namespace):
//! `CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT
//! SETFCAP AUDIT_WRITE` — Docker's default set without `NET_RAW` (no raw sockets: no packet
//! crafting or ARP tricks on the sandbox network) and without `MKNOD`.

use std::collections::{BTreeMap, HashSet};

use caps::{CapSet, Capability};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::ShimError;

/// Paths under /proc and /sys that containers see empty. `/proc/kpagecgroup` and the other
/// `kpage*` files (DSec crashed a kernel through the first) are not here on purpose: they are
/// mode 0400 and owned by host root, which is unmapped in the container's user namespace, so
/// even container root gets EACCES — a mask would turn that into a successful empty read.
pub const MASKED_PATHS: [&str; 11] = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    "/proc/sysrq-trigger",
    "/sys/firmware",
    "/sys/kernel/debug",
];

/// Paths made read-only inside containers.
pub const READONLY_PATHS: [&str; 4] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"];

/// Capabilities container processes keep.
pub const KEPT_CAPS: [Capability; 12] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_KILL,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_SETFCAP,
    Capability::CAP_AUDIT_WRITE,
];

/// XFS_IOC_SWAPEXT: swap extents between two files (DSec's agents read protected files with it).
pub const XFS_IOC_SWAPEXT: u64 = 0xc0c0_586d;
/// XFS_IOC_EXCHANGE_RANGE: the newer form of the same operation.
pub const XFS_IOC_EXCHANGE_RANGE: u64 = 0x4028_5881;
/// TIOCSTI: push characters into a terminal's input (injection into another session).
pub const TIOCSTI: u64 = 0x5412;

/// System calls refused with EPERM, each with why.
pub fn denied_syscalls() -> Vec<(i64, &'static str)> {
    vec![
        (libc::SYS_mount, "mounting inside the sandbox"),
        (libc::SYS_umount2, "unmounting masks"),
        (libc::SYS_pivot_root, "changing the root"),
        (libc::SYS_move_mount, "new mount API"),
        (libc::SYS_open_tree, "new mount API"),
        (libc::SYS_fsopen, "new mount API"),
        (libc::SYS_fsconfig, "new mount API"),
        (libc::SYS_fsmount, "new mount API"),
        (libc::SYS_fspick, "new mount API"),
        (libc::SYS_mount_setattr, "new mount API"),
        (libc::SYS_unshare, "new namespaces (nested user namespaces regain capabilities)"),
        (libc::SYS_setns, "joining other namespaces"),
        (libc::SYS_keyctl, "kernel keyrings are not namespaced"),
        (libc::SYS_add_key, "kernel keyrings are not namespaced"),
        (libc::SYS_request_key, "kernel keyrings are not namespaced"),
        (libc::SYS_kexec_load, "replacing the kernel"),
        (libc::SYS_kexec_file_load, "replacing the kernel"),
        (libc::SYS_bpf, "eBPF programs run in the host kernel"),
        (libc::SYS_perf_event_open, "perf events leak host state and have had many bugs"),
        (libc::SYS_userfaultfd, "a common kernel-exploit primitive"),
        (libc::SYS_io_uring_setup, "io_uring bypasses seccomp and has had many bugs"),
        (libc::SYS_io_uring_enter, "io_uring"),
        (libc::SYS_io_uring_register, "io_uring"),
        (libc::SYS_open_by_handle_at, "opening files by handle escapes the root (shocker)"),
        (libc::SYS_name_to_handle_at, "file handles"),
        (libc::SYS_init_module, "kernel modules"),
        (libc::SYS_finit_module, "kernel modules"),
        (libc::SYS_delete_module, "kernel modules"),
        (libc::SYS_reboot, "rebooting"),
        (libc::SYS_swapon, "swap"),
        (libc::SYS_swapoff, "swap"),
        (libc::SYS_acct, "process accounting"),
        (libc::SYS_syslog, "kernel log"),
        (libc::SYS_quotactl, "quotas"),
        (libc::SYS_settimeofday, "the clock is not namespaced"),
        (libc::SYS_clock_settime, "the clock is not namespaced"),
        (libc::SYS_clock_adjtime, "the clock is not namespaced"),
        (libc::SYS_fanotify_init, "filesystem-wide monitoring"),
        (libc::SYS_lookup_dcookie, "kernel internals"),
        (libc::SYS_uselib, "obsolete"),
        (libc::SYS_ustat, "obsolete"),
        (libc::SYS_sysfs, "obsolete"),
        (libc::SYS_iopl, "port I/O"),
        (libc::SYS_ioperm, "port I/O"),
    ]
}

/// Namespace flags refused in `clone`.
const CLONE_NAMESPACE_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, ShimError> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| ShimError::Seccomp(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, ShimError> {
    SeccompRule::new(conditions).map_err(|e| ShimError::Seccomp(e.to_string()))
}

/// Compiles the container seccomp filter (once per shim; applied in every child).
pub fn seccomp_programs() -> Result<SeccompPrograms, ShimError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, _why) in denied_syscalls() {
        rules.insert(nr, vec![]);
    }
    let mut clone_rules = Vec::new();
    for flag in CLONE_NAMESPACE_FLAGS {
        clone_rules.push(rule(vec![cond(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(flag),
            flag,
        )?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let mut ioctl_rules = Vec::new();
    for request in [XFS_IOC_SWAPEXT, XFS_IOC_EXCHANGE_RANGE, TIOCSTI] {
        ioctl_rules.push(rule(vec![cond(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)?])?);
    }
    rules.insert(libc::SYS_ioctl, ioctl_rules);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| ShimError::Seccomp(e.to_string()))?;
    let main: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| ShimError::Seccomp(e.to_string()))?;
    // clone3 passes its flags in memory, where seccomp cannot look: answer ENOSYS so libc falls
    // back to clone(2), whose flags the rules above check. A separate filter, because each
    // filter returns one action; the kernel applies the most restrictive of all installed ones.
    let clone3_rules: BTreeMap<i64, Vec<SeccompRule>> =
        [(libc::SYS_clone3, vec![])].into_iter().collect();
    let clone3 = SeccompFilter::new(
        clone3_rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| ShimError::Seccomp(e.to_string()))?;
    let clone3: BpfProgram = clone3
        .try_into()
        .map_err(|e: seccompiler::BackendError| ShimError::Seccomp(e.to_string()))?;
    Ok(SeccompPrograms { main, clone3 })
}

/// The compiled filters, installed together.
pub struct SeccompPrograms {
    main: BpfProgram,
    clone3: BpfProgram,
}

/// Drops capabilities outside [`KEPT_CAPS`] from the bounding set. Needs CAP_SETPCAP, so it
/// runs before the process changes to a non-root user.
pub fn drop_bounding_set() -> Result<(), ShimError> {
    let kept: HashSet<Capability> = KEPT_CAPS.into_iter().collect();
    for cap in caps::all() {
        if !kept.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| ShimError::Caps(e.to_string()))?;
        }
    }
    Ok(())
}

/// Drops capabilities outside [`KEPT_CAPS`] from the process's own sets (a non-root user has
/// none left after setuid anyway).
pub fn drop_capabilities() -> Result<(), ShimError> {
    let kept: HashSet<Capability> = KEPT_CAPS.into_iter().collect();
    caps::clear(None, CapSet::Ambient).map_err(|e| ShimError::Caps(e.to_string()))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| ShimError::Caps(e.to_string()))?;
    for set in [CapSet::Effective, CapSet::Permitted] {
        let current = caps::read(None, set).map_err(|e| ShimError::Caps(e.to_string()))?;
        let keep: caps::CapsHashSet = current.intersection(&kept).copied().collect();
        caps::set(None, set, &keep).map_err(|e| ShimError::Caps(e.to_string()))?;
    }
    Ok(())
}

/// Applies the confinement every container process inherits: the seccomp filters, then
/// capabilities. [`drop_bounding_set`] must have run first.
///
/// The filters go in while the process still holds `CAP_SYS_ADMIN` in the container's user
/// namespace, so they need no `no_new_privs`: a setuid program in the image (`sudo`, as E2B's
/// base template has for its `user`) may make a process container root, with no more than the
/// bounding set's capabilities and the same filters (what a command run as root has anyway),
/// as in Docker's default. Where the filters cannot go in that way, `no_new_privs` is set
/// first, as before.
pub fn confine(programs: &SeccompPrograms) -> Result<(), ShimError> {
    let filters = [&programs.clone3, &programs.main];
    match super::sys::install_seccomp(filters[0]) {
        Ok(()) => {
            super::sys::install_seccomp(filters[1])
                .map_err(|e| ShimError::Seccomp(e.to_string()))?;
            drop_capabilities()
        }
        Err(_) => {
            drop_capabilities()?;
            nix::sys::prctl::set_no_new_privs().map_err(|e| ShimError::Sys("no_new_privs", e))?;
            for program in filters {
                seccompiler::apply_filter(program)
                    .map_err(|e| ShimError::Seccomp(e.to_string()))?;
            }
            Ok(())
        }
    }
}
