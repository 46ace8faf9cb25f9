//! The node's requests for containers in container-host VMs (`crate::container_host`): where a
//! new container goes, and exec, files and status through the guest's agent. Sessions, pause
//! and resume are in `sessions` and `lifecycle` beside the other tiers'.

use std::sync::Arc;

use brig_core::files::{Entry, EntryKind};
use brig_proto::{Placement, Reply, Request, StdinMode};
use brig_transport::Exchange;

use crate::container_host::{host_error, ContainerHosts, PlacementPolicy};
use crate::microvm_exec::feed_stdin;
use crate::sandboxes::{SandboxEntry, TierHandle};
use crate::{Node, NodeError};

impl Node {
    pub(crate) fn container_hosts(&self) -> Result<&Arc<ContainerHosts>, NodeError> {
        self.inner.container_hosts.as_ref().map_err(|why| NodeError::TierUnavailable {
            tier: brig_core::Tier::Container,
            why: format!("no container-host VMs here: {why}"),
        })
    }

    /// Where a new container goes: where the create asks, else the node's policy (`vm` never
    /// falls back to the node's kernel; `host` goes to a VM only where the node's kernel
    /// cannot run containers).
    pub(crate) fn placement_for(&self, asked: Option<Placement>) -> Result<Placement, NodeError> {
        let policy = self.inner.config.container_host.placement;
        let placement = match (asked, policy) {
            (Some(p), _) => p,
            (None, PlacementPolicy::Vm) => Placement::Vm,
            (None, PlacementPolicy::Host) if self.inner.containers.is_err() => {
                if self.inner.container_hosts.is_ok() {
                    Placement::Vm
                } else {
                    Placement::HostKernel
                }
            }
            (None, PlacementPolicy::Host) => Placement::HostKernel,
        };
        match placement {
            Placement::Vm => self.container_hosts().map(|_| placement),
            Placement::HostKernel => self.container_tier().map(|_| placement),
        }
    }

    /// Runs an exec request in a container of a container-host VM.
    pub(crate) async fn exec_hosted(
        &self,
        entry: &SandboxEntry,
        req: brig_proto::ExecRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let TierHandle::Hosted(h) = &entry.handle else { return Ok(None) };
        let env = crate::container::merged_env(&h.env, req.env.clone());
        let guest = h.guest();
        let stdin = !matches!(req.stdin, StdinMode::Empty);
        let (stream, stdin) = guest
            .exec(req.argv.clone(), env, &req.cwd, req.user.clone(), stdin)
            .await
            .map_err(host_error)?;
        let feeder = stdin.map(|stdin| feed_stdin(&req.stdin, stdin, exchange));
        self.guest_command(entry, &h.execs, &req, stream, feeder, exchange).await
    }

    /// Uploads a file into a container of a container-host VM.
    pub(crate) async fn write_hosted_file(
        &self,
        entry: &SandboxEntry,
        req: brig_proto::FileWriteRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let TierHandle::Hosted(h) = &entry.handle else { return Ok(None) };
        let data = self.guest_upload(exchange).await?;
        let guest = h.guest();
        if !req.parents {
            // As on the node's kernel: without `parents` the directory must exist.
            if let Some((dir, _)) = req.path.trim_end_matches('/').rsplit_once('/') {
                if !dir.is_empty() {
                    guest.stat(dir).await.map_err(host_error)?;
                }
            }
        }
        guest.put(&req.path, &data, req.append, req.mode).await.map_err(host_error)?;
        entry.touch();
        Ok(Some(Reply::Written { bytes: data.len() as u64 }))
    }

    /// Downloads a file (or a range of it) from a container of a container-host VM.
    pub(crate) async fn read_hosted_file(
        &self,
        entry: &SandboxEntry,
        req: brig_proto::FileReadRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let TierHandle::Hosted(h) = &entry.handle else { return Ok(None) };
        let data = h.guest().get(&req.path, self.guest_read_limit()).await.map_err(host_error)?;
        crate::files::send_range(exchange, &data, req.offset, req.len).await?;
        entry.touch();
        Ok(None)
    }

    /// The small file requests for a container of a container-host VM, if `request` is one
    /// for such a sandbox.
    pub(crate) async fn hosted_file_request(
        &self,
        request: &Request,
    ) -> Option<Result<Reply, NodeError>> {
        let sandbox = match request {
            Request::FileList { sandbox, .. }
            | Request::FileStat { sandbox, .. }
            | Request::FileMkdir { sandbox, .. }
            | Request::FileRemove { sandbox, .. } => sandbox,
            _ => return None,
        };
        match self.inner.sandboxes.get(sandbox) {
            Ok(entry) if matches!(entry.handle, TierHandle::Hosted(_)) => {}
            _ => return None,
        }
        let entry = match self.live(sandbox).await {
            Ok(entry) => entry,
            Err(e) => return Some(Err(e)),
        };
        let TierHandle::Hosted(h) = &entry.handle else { return None };
        let guest = h.guest();
        let reply = match request {
            Request::FileList { path, .. } => guest.list(path).await.map(|entries| {
                Reply::Entries(
                    entries
                        .into_iter()
                        .map(entry_from_guest)
                        .map(crate::convert::entry_to_wire)
                        .collect(),
                )
            }),
            Request::FileStat { path, .. } => guest
                .stat(path)
                .await
                .map(|e| Reply::Stat(crate::convert::entry_to_wire(entry_from_guest(e)))),
            Request::FileMkdir { path, parents, .. } => {
                guest.mkdir(path, *parents).await.map(|()| Reply::Done)
            }
            Request::FileRemove { path, recursive, .. } => {
                guest.remove(path, *recursive).await.map(|()| Reply::Done)
            }
            _ => return None,
        };
        entry.touch();
        Some(reply.map_err(host_error))
    }
}

/// A file entry as the guest's agent reported it, as the node's file API reports entries.
fn entry_from_guest(e: brig_vmtier::FileEntry) -> Entry {
    let kind = match e.kind.as_str() {
        "file" => EntryKind::File,
        "dir" => EntryKind::Dir,
        "symlink" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    Entry { path: e.path, kind, size: e.size, mode: e.mode, modified_unix_ms: e.modified_unix_ms }
}
