//! The node's host: kernel settings, swap, free page reporting, shrinker ids, the doctor, usage history and metrics.

pub(crate) mod doctor;
pub(crate) mod free_page_reporting;
pub(crate) mod host_settings;
pub mod metrics;
pub mod shrinker_ids;
pub mod swap;
pub mod usage_history;
