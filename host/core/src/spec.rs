//! What a sandbox is asked to be.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Isolation tier, from lightest to heaviest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// A WASI component per call, in-process on Wasmtime.
    Fncall,
    /// A Linux container on the node's kernel (or in a shared container-host VM).
    Container,
    /// One KVM microVM per sandbox.
    Microvm,
    /// A whole OS image with its own init in a larger VM.
    Fullvm,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Fncall, Tier::Container, Tier::Microvm, Tier::Fullvm];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Fncall => "fncall",
            Tier::Container => "container",
            Tier::Microvm => "microvm",
            Tier::Fullvm => "fullvm",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Tier, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown tier {s:?} (fncall, container, microvm, fullvm)"))
    }
}

/// Sandbox labels (job, rollout, step, …), kept sorted by key.
pub type Labels = Vec<(String, String)>;

/// Most labels one sandbox carries (they live in its record and in every listing).
pub const MAX_LABELS: usize = 256;
/// Most bytes of one label's key.
pub const MAX_LABEL_KEY_BYTES: usize = 256;
/// Most bytes of one label's value.
pub const MAX_LABEL_VALUE_BYTES: usize = 4096;
/// Most bytes of all of a sandbox's labels together.
pub const MAX_LABELS_BYTES: usize = 64 << 10;

/// Labels past one of the bounds above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("{count} labels; at most {MAX_LABELS} are accepted")]
    TooMany { count: usize },
    #[error("label key {key:?}… is empty or longer than {MAX_LABEL_KEY_BYTES} bytes")]
    BadKey { key: String },
    #[error("the value of label {key:?} is longer than {MAX_LABEL_VALUE_BYTES} bytes")]
    ValueTooLong { key: String },
    #[error("labels take {bytes} bytes; at most {MAX_LABELS_BYTES} are accepted")]
    TooLarge { bytes: usize },
}

/// Checks a sandbox's labels against the bounds above.
pub fn check_labels(labels: &[(String, String)]) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany { count: labels.len() });
    }
    let mut bytes = 0;
    for (key, value) in labels {
        if key.is_empty() || key.len() > MAX_LABEL_KEY_BYTES {
            return Err(LabelError::BadKey { key: key.chars().take(64).collect() });
        }
        if value.len() > MAX_LABEL_VALUE_BYTES {
            return Err(LabelError::ValueTooLong { key: key.clone() });
        }
        bytes += key.len() + value.len();
    }
    if bytes > MAX_LABELS_BYTES {
        return Err(LabelError::TooLarge { bytes });
    }
    Ok(())
}

/// What happens to a sandbox left idle past its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    /// Pause it (it resumes on the next request).
    Pause,
    /// Destroy it.
    #[default]
    Destroy,
    /// Pause it keeping its files only: its processes end and its memory is given back; it
    /// resumes with none running.
    PauseFilesOnly,
}

/// A request for a sandbox, after the node has filled in its defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub tier: Tier,
    pub image: Option<String>,
    pub labels: Labels,
    /// Act after this long without a request.
    pub idle_ttl: Duration,
    #[serde(default)]
    pub idle_action: IdleAction,
    /// Destroy a paused sandbox after it has been paused this long (`None`: keep it).
    #[serde(default)]
    pub paused_ttl: Option<Duration>,
    /// Destroy after this long, whatever it is doing (`None`: no limit).
    #[serde(default)]
    pub max_lifetime: Option<Duration>,
    /// Egress policy: `None` gives the sandbox no network beyond its own loopback; `Some`
    /// gives it a link to the node whose traffic only these rules let through.
    #[serde(default)]
    pub egress: Option<Vec<crate::EgressRule>>,
    /// The node's network slot of a sandbox with a link (persisted for restarts).
    #[serde(default)]
    pub net_slot: Option<u32>,
    /// CPU QoS class.
    #[serde(default)]
    pub qos: QosClass,
    /// Volumes mounted into it (a volume is not deleted while a sandbox mounts it).
    #[serde(default)]
    pub volumes: Vec<VolumeBinding>,
}

/// A volume a sandbox mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeBinding {
    /// The volume's id.
    pub volume: String,
    /// Absolute path in the sandbox.
    pub path: String,
    pub read_only: bool,
}

/// How a sandbox's CPU work is scheduled against others' under overcommit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QosClass {
    /// Normal weight: tool calls and steps a trainer waits on.
    #[default]
    LatencySensitive,
    /// The smallest weight and the idle scheduling policy: runs on what others leave.
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::LatencySensitive => "latency_sensitive",
            QosClass::BestEffort => "best_effort",
        }
    }
}

impl SandboxSpec {
    /// Whether every pair of `selector` is among this sandbox's labels.
    pub fn matches(&self, selector: &[(String, String)]) -> bool {
        selector.iter().all(|pair| self.labels.contains(pair))
    }
}

#[cfg(test)]
mod label_tests {
    use super::*;

    fn labels(n: usize, value: usize) -> Labels {
        (0..n).map(|i| (format!("k{i}"), "v".repeat(value))).collect()
    }

    #[test]
    fn labels_past_their_bounds_are_refused() {
        assert_eq!(check_labels(&labels(MAX_LABELS, 10)), Ok(()));
        assert!(matches!(check_labels(&labels(10_000, 1)), Err(LabelError::TooMany { .. })));
        assert!(matches!(
            check_labels(&labels(1, MAX_LABEL_VALUE_BYTES + 1)),
            Err(LabelError::ValueTooLong { .. })
        ));
        assert!(matches!(check_labels(&labels(100, 1000)), Err(LabelError::TooLarge { .. })));
        let long_key = vec![("k".repeat(MAX_LABEL_KEY_BYTES + 1), String::new())];
        assert!(matches!(check_labels(&long_key), Err(LabelError::BadKey { .. })));
        assert!(matches!(
            check_labels(&[(String::new(), "v".into())]),
            Err(LabelError::BadKey { .. })
        ));
    }
}
