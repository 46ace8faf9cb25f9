//! The purpose-built test guest (feature `test-guest`; not in the shipped VMM): a few
//! instructions of 64-bit code that touch a configurable amount of memory (so snapshots hold
//! real pages), then serve requests forever over two ports:
//! it reads a request from port [`REQUEST_PORT`] and answers `request + n` (n counts answers
//! since boot) on [`REPLY_PORT`]. The counter lives in a register, so an answer after a restore
//! proves the vCPU state came back; the last answer is also kept in guest memory at
//! [`LAST_REPLY_ADDR`].
//!
//! Guest physical layout:
//! ```text
//! 0x0500  GDT, 0x9000… page tables: see `crate::long_mode`
//! 0x1000  code
//! 0x3000  u64 pages to touch (written by the VMM); 0x3008 last reply
//! 0x200000…  the touched pages
//! ```

use kvm_bindings::kvm_regs;

use crate::memory::{GuestMemory, MemoryError};

pub const REQUEST_PORT: u16 = 0x10;
pub const REPLY_PORT: u16 = 0x11;
pub const LAST_REPLY_ADDR: u64 = 0x3008;
pub const CODE_ADDR: u64 = 0x1000;
const PARAMS_ADDR: u64 = 0x3000;
/// Where touched pages start.
pub const TOUCH_BASE: u64 = 0x20_0000;

/// The guest's code (assembled from the listing beside each line).
const CODE: [u8; 56] = [
    0x48, 0xc7, 0xc7, 0x00, 0x00, 0x20, 0x00, //       mov rdi, 0x200000
    0x48, 0x8b, 0x0c, 0x25, 0x00, 0x30, 0x00, 0x00, // mov rcx, [0x3000]
    0x48, 0x89, 0x3f, //                               fill: mov [rdi], rdi
    0x48, 0x81, 0xc7, 0x00, 0x10, 0x00, 0x00, //       add rdi, 0x1000
    0x48, 0xff, 0xc9, //                               dec rcx
    0x75, 0xf1, //                                     jnz fill
    0x31, 0xdb, //                                     xor ebx, ebx
    0x66, 0xba, 0x10, 0x00, //                         again: mov dx, 0x10
    0xed, //                                           in eax, dx
    0x83, 0xc3, 0x01, //                               add ebx, 1
    0x01, 0xd8, //                                     add eax, ebx
    0x89, 0x04, 0x25, 0x08, 0x30, 0x00, 0x00, //       mov [0x3008], eax
    0x66, 0xba, 0x11, 0x00, //                         mov dx, 0x11
    0xef, //                                           out dx, eax
    0xeb, 0xe8, //                                     jmp again
];

/// Writes code, GDT and page tables; `touch_mib` of memory above [`TOUCH_BASE`] will be
/// written by the guest at boot.
pub fn load(mem: &mut GuestMemory, touch_mib: u64) -> Result<(), MemoryError> {
    crate::long_mode::write_tables(mem)?;
    mem.write(CODE_ADDR, &CODE)?;
    let pages = touch_mib.saturating_mul(256);
    let max_pages = (mem.size() as u64).saturating_sub(TOUCH_BASE) / 4096;
    mem.write(PARAMS_ADDR, &pages.min(max_pages).max(1).to_le_bytes())
}

pub use crate::long_mode::sregs;

pub fn regs() -> kvm_regs {
    kvm_regs { rip: CODE_ADDR, rflags: 0x2, rsp: 0x8000, ..Default::default() }
}
