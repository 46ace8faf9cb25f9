//! The sandbox table: entries and their records, intents and scopes, and each entry's sessions.

pub(crate) mod intents;
pub(crate) mod sandboxes;
pub(crate) mod scope;
pub(crate) mod session_table;
