//! A sandbox's life on the node: create (through the tier registry), restore after a restart,
//! pause and resume, fork, TTLs and destroy.

pub(crate) mod transitions;
