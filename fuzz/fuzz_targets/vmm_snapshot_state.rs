//! The Linux VM snapshot parser (`brig_vmm::linux_snapshot::parse_state`): header, version,
//! sections and every device's saved state. The input gets its checksum appended, so the
//! fuzzer reaches the sections instead of stopping at the digest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

fuzz_target!(|body: &[u8]| {
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(&Sha256::digest(body));
    let _ = brig_vmm::linux_snapshot::parse_state(&bytes);
    // As it came, too (a wrong digest is a typed error).
    let _ = brig_vmm::linux_snapshot::parse_state(body);
});
