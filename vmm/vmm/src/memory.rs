//! Guest memory: one host mapping backing guest physical addresses `0..size`.
//!
//! A fresh VM gets anonymous memory. A restore maps the snapshot's memory file over the same
//! host range with `MAP_PRIVATE | MAP_FIXED`: the VM reads the file's pages from the page cache,
//! shared with every other VM restored from it, and a write copies only the page written.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("mmap of {size} bytes failed")]
    Map {
        size: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("guest address {addr:#x}+{len} is outside guest memory ({size} bytes)")]
    OutOfRange { addr: u64, len: usize, size: usize },
    #[error("memory file is {file} bytes, guest memory {size}")]
    SizeMismatch { file: u64, size: usize },
    #[error("reading the memory file")]
    Io(#[source] std::io::Error),
}

/// The host mapping behind guest memory: unmapped when the last owner (the [`GuestMemory`]
/// or any [`GuestView`] of it) goes, so no view can outlive the pages it points at.
#[derive(Debug)]
struct Mapping {
    host: *mut u8,
    size: usize,
}

// SAFETY: the mapping is plain memory owned by this value; every access goes through bounds-
// checked methods (ours, or vm-memory's through a view), and the guest's concurrent writes are
// the usual VMM contract (bytes only, never Rust references into guest memory).
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access is by copying bytes in and out, never by `&` references that
// could observe a torn value.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `GuestMemory::anonymous` created; this is the
        // last owner (the Arc count reached zero), so no view or slice refers to it any more.
        unsafe { libc::munmap(self.host.cast(), self.size) };
    }
}

/// Guest memory owned by the VMM; unmapped when it and every view of it are gone.
#[derive(Debug)]
pub struct GuestMemory {
    host: *mut u8,
    size: usize,
    mapping: std::sync::Arc<Mapping>,
}

// SAFETY: `host` and `size` describe `mapping`, which is Send; access goes through &self/&mut
// self methods that bounds-check.
unsafe impl Send for GuestMemory {}

/// A `vm-memory` view of guest memory for the virtio queue code (which bounds-checks every
/// guest address through it). It holds the mapping alive: a device thread's view stays valid
/// even if the VM that made it is dropped first.
#[derive(Debug, Clone)]
pub struct GuestView {
    memory: vm_memory::GuestMemoryMmap,
    _mapping: std::sync::Arc<Mapping>,
}

impl GuestView {
    pub fn memory(&self) -> &vm_memory::GuestMemoryMmap {
        &self.memory
    }
}

impl std::ops::Deref for GuestView {
    type Target = vm_memory::GuestMemoryMmap;

    fn deref(&self) -> &vm_memory::GuestMemoryMmap {
        &self.memory
    }
}

impl GuestMemory {
    /// Anonymous, zeroed memory of `size` bytes.
    pub fn anonymous(size: usize) -> Result<GuestMemory, MemoryError> {
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; no
        // existing memory is affected.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(MemoryError::Map { size, source: std::io::Error::last_os_error() });
        }
        let host: *mut u8 = host.cast();
        Ok(GuestMemory { host, size, mapping: std::sync::Arc::new(Mapping { host, size }) })
    }

    /// Replaces the contents with `file`, mapped copy-on-write over the same host addresses
    /// (so a memory slot registered on them stays valid).
    pub fn map_private(&mut self, file: &File) -> Result<(), MemoryError> {
        let len = file.metadata().map_err(MemoryError::Io)?.len();
        if len != self.size as u64 {
            return Err(MemoryError::SizeMismatch { file: len, size: self.size });
        }
        // SAFETY: MAP_FIXED replaces exactly our own mapping [host, host+size), which this
        // value owns; nothing else refers to those pages except KVM's memory slot, which
        // follows the new pages through its MMU notifier.
        let host = unsafe {
            libc::mmap(
                self.host.cast(),
                self.size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(MemoryError::Map {
                size: self.size,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Lets KSM merge identical pages of this memory with other mergeable memory (the
    /// kernel's ksmd must be running: /sys/kernel/mm/ksm/run).
    pub fn set_mergeable(&self) -> std::io::Result<()> {
        // SAFETY: advises exactly our own mapping; MADV_MERGEABLE changes only how the kernel
        // backs the pages (merged pages are copied again on write), never their contents.
        let rc = unsafe { libc::madvise(self.host.cast(), self.size, libc::MADV_MERGEABLE) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// KVM memory slot 0 over this mapping, at guest physical 0.
    pub fn slot(&self) -> kvm_bindings::kvm_userspace_memory_region {
        kvm_bindings::kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: self.size as u64,
            userspace_addr: self.host as u64,
            flags: 0,
        }
    }

    /// Host address of guest physical 0 (for the memory slot).
    pub fn host_address(&self) -> u64 {
        self.host as u64
    }

    fn check(&self, addr: u64, len: usize) -> Result<usize, MemoryError> {
        let out = || MemoryError::OutOfRange { addr, len, size: self.size };
        let start = usize::try_from(addr).map_err(|_| out())?;
        match start.checked_add(len) {
            Some(end) if end <= self.size => Ok(start),
            _ => Err(out()),
        }
    }

    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> Result<(), MemoryError> {
        let start = self.check(addr, bytes.len())?;
        // SAFETY: `check` keeps [start, start+len) inside the mapping, which lives as long as
        // self; the source is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.host.add(start), bytes.len()) };
        Ok(())
    }

    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let start = self.check(addr, out.len())?;
        // SAFETY: as in `write`, the range is inside the mapping; `out` is a distinct slice.
        unsafe { std::ptr::copy_nonoverlapping(self.host.add(start), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Reads one byte of every page, faulting the whole memory in (shared file pages stay
    /// shared); returns a checksum so the reads are not optimized away.
    pub fn touch_all(&self) -> u64 {
        self.as_slice().iter().step_by(4096).fold(0u64, |acc, b| acc.wrapping_add(u64::from(*b)))
    }

    /// A `vm-memory` view of the same mapping, for the virtio queue code. A restore's
    /// MAP_FIXED remap keeps the host addresses, so a view stays valid across it.
    pub fn view(&self) -> Result<GuestView, MemoryError> {
        let map_err = |e: &dyn std::fmt::Display| MemoryError::Map {
            size: self.size,
            source: std::io::Error::other(e.to_string()),
        };
        // SAFETY: [host, host+size) is a live read/write mapping; build_raw does not take
        // ownership (it never unmaps), and the view returned holds the mapping's Arc, so the
        // region is unmapped only after the view and all its clones are gone.
        let region = unsafe {
            vm_memory::MmapRegion::build_raw(
                self.host,
                self.size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
            )
        }
        .map_err(|e| map_err(&e))?;
        let region = vm_memory::GuestRegionMmap::new(region, vm_memory::GuestAddress(0))
            .ok_or_else(|| map_err(&"guest region overflows"))?;
        let memory =
            vm_memory::GuestMemoryMmap::from_regions(vec![region]).map_err(|e| map_err(&e))?;
        Ok(GuestView { memory, _mapping: self.mapping.clone() })
    }

    /// The whole guest memory as bytes (for saving a snapshot).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `size` readable bytes for as long as self lives; the vCPU is
        // paused whenever a snapshot is written, so nothing changes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.host, self.size) }
    }
}
