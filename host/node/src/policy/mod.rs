//! Policy: admission, egress rules, the audit trail and lifecycle events.

pub(crate) mod admission;
pub(crate) mod audit;
pub(crate) mod egress;
pub mod lifecycle_events;
