//! Small files of the host that the node's host-wide modules read and lock: kernel parameters
//! (`free_page_reporting`, `shrinker_ids`) and the records kept beside the run directories
//! (`host_settings`, `shrinker_ids`).

use std::io::Read;
use std::path::Path;

/// At most `cap` bytes of `path`, as text.
pub(crate) fn read_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(cap).read_to_string(&mut text)?;
    Ok(text)
}

/// Opens `path` (creating it and its directory) and locks it exclusively, for every process of
/// the host, until the returned value drops.
pub(crate) fn lock_exclusive(path: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno.into())
}
