//! What brig-vmm, brig-agent and the node's VM tier agree on: how to tell the host's
//! virtualization, the agent protocol, and the container requests of a container-host VM.
#![forbid(unsafe_code)]

pub mod agent;
pub mod container;
pub mod control;
pub mod guest_files;
pub mod launch;
pub mod sparse;

/// The host's virtualization, as far as the VM tiers care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Virtualization {
    /// VT-x or AMD-V: Linux guests boot.
    Hardware,
    /// The PVM software hypervisor: only purpose-built guests run, no Linux.
    Pvm,
    /// No usable /dev/kvm.
    None,
}

impl Virtualization {
    pub fn detect() -> Virtualization {
        if !std::path::Path::new("/dev/kvm").exists() {
            return Virtualization::None;
        }
        if std::path::Path::new("/sys/module/kvm_pvm").exists() {
            return Virtualization::Pvm;
        }
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let hw = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
        if hw {
            Virtualization::Hardware
        } else {
            Virtualization::None
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Virtualization::Hardware => "hardware",
            Virtualization::Pvm => "pvm",
            Virtualization::None => "none",
        }
    }

    /// Whether Linux guests can run here.
    pub fn runs_linux(self) -> bool {
        self == Virtualization::Hardware
    }
}
