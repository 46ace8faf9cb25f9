//! How the host starts a VMM: one [`LaunchConfig`], as JSON on one line of the VMM's stdin
//! (`brig-vmm launch`, or a warm `brig-vmm standby` that waits for it). The command-line
//! `boot` and `resume` build the same struct from flags, so there is one way in.
//!
//! ```text
//! host → brig-vmm stdin   {"start":{"from":"resume","snapshot":"/…"},"disks":[…],…}\n
//! ```

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Longest launch line the VMM reads.
pub const MAX_LAUNCH_BYTES: usize = 1 << 20;

/// Everything a VMM needs to run one VM.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LaunchConfig {
    pub start: Start,
    /// The VMM stops the VM after this long.
    pub timeout_s: u64,
    /// The guest's vsock device (CID 3), reached through this Unix socket.
    pub vsock_uds: Option<PathBuf>,
    /// Serve the control socket (`crate::control`) here.
    pub control_uds: Option<PathBuf>,
    /// virtio-blk disks, /dev/vda, vdb… in this order (a resume names the boot's disks).
    pub disks: Vec<DiskSpec>,
    /// A virtio-net device on an existing tap.
    pub net: Option<NetSpec>,
    /// Let KSM merge identical pages of the VM's memory (MADV_MERGEABLE).
    pub ksm: bool,
    /// Confine the VMM before it touches guest data (none: run unconfined, for tests).
    pub jail: Option<JailSpec>,
}

/// A fresh boot, or a resume from a snapshot.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "from", rename_all = "snake_case", deny_unknown_fields)]
pub enum Start {
    Boot {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
        mem_mib: usize,
        vcpus: u8,
        /// A virtio-rng device.
        rng: bool,
        /// A virtio-balloon device with free-page reporting.
        balloon: bool,
        /// When the guest writes the snapshot trigger address, save the VM here and exit 4.
        snapshot_to: Option<PathBuf>,
    },
    Resume {
        snapshot: PathBuf,
    },
}

/// A virtio-blk disk: a file or block device, read-only or writable, or a copy-on-write disk
/// (`overlay` over the read-only base `path`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub read_only: bool,
    /// The overlay of a copy-on-write disk over `path` (created when missing).
    pub overlay: Option<PathBuf>,
}

impl DiskSpec {
    pub fn read_only(path: impl Into<PathBuf>) -> DiskSpec {
        DiskSpec { path: path.into(), read_only: true, overlay: None }
    }

    pub fn writable(path: impl Into<PathBuf>) -> DiskSpec {
        DiskSpec { path: path.into(), read_only: false, overlay: None }
    }

    pub fn cow(base: impl Into<PathBuf>, overlay: impl Into<PathBuf>) -> DiskSpec {
        DiskSpec { path: base.into(), read_only: false, overlay: Some(overlay.into()) }
    }

    /// Parses a `--disk` flag: `PATH` (writable), `PATH:ro`, or `BASE:cow:OVERLAY`.
    pub fn parse(s: &str) -> Result<DiskSpec, String> {
        if let Some((base, overlay)) = s.split_once(":cow:") {
            if base.is_empty() || overlay.is_empty() {
                return Err(format!("{s:?}: expected BASE:cow:OVERLAY"));
            }
            return Ok(DiskSpec::cow(base, overlay));
        }
        let (path, read_only) = match s.strip_suffix(":ro") {
            Some(p) => (p, true),
            None => (s, false),
        };
        if path.is_empty() {
            return Err("an empty disk path".into());
        }
        Ok(DiskSpec { path: path.into(), read_only, overlay: None })
    }

    /// The flag that parses back to this spec.
    pub fn arg(&self) -> String {
        match (&self.overlay, self.read_only) {
            (Some(o), _) => format!("{}:cow:{}", self.path.display(), o.display()),
            (None, true) => format!("{}:ro", self.path.display()),
            (None, false) => self.path.display().to_string(),
        }
    }

    /// The file holding what the guest writes (the overlay, or a writable disk's file): what a
    /// snapshot copies. None for a read-only disk.
    pub fn writable_file(&self) -> Option<&Path> {
        match (&self.overlay, self.read_only) {
            (Some(o), _) => Some(o),
            (None, false) => Some(&self.path),
            (None, true) => None,
        }
    }
}

/// A virtio-net device on a tap the host made.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetSpec {
    pub tap: String,
    /// The network namespace to join first (where the tap is), e.g. `/run/netns/NAME`.
    pub netns: Option<PathBuf>,
    pub mac: [u8; 6],
}

/// The VMM's jail (see `brig_vmm::jail`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JailSpec {
    /// Directories left writable.
    pub writable: Vec<PathBuf>,
    /// `cgroup.procs` files to join first.
    pub cgroup_procs: Vec<PathBuf>,
}

/// A launch line the VMM cannot take.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("reading the launch configuration")]
    Read(#[source] std::io::Error),
    #[error("no launch configuration (stdin ended)")]
    Missing,
    #[error("a launch configuration of more than {MAX_LAUNCH_BYTES} bytes")]
    TooLong,
    #[error("malformed launch configuration")]
    Malformed(#[source] serde_json::Error),
}

impl LaunchConfig {
    /// The config as one line for the VMM's stdin.
    pub fn to_line(&self) -> String {
        // Plain data with string keys: serializing cannot fail.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    /// Reads one launch line, at most [`MAX_LAUNCH_BYTES`].
    pub fn read_line(reader: &mut impl BufRead) -> Result<LaunchConfig, LaunchError> {
        let mut line = Vec::new();
        let mut capped = std::io::Read::take(reader, MAX_LAUNCH_BYTES as u64 + 1);
        capped.read_until(b'\n', &mut line).map_err(LaunchError::Read)?;
        if line.is_empty() {
            return Err(LaunchError::Missing);
        }
        if line.len() > MAX_LAUNCH_BYTES {
            return Err(LaunchError::TooLong);
        }
        serde_json::from_slice(&line).map_err(LaunchError::Malformed)
    }

    /// The writable disks, in order (what a snapshot copies: `disk-N` in its directory).
    pub fn writable_disks(&self) -> Vec<PathBuf> {
        self.disks.iter().filter_map(|d| d.writable_file().map(PathBuf::from)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LaunchConfig {
        LaunchConfig {
            start: Start::Boot {
                kernel: "/k".into(),
                initrd: Some("/i".into()),
                cmdline: "console=ttyS0 quiet\nx".into(),
                mem_mib: 256,
                vcpus: 2,
                rng: true,
                balloon: true,
                snapshot_to: None,
            },
            timeout_s: 5,
            vsock_uds: Some("/run/v.sock".into()),
            control_uds: None,
            disks: vec![DiskSpec::read_only("/l"), DiskSpec::cow("/b", "/o")],
            net: Some(NetSpec { tap: "tap0".into(), netns: None, mac: [6, 0, 0, 0, 0, 2] }),
            ksm: false,
            jail: Some(JailSpec { writable: vec!["/d".into()], cgroup_procs: vec![] }),
        }
    }

    #[test]
    fn a_launch_line_round_trips_and_bad_ones_are_typed_errors() {
        let cfg = sample();
        let line = cfg.to_line();
        assert_eq!(line.matches('\n').count(), 1, "one line, whatever the fields hold");
        let read = LaunchConfig::read_line(&mut line.as_bytes()).expect("read");
        assert_eq!(read, cfg);
        assert_eq!(read.writable_disks(), vec![PathBuf::from("/o")]);
        assert!(matches!(LaunchConfig::read_line(&mut &b""[..]), Err(LaunchError::Missing)));
        let renamed = line.replace("timeout_s", "timeout");
        assert!(matches!(
            LaunchConfig::read_line(&mut renamed.as_bytes()),
            Err(LaunchError::Malformed(_))
        ));
        let huge = vec![b' '; MAX_LAUNCH_BYTES + 10];
        assert!(matches!(LaunchConfig::read_line(&mut &huge[..]), Err(LaunchError::TooLong)));
    }

    #[test]
    fn disk_flags_parse_and_print_back() {
        for arg in ["/a/disk", "/a/layer.erofs:ro", "/img/root.ext4:cow:/run/vm.overlay"] {
            assert_eq!(DiskSpec::parse(arg).expect("parse").arg(), arg);
        }
        assert_eq!(DiskSpec::parse("/b:cow:/o").expect("p").writable_file(), Some(Path::new("/o")));
        assert_eq!(DiskSpec::parse("/l:ro").expect("parse").writable_file(), None);
        assert!(DiskSpec::parse(":cow:/o").is_err());
        assert!(DiskSpec::parse("").is_err());
    }
}
