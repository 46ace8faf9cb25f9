//! The full-VM tier in the node: a complete operating system image (systemd as init, its own
//! kernel, brig-agent as a service) booted per sandbox on brig-vmm, its root disk a
//! copy-on-write overlay of the image. Served by a second brig-vmtier instance, so exec,
//! files, sessions, pause, resume and fork work as in the microVM tier.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::{EgressPolicy, SandboxId, Tier};
use brig_hostkit::network::{self, VM_GATEWAY, VM_GUEST_ADDR, VM_TAP};
use brig_vmtier::{GuestAddress, MicroVm, VmNet, VmTier, VmTierConfig};
use serde::{Deserialize, Serialize};

use crate::policy::egress::NetnsRef;
use crate::tiers::microvm::vm_error;
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
    /// How long a VM's init may take to start brig-agent before the create fails (seconds).
    pub boot_limit_s: u64,
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
            boot_limit_s: 180,
        }
    }
}

/// The tier, or why the node does not offer it.
pub(crate) fn open(cfg: &FullvmConfig, state_dir: &Path) -> Result<Arc<VmTier>, String> {
    let (Some(image), Some(kernel), Some(initrd)) = (&cfg.image, &cfg.kernel, &cfg.initrd) else {
        return Err("no OS image configured ([fullvm] image, kernel, initrd)".into());
    };
    let tier = VmTier::open(VmTierConfig {
        vmm: crate::tiers::microvm::vmm_binary(cfg.vmm.as_ref()),
        kernel: kernel.clone(),
        initrd: initrd.clone(),
        cmdline: cfg.cmdline.clone(),
        mem_mib: cfg.mem_mib,
        vcpus: cfg.vcpus.clamp(1, 64),
        dir: state_dir.join("fullvm"),
        ksm: false,
        warm: 0,
        root_image: Some(image.clone()),
        boot_limit: std::time::Duration::from_secs(cfg.boot_limit_s.max(1)),
    });
    crate::tiers::microvm::offered(Tier::Fullvm, tier)
}

impl Node {
    pub(crate) fn fullvm_tier(&self) -> Result<&Arc<VmTier>, NodeError> {
        self.inner
            .fullvm
            .as_ref()
            .map_err(|why| NodeError::TierUnavailable { tier: Tier::Fullvm, why: why.clone() })
    }

    /// A new full VM (the image names no layers: the OS image is the node's). With `egress`,
    /// it gets a network device: a tap in a network namespace of its own, whose link to the
    /// node carries the egress rules as a container's does; returns the link's slot too.
    pub(crate) async fn create_fullvm(
        &self,
        id: &SandboxId,
        egress: Option<EgressPolicy>,
    ) -> Result<(MicroVm, Option<u32>), NodeError> {
        let tier = self.fullvm_tier()?.clone();
        let name = id.to_string();
        let Some(dests) = egress else {
            let vm = tier.create_full(&name, None).await.map_err(vm_error(id, Tier::Fullvm))?;
            return Ok((vm, None));
        };
        let (net, slot) = self.vm_network(id, dests).await?;
        let guest = GuestAddress { addr: VM_GUEST_ADDR.into(), gateway: VM_GATEWAY.into() };
        match tier.create_full(&name, Some((net.clone(), guest))).await {
            Ok(vm) => Ok((vm, Some(slot))),
            Err(e) => {
                self.release_vm_network(&net, slot);
                Err(vm_error(id, Tier::Fullvm)(e))
            }
        }
    }

    /// A VM sandbox's network: a namespace of its own with the tap its VMM attaches to, and
    /// the node's link into it carrying `dests` as egress rules; the link's slot too.
    pub(crate) async fn vm_network(
        &self,
        id: &SandboxId,
        dests: EgressPolicy,
    ) -> Result<(VmNet, u32), NodeError> {
        let ns = self.netns_name(id);
        let made = {
            let ns = ns.clone();
            tokio::task::spawn_blocking(move || network::create_vm_netns(&ns)).await
        };
        made.map_err(|e| NodeError::Io { what: "network setup".into(), source: e.into() })??;
        match self.attach_network_to(&id.to_string(), NetnsRef::Named(ns.clone()), dests).await {
            Ok(slot) => {
                let net = VmNet { netns: Path::new("/run/netns").join(&ns), tap: VM_TAP.into() };
                Ok((net, slot))
            }
            Err(e) => {
                network::remove_vm_netns(&ns);
                Err(e)
            }
        }
    }

    /// Gives back a network [`Node::vm_network`] made for a VM that did not start.
    pub(crate) fn release_vm_network(&self, net: &VmNet, slot: u32) {
        self.detach_network(slot);
        if let Some(name) = net.netns.file_name() {
            network::remove_vm_netns(&name.to_string_lossy());
        }
    }
}

impl Node {
    /// The network namespace of a full-VM sandbox (`ip netns` name): the node's tag first, so
    /// `brig doctor` tells its own from another daemon's on the same host.
    pub(crate) fn netns_name(&self, id: &SandboxId) -> String {
        format!("{}{id}", self.netns_prefix())
    }

    /// What the names of this node's VM network namespaces start with.
    pub(crate) fn netns_prefix(&self) -> String {
        format!("brig-{}-", self.inner.tag)
    }
}
