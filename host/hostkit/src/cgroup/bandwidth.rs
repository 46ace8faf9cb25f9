//! CPU bandwidth (CFS quota and period) of container cgroups, and the host's bandwidth slice.

use std::io::Read;
use std::path::Path;

use super::{io, CgroupError, ContainerCgroup, Version};

/// Where the kernel keeps the CFS bandwidth slice (a host-wide setting).
const BANDWIDTH_SLICE: &str = "/proc/sys/kernel/sched_cfs_bandwidth_slice_us";

/// Lowers the host's CFS bandwidth slice to at most `us` microseconds; returns the previous
/// value if it changed. A CPU takes runtime from its group's quota a slice at a time (5 ms by
/// default), so with a quota of a millisecond or two the first CPU takes it all and a process
/// woken on the other CPU (the child of every exec) waits for the next 100 ms period; with a
/// slice below the quota, both CPUs get their share.
pub fn lower_bandwidth_slice(us: u64) -> Result<Option<u64>, CgroupError> {
    let path = Path::new(BANDWIDTH_SLICE);
    let current: u64 = match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().unwrap_or(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CgroupError::Io { what: "read", path: path.into(), source }),
    };
    if us == 0 || current <= us {
        return Ok(None);
    }
    std::fs::write(path, us.to_string()).map_err(io("write", path))?;
    Ok(Some(current))
}

/// Puts the host's CFS bandwidth slice back to `us` (what [`lower_bandwidth_slice`] found).
pub fn restore_bandwidth_slice(us: u64) {
    let _ = std::fs::write(BANDWIDTH_SLICE, us.to_string());
}

/// The CFS period and quota, in µs, that cap a container at `millis` thousandths of a core.
/// The period is the usual 100 ms unless its quota would be under `min_quota_us`; then it is
/// as long as needed for that quota, up to the kernel's limit of 1 s. The rate is the same
/// either way; what changes is how much CPU a quiet container may use at once. A quota of
/// 1 ms per 100 ms (10 millicores) is less than one `exec true` costs on a loaded node, so
/// every such exec would wait for the next period; 5 ms per 500 ms holds it.
pub fn cpu_period_and_quota(millis: u64, min_quota_us: u64) -> (u64, u64) {
    const DEFAULT_PERIOD_US: u64 = 100_000;
    const MAX_PERIOD_US: u64 = 1_000_000;
    /// The kernel refuses quotas under 1 ms.
    const MIN_QUOTA_US: u64 = 1_000;
    let millis = millis.max(1);
    let period =
        min_quota_us.saturating_mul(1000).div_ceil(millis).clamp(DEFAULT_PERIOD_US, MAX_PERIOD_US);
    (period, (millis.saturating_mul(period) / 1000).max(MIN_QUOTA_US))
}

/// Default of [`cpu_period_and_quota`]'s `min_quota_us` (node config
/// `[container] cpu_min_quota_us`).
pub const DEFAULT_CPU_MIN_QUOTA_US: u64 = 5_000;

impl ContainerCgroup {
    /// Caps the container at `millis` thousandths of a core, with a burst of one more quota:
    /// an idle container answers a short exec at once instead of waiting for the next period.
    /// The period is 100 ms, or longer when that would leave a quota under `min_quota_us`
    /// (see [`cpu_period_and_quota`]).
    pub fn limit_cpu(&self, millis: u64, min_quota_us: u64) -> Result<(), CgroupError> {
        let Some(d) = self.dir("cpu") else { return Ok(()) };
        let (period, quota) = cpu_period_and_quota(millis, min_quota_us);
        let (period, quota) = (period.to_string(), quota.to_string());
        let write = |name: &str, value: &str| {
            let file = d.join(name);
            std::fs::write(&file, value).map_err(io("write", &file))
        };
        // The burst is optional (kernels before 5.14 have none).
        match self.version {
            // Each file is written only where it differs (a spare may hold these values
            // already). The kernel refuses a burst above the quota, so a spare whose burst is
            // above the new quota gets its burst first.
            Version::V1 => {
                write_if_changed(&d.join("cpu.cfs_period_us"), &period)?;
                let (quota_file, burst_file) =
                    (d.join("cpu.cfs_quota_us"), d.join("cpu.cfs_burst_us"));
                let has_burst = burst_file.exists();
                let burst_now: Option<i64> =
                    has_burst.then(|| read_value(&burst_file)?.parse().ok()).flatten();
                let burst_first = burst_now.is_some_and(|b| b > quota.parse().unwrap_or(i64::MAX));
                if burst_first {
                    write_if_changed(&burst_file, &quota)?;
                }
                write_if_changed(&quota_file, &quota)?;
                if has_burst && !burst_first {
                    write_if_changed(&burst_file, &quota)?;
                }
            }
            // No cpu.max: the cpu controller is not delegated to this subtree.
            Version::V2 if !d.join("cpu.max").exists() => {
                tracing::warn!(cgroup = %d.display(), "no cpu controller: CPU limit not applied");
            }
            Version::V2 => {
                write("cpu.max", &format!("{quota} {period}"))?;
                if d.join("cpu.max.burst").exists() {
                    write("cpu.max.burst", &quota)?;
                }
            }
        }
        Ok(())
    }

    /// CPU QoS: best-effort gets the smallest weight and, where the kernel has `cpu.idle`, the
    /// idle scheduling policy for the whole group (it runs only on CPU nobody else wants);
    /// latency-sensitive gets the default weight.
    pub fn set_best_effort(&self, best_effort: bool) -> Result<(), CgroupError> {
        let Some(d) = self.dir("cpu") else { return Ok(()) };
        let (weight_file, weight) = match (self.version, best_effort) {
            (Version::V1, true) => ("cpu.shares", "2"),
            (Version::V1, false) => ("cpu.shares", "1024"),
            (Version::V2, true) => ("cpu.weight", "1"),
            (Version::V2, false) => ("cpu.weight", "100"),
        };
        // An idle group refuses weight changes: leave idle first, enter it last.
        let (path, idle) = (d.join(weight_file), d.join("cpu.idle"));
        let set_idle = |on: bool| -> Result<(), CgroupError> {
            if idle.exists() {
                std::fs::write(&idle, if on { "1" } else { "0" }).map_err(io("write", &idle))?;
            }
            Ok(())
        };
        set_idle(false)?;
        std::fs::write(&path, weight).map_err(io("write", &path))?;
        if best_effort {
            set_idle(true)?;
        }
        Ok(())
    }
}

/// Writes `value` to the cgroup file `file` unless it already reads so; says whether it wrote.
/// Every write of a CFS bandwidth file (`cpu.cfs_period_us`, `cpu.cfs_quota_us`,
/// `cpu.cfs_burst_us`, `cpu.max`) walks every task group on the host to check the hierarchy's
/// quotas (`tg_set_bandwidth` → `__cfs_schedulable`), so with thousands of containers each one
/// costs in proportion to them; reading costs nothing of the kind. A new cgroup's period is
/// already the usual 100 ms, so a container of a core or more skips that write, and a spare
/// cgroup (`super::spares`) taken for the same CPU limit as its last container skips all.
pub(super) fn write_if_changed(file: &Path, value: &str) -> Result<bool, CgroupError> {
    if read_value(file).is_some_and(|current| current == value) {
        return Ok(false);
    }
    std::fs::write(file, value).map_err(io("write", file))?;
    Ok(true)
}

/// A cgroup file of one value, trimmed (`None` if it cannot be read).
fn read_value(file: &Path) -> Option<String> {
    /// Cgroup files of one value are a few dozen bytes.
    const READ_CAP: u64 = 256;
    let mut text = String::new();
    std::fs::File::open(file).and_then(|f| f.take(READ_CAP).read_to_string(&mut text)).ok()?;
    Some(text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::{cpu_period_and_quota, write_if_changed};

    #[test]
    fn a_bandwidth_file_that_already_holds_the_value_is_not_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cpu.cfs_period_us");
        // The kernel's files end in a newline.
        std::fs::write(&file, "100000\n").expect("seed");
        assert!(!write_if_changed(&file, "100000").expect("same"));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "100000\n");
        assert!(write_if_changed(&file, "500000").expect("changed"));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "500000");
        // v2's one file of two values.
        let max = dir.path().join("cpu.max");
        std::fs::write(&max, "max 100000\n").expect("seed");
        assert!(write_if_changed(&max, "5000 500000").expect("changed"));
        assert!(!write_if_changed(&max, "5000 500000").expect("same"));
        // A file that cannot be read or written is the write's typed error.
        let missing = dir.path().join("gone").join("cpu.cfs_quota_us");
        assert!(write_if_changed(&missing, "5000").is_err());
    }

    #[test]
    fn small_quotas_get_longer_periods_at_the_same_rate() {
        // A core or more: the usual 100 ms period.
        assert_eq!(cpu_period_and_quota(1000, 5_000), (100_000, 100_000));
        assert_eq!(cpu_period_and_quota(2500, 5_000), (100_000, 250_000));
        assert_eq!(cpu_period_and_quota(50, 5_000), (100_000, 5_000));
        // 10 millicores: 5 ms per 500 ms instead of 1 ms per 100 ms.
        assert_eq!(cpu_period_and_quota(10, 5_000), (500_000, 5_000));
        assert_eq!(cpu_period_and_quota(30, 5_000), (166_667, 5_000));
        // The kernel's longest period, then its smallest quota.
        assert_eq!(cpu_period_and_quota(2, 5_000), (1_000_000, 2_000));
        assert_eq!(cpu_period_and_quota(0, 5_000), (1_000_000, 1_000));
        // 0 keeps 100 ms periods, never under the kernel's 1 ms quota.
        assert_eq!(cpu_period_and_quota(10, 0), (100_000, 1_000));
        assert_eq!(cpu_period_and_quota(3, 0), (100_000, 1_000));
        for millis in [1, 7, 10, 33, 99, 100, 101, 999, 16_000] {
            let (period, quota) = cpu_period_and_quota(millis, 5_000);
            assert!((100_000..=1_000_000).contains(&period), "{millis}: {period}");
            // The rate asked for, to within the rounding of one µs per period.
            let rate = quota as f64 * 1000.0 / period as f64;
            assert!((rate - millis as f64).abs() <= millis as f64 * 0.01 + 1.0, "{millis}: {rate}");
        }
    }
}
