//! Serving requests: routing by family, execs, files, watches, sessions, ports and volume files.

pub(crate) mod exec;
pub(crate) mod file_watch;
pub(crate) mod file_work;
pub(crate) mod files;
pub(crate) mod ports;
pub(crate) mod route;
pub(crate) mod sessions;
pub(crate) mod volume_files;
