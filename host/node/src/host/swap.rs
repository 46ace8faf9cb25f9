//! The node's own compressed swap: a zram device, so that pausing a sandbox can push its
//! anonymous and tmpfs memory out of RAM on a machine with no swap (`[swap] zram_mib`).
//!
//! The device stays across brigd restarts (a restarted node finds it through
//! `<state>/zram-device` and keeps it); a node whose configuration turns it off leaves a device
//! it set up earlier alone until `swapoff`. What it costs is reported, not hidden: the node's
//! status carries the device's compressed size next to the data it holds.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// `[swap]` in the node configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SwapConfig {
    /// Size of the node's zram swap device in MiB (of uncompressed data); 0 sets up none.
    pub zram_mib: u64,
    /// Compression algorithm, if the kernel offers it (default: the kernel's).
    pub zram_algorithm: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    #[error("this kernel has no zram (no /sys/class/zram-control and no free /sys/block/zram*)")]
    NoZram,
    #[error("zram algorithm {wanted:?} is not offered (the kernel has: {offered})")]
    BadAlgorithm { wanted: String, offered: String },
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {status}")]
    Command { command: String, status: String },
}

/// The zram swap device a node uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZramSwap {
    /// `zram0`, …
    pub name: String,
}

/// What the device holds and costs, from its `mm_stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZramStats {
    pub disksize_bytes: u64,
    /// Uncompressed bytes stored, pages of one repeated value (kept as that value alone)
    /// included.
    pub orig_data_bytes: u64,
    /// Compressed bytes stored.
    pub compr_data_bytes: u64,
    /// RAM the device uses, allocator overhead included.
    pub mem_used_bytes: u64,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SwapError + 'a {
    move |source| SwapError::Io { what, path: path.to_owned(), source }
}

fn sysfs(name: &str) -> PathBuf {
    Path::new("/sys/block").join(name)
}

fn read_trim(path: &Path) -> Result<String, SwapError> {
    Ok(std::fs::read_to_string(path).map_err(io("reading", path))?.trim().to_owned())
}

fn active_swaps() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn run(program: &str, args: &[&str]) -> Result<(), SwapError> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().map_err(|source| SwapError::Io {
        what: "running",
        path: program.into(),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(SwapError::Command { command, status: format!("{} ({})", out.status, stderr.trim()) })
}

impl ZramSwap {
    /// Sets up (or, after a restart, finds again) the node's zram swap device.
    pub fn ensure(config: &SwapConfig, state_dir: &Path) -> Result<Option<ZramSwap>, SwapError> {
        if config.zram_mib == 0 {
            return Ok(None);
        }
        let record = state_dir.join("zram-device");
        let swaps = active_swaps();
        if let Ok(name) = std::fs::read_to_string(&record) {
            let name = name.trim().to_owned();
            if swaps.iter().any(|s| s == &format!("/dev/{name}")) {
                tracing::info!(device = %name, "zram swap kept from an earlier run");
                return Ok(Some(ZramSwap { name }));
            }
        }
        let name = free_device(&swaps)?;
        let dir = sysfs(&name);
        if let Some(wanted) = &config.zram_algorithm {
            let path = dir.join("comp_algorithm");
            let offered = read_trim(&path)?;
            let names: Vec<&str> =
                offered.split_whitespace().map(|a| a.trim_matches(['[', ']'])).collect();
            if !names.contains(&wanted.as_str()) {
                return Err(SwapError::BadAlgorithm { wanted: wanted.clone(), offered });
            }
            std::fs::write(&path, wanted).map_err(io("writing", &path))?;
        }
        let path = dir.join("disksize");
        std::fs::write(&path, (config.zram_mib << 20).to_string()).map_err(io("writing", &path))?;
        let dev = format!("/dev/{name}");
        run("mkswap", &["-q", &dev])?;
        run("swapon", &["-p", "100", &dev])?;
        std::fs::write(&record, &name).map_err(io("writing", &record))?;
        tracing::info!(device = %name, mib = config.zram_mib, "zram swap on");
        Ok(Some(ZramSwap { name }))
    }

    /// Turns the device off and gives it back to the kernel (tests and benchmarks).
    pub fn remove(&self, state_dir: &Path) -> Result<(), SwapError> {
        let dev = format!("/dev/{}", self.name);
        run("swapoff", &[&dev])?;
        let reset = sysfs(&self.name).join("reset");
        std::fs::write(&reset, "1").map_err(io("writing", &reset))?;
        let _ = std::fs::remove_file(state_dir.join("zram-device"));
        Ok(())
    }

    pub fn stats(&self) -> ZramStats {
        let dir = sysfs(&self.name);
        let num = |file: &str| -> Vec<u64> {
            std::fs::read_to_string(dir.join(file))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        };
        let mm = num("mm_stat");
        let at = |i: usize| mm.get(i).copied().unwrap_or(0);
        ZramStats {
            disksize_bytes: num("disksize").first().copied().unwrap_or(0),
            // `orig_data_size` leaves out same-filled pages (`same_pages`, field 6).
            orig_data_bytes: at(0) + at(5) * 4096,
            compr_data_bytes: at(1),
            mem_used_bytes: at(2),
        }
    }
}

/// A zram device no one uses: a new one from `hot_add`, else an unconfigured one.
fn free_device(swaps: &[String]) -> Result<String, SwapError> {
    let mut candidates: Vec<String> = std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("zram"))
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    for name in candidates {
        let unused = read_trim(&sysfs(&name).join("disksize")).is_ok_and(|s| s == "0");
        if unused && !swaps.iter().any(|s| s == &format!("/dev/{name}")) {
            return Ok(name);
        }
    }
    let hot_add = Path::new("/sys/class/zram-control/hot_add");
    match std::fs::read_to_string(hot_add) {
        Ok(n) => Ok(format!("zram{}", n.trim())),
        Err(_) => Err(SwapError::NoZram),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_size_is_no_swap_and_an_unknown_algorithm_is_refused_before_anything_changes() {
        let state = tempfile::tempdir().expect("tmp");
        assert_eq!(ZramSwap::ensure(&SwapConfig::default(), state.path()).expect("none"), None);
        let config = SwapConfig { zram_mib: 64, zram_algorithm: Some("no-such-algorithm".into()) };
        let before = active_swaps();
        let err = ZramSwap::ensure(&config, state.path()).expect_err("refused");
        assert!(matches!(err, SwapError::BadAlgorithm { .. }), "{err}");
        assert_eq!(active_swaps(), before);
        assert!(!state.path().join("zram-device").exists());
    }
}
