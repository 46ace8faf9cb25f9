//! Full VMs: a complete operating system image with its own init (systemd) and kernel, booted
//! rather than resumed. Each VM's root disk is a copy-on-write overlay of the image (see
//! `brig_vmm::virtio::cow`), so VMs share the image and pay only for the blocks they change;
//! brig-agent runs as a service of the image. Once running, a full VM is steered like a
//! microVM: exec, files, sessions, pause (a snapshot), implicit resume and fork.

use std::path::Path;
use std::time::Duration;

use crate::{io, locked, Disks, MicroVm, VmNet, VmTier, VmTierError};

impl VmTier {
    /// A new full VM booted from this tier's image, with an empty overlay of its own and, with
    /// `net`, a network device on that tap (the guest is given `guest_addr`/30 behind `gateway`:
    /// see `brig_hostkit::network::create_vm_netns`), its agent answering.
    pub async fn create_full(
        &self,
        id: &str,
        net: Option<(VmNet, GuestAddress)>,
    ) -> Result<MicroVm, VmTierError> {
        let Some(image) = &self.cfg.root_image else {
            return Err(VmTierError::Unsupported("booting an OS image in a microVM tier"));
        };
        let (net, guest) = match net {
            Some((n, g)) => (Some(n), Some(g)),
            None => (None, None),
        };
        let vm = self.boot_full(id, image, net).await?;
        if let Some(guest) = guest {
            if let Err(e) = self.configure_guest_net(&vm, &guest).await {
                self.destroy(&vm).await;
                return Err(e);
            }
        }
        Ok(vm)
    }

    /// Gives the guest's network interface its address and default route (the image runs no
    /// network manager; the address is the same in every VM, each behind its own tap).
    async fn configure_guest_net(
        &self,
        vm: &MicroVm,
        guest: &GuestAddress,
    ) -> Result<(), VmTierError> {
        let script = format!(
            "dev=$(ls /sys/class/net | grep -v '^lo$' | head -1); [ -n \"$dev\" ] && \
             ip addr add {}/30 dev $dev && ip link set $dev up && ip route add default via {}",
            guest.addr, guest.gateway
        );
        // Part of the boot: a slow host (an emulated one under load) gets the boot's limit.
        let limit = self.cfg.boot_limit.max(Duration::from_secs(30));
        let out = self.exec(vm, &script, limit).await?;
        if out.exit_code != 0 {
            return Err(VmTierError::Agent(format!(
                "configuring the guest's network: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    async fn boot_full(
        &self,
        id: &str,
        image: &Path,
        net: Option<VmNet>,
    ) -> Result<MicroVm, VmTierError> {
        let overlay = self.cfg.dir.join(format!("{id}.disk"));
        // A stale overlay of an earlier VM of that name would shadow the image.
        let _ = std::fs::remove_file(&overlay);
        let disks =
            Disks { layers: Vec::new(), writable: Some(overlay), cow_base: Some(image.into()) };
        let vm = MicroVm::with_net(&self.cfg.dir, id, Some(disks), Default::default(), net);
        let started = std::time::Instant::now();
        if let Err(e) = self.spawn_vmm(&vm).await {
            self.destroy(&vm).await;
            return Err(e);
        }
        tracing::info!(vm = id, secs = started.elapsed().as_secs_f64(), "full VM booted");
        if let Err(e) = self.give_identity(&vm).await {
            self.destroy(&vm).await;
            return Err(e);
        }
        debug_assert!(locked(&vm.memory_from).as_os_str().is_empty());
        Ok(vm)
    }
}

/// A guest's address on its network device and its gateway (the tap's host side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestAddress {
    pub addr: String,
    pub gateway: String,
}

impl VmTier {
    /// The image exists and is a file (or block device) the VMM can read.
    pub(crate) fn check_image(image: &Path) -> Result<(), VmTierError> {
        std::fs::File::open(image)
            .map(drop)
            .map_err(io(format!("the full-VM image {}", image.display())))
    }
}
