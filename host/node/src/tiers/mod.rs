//! Tier construction and configuration: containers on the node's kernel, container-host VMs and their containers, microVMs and full VMs.

pub(crate) mod builtin;
pub(crate) mod container;
pub(crate) mod container_host;
pub(crate) mod fullvm;
pub(crate) mod hosted;
pub(crate) mod microvm;
pub mod registry;
