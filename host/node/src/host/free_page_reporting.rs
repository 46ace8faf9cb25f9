//! Free page reporting of a node that is itself a VM: its kernel tells the hypervisor which
//! blocks of memory are free (virtio-balloon `page_reporting`), and the hypervisor takes their
//! backing away. The next use of such a page faults in the hypervisor as well as in the kernel.
//! A node that creates and destroys sandboxes all day frees and reuses the same memory, so
//! each create paid that second fault for its kernel objects: measured on a 2-core VM, touching
//! a reported page costs 10-18 µs against 1.1 µs for a backed one, and the 10,000-container
//! fill took 121 s with freshly reported memory against 51-61 s with it backed
//! (`docs/density.md`). While brigd runs, the node holds its freed memory: the reporting order
//! is raised above the largest order a free block can have, so nothing is reported; the
//! host's order goes back when the last brigd leaves (`host_settings`).

use std::path::{Path, PathBuf};

/// The kernel's threshold: free blocks of this order or larger are reported.
pub(crate) const REPORTING_ORDER: &str =
    "/sys/module/page_reporting/parameters/page_reporting_order";
/// One column per order a free block can have.
pub(crate) const BUDDYINFO: &str = "/proc/buddyinfo";
/// Longest file read here (the parameter is one number; buddyinfo one line per zone).
const READ_CAP: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FreePageReportingError {
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path} does not hold a page order: {text:?}")]
    NotAnOrder { path: PathBuf, text: String },
}

/// Where the two kernel files are (the real ones in a node; others in tests).
pub(crate) struct ReportingFiles<'a> {
    pub order: &'a Path,
    pub buddyinfo: &'a Path,
}

impl ReportingFiles<'static> {
    pub fn host() -> Self {
        ReportingFiles { order: Path::new(REPORTING_ORDER), buddyinfo: Path::new(BUDDYINFO) }
    }
}

/// What a node's kernel does with its free memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportingState {
    /// No free page reporting (bare metal, or no balloon that asks for it).
    Absent,
    /// Free blocks of this order or larger go back to the hypervisor.
    Reporting(u32),
    /// The order is above any free block's: nothing is reported.
    Held(u32),
}

impl ReportingFiles<'_> {
    /// The reporting order now.
    pub fn state(&self) -> Result<ReportingState, FreePageReportingError> {
        Ok(self.read()?.map_or(ReportingState::Absent, |(order, held)| {
            if order >= held {
                ReportingState::Held(order)
            } else {
                ReportingState::Reporting(order)
            }
        }))
    }

    /// Stops reporting; returns the order it replaced, or `None` when there was nothing to
    /// change (no reporting here, or held already).
    pub fn hold(&self) -> Result<Option<u32>, FreePageReportingError> {
        match self.read()? {
            Some((order, held)) if order < held => self.restore(held).map(|()| Some(order)),
            _ => Ok(None),
        }
    }

    /// Sets the reporting order to `order` (what [`hold`](Self::hold) replaced, to put it
    /// back).
    pub fn restore(&self, order: u32) -> Result<(), FreePageReportingError> {
        std::fs::write(self.order, order.to_string()).map_err(|source| FreePageReportingError::Io {
            what: "write",
            path: self.order.into(),
            source,
        })
    }

    /// The reporting order and the order that stops all reporting; `None` where the kernel
    /// has no free page reporting.
    fn read(&self) -> Result<Option<(u32, u32)>, FreePageReportingError> {
        let Some(order) = read_order(self.order)? else { return Ok(None) };
        Ok(Some((order, self.held_order()?)))
    }

    /// One more than the largest order of a free block: the number of order columns in
    /// buddyinfo (`Node 0, zone Normal  c0 c1 ... cN`).
    fn held_order(&self) -> Result<u32, FreePageReportingError> {
        let text = read_capped(self.buddyinfo)?;
        let columns = text
            .lines()
            .filter_map(|line| {
                let counts: Vec<&str> =
                    line.split_whitespace().skip_while(|w| *w != "zone").skip(2).collect();
                counts.iter().all(|c| c.parse::<u64>().is_ok()).then_some(counts.len())
            })
            .max()
            .unwrap_or(0);
        match u32::try_from(columns) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(FreePageReportingError::NotAnOrder {
                path: self.buddyinfo.into(),
                text: text.chars().take(200).collect(),
            }),
        }
    }
}

/// The reporting order, or `None` where the kernel has no free page reporting.
fn read_order(path: &Path) -> Result<Option<u32>, FreePageReportingError> {
    let text = match read_capped(path) {
        Ok(text) => text,
        Err(FreePageReportingError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| FreePageReportingError::NotAnOrder { path: path.into(), text })
}

fn read_capped(path: &Path) -> Result<String, FreePageReportingError> {
    crate::host::host_files::read_capped(path, READ_CAP)
        .map_err(|source| FreePageReportingError::Io { what: "read", path: path.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDDYINFO_TEXT: &str = "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      2 \n\
Node 0, zone    DMA32    118    119    100     88     60     41     22     12      8      5    612 \n\
Node 0, zone   Normal   1969   1553   1179    998    744    600    421    238    136     86   4121 \n";

    fn files(dir: &Path) -> (PathBuf, PathBuf) {
        let (order, buddyinfo) = (dir.join("page_reporting_order"), dir.join("buddyinfo"));
        std::fs::write(&buddyinfo, BUDDYINFO_TEXT).expect("write buddyinfo");
        (order, buddyinfo)
    }

    #[test]
    fn holding_raises_the_order_above_every_free_block_and_restore_puts_it_back() {
        let dir = tempfile::tempdir().expect("tmp");
        let (order, buddyinfo) = files(dir.path());
        std::fs::write(&order, "9\n").expect("write");
        let reporting = ReportingFiles { order: &order, buddyinfo: &buddyinfo };
        assert_eq!(reporting.state().expect("state"), ReportingState::Reporting(9));

        // Eleven order columns (0..=10): order 11 is never reached by a free block.
        assert_eq!(reporting.hold().expect("hold"), Some(9));
        assert_eq!(std::fs::read_to_string(&order).expect("read"), "11");
        assert_eq!(reporting.state().expect("state"), ReportingState::Held(11));
        // Held already (another brigd, or this one before a kill): nothing to put back.
        assert_eq!(reporting.hold().expect("hold again"), None);

        reporting.restore(9).expect("restore");
        assert_eq!(reporting.state().expect("state"), ReportingState::Reporting(9));
    }

    #[test]
    fn a_kernel_without_reporting_is_left_alone_and_garbage_is_a_typed_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let (order, buddyinfo) = files(dir.path());
        let reporting = ReportingFiles { order: &order, buddyinfo: &buddyinfo };
        assert_eq!(reporting.state().expect("state"), ReportingState::Absent);
        assert_eq!(reporting.hold().expect("hold"), None);
        assert!(!order.exists(), "created the parameter of a kernel that has none");

        std::fs::write(&order, "nine").expect("write");
        assert!(matches!(reporting.hold(), Err(FreePageReportingError::NotAnOrder { .. })));
        std::fs::write(&order, "9").expect("write");
        std::fs::write(&buddyinfo, "no zones here").expect("write");
        assert!(matches!(reporting.hold(), Err(FreePageReportingError::NotAnOrder { .. })));
        assert_eq!(std::fs::read_to_string(&order).expect("read"), "9", "changed on an error");
    }

    #[test]
    fn the_real_files_parse_where_the_kernel_has_them() {
        // Reads only: a node under test must not change the host's reporting.
        let state = ReportingFiles::host().state().expect("state of this host");
        if Path::new(REPORTING_ORDER).exists() {
            assert_ne!(state, ReportingState::Absent);
        } else {
            assert_eq!(state, ReportingState::Absent);
        }
    }
}
