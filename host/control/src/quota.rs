//! Project quotas: live sandboxes and creation rate, for a project and every ancestor
//! (`team/a/b` is held to the limits of `team/a` and `team`).
//!
//! Live counts come from node heartbeats plus the creates this replica confirmed since the
//! owning node's last heartbeat (like placement's in-flight overlay). The creation rate is a
//! token bucket per replica holding its share (`rate / live replicas`), so no request touches
//! the shared store.

use std::collections::HashMap;
use std::time::Instant;

use brig_proto::ProjectLimits;
use parking_lot::Mutex;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("project {project:?} is at its limit of {max} live sandboxes ({live} live); destroy some or raise max_live")]
    Live { project: String, max: u64, live: u64 },
    #[error("project {project:?} is at its limit of {per_sec} creates per second; retry in {retry_ms} ms")]
    Rate { project: String, per_sec: u32, retry_ms: u64 },
}

/// `a/b/c`, `a/b`, `a`.
pub fn ancestry(project: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(project);
    std::iter::from_fn(move || {
        let current = next?;
        next = current.rfind('/').map(|i| &current[..i]);
        Some(current)
    })
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

#[derive(Debug, Default)]
pub struct Quotas {
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Creates confirmed or in flight since the node's last heartbeat: (project, node, ms).
    recent: Mutex<Vec<(String, u32, Option<u64>)>>,
}

impl Quotas {
    /// Admits one create in `project`, or says which limit stops it. `live` has the live
    /// counts from heartbeats (ancestors included); `replicas` shares the rate.
    pub fn admit(
        &self,
        project: &str,
        limits: &HashMap<String, ProjectLimits>,
        live: &HashMap<String, u64>,
        replicas: usize,
    ) -> Result<(), QuotaError> {
        let recent = self.recent.lock();
        for name in ancestry(project) {
            let Some(l) = limits.get(name) else { continue };
            if let Some(max) = l.max_live {
                let pending = recent
                    .iter()
                    .filter(|(p, _, _)| p == name || p.starts_with(&format!("{name}/")))
                    .count() as u64;
                let now_live = live.get(name).copied().unwrap_or(0) + pending;
                if now_live >= max {
                    return Err(QuotaError::Live { project: name.into(), max, live: now_live });
                }
            }
        }
        drop(recent);
        let mut buckets = self.buckets.lock();
        let now = Instant::now();
        let mut charged = Vec::new();
        let mut refused = None;
        for name in ancestry(project) {
            let Some(per_sec) = limits.get(name).and_then(|l| l.max_creates_per_sec) else {
                continue;
            };
            let share = f64::from(per_sec) / replicas.max(1) as f64;
            let b = buckets
                .entry(name.to_string())
                .or_insert(Bucket { tokens: share.max(1.0), last: now });
            b.tokens =
                (b.tokens + now.duration_since(b.last).as_secs_f64() * share).min(share.max(1.0));
            b.last = now;
            if b.tokens < 1.0 {
                let retry_ms = ((1.0 - b.tokens) / share.max(1e-9) * 1000.0).ceil() as u64;
                refused = Some(QuotaError::Rate { project: name.into(), per_sec, retry_ms });
                break;
            }
            b.tokens -= 1.0;
            charged.push(name);
        }
        if let Some(e) = refused {
            // Give back what ancestors already paid for this create.
            for paid in charged {
                if let Some(b) = buckets.get_mut(paid) {
                    b.tokens += 1.0;
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Counts a create that is being placed; `node` fills in on confirmation.
    pub fn reserve(&self, project: &str) {
        self.recent.lock().push((project.to_string(), u32::MAX, None));
    }

    /// The create landed on `node` at `now_ms`: it stays counted until that node's next
    /// heartbeat. A failed create is simply released.
    pub fn settle(&self, project: &str, node: Option<u32>, now_ms: u64) {
        let mut recent = self.recent.lock();
        if let Some(pos) = recent.iter().position(|(p, n, _)| p == project && *n == u32::MAX) {
            match node {
                Some(node) => recent[pos] = (project.to_string(), node, Some(now_ms)),
                None => {
                    recent.swap_remove(pos);
                }
            }
        }
    }

    /// `node`'s heartbeat received at `now_ms` counts what it confirmed before.
    pub fn heartbeat(&self, node: u32, now_ms: u64) {
        self.recent.lock().retain(|(_, n, at)| *n != node || at.is_some_and(|t| t > now_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(&str, Option<u64>, Option<u32>)]) -> HashMap<String, ProjectLimits> {
        pairs
            .iter()
            .map(|(n, live, rate)| {
                (n.to_string(), ProjectLimits { max_live: *live, max_creates_per_sec: *rate })
            })
            .collect()
    }

    #[test]
    fn ancestry_walks_up() {
        assert_eq!(ancestry("a/b/c").collect::<Vec<_>>(), vec!["a/b/c", "a/b", "a"]);
        assert_eq!(ancestry("a").collect::<Vec<_>>(), vec!["a"]);
    }

    #[test]
    fn live_limit_of_an_ancestor_applies_and_counts_in_flight() {
        let q = Quotas::default();
        let l = limits(&[("team", Some(2), None)]);
        let mut live = HashMap::new();
        live.insert("team".to_string(), 1);
        q.admit("team/a", &l, &live, 1).expect("one more fits");
        q.reserve("team/a");
        q.settle("team/a", Some(3), 100);
        let err = q.admit("team/b", &l, &live, 1).expect_err("full");
        assert_eq!(err, QuotaError::Live { project: "team".into(), max: 2, live: 2 });
        // Node 3's heartbeat now counts that create itself.
        q.heartbeat(3, 200);
        live.insert("team".to_string(), 1);
        q.admit("team/b", &l, &live, 1).expect("fits again");
    }

    #[test]
    fn rate_is_shared_between_replicas() {
        let q = Quotas::default();
        let l = limits(&[("p", None, Some(4))]);
        let live = HashMap::new();
        // Two replicas: this one may create 2 at once.
        q.admit("p", &l, &live, 2).expect("1");
        q.admit("p", &l, &live, 2).expect("2");
        assert!(matches!(q.admit("p", &l, &live, 2), Err(QuotaError::Rate { per_sec: 4, .. })));
    }
}
