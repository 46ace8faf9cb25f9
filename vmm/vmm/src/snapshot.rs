//! Snapshots: the paused vCPU's state and the guest's memory, in two files.
//!
//! ```text
//! vm.state   "BRIGVMSN" | version u32 | memory size u64 | sha256(vm.mem) 32 B
//!            | len u32 + kvm_regs | len u32 + kvm_sregs | sha256(all of the above) 32 B
//! vm.mem     guest memory, byte for byte (mapped MAP_PRIVATE by restores)
//! ```
//! A state file with another version, a wrong length or a bad checksum is refused. The memory
//! file's digest is checked by [`Snapshot::verify_memory`] (once, when a snapshot is taken into
//! use), not on every restore, which must not read the whole file.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use kvm_bindings::{kvm_regs, kvm_sregs};
use sha2::{Digest, Sha256};

use crate::vm::{Vm, VmError};

const MAGIC: &[u8; 8] = b"BRIGVMSN";
pub const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot file {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a Brig VM snapshot")]
    NotASnapshot(PathBuf),
    #[error("snapshot version {found}; this VMM reads version {VERSION}")]
    Version { found: u32 },
    #[error("snapshot {0} is corrupt (checksum mismatch)")]
    Checksum(PathBuf),
    #[error("snapshot {0} is truncated or has a bad field length")]
    Malformed(PathBuf),
    #[error("snapshot memory is {snapshot} bytes; the VM has {vm}")]
    MemorySize { snapshot: u64, vm: usize },
    #[error("the VM has virtio devices, whose state snapshots do not carry yet")]
    DevicesAttached,
    #[error(transparent)]
    Vm(#[from] VmError),
}

use crate::kvm_abi::{bytes_of, from_bytes};

/// A loaded snapshot, ready to restore from.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub memory_size: u64,
    memory_sha256: [u8; 32],
    regs: kvm_regs,
    sregs: kvm_sregs,
}

impl Snapshot {
    pub fn state_path(dir: &Path) -> PathBuf {
        dir.join("vm.state")
    }

    pub fn memory_path(dir: &Path) -> PathBuf {
        dir.join("vm.mem")
    }

    /// Saves a paused VM into `dir`.
    pub fn save(vm: &Vm, dir: &Path) -> Result<Snapshot, SnapshotError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| SnapshotError::Io { path, source }
        };
        if vm.device(0).is_some() {
            return Err(SnapshotError::DevicesAttached);
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let (regs, sregs) = vm.regs()?;
        let memory = vm.memory().as_slice();
        let mem_path = Self::memory_path(dir);
        let mut f = File::create(&mem_path).map_err(io(&mem_path))?;
        f.write_all(memory).map_err(io(&mem_path))?;
        f.sync_all().map_err(io(&mem_path))?;
        let memory_sha256: [u8; 32] = Sha256::digest(memory).into();
        let snap = Snapshot {
            dir: dir.to_owned(),
            memory_size: memory.len() as u64,
            memory_sha256,
            regs,
            sregs,
        };
        let state_path = Self::state_path(dir);
        std::fs::write(&state_path, snap.encode()).map_err(io(&state_path))?;
        Ok(snap)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.memory_size.to_le_bytes());
        out.extend_from_slice(&self.memory_sha256);
        for part in [bytes_of(&self.regs), bytes_of(&self.sregs)] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part);
        }
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        out
    }

    /// Reads and checks a snapshot's state file.
    pub fn load(dir: &Path) -> Result<Snapshot, SnapshotError> {
        let path = Self::state_path(dir);
        let bytes = std::fs::read(&path)
            .map_err(|source| SnapshotError::Io { path: path.clone(), source })?;
        Self::decode(dir, &bytes)
    }

    fn decode(dir: &Path, bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let path = Self::state_path(dir);
        let malformed = || SnapshotError::Malformed(path.clone());
        if bytes.len() < 8 || &bytes[..8] != MAGIC {
            return Err(SnapshotError::NotASnapshot(path));
        }
        let (body, digest) = bytes.split_at(bytes.len().checked_sub(32).ok_or_else(malformed)?);
        let version = u32::from_le_bytes(
            body.get(8..12).ok_or_else(malformed)?.try_into().map_err(|_| malformed())?,
        );
        if version != VERSION {
            return Err(SnapshotError::Version { found: version });
        }
        if Sha256::digest(body).as_slice() != digest {
            return Err(SnapshotError::Checksum(path));
        }
        let memory_size = u64::from_le_bytes(
            body.get(12..20).ok_or_else(malformed)?.try_into().map_err(|_| malformed())?,
        );
        let memory_sha256: [u8; 32] =
            body.get(20..52).ok_or_else(malformed)?.try_into().map_err(|_| malformed())?;
        let mut at = 52;
        let mut part = || -> Result<&[u8], SnapshotError> {
            let len = body.get(at..at + 4).ok_or_else(malformed)?;
            let len = u32::from_le_bytes(len.try_into().map_err(|_| malformed())?) as usize;
            let data = body.get(at + 4..at + 4 + len).ok_or_else(malformed)?;
            at += 4 + len;
            Ok(data)
        };
        let regs = from_bytes::<kvm_regs>(part()?).ok_or_else(malformed)?;
        let sregs = from_bytes::<kvm_sregs>(part()?).ok_or_else(malformed)?;
        Ok(Snapshot { dir: dir.to_owned(), memory_size, memory_sha256, regs, sregs })
    }

    /// Reads the whole memory file and checks its digest.
    pub fn verify_memory(&self) -> Result<(), SnapshotError> {
        let path = Self::memory_path(&self.dir);
        let io = |source| SnapshotError::Io { path: path.clone(), source };
        let mut f = File::open(&path).map_err(io)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut f, &mut hasher).map_err(io)?;
        if hasher.finalize().as_slice() != self.memory_sha256 {
            return Err(SnapshotError::Checksum(path));
        }
        Ok(())
    }

    /// Restores into `vm` (fresh or pre-created): its memory becomes a private mapping of the
    /// memory file and its vCPU gets the saved registers.
    pub fn restore_into(&self, vm: &mut Vm) -> Result<(), SnapshotError> {
        if self.memory_size != vm.memory().size() as u64 {
            return Err(SnapshotError::MemorySize {
                snapshot: self.memory_size,
                vm: vm.memory().size(),
            });
        }
        let path = Self::memory_path(&self.dir);
        let file =
            File::open(&path).map_err(|source| SnapshotError::Io { path: path.clone(), source })?;
        vm.memory_mut().map_private(&file).map_err(VmError::from)?;
        vm.set_regs(&self.regs, &self.sregs)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_and_foreign_state_files_are_refused() {
        let dir = Path::new("/nonexistent");
        let snap = Snapshot {
            dir: dir.to_owned(),
            memory_size: 4096,
            memory_sha256: [7; 32],
            regs: kvm_regs { rip: 0x1234, ..Default::default() },
            sregs: kvm_sregs::default(),
        };
        let good = snap.encode();
        let back = Snapshot::decode(dir, &good).expect("decode");
        assert_eq!(back.regs.rip, 0x1234);
        assert_eq!(back.memory_size, 4096);
        let mut flipped = good.clone();
        flipped[60] ^= 1;
        assert!(matches!(Snapshot::decode(dir, &flipped), Err(SnapshotError::Checksum(_))));
        let mut newer = good.clone();
        newer[8] = 9;
        assert!(matches!(Snapshot::decode(dir, &newer), Err(SnapshotError::Version { found: 9 })));
        assert!(matches!(Snapshot::decode(dir, b"ELF..."), Err(SnapshotError::NotASnapshot(_))));
        assert!(matches!(
            Snapshot::decode(dir, &good[..40]),
            Err(SnapshotError::Checksum(_) | SnapshotError::Malformed(_))
        ));
    }
}
