//! Brig's container runtime, as a library the node uses on the host kernel (and a
//! container-host VM's agent can use inside a guest).
//!
//! ```text
//! Runtime::create(spec)
//!   rootfs   EROFS layer images mounted once per node (read-only, shared) → overlayfs with a
//!            per-sandbox writable upper on the node's disk (`writable_store`), or a
//!            size-capped tmpfs → <run>/c/<id>/rootfs
//!   cgroup   memory, pids, cpu limits (v1 hierarchies or the v2 unified tree)
//!   shim     brig-shim: user namespace (container root = host uid 100000), then mount, uts,
//!            ipc, net, cgroup and pid namespaces (the mount namespace a copy of the node's
//!            empty template); the shim is pid 1 and chroots into the rootfs
//! Container::exec(request)  the node asks the shim to start a process: the request never
//!            passes through anything inside the sandbox that a guest could forge or replace
//! ```
#![deny(unsafe_code)]

pub(crate) mod containers_dir;
pub(crate) mod control;
pub mod exec;
mod file_metadata;
pub mod files;
pub(crate) mod kept;
pub mod port_connect;
pub(crate) mod process_defaults;
pub mod protect;
pub mod record;

mod create;
pub mod rootfs;
pub mod runtime;
pub mod sandbox;
mod sandbox_errors;
pub mod session;
pub(crate) mod session_backlog;
pub mod session_journal;
pub(crate) mod shared_sys;
pub mod shim;
pub mod shim_conn;
pub(crate) mod shim_files;
pub mod shim_proto;
pub(crate) mod spawner;
pub(crate) mod spool;
pub(crate) mod strays;
pub mod writable_store;
mod xfs_quota;
