//! Sandbox lifecycles: create, restore after a restart, pause and (implicit) resume, fork,
//! lifetimes (idle TTL with pause or destroy, paused TTL, maximum lifetime), destroy.
//!
//! ```text
//!            create ──▶ running ──idle TTL (pause)──▶ paused ──paused TTL──▶ destroyed
//!                         ▲   │                         │
//!  any request / resume ──┘   └──idle TTL (destroy), max lifetime, destroy ─────▶ destroyed
//! ```
//! A paused container is frozen (its processes keep their state) with its reclaimable memory
//! pushed out; a paused microVM is saved to disk and its VMM stopped (it holds no memory); a
//! paused fncall sandbox just runs nothing. Transitions of one sandbox are
//! serialized by its `transition` lock.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use brig_core::{IdleAction, QosClass, SandboxId, SandboxSpec, Tier};
use brig_proto::{CreateRequest, SandboxInfo, Target, TtlUpdate};

use crate::sandboxes::{now_unix_ms, Due, Gone, SandboxEntry, TierHandle};
use crate::{convert, info, Node, NodeError};

fn idle_action(a: brig_proto::IdleAction) -> IdleAction {
    match a {
        brig_proto::IdleAction::Pause => IdleAction::Pause,
        brig_proto::IdleAction::Destroy => IdleAction::Destroy,
    }
}

impl Node {
    /// A sandbox for a request that needs it running: resumed first if paused.
    pub(crate) async fn live(&self, id: &str) -> Result<Arc<SandboxEntry>, NodeError> {
        let entry = self.inner.sandboxes.get(id)?;
        if let TierHandle::Hosted(h) = &entry.handle {
            h.check(id)?;
        }
        entry.touch();
        if entry.paused_unix_ms().is_some() {
            self.resume_entry(&entry).await?;
        }
        Ok(entry)
    }

    pub(crate) async fn create(&self, req: CreateRequest) -> Result<SandboxInfo, NodeError> {
        let started = std::time::Instant::now();
        let tier = req.tier.map_or(Tier::Fncall, convert::tier_from_wire);
        let max = self.inner.config.max_sandboxes;
        if self.inner.sandboxes.len() >= max {
            return Err(NodeError::Full(max));
        }
        let cfg = &self.inner.config;
        let ttl_ms = req.idle_ttl_ms.unwrap_or(cfg.default_idle_ttl_ms).min(cfg.max_idle_ttl_ms);
        let mut labels = req.labels.clone();
        labels.sort();
        labels.dedup();
        let id = SandboxId::generate(cfg.node_id());
        let egress = match &req.egress {
            Some(texts) if matches!(tier, Tier::Container | Tier::Fullvm) => {
                Some(self.resolve_egress(texts)?)
            }
            Some(_) => {
                return Err(NodeError::WrongTier { id: id.to_string(), tier, op: "egress rules" })
            }
            None => None,
        };
        let placement = match tier {
            Tier::Container => Some(self.placement_for(req.placement)?),
            _ => None,
        };
        let (memory, cpu) = match tier {
            Tier::Container => crate::container::requested(&cfg.container, &req.limits),
            _ => (0, 0),
        };
        self.admit(tier, memory, cpu)?;
        let qos = req.qos.map(convert::qos_from_wire).unwrap_or_default();
        // A full VM's link is made with it (its VMM attaches to the tap at start).
        let mut vm_slot = None;
        let handle = match tier {
            Tier::Fncall => {
                TierHandle::Fncall(self.inner.fncall.create_workspace(&id.to_string())?)
            }
            Tier::Container if placement == Some(brig_proto::Placement::Vm) => TierHandle::Hosted(
                Box::new(self.container_hosts()?.create(&id, &req, &cfg.container).await?),
            ),
            Tier::Container => {
                let store = self.inner.store.as_ref().ok().map(Arc::as_ref);
                TierHandle::Container(Box::new(
                    self.container_tier()?.create(&id, &req, store).await?,
                ))
            }
            Tier::Microvm => TierHandle::Microvm(crate::microvm::MicrovmSandbox::new(
                self.create_microvm(&id, req.image.as_deref()).await?,
                self.vmtier()?.clone(),
            )),
            Tier::Fullvm => {
                let dests = egress.as_ref().map(|(_, d)| d.clone());
                let (vm, slot) = self.create_fullvm(&id, dests).await?;
                vm_slot = slot;
                TierHandle::Microvm(crate::microvm::MicrovmSandbox::new(
                    vm,
                    self.fullvm_tier()?.clone(),
                ))
            }
        };
        let spec = SandboxSpec {
            tier,
            image: req.image,
            labels,
            idle_ttl: Duration::from_millis(ttl_ms),
            idle_action: req.idle_action.map_or(IdleAction::Destroy, idle_action),
            paused_ttl: req.paused_ttl_ms.map(Duration::from_millis),
            max_lifetime: req.max_lifetime_ms.map(Duration::from_millis),
            egress: egress.as_ref().map(|(rules, _)| rules.clone()),
            net_slot: vm_slot,
            qos,
        };
        if let (TierHandle::Container(c), QosClass::BestEffort) = (&handle, qos) {
            if let Err(e) = c.container.cgroup().set_best_effort(true) {
                tracing::warn!(sandbox = %id, error = %e, "cannot set the QoS class");
            }
        }
        self.audit_lifecycle(&id.to_string(), "created", spec.image.clone().unwrap_or_default());
        let entry = self.adopt(SandboxEntry::new(id, spec, now_unix_ms(), handle)).await?;
        if vm_slot.is_some() {
            self.audit_policy(&entry);
        }
        if let (Some((_, dests)), TierHandle::Container(c)) = (egress, &entry.handle) {
            match self.attach_network(&id.to_string(), c.container.init_pid(), dests).await {
                Ok(slot) => {
                    entry.update_spec(|s| s.net_slot = Some(slot));
                    self.inner.sandboxes.save(&entry)?;
                    self.audit_policy(&entry);
                }
                Err(e) => {
                    self.destroy(&id, Gone::Destroyed).await;
                    return Err(e);
                }
            }
        }
        self.inner
            .metrics
            .creates
            .get_or_create(&crate::metrics::TierLabel { tier: tier.as_str() })
            .inc();
        tracing::debug!(sandbox = %id, tier = %tier, took = ?started.elapsed(), "sandbox created");
        Ok(info(self, &entry))
    }

    /// Puts a new sandbox in the table and records it; a sandbox that cannot be recorded would
    /// not survive a restart, so it is destroyed instead.
    async fn adopt(&self, entry: SandboxEntry) -> Result<Arc<SandboxEntry>, NodeError> {
        let id = entry.id;
        let entry = self.inner.sandboxes.insert(entry);
        if let Err(e) = self.inner.sandboxes.save(&entry) {
            self.destroy(&id, Gone::Destroyed).await;
            return Err(e);
        }
        Ok(entry)
    }

    /// Adopts a fork's child and gives it a link of its own with its parent's rules.
    async fn adopt_fork(
        &self,
        entry: SandboxEntry,
        egress: Option<Vec<brig_core::Destination>>,
    ) -> Result<Arc<SandboxEntry>, NodeError> {
        let id = entry.id;
        let entry = self.adopt(entry).await?;
        if let (TierHandle::Microvm(_), Some(_)) = (&entry.handle, entry.spec().net_slot) {
            // A networked VM's child: its link came with it.
            self.audit_policy(&entry);
        }
        if let (TierHandle::Container(c), QosClass::BestEffort) = (&entry.handle, entry.spec().qos)
        {
            if let Err(e) = c.container.cgroup().set_best_effort(true) {
                tracing::warn!(sandbox = %id, error = %e, "cannot set the QoS class");
            }
        }
        if let (Some(dests), TierHandle::Container(c)) = (egress, &entry.handle) {
            let attached =
                self.attach_network(&id.to_string(), c.container.init_pid(), dests).await;
            let saved = attached.and_then(|slot| {
                entry.update_spec(|s| s.net_slot = Some(slot));
                self.inner.sandboxes.save(&entry)
            });
            if let Err(e) = saved {
                self.destroy(&id, Gone::Destroyed).await;
                return Err(e);
            }
        }
        Ok(entry)
    }

    /// Takes back the sandboxes an earlier run of the node recorded; removes what it cannot.
    pub(crate) async fn restore(&self) {
        let mut restored = 0;
        let mut containers = Vec::new();
        for record in self.inner.sandboxes.saved_records() {
            let id = record.id;
            let handle = match (record.spec.tier, &record.container) {
                (Tier::Fncall, _) => self
                    .inner
                    .fncall
                    .open_workspace(&id.to_string())
                    .map(TierHandle::Fncall)
                    .map_err(NodeError::from),
                (Tier::Container, Some(c)) => match self.container_tier() {
                    Ok(tier) => {
                        let store = self.inner.store.as_ref().ok().map(Arc::as_ref);
                        tier.attach(&id, c, store).await.map(|c| TierHandle::Container(Box::new(c)))
                    }
                    Err(e) => Err(e),
                },
                (tier, _) => Err(NodeError::TierUnavailable { tier, why: "not restorable".into() }),
            };
            let handle = match handle {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "sandbox did not survive the restart");
                    self.inner.sandboxes.forget(&id);
                    continue;
                }
            };
            if matches!(handle, TierHandle::Container(_)) {
                containers.push(id.to_string());
            }
            if let Some(slot) = record.spec.net_slot {
                self.reserve_network(&id.to_string(), slot);
            }
            let entry = SandboxEntry::new(id, record.spec, record.created_unix_ms, handle);
            entry.set_paused(record.paused_unix_ms != 0);
            // The node was down: count idleness from now, not from before the restart.
            entry.touch();
            self.inner.sandboxes.insert(entry);
            restored += 1;
        }
        if let Ok(tier) = self.container_tier() {
            tier.remove_orphans(&containers);
        }
        if restored > 0 {
            tracing::info!(restored, containers = containers.len(), "sandboxes restored");
        }
    }

    /// Pauses one sandbox; returns the bytes of memory freed.
    pub(crate) async fn pause_entry(&self, entry: &SandboxEntry) -> Result<u64, NodeError> {
        let _t = entry.transition.lock().await;
        if entry.paused_unix_ms().is_some() {
            return Ok(0);
        }
        let freed = match &entry.handle {
            TierHandle::Fncall(_) => 0,
            TierHandle::Container(c) => c.pause().await?,
            TierHandle::Microvm(vm) => self.pause_microvm(vm).await?,
            TierHandle::Hosted(h) => {
                h.check(&entry.id.to_string())?;
                h.guest().set_frozen(true).await.map_err(crate::container_host::host_error)?;
                0
            }
        };
        entry.set_paused(true);
        self.inner.sandboxes.save(entry)?;
        self.inner.metrics.reclaimed_bytes.inc_by(freed);
        self.audit_lifecycle(&entry.id.to_string(), "paused", format!("{freed} bytes reclaimed"));
        tracing::debug!(sandbox = %entry.id, freed, "sandbox paused");
        Ok(freed)
    }

    pub(crate) async fn resume_entry(&self, entry: &SandboxEntry) -> Result<(), NodeError> {
        let _t = entry.transition.lock().await;
        if entry.paused_unix_ms().is_none() {
            return Ok(());
        }
        match &entry.handle {
            TierHandle::Container(c) => c.resume().await?,
            TierHandle::Microvm(vm) => self.resume_microvm(vm).await?,
            TierHandle::Hosted(h) => {
                h.check(&entry.id.to_string())?;
                h.guest().set_frozen(false).await.map_err(crate::container_host::host_error)?;
            }
            TierHandle::Fncall(_) => {}
        }
        entry.set_paused(false);
        entry.touch();
        self.inner.sandboxes.save(entry)?;
        self.audit_lifecycle(&entry.id.to_string(), "resumed", "");
        tracing::debug!(sandbox = %entry.id, "sandbox resumed");
        Ok(())
    }

    fn targets(&self, target: &Target) -> Result<Vec<Arc<SandboxEntry>>, NodeError> {
        Ok(match target {
            Target::Sandbox(id) => vec![self.inner.sandboxes.get(id)?],
            Target::Labels(labels) => self.inner.sandboxes.list(labels),
        })
    }

    /// Pauses every targeted sandbox, several at a time; returns their ids.
    pub(crate) async fn pause(&self, target: &Target) -> Result<Vec<String>, NodeError> {
        let entries = self.targets(target)?;
        let results = join_all(
            entries
                .iter()
                .map(|e| async move { self.pause_entry(e).await.map(|_| e.id.to_string()) }),
        )
        .await;
        results.into_iter().collect()
    }

    pub(crate) async fn resume(&self, target: &Target) -> Result<Vec<String>, NodeError> {
        let entries = self.targets(target)?;
        let results = join_all(
            entries
                .iter()
                .map(|e| async move { self.resume_entry(e).await.map(|_| e.id.to_string()) }),
        )
        .await;
        results.into_iter().collect()
    }

    pub(crate) async fn destroy_matching(&self, labels: &[(String, String)]) -> Vec<String> {
        let entries = self.inner.sandboxes.list(labels);
        join_all(entries.iter().map(|e| self.destroy(&e.id, Gone::Destroyed))).await;
        entries.iter().map(|e| e.id.to_string()).collect()
    }

    pub(crate) fn set_ttl(&self, update: TtlUpdate) -> Result<SandboxInfo, NodeError> {
        let entry = self.inner.sandboxes.get(&update.sandbox)?;
        let max_idle = self.inner.config.max_idle_ttl_ms;
        entry.update_spec(|spec| {
            if let Some(ms) = update.idle_ttl_ms {
                spec.idle_ttl = Duration::from_millis(ms.min(max_idle));
            }
            if let Some(a) = update.idle_action {
                spec.idle_action = idle_action(a);
            }
            if let Some(p) = update.paused_ttl_ms {
                spec.paused_ttl = p.map(Duration::from_millis);
            }
            if let Some(m) = update.max_lifetime_ms {
                spec.max_lifetime = m.map(Duration::from_millis);
            }
        });
        entry.touch();
        self.inner.sandboxes.save(&entry)?;
        Ok(info(self, &entry))
    }

    /// Clones a sandbox into `count` children that start from its exact files and then
    /// diverge. A container's processes are not cloned (each child starts with none running;
    /// the parent is frozen while its writable layer is copied); a microVM's children resume
    /// from one snapshot of the whole running machine, processes included.
    pub(crate) async fn fork(
        &self,
        id: &str,
        count: u32,
        extra_labels: Vec<(String, String)>,
        evaluation: bool,
    ) -> Result<Vec<SandboxInfo>, NodeError> {
        let parent = self.inner.sandboxes.get(id)?;
        let count = count.clamp(1, 256);
        let (memory, cpu) = match &parent.handle {
            TierHandle::Container(c) => c.requested(),
            TierHandle::Hosted(_) => {
                return Err(NodeError::WrongTier {
                    id: id.to_string(),
                    tier: parent.tier,
                    op: "fork (not yet for containers in a container-host VM)",
                })
            }
            TierHandle::Fncall(_) | TierHandle::Microvm(_) => (0, 0),
        };
        self.admit(parent.tier, memory * u64::from(count), cpu * u64::from(count))?;
        if self.inner.sandboxes.len() + count as usize > self.inner.config.max_sandboxes {
            return Err(NodeError::Full(self.inner.config.max_sandboxes));
        }
        let mut spec = parent.spec();
        spec.labels.retain(|(k, _)| k != "forked-from");
        spec.labels.push(("forked-from".into(), id.to_string()));
        spec.labels.extend(extra_labels);
        spec.labels.sort();
        spec.labels.dedup();
        spec.net_slot = None;
        let egress = match &spec.egress {
            Some(rules) => {
                let texts: Vec<String> = rules.iter().map(|r| r.to_string()).collect();
                Some(self.resolve_egress(&texts)?.1)
            }
            None => None,
        };
        let _t = parent.transition.lock().await;
        let was_paused = parent.paused_unix_ms().is_some();
        if let (TierHandle::Container(c), false) = (&parent.handle, was_paused) {
            c.set_frozen(true).await?;
        }
        let ids: Vec<SandboxId> =
            (0..count).map(|_| SandboxId::generate(self.inner.config.node_id())).collect();
        let made = if let TierHandle::Microvm(vm) = &parent.handle {
            // One snapshot of the parent, then every child resumes from it (a networked VM's
            // children on networks of their own).
            self.fork_microvm(vm, &ids, egress.clone()).await?
        } else {
            let made = self.fork_handles(&parent, &ids, evaluation).await;
            made.into_iter().map(|handle| handle.map(|h| (h, None))).collect()
        };
        if let (TierHandle::Container(c), false) = (&parent.handle, was_paused) {
            c.set_frozen(false).await?;
        }
        let mut out = Vec::new();
        let mut first_err = None;
        for (child, handle) in ids.into_iter().zip(made) {
            match handle {
                Ok((handle, vm_slot)) => {
                    let mut spec = spec.clone();
                    spec.net_slot = vm_slot;
                    let entry = SandboxEntry::new(child, spec, now_unix_ms(), handle);
                    self.audit_lifecycle(
                        &child.to_string(),
                        "created",
                        format!("forked from {id}"),
                    );
                    match self.adopt_fork(entry, egress.clone()).await {
                        Ok(entry) => out.push(info(self, &entry)),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let children: Vec<&str> = out.iter().map(|i| i.id.as_str()).collect();
        self.audit_lifecycle(id, "forked", children.join(" "));
        match (out.is_empty(), first_err) {
            (true, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }

    /// Children of a fncall or container sandbox, made side by side from its files.
    async fn fork_handles(
        &self,
        parent: &Arc<SandboxEntry>,
        ids: &[SandboxId],
        evaluation: bool,
    ) -> Vec<Result<TierHandle, NodeError>> {
        join_all(ids.iter().map(|child| {
            let parent = parent.clone();
            async move {
                let handle = match &parent.handle {
                    TierHandle::Fncall(ws) => {
                        let (fncall, from) = (self.inner.fncall.clone(), ws.path().to_owned());
                        let key = child.to_string();
                        let forked =
                            tokio::task::spawn_blocking(move || fncall.fork_workspace(&from, &key))
                                .await
                                .map_err(|e| NodeError::Io {
                                    what: "forking a workspace".into(),
                                    source: std::io::Error::other(e),
                                })??;
                        TierHandle::Fncall(forked)
                    }
                    TierHandle::Container(c) => {
                        let store = self.inner.store.as_ref().ok().map(Arc::as_ref);
                        TierHandle::Container(Box::new(
                            self.container_tier()?.fork(c, child, store, evaluation).await?,
                        ))
                    }
                    TierHandle::Microvm(_) | TierHandle::Hosted(_) => {
                        return Err(NodeError::WrongTier {
                            id: child.to_string(),
                            tier: parent.tier,
                            op: "fork",
                        })
                    }
                };
                Ok::<_, NodeError>(handle)
            }
        }))
        .await
    }

    /// Removes a sandbox and frees its resources.
    pub(crate) async fn destroy(&self, id: &SandboxId, reason: Gone) {
        let event = match &reason {
            Gone::Destroyed => ("destroyed", String::new()),
            Gone::Expired(why) => ("expired", why.clone()),
        };
        let Some(entry) = self.inner.sandboxes.remove(id, reason) else { return };
        let _t = entry.transition.lock().await;
        if let Some(slot) = entry.spec().net_slot {
            let node = self.clone();
            let _ = tokio::task::spawn_blocking(move || node.detach_network(slot)).await;
        }
        self.audit_lifecycle(&id.to_string(), event.0, event.1);
        self.inner.audit.close(&id.to_string());
        let result = match &entry.handle {
            TierHandle::Fncall(ws) => ws.remove().map_err(NodeError::from),
            TierHandle::Container(c) => {
                let result = c.destroy().await;
                if let Ok(store) = &self.inner.store {
                    store.release(&c.layer_digests);
                }
                result
            }
            TierHandle::Microvm(vm) => {
                vm.tier.destroy(vm).await;
                crate::fullvm::remove_netns(vm);
                Ok(())
            }
            TierHandle::Hosted(h) => {
                h.destroy().await;
                Ok(())
            }
        };
        if let Err(e) = result {
            tracing::warn!(sandbox = %id, error = %e, "cleanup after destroy failed");
        }
    }

    /// Applies lifetimes every `reap_interval_ms`, until dropped.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let node = self.clone();
        let every = Duration::from_millis(self.inner.config.reap_interval_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Ok(hosts) = &node.inner.container_hosts {
                    hosts.sweep().await;
                }
                // One slow pause or destroy must not hold up the others.
                let due = node.inner.sandboxes.due(now_unix_ms());
                join_all(due.into_iter().map(|(entry, due)| {
                    let node = &node;
                    async move {
                        match due {
                            Due::Pause => {
                                tracing::info!(sandbox = %entry.id, "idle TTL passed; pausing");
                                if let Err(e) = node.pause_entry(&entry).await {
                                    tracing::warn!(sandbox = %entry.id, error = %e, "pause failed");
                                }
                            }
                            Due::Destroy(reason) => {
                                tracing::info!(sandbox = %entry.id, %reason, "lifetime over; destroying");
                                node.destroy(&entry.id, Gone::Expired(reason)).await;
                            }
                        }
                    }
                }))
                .await;
            }
        })
    }
}
