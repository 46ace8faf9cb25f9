//! Admission by use and CPU QoS.
//!
//! A node admits a sandbox against what its sandboxes actually use, not what they ask for
//! (90% of sandboxes use under 5% of the CPU they request): the host's available memory must
//! stay above a floor after the newcomer's expected use (the mean charge of the node's
//! containers), and the memory and CPU the sandboxes *request* may add up to an overcommit
//! multiple of the machine. A refusal is `ResourceExhausted` (retryable: a control plane routes
//! to another node) and says which bound it hit.

use brig_core::sandbox::Op;
use brig_core::{QosClass, Tier};
use brig_proto::{NodeCapacity, SandboxInfo};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::host::metrics::{AdmissionLabels, QosLabel};
use crate::{info, Node, NodeError};

/// Admission bounds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Requested memory may add up to this percentage of the machine's (400 = 4×).
    pub memory_overcommit_pct: u64,
    /// Requested CPU may add up to this percentage of the machine's cores.
    pub cpu_overcommit_pct: u64,
    /// Available memory that must remain after admitting.
    pub min_free_mib: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            memory_overcommit_pct: 1000,
            cpu_overcommit_pct: 20000,
            min_free_mib: 512,
        }
    }
}

/// How long a measured working set stands in for admission decisions.
const WORKING_SET_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(5);

fn meminfo_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .and_then(|v| v.trim_start_matches(':').trim().trim_end_matches(" kB").parse().ok())
        })
        .unwrap_or(0)
}

/// What a create or fork asks of the node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    /// The tier, for the metrics.
    pub tier: Tier,
    pub memory: u64,
    pub cpu_millis: u64,
    /// Admitted by use: the newcomer is expected to use what the node's containers use on
    /// average, and what its kind of sandbox asks is bounded by the overcommit multiples (a
    /// tier's backends say so: `TierBackend::admitted_by_use`). Otherwise only the free-memory
    /// floor applies.
    pub by_use: bool,
}

/// Admission's own state: its bounds and the last measurement of what containers use.
pub(crate) struct Admission {
    config: AdmissionConfig,
    /// When the containers' working sets were last summed, the sum, and how many there were.
    working_set: parking_lot::Mutex<(std::time::Instant, u64, u64)>,
    /// Set while a blocking task re-measures `working_set` (one at a time).
    refreshing: std::sync::atomic::AtomicBool,
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Admission {
        Admission {
            config,
            working_set: parking_lot::Mutex::new((std::time::Instant::now(), 0, 0)),
            refreshing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Takes a measurement of the containers' working sets.
    fn measured(&self, working_set: u64, containers: u64) {
        *self.working_set.lock() = (std::time::Instant::now(), working_set, containers);
    }

    /// Admits `ask` against what the sandboxes ask (`requested`: memory bytes, CPU millis) and
    /// use (`mean_use`: the expected use of a sandbox admitted by use); why not, if not.
    fn check(
        &self,
        ask: Ask,
        requested: (u64, u64),
        mean_use: impl FnOnce() -> u64,
    ) -> Result<(), (&'static str, String)> {
        let cfg = &self.config;
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let available = meminfo_kib("MemAvailable") << 10;
        let min_free = cfg.min_free_mib << 20;
        // Expected use of the newcomer: what the node's containers used on average at the last
        // measurement (fncall sandboxes are a directory and a table entry). Nothing here walks
        // the sandbox table unless a sandbox admitted by use is being admitted.
        let expected = if ask.by_use { mean_use() } else { 0 };
        if available.saturating_sub(expected) < min_free {
            return Err((
                "memory_floor",
                format!(
                    "node memory: {:.0} MiB available, {:.0} MiB must stay free",
                    mib(available),
                    mib(min_free)
                ),
            ));
        }
        if !ask.by_use {
            return Ok(());
        }
        let (requested_mem, requested_cpu) = requested;
        let (memory, cpu_millis) = (ask.memory, ask.cpu_millis);
        let total = meminfo_kib("MemTotal") << 10;
        let mem_cap = total / 100 * cfg.memory_overcommit_pct;
        if requested_mem + memory > mem_cap {
            return Err((
                "memory_overcommit",
                format!(
                    "node memory: {:.0} MiB requested + {:.0} MiB asked exceeds {}% of {:.0} MiB",
                    mib(requested_mem),
                    mib(memory),
                    cfg.memory_overcommit_pct,
                    mib(total)
                ),
            ));
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let cpu_cap = cpus * 1000 * cfg.cpu_overcommit_pct / 100;
        if requested_cpu + cpu_millis > cpu_cap {
            return Err((
                "cpu_overcommit",
                format!(
                    "node CPU: {requested_cpu} millicores requested + {cpu_millis} asked exceeds {}% of {cpus} cores",
                    cfg.cpu_overcommit_pct
                ),
            ));
        }
        Ok(())
    }

    /// Mean memory charged per container, as last measured. Measuring reads two cgroup files
    /// per container (a tenth of a second at 10,000), so a create never waits for it: a stale
    /// figure starts one re-measurement (`remeasure`, in the background) and is used meanwhile.
    fn mean_working_set(self: &Arc<Self>, remeasure: impl FnOnce() + Send + 'static) -> u64 {
        use std::sync::atomic::Ordering;
        let (at, bytes, containers) = *self.working_set.lock();
        let stale = at.elapsed() >= WORKING_SET_MAX_AGE || containers == 0;
        if stale && !self.refreshing.swap(true, Ordering::AcqRel) {
            /// Clears the flag however the measurement ends (a panic, or a task dropped at
            /// shutdown), so the next stale read starts another.
            struct Refreshing(Arc<Admission>);
            impl Drop for Refreshing {
                fn drop(&mut self) {
                    self.0.refreshing.store(false, Ordering::Release);
                }
            }
            let guard = Refreshing(self.clone());
            let refresh = move || {
                remeasure();
                drop(guard);
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(refresh)),
                Err(_) => refresh(),
            }
        }
        bytes.checked_div(containers).unwrap_or(1 << 20)
    }
}

impl Node {
    /// What the node has, what its sandboxes ask for and what they use. Reads every
    /// container's cgroup: for status and metrics, and at most every few seconds for admission.
    pub fn capacity(&self) -> NodeCapacity {
        let (mut working_set, mut containers) = (0, 0);
        let (mut latency, mut best_effort) = (0, 0);
        // What the sandboxes ask, as admission counts it; their use where a cheap read says (a
        // container in a container-host VM: the VM's).
        let (requested_mem, requested_cpu) = self.inner.sandboxes.asked();
        for e in self.inner.sandboxes.all() {
            match e.spec().qos {
                QosClass::LatencySensitive => latency += 1,
                QosClass::BestEffort => best_effort += 1,
            }
            if let Some(bytes) = e.sandbox.working_set_bytes() {
                working_set += bytes;
                containers += 1;
            }
        }
        let admission = &self.inner.admission;
        admission.measured(working_set, containers);
        let cfg = &admission.config;
        NodeCapacity {
            memory_total_bytes: meminfo_kib("MemTotal") << 10,
            memory_available_bytes: meminfo_kib("MemAvailable") << 10,
            memory_requested_bytes: requested_mem,
            working_set_bytes: working_set,
            containers,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            cpu_requested_millis: requested_cpu,
            memory_overcommit_pct: cfg.memory_overcommit_pct,
            cpu_overcommit_pct: cfg.cpu_overcommit_pct,
            min_free_bytes: cfg.min_free_mib << 20,
            latency_sensitive: latency,
            best_effort,
        }
    }

    /// Admits or refuses a new sandbox asking `ask`.
    pub(crate) fn admit(&self, ask: Ask) -> Result<(), NodeError> {
        let admission = &self.inner.admission;
        // Summed as sandboxes enter and leave the table: no walk over it per create.
        let requested = self.inner.sandboxes.asked();
        let mean_use = || {
            let node = self.clone();
            admission.mean_working_set(move || {
                node.capacity();
            })
        };
        let verdict = admission.check(ask, requested, mean_use);
        let reason = match &verdict {
            Ok(()) => "admitted",
            Err((reason, _)) => reason,
        };
        let labels = AdmissionLabels { tier: ask.tier.as_str(), reason };
        self.inner.metrics.admission.get_or_create(&labels).inc();
        verdict.map_err(|(_, why)| NodeError::Overcommitted(why))
    }

    /// Moves a sandbox to another QoS class (setup is bulk work, tool calls are not).
    pub(crate) async fn set_qos(
        &self,
        sandbox: &str,
        class: QosClass,
    ) -> Result<SandboxInfo, NodeError> {
        let entry = self.inner.sandboxes.get(sandbox)?;
        let _t = entry.transition.lock().await;
        entry.require(Op::Qos)?;
        entry.sandbox.set_qos(class).map_err(|e| entry.fail(e))?;
        entry.update_spec(|s| s.qos = class);
        self.inner.sandboxes.save(&entry)?;
        self.audit_lifecycle(sandbox, "qos", class.as_str());
        Ok(info(self, &entry))
    }

    /// QoS class gauges for the metrics endpoint.
    pub(crate) fn refresh_qos_metrics(&self, cap: &NodeCapacity) {
        let m = &self.inner.metrics;
        m.qos
            .get_or_create(&QosLabel { class: "latency_sensitive" })
            .set(cap.latency_sensitive as i64);
        m.qos.get_or_create(&QosLabel { class: "best_effort" }).set(cap.best_effort as i64);
    }
}
