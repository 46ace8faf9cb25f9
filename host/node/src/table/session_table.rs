//! A sandbox's open shell sessions by id, whichever tier runs their shells: held in its
//! entry of the sandbox table, served by `crate::serve::sessions`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use brig_core::sandbox::Session;

use crate::limits::Limit;
use crate::NodeError;

/// A sandbox's open sessions by id (`s1`, `s2`, …), whichever tier runs their shells.
#[derive(Default)]
pub(crate) struct SessionTable {
    sessions: parking_lot::Mutex<HashMap<String, Arc<dyn Session>>>,
    next: AtomicU64,
}

impl SessionTable {
    /// The id the next session gets (`s1`, `s2`, …).
    pub fn new_id(&self) -> String {
        format!("s{}", self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Keeps an open session under `id`, or gives it back when `max` are open.
    pub fn add(
        &self,
        id: &str,
        session: Box<dyn Session>,
        max: usize,
    ) -> Result<(), Box<dyn Session>> {
        let mut sessions = self.sessions.lock();
        if sessions.len() >= max {
            return Err(session);
        }
        sessions.insert(id.to_string(), Arc::from(session));
        Ok(())
    }

    /// Keeps a session the tier kept across a restart, under its old id; new ids follow it.
    pub fn restore(&self, id: String, session: Box<dyn Session>) {
        if let Some(n) = id.strip_prefix('s').and_then(|n| n.parse::<u64>().ok()) {
            self.next.fetch_max(n, Ordering::Relaxed);
        }
        self.sessions.lock().insert(id, Arc::from(session));
    }

    /// Refuses a new session when `max` are open already.
    pub fn check_room(&self, max: usize) -> Result<(), NodeError> {
        match self.sessions.lock().len() < max {
            true => Ok(()),
            false => Err(Limit::SessionsPerSandbox.reached(max)),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<dyn Session>> {
        self.sessions.lock().get(id).cloned()
    }

    /// Forgets session `id` (the caller closes it).
    pub fn remove(&self, id: &str) -> Option<Arc<dyn Session>> {
        self.sessions.lock().remove(id)
    }

    /// Ids of the open sessions, sorted (for a client that reconnects).
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.sessions.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Ends every session (their shells and all they started).
    /// Forgets every session without closing it: the tier keeps their shells (a VM saved by
    /// a pause) and hands them back later under the same ids.
    pub fn detach_all(&self) {
        let detached = std::mem::take(&mut *self.sessions.lock());
        drop(detached);
    }

    pub async fn close_all(&self) {
        let sessions: Vec<_> = self.sessions.lock().drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.close().await;
        }
    }
}
