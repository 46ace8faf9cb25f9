//! The host's Linux toolkit: what the node, its tiers and a container-host VM's agent all need
//! of the kernel, apart from any one tier.
//!
//! ```text
//! cgroup        memory, pids and cpu cgroups (v1 hierarchies or the v2 tree), spares, bandwidth
//! cgroup_favor  the node's cgroup mount options (favordynmods) and what they cost
//! netlink       links and addresses in network namespaces (rtnetlink)
//! network       the node's sandbox network: bridge, veth slots, the nftables guard and rules
//! slot_file     a record file written in alternating slots (a crash leaves the last whole one)
//! spare_files   emptied files kept for reuse (an unlink on a `discard` mount is slow)
//! terminal      pseudo-terminals for execs, with the window size
//! ```
#![deny(unsafe_code)]

pub mod cgroup;
pub mod cgroup_favor;
pub mod netlink;
pub mod network;
mod nft_rules;
pub mod slot_file;
pub mod spare_files;
pub mod terminal;
