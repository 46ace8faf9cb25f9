//! Egress policies on this node: rules resolved to destinations, links given to sandboxes, rules
//! replaced at run time, and connection attempts from the kernel log into the audit trail.
//!
//! The network (an nftables table and a subnet of this daemon's) is opened the first time a
//! sandbox asks for a link, so nodes whose sandboxes never network change nothing on the host.

use std::collections::HashMap;
use std::sync::Arc;

use brig_core::{EgressPolicy, EgressRule};
use brig_hostkit::network::{self, Network, SlotOutcome};
use brig_proto::{AuditKind, SandboxInfo};
use parking_lot::Mutex;

use crate::table::sandboxes::SandboxEntry;
use crate::{info, Node, NodeError};

/// The node's egress state.
#[derive(Default)]
pub(crate) struct EgressState {
    network: Mutex<Option<Arc<Network>>>,
    /// Which sandbox holds each slot, for the kernel-log watcher.
    owners: Arc<Mutex<HashMap<u32, String>>>,
}

impl EgressState {
    /// The network, if a sandbox has opened it.
    pub(crate) fn opened(&self) -> Option<Arc<Network>> {
        self.network.lock().clone()
    }
}

/// A sandbox's network namespace, owned (see `brig_hostkit::network::Netns`).
pub(crate) enum NetnsRef {
    Pid(i32),
    Named(String),
}

impl Node {
    /// Parses rule texts and resolves services through the node's configuration. At most
    /// [`brig_core::egress::MAX_EGRESS_RULES`] rules (a `bad_request` beyond); linear in them.
    pub(crate) fn resolve_egress(
        &self,
        texts: &[String],
    ) -> Result<(Vec<EgressRule>, EgressPolicy), NodeError> {
        brig_core::egress::check_rule_count(texts.len())
            .map_err(|e| NodeError::BadEgress(e.to_string()))?;
        let mut rules = Vec::with_capacity(texts.len());
        let (mut reached, mut deny, mut allow) = (Vec::new(), Vec::new(), Vec::new());
        for text in texts {
            let rule: EgressRule =
                text.parse().map_err(|e: brig_core::egress::EgressRuleError| {
                    NodeError::BadEgress(e.to_string())
                })?;
            match &rule {
                EgressRule::Destination(d) => allow.push(*d),
                EgressRule::Deny(d) => deny.push(*d),
                EgressRule::Service(name) => {
                    let services = &self.inner.config.egress_services;
                    let Some((_, to)) = services.iter().find(|(n, _)| n == name) else {
                        let known: Vec<&str> = services.iter().map(|(n, _)| n.as_str()).collect();
                        return Err(NodeError::BadEgress(format!(
                            "no egress service {name:?} on this node (configured: {})",
                            if known.is_empty() { "none".into() } else { known.join(", ") }
                        )));
                    };
                    // The operator's own destinations: the one way to the node's addresses.
                    reached.extend(to.iter().copied());
                }
            }
            rules.push(rule);
        }
        Ok((rules, EgressPolicy::new(reached, deny, allow)))
    }

    /// The node's network, opened on first use (with its kernel-log watcher).
    fn network(&self) -> Result<Arc<Network>, NodeError> {
        let mut slot = self.inner.egress.network.lock();
        if let Some(net) = slot.as_ref() {
            return Ok(net.clone());
        }
        let net = Arc::new(Network::open(&self.inner.tag, &self.inner.run_dir.join("../net"))?);
        let (owners, audit, metrics) = (
            self.inner.egress.owners.clone(),
            self.inner.audit.clone(),
            self.inner.metrics.clone(),
        );
        let watcher_net = net.clone();
        let watch = network::watch_kernel_log(net.log_prefix(), move |event| {
            let Some(slot) = watcher_net.slot_of_ifname(&event.ifname) else { return };
            let Some(id) = owners.lock().get(&slot).cloned() else { return };
            let verdict = if event.allowed { "allowed" } else { "denied" };
            metrics.egress.get_or_create(&crate::host::metrics::VerdictLabel { verdict }).inc();
            audit.record(
                &id,
                AuditKind::Egress {
                    allowed: event.allowed,
                    proto: event.proto,
                    dst: event.dst,
                    port: event.port,
                },
            );
        });
        if let Err(e) = watch {
            tracing::warn!(error = %e, "egress attempts will not reach the audit trail");
        }
        *slot = Some(net.clone());
        Ok(net)
    }

    /// Gives a new container sandbox its link; returns the slot.
    pub(crate) async fn attach_network(
        &self,
        id: &str,
        pid: i32,
        dests: EgressPolicy,
    ) -> Result<u32, NodeError> {
        self.attach_network_to(id, NetnsRef::Pid(pid), dests).await
    }

    /// Gives a sandbox whose network namespace is `netns` its link; returns the slot.
    pub(crate) async fn attach_network_to(
        &self,
        id: &str,
        netns: NetnsRef,
        dests: EgressPolicy,
    ) -> Result<u32, NodeError> {
        let net = self.network()?;
        let slot = match &netns {
            NetnsRef::Pid(pid) => net.attach(*pid, &dests).await,
            NetnsRef::Named(name) => net.attach_in(network::Netns::Named(name), &dests).await,
        }?;
        self.inner.egress.owners.lock().insert(slot, id.to_string());
        Ok(slot)
    }

    /// Takes back a restored sandbox's slot. A slot an older daemon wrote without the guard
    /// (see `brig_hostkit::network`; closed since the network opened) gets its sandbox's
    /// `rules` written again; rules that no longer resolve (a service gone from the
    /// configuration) or that cannot be written leave it closed, which is logged and audited.
    pub(crate) async fn reserve_network(&self, id: &str, slot: u32, rules: Option<&[EgressRule]>) {
        let net = match self.network() {
            Ok(net) => net,
            Err(e) => {
                tracing::warn!(sandbox = id, error = %e, "network unavailable on restore");
                return;
            }
        };
        net.reserve(slot);
        self.inner.egress.owners.lock().insert(slot, id.to_string());
        if !net.unguarded(slot) {
            return;
        }
        let texts: Vec<String> = rules.unwrap_or_default().iter().map(|r| r.to_string()).collect();
        let (policy, unresolved) = match self.resolve_egress(&texts) {
            Ok((_, policy)) => (policy, None),
            Err(e) => (EgressPolicy::default(), Some(e.to_string())),
        };
        let written = tokio::task::spawn_blocking(move || net.restore_rules(slot, &policy)).await;
        let closed = match (written, unresolved) {
            (Ok(Ok((SlotOutcome::Ruled, _))), None) => {
                tracing::info!(sandbox = id, slot, "egress rules rewritten with the guard");
                return;
            }
            (Ok(Ok((SlotOutcome::Ruled, _))), Some(why)) => {
                format!("its egress rules no longer resolve ({why}): no egress")
            }
            (Ok(Ok((outcome, errors))), _) => {
                let why: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                let left = match outcome {
                    SlotOutcome::Unmapped => "its link is out of the sandboxes map",
                    _ => "its chain refuses everything",
                };
                format!("its egress rules could not be written ({}): {left}", why.join("; "))
            }
            (Ok(Err(e)), _) => format!(
                "its egress rules could not be written, its chain left as opened (closed): {e}"
            ),
            (Err(e), _) => format!("writing its egress rules failed: {e}"),
        };
        tracing::error!(sandbox = id, slot, reason = %closed, "restored sandbox's egress closed");
        self.inner
            .audit
            .record(id, AuditKind::Lifecycle { event: "egress_closed".into(), detail: closed });
    }

    pub(crate) fn detach_network(&self, slot: u32) {
        if let Some(net) = self.inner.egress.network.lock().clone() {
            net.detach(slot);
            self.inner.egress.owners.lock().remove(&slot);
        }
    }

    /// The sandbox's address on its link.
    pub(crate) fn sandbox_address(&self, slot: u32) -> Option<String> {
        self.inner.egress.network.lock().as_ref().map(|n| n.sandbox_addr(slot).to_string())
    }

    /// Replaces a sandbox's egress rules, giving it a link first if it has none.
    pub(crate) async fn set_egress(
        &self,
        sandbox: &str,
        texts: Vec<String>,
    ) -> Result<SandboxInfo, NodeError> {
        let (rules, dests) = self.resolve_egress(&texts)?;
        let entry = self.live(sandbox).await?;
        let _t = entry.transition.lock().await;
        match (entry.spec().net_slot, entry.sandbox.net_pid()) {
            // A container or a networked full VM: new rules on its link.
            (Some(slot), _) => {
                let net = self.network()?;
                tokio::task::spawn_blocking(move || net.set_rules(slot, &dests)).await.map_err(
                    |e| NodeError::Io { what: "egress rules".into(), source: e.into() },
                )??
            }
            (None, Some(pid)) => {
                let slot = self.attach_network(sandbox, pid, dests).await?;
                entry.update_spec(|s| s.net_slot = Some(slot));
            }
            // A VM's network device is made with it.
            (None, _) => {
                return Err(NodeError::WrongTier {
                    id: sandbox.to_string(),
                    tier: entry.tier,
                    op: "egress rules for a sandbox created without a network",
                })
            }
        }
        entry.update_spec(|s| s.egress = Some(rules));
        self.inner.sandboxes.save(&entry)?;
        self.audit_policy(&entry);
        Ok(info(self, &entry))
    }

    pub(crate) fn audit_policy(&self, entry: &SandboxEntry) {
        let rules = entry.spec().egress.unwrap_or_default().iter().map(|r| r.to_string()).collect();
        self.inner.audit.record(&entry.id.to_string(), AuditKind::Policy { rules });
    }

    /// Removes the node's table when the daemon goes and no sandbox needs it any more.
    pub(crate) fn close_network(&self) {
        if self.inner.egress.owners.lock().is_empty() {
            if let Some(net) = self.inner.egress.network.lock().take() {
                net.remove();
            }
        }
    }
}
