//! Prometheus metrics of one node, served as text on a plain HTTP endpoint (`GET /metrics`).
//!
//! Every label takes values from a closed set (tiers, request kinds, error codes, verdicts),
//! so a misbehaving client cannot blow up the series count.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub kind: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LiveLabels {
    pub tier: &'static str,
    pub state: &'static str,
}

/// Live sandboxes by tier and state (`running`, `paused`) from `(tier, paused)` pairs: every
/// tier and state is there, 0 where none, so a tier's series never goes missing from the gauge.
pub(crate) fn live_counts(
    sandboxes: impl Iterator<Item = (brig_core::Tier, bool)>,
) -> std::collections::HashMap<(&'static str, &'static str), i64> {
    let state = |paused: bool| if paused { "paused" } else { "running" };
    let mut counts = std::collections::HashMap::new();
    for tier in brig_core::Tier::ALL {
        for paused in [false, true] {
            counts.insert((tier.as_str(), state(paused)), 0);
        }
    }
    for (tier, paused) in sandboxes {
        *counts.entry((tier.as_str(), state(paused))).or_default() += 1;
    }
    counts
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    pub verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub tier: &'static str,
    /// `admitted`, or the bound that refused: `memory_floor`, `memory_overcommit`, …
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QosLabel {
    pub class: &'static str,
}

/// The node's metrics.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<KindLabel, Counter>,
    pub refusals: Family<RefusalLabels, Counter>,
    pub creates: Family<TierLabel, Counter>,
    pub exec_seconds: Family<TierLabel, Histogram>,
    pub live: Family<LiveLabels, Gauge>,
    pub reclaimed_bytes: Counter<u64, AtomicU64>,
    pub egress: Family<VerdictLabel, Counter>,
    pub audit_events: Counter,
    pub admission: Family<AdmissionLabels, Counter>,
    pub qos: Family<QosLabel, Gauge>,
    /// Objects on the host that belong to no sandbox (`brig doctor`).
    pub stray_objects: Gauge,
    /// What the host's kernel does with free memory (`free_page_reporting`), read at each
    /// scrape: 1 for the state it is in (`absent`, `reporting`, `held`), 0 for the others.
    free_page_reporting: Family<StateLabel, Gauge>,
    /// Memory cgroup shrinker ids this boot has reserved (`shrinker_ids`); 0 if none.
    pub shrinker_ids_reserved: Gauge,
    /// Destroyed containers' cgroups kept for the next creates, read at each scrape.
    pub spare_cgroups: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("brig");
        let requests = Family::<KindLabel, Counter>::default();
        registry.register("requests", "Requests served, by kind", requests.clone());
        let refusals = Family::<RefusalLabels, Counter>::default();
        registry.register("requests_refused", "Requests answered with an error", refusals.clone());
        let creates = Family::<TierLabel, Counter>::default();
        registry.register("sandbox_creates", "Sandboxes created (forks included)", creates.clone());
        let exec_seconds = Family::<TierLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 18))
        });
        registry.register(
            "exec_duration_seconds",
            "Wall time of execs and tool calls",
            exec_seconds.clone(),
        );
        let live = Family::<LiveLabels, Gauge>::default();
        registry.register(
            "sandboxes_live",
            "Sandboxes on the node, by tier and state",
            live.clone(),
        );
        let reclaimed_bytes = Counter::<u64, AtomicU64>::default();
        registry.register(
            "memory_reclaimed_bytes",
            "Memory pushed out of RAM by pausing sandboxes",
            reclaimed_bytes.clone(),
        );
        let egress = Family::<VerdictLabel, Counter>::default();
        registry.register(
            "egress_connections",
            "New sandbox connections by verdict",
            egress.clone(),
        );
        let audit_events = Counter::default();
        registry.register("audit_events", "Audit events recorded", audit_events.clone());
        let admission = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admission",
            "Admission decisions by tier and outcome",
            admission.clone(),
        );
        let qos = Family::<QosLabel, Gauge>::default();
        registry.register("sandboxes_qos", "Sandboxes per CPU QoS class", qos.clone());
        let stray_objects = Gauge::default();
        registry.register(
            "stray_objects",
            "Objects on the host that belong to no sandbox of the node (brig doctor lists them)",
            stray_objects.clone(),
        );
        let free_page_reporting = Family::<StateLabel, Gauge>::default();
        registry.register(
            "host_free_page_reporting",
            "Whether the host reports free memory to a hypervisor (1 for the state it is in: absent, reporting, held)",
            free_page_reporting.clone(),
        );
        let shrinker_ids_reserved = Gauge::default();
        registry.register(
            "host_shrinker_ids_reserved",
            "Memory cgroup shrinker ids the host reserved this boot, so a fill does not grow every memory cgroup's shrinker map (0 if none)",
            shrinker_ids_reserved.clone(),
        );
        let spare_cgroups = Gauge::default();
        registry.register(
            "container_spare_cgroups",
            "Destroyed containers' cgroups kept, emptied and reset, for the next creates ([container] spare_cgroups)",
            spare_cgroups.clone(),
        );
        Metrics {
            spare_cgroups,
            shrinker_ids_reserved,
            free_page_reporting,
            stray_objects,
            admission,
            qos,
            registry,
            requests,
            refusals,
            creates,
            exec_seconds,
            live,
            reclaimed_bytes,
            egress,
            audit_events,
        }
    }
}

impl Metrics {
    pub fn observe_exec(&self, tier: &'static str, took: Duration) {
        self.exec_seconds.get_or_create(&TierLabel { tier }).observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        use crate::host::free_page_reporting::{ReportingFiles, ReportingState};
        match ReportingFiles::host().state() {
            Ok(now) => {
                for (state, is) in [
                    ("absent", now == ReportingState::Absent),
                    ("reporting", matches!(now, ReportingState::Reporting(_))),
                    ("held", matches!(now, ReportingState::Held(_))),
                ] {
                    self.free_page_reporting
                        .get_or_create(&StateLabel { state })
                        .set(i64::from(is));
                }
            }
            Err(e) => tracing::debug!(error = %e, "free page reporting state unreadable"),
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use brig_core::Tier;

    #[test]
    fn every_tier_and_state_is_in_the_live_gauge() {
        let none = super::live_counts(std::iter::empty());
        assert_eq!(none.len(), 8);
        assert!(none.values().all(|n| *n == 0));
        let some = [(Tier::Microvm, true), (Tier::Fullvm, false), (Tier::Fullvm, false)];
        let counts = super::live_counts(some.into_iter());
        assert_eq!(counts[&("microvm", "paused")], 1);
        assert_eq!(counts[&("fullvm", "running")], 2);
        assert_eq!(counts[&("container", "running")], 0);
    }
}
