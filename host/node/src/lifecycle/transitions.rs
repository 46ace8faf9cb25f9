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

use brig_core::sandbox::{
    ForkChild, ForkKind, ForkOptions, NetAttachment, Op, PauseKind, Persistence, Sandbox,
    SandboxError,
};
use brig_core::{IdleAction, QosClass, SandboxId, SandboxSpec, Tier};
use brig_proto::{CreateRequest, SandboxInfo, Target, TtlUpdate};

use crate::convert;
use crate::host::clock::now_unix_ms;
use crate::table::intents::ForkIntent;
use crate::table::sandboxes::{Due, Gone, SandboxEntry, SandboxRecord};
use crate::tiers::registry::CreatePlan;
use crate::{info, Node, NodeError};

fn idle_action(a: brig_proto::IdleAction) -> IdleAction {
    match a {
        brig_proto::IdleAction::Pause => IdleAction::Pause,
        brig_proto::IdleAction::Destroy => IdleAction::Destroy,
        brig_proto::IdleAction::PauseFilesOnly => IdleAction::PauseFilesOnly,
    }
}

impl Node {
    /// A sandbox for a request that needs it running: resumed first if paused.
    pub(crate) async fn live(&self, id: &str) -> Result<Arc<SandboxEntry>, NodeError> {
        let entry = self.inner.sandboxes.get(id)?;
        if let Some(why) = entry.sandbox.lost() {
            return Err(entry.fail(SandboxError::Lost(why)));
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
        brig_core::check_labels(&labels)?;
        brig_core::check_sandbox_env(&req.env)?;
        let id = SandboxId::generate(cfg.node_id());
        let placement = match tier {
            Tier::Container => Some(self.placement_for(req.placement)?),
            _ => None,
        };
        // The one place a tier is chosen (`crate::tiers::registry`).
        let backend = self.inner.tiers.for_create(self, tier, placement)?.clone();
        let egress = match &req.egress {
            Some(texts) if backend.takes_egress() => Some(self.resolve_egress(texts)?),
            Some(_) => {
                return Err(NodeError::WrongTier { id: id.to_string(), tier, op: "egress rules" })
            }
            None => None,
        };
        let (memory, cpu_millis) = backend.asks(self, &req);
        let by_use = backend.admitted_by_use();
        self.admit(crate::policy::admission::Ask { tier, memory, cpu_millis, by_use })?;
        let qos = req.qos.map(convert::qos_from_wire).unwrap_or_default();
        let project = labels.iter().find(|(k, _)| k == crate::table::scope::PROJECT_LABEL);
        let project = project.map(|(_, p)| p.as_str());
        let (_volumes_held, volumes, binds) = self.volumes_for_create(&req, project).await?;
        if !binds.is_empty() && !backend.mounts_volumes() {
            let op = "volumes (a container on the node's kernel mounts them)";
            return Err(NodeError::WrongTier { id: id.to_string(), tier, op });
        }
        // A full VM's link is made with it (its VMM attaches to the tap at start).
        let plan = CreatePlan { id: &id, request: &req, placement, egress: &egress, binds };
        let created = backend.create(self, plan).await?;
        let (sandbox, vm_slot) = (created.sandbox, created.net_slot);
        let made = started.elapsed();
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
            volumes,
        };
        set_best_effort(&id, sandbox.as_ref(), qos);
        let image = spec.image.clone().unwrap_or_default();
        let created = now_unix_ms();
        let known = Some((spec.labels.clone(), created));
        self.audit_lifecycle_of(&id.to_string(), "created", image, known);
        let entry = self.adopt(SandboxEntry::new(id, spec, created, sandbox)).await?;
        let adopted = started.elapsed();
        if vm_slot.is_some() {
            self.audit_policy(&entry);
        }
        if let (Some((_, dests)), Some(pid)) = (egress, entry.sandbox.net_pid()) {
            match self.attach_network(&id.to_string(), pid, dests).await {
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
            .get_or_create(&crate::host::metrics::TierLabel { tier: tier.as_str() })
            .inc();
        tracing::debug!(
            sandbox = %id,
            tier = %tier,
            made = ?made,
            recorded = ?adopted.saturating_sub(made),
            took = ?started.elapsed(),
            "sandbox created"
        );
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
        egress: Option<brig_core::EgressPolicy>,
    ) -> Result<Arc<SandboxEntry>, NodeError> {
        let id = entry.id;
        let entry = self.adopt(entry).await?;
        if entry.spec().net_slot.is_some() {
            // A networked VM's child: its link came with it.
            self.audit_policy(&entry);
        }
        set_best_effort(&id, entry.sandbox.as_ref(), entry.spec().qos);
        if let (Some(dests), Some(pid)) = (egress, entry.sandbox.net_pid()) {
            let attached = self.attach_network(&id.to_string(), pid, dests).await;
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

    /// One recorded sandbox taken back by its tier's backend, from the tier's part of its
    /// record.
    async fn take_back(&self, record: &SandboxRecord) -> Result<Arc<dyn Sandbox>, NodeError> {
        let tier_record = record.tier_record();
        let kind = tier_record.as_ref().map(|r| r.kind.as_str());
        let backend = self.inner.tiers.for_record(record.spec.tier, kind)?;
        backend.adopt(self, &record.id, tier_record.as_ref()).await
    }

    /// Whether `entry` was admitted by use: its backend's say, found as a restore finds it (by
    /// its tier and its record's kind); a sandbox whose record cannot be made counts as one.
    fn admitted_by_use(&self, entry: &SandboxEntry) -> bool {
        match entry.sandbox.record() {
            Ok(record) => {
                let kind = record.as_ref().map(|r| r.kind.as_str());
                self.inner.tiers.for_record(entry.tier, kind).is_ok_and(|b| b.admitted_by_use())
            }
            Err(_) => true,
        }
    }

    /// Takes back the sandboxes an earlier run of the node recorded; removes what it cannot.
    pub(crate) async fn restore(&self) {
        let mut restored = 0;
        // Every sandbox taken back, by any backend: ids are unique on the node, so each backend
        // keeps what any of them adopted (a backend a caller registered may take records over
        // the same resources as a built-in one).
        let mut adopted: Vec<String> = Vec::new();
        for record in self.inner.sandboxes.saved_records() {
            let id = record.id;
            let sandbox = match self.take_back(&record).await {
                Ok(sandbox) => {
                    adopted.push(id.to_string());
                    sandbox
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "sandbox did not survive the restart");
                    self.inner.sandboxes.forget(&id);
                    continue;
                }
            };
            if let Some(slot) = record.spec.net_slot {
                self.reserve_network(&id.to_string(), slot, record.spec.egress.as_deref()).await;
            }
            // Recorded as running but found frozen: the node died in a fork or checkpoint,
            // which freeze the parent meanwhile. Thaw it (a no-op when it runs).
            if record.paused_unix_ms == 0
                && sandbox.capabilities().persistence == Persistence::Record
            {
                if let Err(e) = sandbox.freeze(false).await {
                    tracing::warn!(sandbox = %id, error = %e, "cannot thaw a sandbox recorded as running");
                }
            }
            let entry = SandboxEntry::new(id, record.spec.clone(), record.created_unix_ms, sandbox);
            entry.restore_clocks(&record);
            self.recover_kept(&entry).await;
            self.inner.sandboxes.insert(entry);
            restored += 1;
        }
        // What earlier runs left that no record claimed, backend by backend, once every
        // record had its chance to be adopted.
        for backend in self.inner.tiers.all() {
            let removed = backend.remove_orphans(self, &adopted).await;
            if removed > 0 {
                let tier = backend.tier().as_str();
                tracing::info!(removed, tier, "removed what sandboxes of an earlier run left");
            }
        }
        self.roll_back_forks().await;
        let swept = self.inner.fncall.sweep_layers();
        if swept > 0 {
            tracing::info!(swept, "removed shared workspace layers no sandbox uses");
        }
        if restored > 0 {
            tracing::info!(restored, "sandboxes restored");
        }
    }

    /// Undoes the forks an earlier run died in: their children are destroyed (no client was
    /// told of them) and the parent, if restore found it frozen while recorded as running, was
    /// thawed already.
    async fn roll_back_forks(&self) {
        for (intent, _file) in self.inner.intents.pending_forks() {
            let mut undone = Vec::new();
            for child in &intent.children {
                let Ok(child) = child.parse::<SandboxId>() else { continue };
                if self.inner.sandboxes.get(&child.to_string()).is_ok() {
                    self.destroy(&child, Gone::Destroyed).await;
                    undone.push(child.to_string());
                }
            }
            tracing::warn!(parent = %intent.parent, children = ?undone, "rolled back a fork the node died in");
            if self.inner.sandboxes.get(&intent.parent).is_ok() {
                let detail =
                    format!("the node died during a fork; children removed: {}", undone.join(" "));
                self.audit_lifecycle(&intent.parent, "fork-rolled-back", detail);
            }
        }
    }

    /// Pauses a sandbox: frozen in place (or saved), or with `files_only`, with every process
    /// ended and its memory given back; the bytes of memory freed.
    pub(crate) async fn pause_entry(
        &self,
        entry: &SandboxEntry,
        files_only: bool,
    ) -> Result<u64, NodeError> {
        let _t = entry.transition.lock().await;
        if entry.paused_unix_ms().is_some() {
            return Ok(0);
        }
        if files_only {
            return self.pause_files_only_locked(entry).await;
        }
        let saved = entry.sandbox.capabilities().pause == PauseKind::Snapshot;
        if saved {
            // A session's connection to the guest does not survive the saved machine; the
            // guest keeps its shell, and the node takes it back at the resume.
            entry.sessions.detach_all();
        }
        let freed = match entry.sandbox.pause().await {
            Ok(freed) => freed,
            Err(e) => {
                if saved {
                    // Whatever the failed save detached is taken back (or ended as lost).
                    self.take_back_after_pause(entry, false).await;
                }
                return Err(entry.fail(e));
            }
        };
        entry.set_paused(true);
        self.inner.sandboxes.save(entry)?;
        self.inner.metrics.reclaimed_bytes.inc_by(freed);
        self.audit_lifecycle(&entry.id.to_string(), "paused", format!("{freed} bytes reclaimed"));
        tracing::debug!(sandbox = %entry.id, freed, "sandbox paused");
        Ok(freed)
    }

    /// Ends every process and gives the memory back; the transition lock is held.
    async fn pause_files_only_locked(&self, entry: &SandboxEntry) -> Result<u64, NodeError> {
        entry.require(Op::PauseFilesOnly)?;
        let freed = entry.sandbox.pause_files_only().await.map_err(|e| entry.fail(e))?;
        // Its shells went with their processes.
        entry.sessions.detach_all();
        entry.set_paused(true);
        entry.set_paused_files_only(true);
        self.inner.sandboxes.save(entry)?;
        self.inner.metrics.reclaimed_bytes.inc_by(freed);
        let detail = format!("files only, {freed} bytes reclaimed");
        self.audit_lifecycle(&entry.id.to_string(), "paused", detail);
        tracing::debug!(sandbox = %entry.id, freed, "sandbox paused, files only");
        Ok(freed)
    }

    pub(crate) async fn resume_entry(&self, entry: &SandboxEntry) -> Result<(), NodeError> {
        let _t = entry.transition.lock().await;
        if entry.paused_unix_ms().is_none() {
            return Ok(());
        }
        if entry.paused_files_only() {
            // Nothing was frozen: the sandbox starts again with no process running.
            entry.set_paused_files_only(false);
            entry.set_paused(false);
            entry.touch();
            self.inner.sandboxes.save(entry)?;
            self.audit_lifecycle(&entry.id.to_string(), "resumed", "cold, files only");
            return Ok(());
        }
        entry.sandbox.resume().await.map_err(|e| entry.fail(e))?;
        if entry.sandbox.capabilities().pause == PauseKind::Snapshot {
            self.take_back_after_pause(entry, true).await;
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

    /// Pauses every targeted sandbox (`files_only`: ending their processes), several at a
    /// time; returns their ids.
    pub(crate) async fn pause(
        &self,
        target: &Target,
        files_only: bool,
    ) -> Result<Vec<String>, NodeError> {
        let entries = self.targets(target)?;
        let results = join_all(entries.iter().map(|e| async move {
            self.pause_entry(e, files_only).await.map(|_| e.id.to_string())
        }))
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
        parent.require(Op::Fork)?;
        let count = count.clamp(1, 256);
        let asked = parent.sandbox.requested().unwrap_or_default();
        let (memory, cpu) = (asked.memory_bytes, asked.cpu_millis);
        self.admit(crate::policy::admission::Ask {
            tier: parent.tier,
            memory: memory * u64::from(count),
            cpu_millis: cpu * u64::from(count),
            by_use: self.admitted_by_use(&parent),
        })?;
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
        let ids: Vec<SandboxId> =
            (0..count).map(|_| SandboxId::generate(self.inner.config.node_id())).collect();
        // Removed when this returns; found at the next start only if the node died meanwhile.
        let _intent = self.inner.intents.begin_fork(&ForkIntent {
            parent: id.to_string(),
            children: ids.iter().map(|c| c.to_string()).collect(),
        })?;
        let made =
            self.fork_children(&parent, &ids, egress.clone(), was_paused, evaluation).await?;
        let mut out = Vec::new();
        let mut first_err = None;
        for (child, made) in ids.into_iter().zip(made) {
            match made {
                Ok((sandbox, vm_slot)) => {
                    let mut spec = spec.clone();
                    spec.net_slot = vm_slot;
                    let created = now_unix_ms();
                    let known = Some((spec.labels.clone(), created));
                    let entry = SandboxEntry::new(child, spec, created, sandbox);
                    let from = format!("forked from {id}");
                    self.audit_lifecycle_of(&child.to_string(), "created", from, known);
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

    /// The children of a fork, each with its network slot: a networked VM's children get
    /// networks of their own (with the parent's rules, `egress`), and store layers the parent
    /// holds are held once more per child. What a child does not become is given back.
    async fn fork_children(
        &self,
        parent: &SandboxEntry,
        ids: &[SandboxId],
        egress: Option<brig_core::EgressPolicy>,
        parent_paused: bool,
        evaluation: bool,
    ) -> Result<Vec<Result<(Arc<dyn Sandbox>, Option<u32>), NodeError>>, NodeError> {
        let machine = parent.sandbox.capabilities().fork == ForkKind::Machine;
        let networked = machine && parent.spec().net_slot.is_some();
        let mut nets: Vec<Option<(brig_vmtier::VmNet, u32)>> = Vec::with_capacity(ids.len());
        let release_nets = |nets: &[Option<(brig_vmtier::VmNet, u32)>]| {
            for (net, slot) in nets.iter().flatten() {
                self.release_vm_network(net, *slot);
            }
        };
        for id in ids {
            let net = match (&egress, networked) {
                (Some(dests), true) => match self.vm_network(id, dests.clone()).await {
                    Ok(made) => Some(made),
                    Err(e) => {
                        release_nets(&nets);
                        return Err(e);
                    }
                },
                _ => None,
            };
            nets.push(net);
        }
        let layers = parent.sandbox.held_layers();
        let store = self.inner.store.as_ref().ok().filter(|_| !layers.is_empty());
        let mut held = 0;
        if let Some(store) = store {
            for _ in ids {
                if let Err(e) = store.acquire(&layers).await {
                    (0..held).for_each(|_| store.release(&layers));
                    release_nets(&nets);
                    return Err(e.into());
                }
                held += 1;
            }
        }
        let children: Vec<ForkChild> = ids
            .iter()
            .zip(&nets)
            .map(|(id, net)| ForkChild {
                id: *id,
                network: net
                    .as_ref()
                    .map(|(n, _)| NetAttachment { netns: n.netns.clone(), tap: n.tap.clone() }),
            })
            .collect();
        let options = ForkOptions { parent_paused, reveal_protected: evaluation };
        let made = match parent.sandbox.fork(children, options).await {
            Ok(made) => made,
            Err(e) => {
                if let Some(store) = store {
                    (0..held).for_each(|_| store.release(&layers));
                }
                release_nets(&nets);
                return Err(parent.fail(e));
            }
        };
        Ok(made
            .into_iter()
            .zip(nets)
            .map(|(child, net)| match child {
                Ok(sandbox) => Ok((sandbox, net.map(|(_, slot)| slot))),
                Err(e) => {
                    if let Some(store) = store {
                        store.release(&layers);
                    }
                    if let Some((net, slot)) = net {
                        self.release_vm_network(&net, slot);
                    }
                    Err(parent.fail(e))
                }
            })
            .collect())
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
        entry.sessions.close_all().await;
        let result = entry.sandbox.destroy().await;
        if let Ok(store) = &self.inner.store {
            let layers = entry.sandbox.held_layers();
            if !layers.is_empty() {
                store.release(&layers);
            }
        }
        if let Err(e) = result {
            tracing::warn!(sandbox = %id, error = %e, "cleanup after destroy failed");
        }
    }

    /// Deletes audit trails past their retention, except those of sandboxes still here.
    fn prune_audit(&self) {
        let sandboxes = &self.inner.sandboxes;
        let pruned =
            self.inner.audit.prune(crate::policy::audit::RETENTION, |id| sandboxes.get(id).is_ok());
        if pruned > 0 {
            tracing::info!(pruned, "audit trail files past their retention removed");
        }
    }

    /// Applies lifetimes every `reap_interval_ms`, and prunes the audit trails every
    /// `audit::PRUNE_EVERY`, until dropped.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let node = self.clone();
        let every = Duration::from_millis(self.inner.config.reap_interval_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut pruned_at: Option<std::time::Instant> = None;
            loop {
                tick.tick().await;
                if pruned_at.is_none_or(|at| at.elapsed() >= crate::policy::audit::PRUNE_EVERY) {
                    pruned_at = Some(std::time::Instant::now());
                    let node = node.clone();
                    tokio::task::spawn_blocking(move || node.prune_audit());
                }
                if let Ok(hosts) = &node.inner.container_hosts {
                    hosts.sweep().await;
                }
                let clocks = node.clone();
                let _ =
                    tokio::task::spawn_blocking(move || clocks.inner.sandboxes.save_clocks()).await;
                // One slow pause or destroy must not hold up the others.
                let due = node.inner.sandboxes.due(now_unix_ms());
                join_all(due.into_iter().map(|(entry, due)| {
                    let node = &node;
                    async move {
                        match due {
                            Due::Pause { files_only } => {
                                tracing::info!(sandbox = %entry.id, files_only, "idle TTL passed; pausing");
                                if let Err(e) = node.pause_entry(&entry, files_only).await {
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

/// Puts a new sandbox in the best-effort class when its spec says so (a tier that cannot is
/// logged: the class is recorded in its spec either way).
fn set_best_effort(id: &SandboxId, sandbox: &dyn Sandbox, qos: QosClass) {
    if qos == QosClass::BestEffort {
        if let Err(e) = sandbox.set_qos(qos) {
            tracing::warn!(sandbox = %id, error = %e, "cannot set the QoS class");
        }
    }
}
