//! The full-VM tier in the node: a complete operating system image (systemd as init, its own
//! kernel, brig-agent as a service) booted per sandbox on brig-vmm, its root disk a
//! copy-on-write overlay of the image. Served by a second brig-vmtier instance, so exec,
//! files, sessions, pause, resume and fork work as in the microVM tier.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::{SandboxId, Tier};
use brig_vmtier::{MicroVm, VmTier, VmTierConfig};
use serde::{Deserialize, Serialize};

use crate::{Node, NodeError};

/// `[fullvm]` in the node configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct FullvmConfig {
    /// The OS image: a raw root disk (`scripts/build-fullvm-image.sh` builds a Debian one);
    /// without it the tier is not offered.
    pub image: Option<PathBuf>,
    /// The image's kernel and initramfs (copied out of its /boot).
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub mem_mib: usize,
    pub vcpus: usize,
    /// The brig-vmm binary; default: beside the running daemon.
    pub vmm: Option<PathBuf>,
}

impl Default for FullvmConfig {
    fn default() -> Self {
        FullvmConfig {
            image: None,
            kernel: None,
            initrd: None,
            cmdline: "console=ttyS0 root=/dev/vda rw reboot=t panic=-1 quiet \
                      initcall_blacklist=i8042_init pci=off"
                .into(),
            mem_mib: 1024,
            vcpus: 2,
            vmm: None,
        }
    }
}

/// The tier, or why the node does not offer it.
pub(crate) fn open(cfg: &FullvmConfig, state_dir: &Path) -> Result<Arc<VmTier>, String> {
    let (Some(image), Some(kernel), Some(initrd)) = (&cfg.image, &cfg.kernel, &cfg.initrd) else {
        return Err("no OS image configured ([fullvm] image, kernel, initrd)".into());
    };
    let tier = VmTier::open(VmTierConfig {
        vmm: crate::microvm::vmm_binary(cfg.vmm.as_ref()),
        kernel: kernel.clone(),
        initrd: initrd.clone(),
        cmdline: cfg.cmdline.clone(),
        mem_mib: cfg.mem_mib,
        vcpus: cfg.vcpus.clamp(1, 64),
        dir: state_dir.join("fullvm"),
        ksm: false,
        warm: 0,
        root_image: Some(image.clone()),
    });
    match tier {
        Ok(t) => {
            tracing::info!(virtualization = t.virtualization().as_str(), "fullvm tier ready");
            Ok(Arc::new(t))
        }
        Err(e) => {
            tracing::warn!(error = %e, "fullvm tier not offered");
            Err(e.to_string())
        }
    }
}

impl Node {
    pub(crate) fn fullvm_tier(&self) -> Result<&Arc<VmTier>, NodeError> {
        self.inner
            .fullvm
            .as_ref()
            .map_err(|why| NodeError::TierUnavailable { tier: Tier::Fullvm, why: why.clone() })
    }

    /// A new full VM (the image names no layers: the OS image is the node's).
    pub(crate) async fn create_fullvm(&self, id: &SandboxId) -> Result<MicroVm, NodeError> {
        self.fullvm_tier()?.create(&id.to_string(), &[]).await.map_err(crate::microvm::vm_error)
    }
}
