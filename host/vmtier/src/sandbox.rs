//! A microVM or full VM as a [`brig_core::Sandbox`]: commands and sessions through the guest's
//! agent (as root), whole files in and out, pause as a snapshot to disk (the VMM stops; sessions
//! end with it), fork of the whole running machine.

use std::sync::Arc;

use brig_core::files::Entry;
use brig_core::sandbox::{
    BoxFuture, Capabilities, Condition, ExecSpec, FileAccess, ForkChild, ForkKind, ForkOptions,
    Forked, KeptWork, Op, PauseKind, Persistence, ReadSource, RunningExec, Sandbox, SandboxError,
    Session, SessionSpec, Stdin, WriteOptions,
};
use brig_core::Tier;

use std::time::Duration;

use crate::guest_exec::{serve_kept, KeptCommand};
use crate::{MicroVm, ProcessRun, VmNet, VmTier, VmTierError};

const VM_OPS: [Op; 6] = [Op::Exec, Op::Sessions, Op::Files, Op::Pause, Op::Fork, Op::Qos];

/// What a microVM serves.
pub const MICROVM_CAPS: Capabilities = Capabilities::new(
    &VM_OPS,
    FileAccess::Guest,
    PauseKind::Snapshot,
    ForkKind::Machine,
    Persistence::Machine,
);

/// What a full VM serves: a microVM's, and egress rules on the link it is made with.
pub const FULLVM_CAPS: Capabilities = Capabilities::new(
    &[Op::Exec, Op::Sessions, Op::Files, Op::Pause, Op::Fork, Op::Qos, Op::Egress],
    FileAccess::Guest,
    PauseKind::Snapshot,
    ForkKind::Machine,
    Persistence::Machine,
);

/// A VM and the tier that runs it.
pub struct VmSandbox {
    vm: MicroVm,
    tier: Arc<VmTier>,
    /// Microvm or Fullvm.
    kind: Tier,
}

/// A sandbox path as the guest sees it (absolute; relative paths start at /).
fn guest_path(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

impl VmSandbox {
    pub fn new(vm: MicroVm, tier: Arc<VmTier>, kind: Tier) -> VmSandbox {
        VmSandbox { vm, tier, kind }
    }

    pub fn vm(&self) -> &MicroVm {
        &self.vm
    }

    /// A VM whose VMM ended (killed, crashed, out of memory) serves nothing more: requests
    /// hear that it is lost, and why, rather than a socket error.
    fn alive(&self) -> Result<(), SandboxError> {
        if self.vm.is_running() {
            return Ok(());
        }
        let how = match self.vm.exit_status() {
            Some(status) => format!("brig-vmm ended: {status}"),
            None => "brig-vmm is gone".to_string(),
        };
        Err(SandboxError::Lost(format!("its VM stopped ({how}); destroy it and make another")))
    }
}

impl Sandbox for VmSandbox {
    fn tier(&self) -> Tier {
        self.kind
    }

    fn capabilities(&self) -> Capabilities {
        if self.kind == Tier::Fullvm {
            FULLVM_CAPS
        } else {
            MICROVM_CAPS
        }
    }

    fn condition(&self) -> Condition {
        if self.vm.is_running() {
            Condition::Running
        } else {
            Condition::Failed
        }
    }

    fn exec(&self, spec: ExecSpec) -> BoxFuture<'_, Result<RunningExec, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            if spec.user.is_some() {
                return Err(SandboxError::unsupported(Op::ExecAsUser, "VM commands run as root"));
            }
            if spec.terminal.is_some() {
                return Err(SandboxError::Unsupported { op: Op::Terminal, note: None });
            }
            // The agent keeps the command under the node's id: it outlives a node restart.
            let keep = crate::guest_exec::keep_for(&spec, self.vm.agent_protocol().await?);
            // Argv, environment and directory go to the agent as data and reach execve as sent.
            let process = ProcessRun { argv: spec.argv, env: spec.env, cwd: spec.cwd };
            let uds = &self.vm.uds;
            let (stream, input) = match spec.stdin {
                Stdin::Empty => (crate::exec_stream(uds, process, Some(keep)).await?, None),
                _ => {
                    let (stream, input) =
                        crate::exec_stream_input(uds, process, Some(keep)).await?;
                    (stream, Some(input))
                }
            };
            let kept = KeptCommand {
                uds: uds.clone(),
                id: spec.exec_id,
                container: None,
                ran_for: Duration::ZERO,
                saving: Some(self.vm.saving_flag()),
            };
            let (stream, input, stdin) =
                crate::guest_exec::until_started(stream, input, spec.stdin, &keep).await?;
            Ok(serve_kept(stream, input, stdin, spec.timeout, spec.output_limit, Some(kept)))
        })
    }

    fn open_session(
        &self,
        spec: SessionSpec,
    ) -> BoxFuture<'_, Result<Box<dyn Session>, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            if spec.user.is_some() {
                return Err(SandboxError::unsupported(
                    Op::SessionAsUser,
                    "VM sessions run as root",
                ));
            }
            let cwd = spec.start_dir();
            let shell = spec.shell.unwrap_or_else(|| "/bin/sh".to_string());
            // Kept in the guest and recorded, so a restarted node takes it back.
            let keep = (!spec.id.is_empty()).then(|| brig_container::session::SessionKeep {
                dir: self.tier.sessions_dir(&self.vm),
                session_id: spec.id.clone(),
            });
            let session = self.tier.open_session(&self.vm, &shell, spec.env, &cwd, keep).await?;
            Ok(Box::new(session) as Box<dyn Session>)
        })
    }

    fn read<'a>(
        &'a self,
        path: &'a str,
        max_bytes: u64,
    ) -> BoxFuture<'a, Result<ReadSource, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
            Ok(ReadSource::Bytes(self.tier.read_file(&self.vm, &guest_path(path), limit).await?))
        })
    }

    fn put<'a>(
        &'a self,
        path: &'a str,
        options: WriteOptions,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            if options.append {
                return Err(SandboxError::unsupported(Op::FileAppend, "not in the VM tiers yet"));
            }
            Ok(self.tier.write_file(&self.vm, &guest_path(path), &data).await?)
        })
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            let entry = self.tier.stat_file(&self.vm, &guest_path(path)).await?;
            Ok(crate::hosts::entry_from_guest(entry))
        })
    }

    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            let entries = self.tier.list_dir(&self.vm, &guest_path(path)).await?;
            Ok(entries.into_iter().map(crate::hosts::entry_from_guest).collect())
        })
    }

    fn mkdir<'a>(
        &'a self,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            Ok(self.tier.make_dir(&self.vm, &guest_path(path), parents).await?)
        })
    }

    fn remove<'a>(
        &'a self,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            Ok(self.tier.remove_path(&self.vm, &guest_path(path), recursive).await?)
        })
    }

    /// Saves the VM to disk and stops its VMM; the bytes that frees.
    fn pause(&self) -> BoxFuture<'_, Result<u64, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            Ok(self.tier.pause(&self.vm).await?)
        })
    }

    fn resume(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.tier.resume(&self.vm).await?) })
    }

    /// Every child resumes from one snapshot of this VM (a networked VM's children each on
    /// the network the node made for it).
    fn fork(
        &self,
        children: Vec<ForkChild>,
        _options: ForkOptions,
    ) -> BoxFuture<'_, Result<Forked, SandboxError>> {
        Box::pin(async move {
            self.alive()?;
            let children: Vec<(String, Option<VmNet>)> = children
                .into_iter()
                .map(|c| {
                    let net = c.network.map(|n| VmNet { netns: n.netns, tap: n.tap });
                    (c.id.to_string(), net)
                })
                .collect();
            let made = self.tier.fork(&self.vm, &children).await?;
            Ok(made
                .into_iter()
                .map(|child| match child {
                    Ok(vm) => Ok(Arc::new(VmSandbox::new(vm, self.tier.clone(), self.kind))
                        as Arc<dyn Sandbox>),
                    Err(e) => Err(e.into()),
                })
                .collect())
        })
    }

    /// Stops the VM and removes what it left, its network namespace included.
    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move {
            self.tier.destroy(&self.vm).await;
            if let Some(name) = self.vm.net().and_then(|n| n.netns.file_name()) {
                brig_hostkit::network::remove_vm_netns(&name.to_string_lossy());
            }
            Ok(())
        })
    }

    fn record(
        &self,
    ) -> Result<Option<brig_core::records::TierRecord>, brig_core::records::RecordError> {
        self.vm.record().to_tier().map(Some)
    }

    /// Commands the guest's agent kept while the node was down: each read again from its
    /// first byte, with its deadline counted from its start; and its sessions, taken back.
    fn recover_kept(&self) -> BoxFuture<'_, KeptWork> {
        Box::pin(async move {
            if self.vm.is_paused() || !self.vm.is_running() {
                return KeptWork::default();
            }
            let sessions = self.tier.sessions_dir(&self.vm);
            let saving = Some(self.vm.saving_flag());
            crate::kept_work::recover(&self.vm.uds, None, &sessions, &self.vm.id, saving).await
        })
    }
}

impl From<VmTierError> for SandboxError {
    fn from(e: VmTierError) -> SandboxError {
        match e {
            VmTierError::GuestFile { failure, message } => match failure.io_kind() {
                Some(kind) => SandboxError::Io { kind, message },
                None => SandboxError::Internal(message),
            },
            VmTierError::Container { failure, message } => match failure.io_kind() {
                Some(kind) => SandboxError::Io { kind, message },
                None => SandboxError::Internal(format!("in the container-host VM: {message}")),
            },
            e @ (VmTierError::Unavailable(_) | VmTierError::ReplyTimeout(_)) => {
                SandboxError::Unavailable(e.to_string())
            }
            e @ VmTierError::ReplyTooLarge { .. } => SandboxError::TooLarge(e.to_string()),
            e @ VmTierError::Paused => SandboxError::Conflict(e.to_string()),
            VmTierError::NotRegular(why) => SandboxError::BadRequest(why),
            VmTierError::Lost(why) => SandboxError::Lost(why),
            other => SandboxError::Internal(brig_core::sandbox::chain(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_meaning() {
        let big = SandboxError::from(VmTierError::ReplyTooLarge { limit: 8 });
        assert!(matches!(&big, SandboxError::TooLarge(t) if t.contains("8-byte")));
        let slow = SandboxError::from(VmTierError::ReplyTimeout(std::time::Duration::from_secs(1)));
        assert!(matches!(slow, SandboxError::Unavailable(_)));
        let fifo = SandboxError::from(VmTierError::NotRegular("/x is not a regular file".into()));
        assert!(matches!(&fifo, SandboxError::BadRequest(t) if t.contains("not a regular file")));
        let agent = SandboxError::from(VmTierError::Agent("the agent failed".into()));
        assert!(matches!(&agent, SandboxError::Internal(t) if t.contains("the agent failed")));
        // A missing file in the VM is the client's NotFound, not a failure of the node.
        let missing = SandboxError::from(VmTierError::GuestFile {
            failure: brig_vmm_api::container::Failure::NotFound,
            message: "no such file".into(),
        });
        let kind = std::io::ErrorKind::NotFound;
        assert!(matches!(missing, SandboxError::Io { kind: k, .. } if k == kind));
    }

    #[test]
    fn vms_refuse_what_only_containers_serve() {
        for caps in [MICROVM_CAPS, FULLVM_CAPS] {
            assert!(!caps.supports(Op::Terminal));
            assert!(!caps.supports(Op::ExecAsUser));
            assert_eq!(caps.pause, PauseKind::Snapshot);
            assert_eq!(caps.persistence, Persistence::Machine);
        }
        assert!(FULLVM_CAPS.supports(Op::Egress) && !MICROVM_CAPS.supports(Op::Egress));
    }

    #[test]
    fn guest_paths_are_absolute() {
        assert_eq!(guest_path("a/b"), "/a/b");
        assert_eq!(guest_path("/a"), "/a");
    }
}
