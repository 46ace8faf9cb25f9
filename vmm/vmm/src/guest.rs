//! The purpose-built test guest: a few instructions of 64-bit code that touch a configurable
//! amount of memory (so snapshots hold real pages), then serve requests forever over two ports:
//! it reads a request from port [`REQUEST_PORT`] and answers `request + n` (n counts answers
//! since boot) on [`REPLY_PORT`]. The counter lives in a register, so an answer after a restore
//! proves the vCPU state came back; the last answer is also kept in guest memory at
//! [`LAST_REPLY_ADDR`].
//!
//! Guest physical layout:
//! ```text
//! 0x0500  GDT: null, 64-bit code (0x08), data (0x10)
//! 0x1000  code
//! 0x3000  u64 pages to touch (written by the VMM); 0x3008 last reply
//! 0x9000  PML4 → 0xA000 PDPT → 0xB000 PD: identity map of the first 1 GiB in 2 MiB pages
//! 0x200000…  the touched pages
//! ```

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use crate::memory::{GuestMemory, MemoryError};

pub const REQUEST_PORT: u16 = 0x10;
pub const REPLY_PORT: u16 = 0x11;
pub const LAST_REPLY_ADDR: u64 = 0x3008;
const GDT_ADDR: u64 = 0x500;
pub const CODE_ADDR: u64 = 0x1000;
const PARAMS_ADDR: u64 = 0x3000;
const PML4_ADDR: u64 = 0x9000;
const PDPT_ADDR: u64 = 0xA000;
const PD_ADDR: u64 = 0xB000;
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

fn segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: 0,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        ..Default::default()
    }
}

/// Writes code, GDT and page tables; `touch_mib` of memory above [`TOUCH_BASE`] will be
/// written by the guest at boot.
pub fn load(mem: &mut GuestMemory, touch_mib: u64) -> Result<(), MemoryError> {
    let gdt: [u64; 3] = [0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff];
    let gdt_bytes: Vec<u8> = gdt.iter().flat_map(|e| e.to_le_bytes()).collect();
    mem.write(GDT_ADDR, &gdt_bytes)?;
    mem.write(CODE_ADDR, &CODE)?;
    let pages = touch_mib * 256;
    let max_pages = (mem.size() as u64).saturating_sub(TOUCH_BASE) / 4096;
    mem.write(PARAMS_ADDR, &pages.min(max_pages).max(1).to_le_bytes())?;
    mem.write(PML4_ADDR, &(PDPT_ADDR | 0x3).to_le_bytes())?;
    mem.write(PDPT_ADDR, &(PD_ADDR | 0x3).to_le_bytes())?;
    let pd: Vec<u8> = (0..512u64).flat_map(|i| ((i << 21) | 0x83).to_le_bytes()).collect(); // present|rw|2M
    mem.write(PD_ADDR, &pd)
}

/// Long mode, paging on, CPL0, 64-bit code segment.
pub fn sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = segment(0x08, true);
    let data = segment(0x10, false);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = 23;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = 1 << 5; // PAE
    sregs.cr0 = 1 | (1 << 31); // PE | PG
    sregs.efer = (1 << 8) | (1 << 10); // LME | LMA
    sregs
}

pub fn regs() -> kvm_regs {
    kvm_regs { rip: CODE_ADDR, rflags: 0x2, rsp: 0x8000, ..Default::default() }
}
