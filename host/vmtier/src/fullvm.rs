//! Full VMs: a complete operating system image with its own init (systemd) and kernel, booted
//! rather than resumed. Each VM's root disk is a copy-on-write overlay of the image (see
//! `brig_vmm::virtio::cow`), so VMs share the image and pay only for the blocks they change;
//! brig-agent runs as a service of the image. Once running, a full VM is steered like a
//! microVM: exec, files, sessions, pause (a snapshot), implicit resume and fork.

use std::ffi::OsString;
use std::path::Path;

use crate::{io, locked, Disks, MicroVm, VmTier, VmTierError};

/// How long a full VM's init may take to start the agent.
pub(crate) const BOOT_LIMIT_S: u64 = 180;

impl VmTier {
    /// `brig-vmm boot` arguments for this tier's machine (disks and sockets come after).
    pub(crate) fn boot_args(&self) -> Vec<OsString> {
        let c = &self.cfg;
        let mut args: Vec<OsString> = vec!["boot".into(), "--kernel".into()];
        args.push(c.kernel.clone().into_os_string());
        args.push("--initrd".into());
        args.push(c.initrd.clone().into_os_string());
        args.extend(["--cmdline".into(), c.cmdline.clone().into()]);
        args.extend(["--mem-mib".into(), c.mem_mib.to_string().into()]);
        args.extend(["--vcpus".into(), c.vcpus.to_string().into()]);
        args.extend(["--rng".into(), "--balloon".into()]);
        args
    }

    /// A new full VM booted from `image`, with an empty overlay of its own, its agent
    /// answering.
    pub(crate) async fn boot_full(&self, id: &str, image: &Path) -> Result<MicroVm, VmTierError> {
        let overlay = self.cfg.dir.join(format!("{id}.disk"));
        // A stale overlay of an earlier VM of that name would shadow the image.
        let _ = std::fs::remove_file(&overlay);
        let disks = Disks { layers: Vec::new(), writable: overlay, cow_base: Some(image.into()) };
        let vm = MicroVm::new(&self.cfg.dir, id, Some(disks), Default::default());
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

    /// The image exists and is a file (or block device) the VMM can read.
    pub(crate) fn check_image(image: &Path) -> Result<(), VmTierError> {
        std::fs::File::open(image)
            .map(drop)
            .map_err(io(format!("the full-VM image {}", image.display())))
    }
}
