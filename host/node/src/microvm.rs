//! The microVM tier in the node: configuration, create, and exec through the guest's agent.
//! Each sandbox is a brig-vmm process resumed from the node's environment snapshot
//! (brig-vmtier). Offered only where Linux guests run (hardware virtualization) and a guest
//! kernel and initramfs are configured.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::{SandboxId, Tier};
use brig_proto::Reply;
use brig_transport::Exchange;
use brig_vmtier::{MicroVm, VmTier, VmTierConfig, VmTierError};
use serde::{Deserialize, Serialize};

use crate::sandboxes::{SandboxEntry, TierHandle};
use crate::{Node, NodeError};

/// A microVM or full-VM sandbox: the VM, the tier it belongs to, and the node's table of the
/// commands it runs.
pub(crate) struct MicrovmSandbox {
    pub vm: MicroVm,
    pub tier: Arc<VmTier>,
    pub execs: crate::exec_hub::ExecTable,
}

impl MicrovmSandbox {
    pub fn new(vm: MicroVm, tier: Arc<VmTier>) -> Box<MicrovmSandbox> {
        Box::new(MicrovmSandbox { vm, tier, execs: Default::default() })
    }
}

/// The brig-vmm binary: `configured`, or the one beside the running daemon.
pub(crate) fn vmm_binary(configured: Option<&PathBuf>) -> PathBuf {
    configured.cloned().unwrap_or_else(|| {
        std::env::current_exe()
            .map(|exe| exe.with_file_name("brig-vmm"))
            .unwrap_or_else(|_| PathBuf::from("brig-vmm"))
    })
}

impl std::ops::Deref for MicrovmSandbox {
    type Target = MicroVm;

    fn deref(&self) -> &MicroVm {
        &self.vm
    }
}

/// `[microvm]` in the node configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct MicrovmConfig {
    /// Guest kernel (bzImage); without it the tier is not offered.
    pub kernel: Option<PathBuf>,
    /// Guest initramfs: its init starts brig-agent and asks for the environment snapshot.
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub mem_mib: usize,
    /// vCPUs per microVM.
    pub vcpus: usize,
    /// The brig-vmm binary; default: beside the running daemon.
    pub vmm: Option<PathBuf>,
    /// Where `<image>.erofs` layer files for microVMs are; default: the container tier's
    /// images directory.
    pub images_dir: Option<PathBuf>,
    /// Let KSM merge identical pages across VMs (`MADV_MERGEABLE`; ksmd must run, and it
    /// costs CPU: see `brig-bench ksm`).
    pub ksm: bool,
    /// VMMs started ahead and waiting for a VM (jailed, KVM VM and memory created).
    pub warm_vmms: usize,
    /// How long a guest may take to boot to its environment snapshot (a slow, emulated host
    /// needs more than a real one).
    pub boot_limit_s: u64,
}

impl Default for MicrovmConfig {
    fn default() -> Self {
        MicrovmConfig {
            kernel: None,
            initrd: None,
            cmdline: "console=ttyS0 reboot=t panic=-1 quiet initcall_blacklist=i8042_init pci=off"
                .into(),
            mem_mib: 256,
            vcpus: 1,
            vmm: None,
            images_dir: None,
            ksm: false,
            warm_vmms: 2,
            boot_limit_s: 180,
        }
    }
}

/// The tier, or why the node does not offer it.
pub(crate) fn open(cfg: &MicrovmConfig, state_dir: &Path) -> Result<Arc<VmTier>, String> {
    let (Some(kernel), Some(initrd)) = (&cfg.kernel, &cfg.initrd) else {
        return Err("no guest kernel and initramfs configured ([microvm] kernel, initrd)".into());
    };
    let vmm = vmm_binary(cfg.vmm.as_ref());
    let tier = VmTier::open(VmTierConfig {
        vmm,
        kernel: kernel.clone(),
        initrd: initrd.clone(),
        cmdline: cfg.cmdline.clone(),
        mem_mib: cfg.mem_mib,
        vcpus: cfg.vcpus.clamp(1, 64),
        dir: state_dir.join("microvm"),
        ksm: cfg.ksm,
        warm: cfg.warm_vmms,
        root_image: None,
        boot_limit: std::time::Duration::from_secs(cfg.boot_limit_s.max(1)),
    });
    offered(Tier::Microvm, tier)
}

/// A VM tier as the node keeps it, or why it is not offered (logged either way).
pub(crate) fn offered(
    tier: Tier,
    opened: Result<VmTier, VmTierError>,
) -> Result<Arc<VmTier>, String> {
    match opened {
        Ok(t) => {
            tracing::info!(%tier, virtualization = t.virtualization().as_str(), "VM tier ready");
            Ok(Arc::new(t))
        }
        Err(e) => {
            tracing::warn!(%tier, error = %e, "VM tier not offered");
            Err(e.to_string())
        }
    }
}

pub(crate) fn vm_error(e: VmTierError) -> NodeError {
    match e {
        VmTierError::Unavailable(why) => NodeError::TierUnavailable { tier: Tier::Microvm, why },
        e @ VmTierError::ReplyTooLarge { .. } => NodeError::GuestReplyTooLarge(e.to_string()),
        e @ VmTierError::ReplyTimeout(_) => NodeError::GuestReplyTimeout(e.to_string()),
        other => NodeError::Io {
            what: "microvm".into(),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// A sandbox path as the guest sees it (absolute; relative paths start at /).
fn guest_path(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

impl Node {
    pub(crate) fn vmtier(&self) -> Result<&Arc<VmTier>, NodeError> {
        self.inner
            .vmtier
            .as_ref()
            .map_err(|why| NodeError::TierUnavailable { tier: Tier::Microvm, why: why.clone() })
    }

    pub(crate) async fn create_microvm(
        &self,
        id: &SandboxId,
        image: Option<&str>,
    ) -> Result<MicroVm, NodeError> {
        let layers = match image {
            None => Vec::new(),
            Some(name) => self.microvm_layers(name)?,
        };
        self.vmtier()?.create(&id.to_string(), &layers).await.map_err(vm_error)
    }

    /// The EROFS files of an image's layers (`base+workspace+toolkit`, base first), each a
    /// read-only disk of the microVM.
    fn microvm_layers(&self, image: &str) -> Result<Vec<PathBuf>, NodeError> {
        let bad = |why: &str| NodeError::BadImage(image.to_string(), why.to_string());
        let cfg = &self.inner.config;
        let dir = cfg
            .microvm
            .images_dir
            .clone()
            .or_else(|| cfg.container.images_dir.clone())
            .ok_or_else(|| bad("no images directory configured for microVMs"))?;
        let parts: Vec<&str> = image.split('+').collect();
        if parts.len() > brig_vmtier::MAX_LAYERS {
            return Err(bad(&format!("more than {} layers", brig_vmtier::MAX_LAYERS)));
        }
        parts
            .into_iter()
            .map(|name| crate::container_host::local_layer(&dir, name).map_err(|why| bad(&why)))
            .collect()
    }

    /// Saves a microVM to disk and stops its VMM; the bytes that frees.
    pub(crate) async fn pause_microvm(&self, vm: &MicrovmSandbox) -> Result<u64, NodeError> {
        vm.tier.pause(vm).await.map_err(vm_error)
    }

    pub(crate) async fn resume_microvm(&self, vm: &MicrovmSandbox) -> Result<(), NodeError> {
        vm.tier.resume(vm).await.map_err(vm_error)
    }

    /// Children of a microVM or full VM, one per id, from one snapshot of it. A networked VM's
    /// children each get a network of their own with the parent's egress rules (`egress`);
    /// each child comes back with its link's slot.
    pub(crate) async fn fork_microvm(
        &self,
        vm: &MicrovmSandbox,
        ids: &[SandboxId],
        egress: Option<Vec<brig_core::Destination>>,
    ) -> Result<Vec<Result<(TierHandle, Option<u32>), NodeError>>, NodeError> {
        let mut children = Vec::with_capacity(ids.len());
        let mut slots = Vec::with_capacity(ids.len());
        for id in ids {
            let net = match (vm.net(), &egress) {
                (Some(_), Some(dests)) => match self.vm_network(id, dests.clone()).await {
                    Ok((net, slot)) => Some((net, slot)),
                    Err(e) => {
                        for ((_, net), slot) in children.iter().zip(&slots) {
                            if let (Some(net), Some(slot)) = (net, slot) {
                                self.release_vm_network(net, *slot);
                            }
                        }
                        return Err(e);
                    }
                },
                _ => None,
            };
            slots.push(net.as_ref().map(|(_, slot)| *slot));
            children.push((id.to_string(), net.map(|(net, _)| net)));
        }
        let made = match vm.tier.fork(vm, &children).await {
            Ok(made) => made,
            Err(e) => {
                for ((_, net), slot) in children.iter().zip(&slots) {
                    if let (Some(net), Some(slot)) = (net, slot) {
                        self.release_vm_network(net, *slot);
                    }
                }
                return Err(vm_error(e));
            }
        };
        Ok(made
            .into_iter()
            .zip(children.iter().zip(slots))
            .map(|(child, ((_, net), slot))| match child {
                Ok(c) => Ok((TierHandle::Microvm(MicrovmSandbox::new(c, vm.tier.clone())), slot)),
                Err(e) => {
                    if let (Some(net), Some(slot)) = (net, slot) {
                        self.release_vm_network(net, slot);
                    }
                    Err(vm_error(e))
                }
            })
            .collect())
    }

    /// Uploads into a microVM through its agent.
    pub(crate) async fn write_microvm_file(
        &self,
        entry: &SandboxEntry,
        req: brig_proto::FileWriteRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let TierHandle::Microvm(vm) = &entry.handle else { return Ok(None) };
        if req.append {
            exchange.refuse_upload();
            return Err(NodeError::WrongTier {
                id: entry.id.to_string(),
                tier: entry.tier,
                op: "appending to a file (not in the microvm tier yet)",
            });
        }
        let data = self.guest_upload(exchange).await?;
        vm.tier.write_file(vm, &guest_path(&req.path), &data).await.map_err(vm_error)?;
        entry.touch();
        Ok(Some(Reply::Written { bytes: data.len() as u64 }))
    }

    /// Downloads from a microVM through its agent.
    pub(crate) async fn read_microvm_file(
        &self,
        entry: &SandboxEntry,
        req: brig_proto::FileReadRequest,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let TierHandle::Microvm(vm) = &entry.handle else { return Ok(None) };
        let limit = self.guest_read_limit();
        let data = vm.tier.read_file(vm, &guest_path(&req.path), limit).await.map_err(vm_error)?;
        crate::files::send_range(exchange, &data, req.offset, req.len).await?;
        entry.touch();
        Ok(None)
    }
}
