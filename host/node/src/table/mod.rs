//! The sandbox table: entries and their records, the lifecycle (create, restore, pause, fork, destroy, TTLs), intents and scopes.

pub(crate) mod intents;
pub(crate) mod lifecycle;
pub(crate) mod sandboxes;
pub(crate) mod scope;
pub(crate) mod session_table;
