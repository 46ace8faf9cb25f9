//! brig-vmm: one KVM VM per process, started from a typed launch configuration
//! (`brig_vmm_api::launch`) and steered through its control socket (`control`):
//!
//! - Linux guests: boot a bzImage with ACPI-described virtio-mmio devices (blk with
//!   copy-on-write disks, vsock, net, rng, balloon), one thread per vCPU (`linux`, `vcpus`);
//! - snapshot and restore of the whole machine (`linux_snapshot`), guest memory mapped
//!   `MAP_PRIVATE` from the snapshot so VMs from one snapshot share clean pages copy-on-write;
//! - the jail every VMM enters before it touches guest data (`jail`).
//!
//! With the `test-guest` feature it also carries a purpose-built guest and the bare VM that
//! runs it (`guest`, `vm`, `snapshot`), for measuring the mechanisms natively where a stock
//! Linux kernel cannot boot (this machine's software hypervisor; see docs/GUEST.md).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod acpi;
pub mod agent_client;
pub mod control;
pub mod jail;
mod kvm_abi;
pub mod linux;
pub mod linux_snapshot;
pub mod long_mode;
pub mod machine;
pub mod memory;
pub mod serial;
pub use brig_vmm_api::sparse;
pub mod vcpus;
pub mod virtio;

// The purpose-built test guest and the bare VM that runs it: for the VMM's own tests and
// benchmarks (`brig-vmm snapshot`, `restore`, `pool`), not part of the shipped VMM.
#[cfg(feature = "test-guest")]
pub mod guest;
#[cfg(feature = "test-guest")]
pub mod snapshot;
#[cfg(feature = "test-guest")]
pub mod vm;

#[cfg(feature = "test-guest")]
pub use snapshot::{Snapshot, SnapshotError};
#[cfg(feature = "test-guest")]
pub use vm::{Vm, VmError};

pub use brig_vmm_api::Virtualization;
