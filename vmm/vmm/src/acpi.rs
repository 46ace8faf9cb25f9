//! ACPI tables that tell Linux about the machine: a hardware-reduced FADT, a MADT with the
//! local APIC and IOAPIC, and a DSDT describing the console UART (`PNP0501`) and each
//! virtio-mmio device as `LNRO0005` with its window and interrupt (Debian's kernels ignore `virtio_mmio.device=` on the command line;
//! QEMU's microvm and Firecracker describe devices this way too).
//!
//! ```text
//! 0xe0000  RSDP → 0xe0040 XSDT → FADT (0xe0100) → DSDT (0xe1000); MADT (0xe0800)
//! ```

use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;

use crate::memory::{GuestMemory, MemoryError};

pub const RSDP_ADDR: u64 = 0xe_0000;
const XSDT_ADDR: u64 = 0xe_0040;
const FADT_ADDR: u64 = 0xe_0100;
const MADT_ADDR: u64 = 0xe_0800;
const DSDT_ADDR: u64 = 0xe_1000;
/// End of the area the tables may use (the legacy BIOS area).
const TABLES_END: u64 = 0xf_0000;
const OEM_ID: [u8; 6] = *b"BRIGVM";
const IOAPIC_ADDR: u32 = 0xfec0_0000;
const LAPIC_ADDR: u32 = 0xfee0_0000;

/// A virtio-mmio device as the guest should find it.
#[derive(Debug, Clone, Copy)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    pub gsi: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("ACPI tables are larger than the area kept for them")]
    TooLarge,
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

fn bytes(t: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    t.to_aml_bytes(&mut out);
    out
}

/// The 36-byte ACPI 2.0 RSDP pointing at the XSDT.
fn rsdp(xsdt: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(36);
    r.extend_from_slice(b"RSD PTR ");
    r.push(0); // checksum of the first 20 bytes
    r.extend_from_slice(&OEM_ID);
    r.push(2); // revision
    r.extend_from_slice(&0u32.to_le_bytes()); // no RSDT
    r.extend_from_slice(&36u32.to_le_bytes());
    r.extend_from_slice(&xsdt.to_le_bytes());
    r.push(0); // extended checksum
    r.extend_from_slice(&[0; 3]);
    let sum = |b: &[u8]| b.iter().fold(0u8, |a, x| a.wrapping_add(*x));
    r[8] = 0u8.wrapping_sub(sum(&r[..20]));
    r[32] = 0u8.wrapping_sub(sum(&r));
    r
}

fn dsdt(devices: &[MmioDevice]) -> Vec<u8> {
    let mut body = Vec::new();
    // COM1, so a hardware-reduced guest (no legacy PIC, no ISA IRQ map) routes IRQ 4 through
    // the IOAPIC for the console's transmit interrupts.
    let com_hid = aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0501"));
    let com_uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let com_io = aml::IO::new(0x3f8, 0x3f8, 0, 8);
    let com_irq = aml::Interrupt::new(true, true, false, false, 4);
    let com_res = aml::ResourceTemplate::new(vec![&com_io, &com_irq]);
    let com_crs = aml::Name::new("_CRS".into(), &com_res);
    aml::Device::new("_SB_.COM1".into(), vec![&com_hid, &com_uid, &com_crs])
        .to_aml_bytes(&mut body);
    let uids: Vec<u32> = (0..devices.len() as u32).collect();
    for (i, dev) in devices.iter().enumerate() {
        let mem = aml::Memory32Fixed::new(true, dev.base as u32, dev.size as u32);
        let irq = aml::Interrupt::new(true, true, false, false, dev.gsi);
        let crs = aml::ResourceTemplate::new(vec![&mem, &irq]);
        let hid = aml::Name::new("_HID".into(), &"LNRO0005");
        let uid = aml::Name::new("_UID".into(), &uids[i]);
        let cca = aml::Name::new("_CCA".into(), &aml::ONE);
        let crs = aml::Name::new("_CRS".into(), &crs);
        let path = format!("_SB_.V{i:03X}");
        aml::Device::new(path.as_str().into(), vec![&hid, &uid, &cca, &crs])
            .to_aml_bytes(&mut body);
    }
    let mut table = Sdt::new(*b"DSDT", 36, 6, OEM_ID, *b"BRIGDSDT", 1);
    table.append_slice(&body);
    table.as_slice().to_vec()
}

/// Writes the tables for `devices` and `vcpus` processors (APIC ids 0..) into guest memory;
/// returns the RSDP's address.
pub fn write_tables(
    mem: &mut GuestMemory,
    devices: &[MmioDevice],
    vcpus: usize,
) -> Result<u64, AcpiError> {
    let fadt = FADTBuilder::new(OEM_ID, *b"BRIGFADT", 1)
        .dsdt_64(DSDT_ADDR)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .finalize();
    let mut madt =
        MADT::new(OEM_ID, *b"BRIGMADT", 1, LocalInterruptController::Address(LAPIC_ADDR));
    for id in 0..vcpus.min(255) as u8 {
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    madt.add_structure(IoApic::new(0, IOAPIC_ADDR, 0));
    let mut xsdt = XSDT::new(OEM_ID, *b"BRIGXSDT", 1);
    xsdt.add_entry(FADT_ADDR);
    xsdt.add_entry(MADT_ADDR);
    let dsdt = dsdt(devices);
    let placed = [
        (RSDP_ADDR, rsdp(XSDT_ADDR), XSDT_ADDR),
        (XSDT_ADDR, bytes(&xsdt), FADT_ADDR),
        (FADT_ADDR, bytes(&fadt), MADT_ADDR),
        (MADT_ADDR, bytes(&madt), DSDT_ADDR),
        (DSDT_ADDR, dsdt, TABLES_END),
    ];
    for (addr, table, limit) in placed {
        if addr + table.len() as u64 > limit {
            return Err(AcpiError::TooLarge);
        }
        mem.write(addr, &table)?;
    }
    Ok(RSDP_ADDR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_checksum_to_zero_and_name_the_devices() {
        let mut mem = GuestMemory::anonymous(2 << 20).expect("memory");
        let devices = [MmioDevice { base: 0xd100_0000, size: 0x1000, gsi: 5 }];
        assert_eq!(write_tables(&mut mem, &devices, 2).expect("tables"), RSDP_ADDR);
        let read = |addr: u64, len: usize| {
            let mut b = vec![0u8; len];
            mem.read(addr, &mut b).expect("read");
            b
        };
        let sum = |b: &[u8]| b.iter().fold(0u8, |a, x| a.wrapping_add(*x));
        let rsdp = read(RSDP_ADDR, 36);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(sum(&rsdp[..20]), 0);
        assert_eq!(sum(&rsdp), 0);
        for (addr, sig) in
            [(XSDT_ADDR, b"XSDT"), (FADT_ADDR, b"FACP"), (MADT_ADDR, b"APIC"), (DSDT_ADDR, b"DSDT")]
        {
            let head = read(addr, 8);
            assert_eq!(&head[..4], sig);
            let len = u32::from_le_bytes(head[4..8].try_into().expect("4")) as usize;
            assert_eq!(sum(&read(addr, len)), 0, "{} checksum", String::from_utf8_lossy(sig));
        }
        let dsdt_len = u32::from_le_bytes(read(DSDT_ADDR + 4, 4).try_into().expect("4")) as usize;
        let dsdt = read(DSDT_ADDR, dsdt_len);
        assert!(dsdt.windows(8).any(|w| w == b"LNRO0005"), "no virtio-mmio device in the DSDT");
        // Two processor local APIC entries (type 0, length 8), ids 0 and 1, both enabled.
        let madt_len = u32::from_le_bytes(read(MADT_ADDR + 4, 4).try_into().expect("4")) as usize;
        let madt = read(MADT_ADDR, madt_len);
        let mut at = 44;
        let mut apics = Vec::new();
        while at + 2 <= madt.len() {
            let (kind, len) = (madt[at], madt[at + 1] as usize);
            if kind == 0 {
                apics.push((madt[at + 3], madt[at + 4] & 1));
            }
            at += len.max(2);
        }
        assert_eq!(apics, vec![(0, 1), (1, 1)]);
    }
}
