//! The microVM tier in the node: configuration and create (the sandbox itself is
//! `brig_vmtier::VmSandbox`).
//! Each sandbox is a brig-vmm process resumed from the node's environment snapshot
//! (brig-vmtier). Offered only where Linux guests run (hardware virtualization) and a guest
//! kernel and initramfs are configured.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::sandbox::Sandbox;
use brig_core::{SandboxId, Tier};
use brig_vmtier::MachineRecord;
use brig_vmtier::{MicroVm, VmSandbox, VmTier, VmTierConfig, VmTierError};
use serde::{Deserialize, Serialize};

use crate::{Node, NodeError};

/// The brig-vmm binary: `configured`, or the one beside the running daemon.
pub(crate) fn vmm_binary(configured: Option<&PathBuf>) -> PathBuf {
    configured.cloned().unwrap_or_else(|| {
        std::env::current_exe()
            .map(|exe| exe.with_file_name("brig-vmm"))
            .unwrap_or_else(|_| PathBuf::from("brig-vmm"))
    })
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

/// A VM tier's failure to make sandbox `id`: a tier that cannot run VMs here is unavailable,
/// the rest is the VM's own failure.
pub(crate) fn vm_error(id: &SandboxId, tier: Tier) -> impl Fn(VmTierError) -> NodeError + '_ {
    move |e| match e {
        VmTierError::Unavailable(why) => NodeError::TierUnavailable { tier, why },
        other => NodeError::sandbox(&id.to_string(), tier, other.into()),
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
        self.vmtier()?.create(&id.to_string(), &layers).await.map_err(vm_error(id, Tier::Microvm))
    }

    /// Takes back a VM sandbox an earlier run of the node made (see `VmTier::adopt`).
    pub(crate) async fn adopt_vm(
        &self,
        id: &SandboxId,
        tier: Tier,
        machine: &MachineRecord,
    ) -> Result<Arc<dyn Sandbox>, NodeError> {
        let vmtier = if tier == Tier::Fullvm { self.fullvm_tier()? } else { self.vmtier()? };
        let vm = vmtier.adopt(&id.to_string(), machine).await.map_err(vm_error(id, tier))?;
        Ok(Arc::new(VmSandbox::new(vm, vmtier.clone(), tier)))
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
            .map(|name| brig_vmtier::hosts::local_layer(&dir, name).map_err(|why| bad(&why)))
            .collect()
    }
}
