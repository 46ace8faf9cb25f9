//! What the gateway remembers of each sandbox it serves commands and ports for: the
//! directory its commands start in (its template's WORKDIR) and whether its ports are private
//! (`allowPublicTraffic: false`). Set at create; read back from the sandbox's labels after a
//! restart of the gateway (one status call, then cached).

use std::collections::HashMap;

/// The label that keeps a template sandbox's default directory.
pub(crate) const WORKDIR_LABEL: &str = "e2b.workdir";
/// The label of a sandbox whose ports need its traffic access token.
pub(crate) const PRIVATE_LABEL: &str = "e2b.private";
/// Entries kept before the cache starts over.
const KEPT: usize = 100_000;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    pub workdir: Option<String>,
    pub private: bool,
}

impl Facts {
    /// The labels that keep these facts with the sandbox.
    pub(crate) fn labels(&self) -> Vec<(&'static str, String)> {
        let mut labels = Vec::new();
        if let Some(dir) = &self.workdir {
            labels.push((WORKDIR_LABEL, dir.clone()));
        }
        if self.private {
            labels.push((PRIVATE_LABEL, "true".to_string()));
        }
        labels
    }

    pub(crate) fn from_labels(labels: &[(String, String)]) -> Facts {
        let get = |key: &str| labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        Facts { workdir: get(WORKDIR_LABEL), private: get(PRIVATE_LABEL).is_some() }
    }
}

/// The facts of the sandboxes, by sandbox id.
#[derive(Default)]
pub(crate) struct SandboxFacts(parking_lot::Mutex<HashMap<String, Facts>>);

impl SandboxFacts {
    pub(crate) fn set(&self, sandbox: &str, facts: Facts) {
        let mut all = self.0.lock();
        if all.len() >= KEPT {
            all.clear();
        }
        all.insert(sandbox.to_string(), facts);
    }

    pub(crate) fn forget(&self, sandbox: &str) {
        self.0.lock().remove(sandbox);
    }

    /// The facts of `sb` (`None` when it cannot be asked: gone, or the node unreachable).
    pub(crate) async fn of(&self, sb: &brig_sdk::Sandbox) -> Option<Facts> {
        if let Some(known) = self.0.lock().get(sb.id()) {
            return Some(known.clone());
        }
        let info = sb.status().await.ok()?;
        let facts = Facts::from_labels(&info.labels);
        self.set(sb.id(), facts.clone());
        Some(facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_round_trip_through_labels() {
        let facts = Facts { workdir: Some("/srv".into()), private: true };
        let labels: Vec<(String, String)> =
            facts.labels().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(Facts::from_labels(&labels), facts);
        assert_eq!(Facts::from_labels(&[]), Facts::default());
    }
}
