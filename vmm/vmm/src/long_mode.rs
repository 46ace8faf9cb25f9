//! 64-bit long mode for a guest entered directly (no firmware): a flat GDT and identity page
//! tables for the first 1 GiB in 2 MiB pages, and the segment and control registers that use
//! them. The Linux boot path and the purpose-built test guest both start here.
//!
//! ```text
//! 0x0500  GDT: null, 64-bit code (0x08), data (0x10)
//! 0x9000  PML4 → 0xA000 PDPT → 0xB000 PD: identity map of the first 1 GiB in 2 MiB pages
//! ```

use kvm_bindings::{kvm_segment, kvm_sregs};

use crate::memory::{GuestMemory, MemoryError};

const GDT_ADDR: u64 = 0x500;
const PML4_ADDR: u64 = 0x9000;
const PDPT_ADDR: u64 = 0xA000;
const PD_ADDR: u64 = 0xB000;

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

/// Writes the GDT and the page tables.
pub fn write_tables(mem: &mut GuestMemory) -> Result<(), MemoryError> {
    let gdt: [u64; 3] = [0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff];
    let gdt_bytes: Vec<u8> = gdt.iter().flat_map(|e| e.to_le_bytes()).collect();
    mem.write(GDT_ADDR, &gdt_bytes)?;
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
