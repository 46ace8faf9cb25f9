//! brig-vmm: one KVM VM per process. This first cut holds the mechanisms the microVM tier is
//! built on, exercised natively with a purpose-built guest (a stock Linux kernel cannot boot on
//! this machine's software hypervisor; see GUEST.md):
//!
//! - a VM with guest memory in one memory slot, anonymous or mapped from a snapshot file;
//! - x86_64 long-mode setup (GDT, identity page tables) and a vCPU run loop that dispatches
//!   port I/O exits to the VMM;
//! - snapshot (vCPU state plus a memory file) and restore, either into a fresh VM or into a
//!   pre-created one, with the memory file mapped `MAP_PRIVATE` so every VM restored from one
//!   snapshot shares its clean pages copy-on-write.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod acpi;
pub mod agent_client;
pub mod control;
pub mod guest;
pub mod jail;
mod kvm_abi;
pub mod linux;
pub mod linux_snapshot;
pub mod memory;
pub mod serial;
pub mod snapshot;
pub use brig_vmm_api::sparse;
pub mod vcpus;
pub mod virtio;
pub mod vm;

pub use snapshot::{Snapshot, SnapshotError};
pub use vm::{Vm, VmError};

pub use brig_vmm_api::Virtualization;
