//! The node's host: its clock, kernel settings, files it keeps, swap, free page reporting,
//! shrinker ids, the doctor, usage history and metrics.

pub(crate) mod clock;
pub(crate) mod doctor;
pub(crate) mod free_page_reporting;
pub(crate) mod host_files;
pub(crate) mod host_settings;
pub mod metrics;
pub mod shrinker_ids;
pub mod swap;
pub mod usage_history;
