//! Serving requests: routing by family, wire conversions, execs and their hubs, files, watches, sessions, ports and volume files.

pub(crate) mod convert;
pub(crate) mod exec;
pub(crate) mod exec_archive;
pub(crate) mod exec_hub;
pub(crate) mod exec_input;
pub(crate) mod file_watch;
pub(crate) mod file_work;
pub(crate) mod files;
pub(crate) mod host_files;
pub(crate) mod ports;
pub(crate) mod route;
pub(crate) mod sessions;
pub(crate) mod volume_files;
