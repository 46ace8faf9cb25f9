//! A virtio device's saved state (`brig_vmm::virtio::state`), as a snapshot file brings it:
//! any bytes decode to a state or a typed error; a state restores into a fresh device of its
//! type or is refused; what restored saves back to a state that decodes to the same.
#![no_main]

use std::sync::Arc;

use brig_vmm::virtio::balloon::Balloon;
use brig_vmm::virtio::mmio::MmioTransport;
use brig_vmm::virtio::net::Net;
use brig_vmm::virtio::rng::Rng;
use brig_vmm::virtio::state::decode;
use brig_vmm::virtio::VirtioDevice;
use libfuzzer_sys::fuzz_target;

fn fresh(device_type: u32) -> Option<Box<dyn VirtioDevice>> {
    Some(match device_type {
        4 => Box::new(Rng::default()),
        5 => Box::new(Balloon::new().0),
        1 => {
            let tap = Arc::new(std::fs::File::open("/dev/null").ok()?);
            Box::new(Net::new([6, 0, 0, 0, 0, 1], tap).0)
        }
        _ => return None,
    })
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(saved) = decode(bytes) else { return };
    let Some(device) = fresh(saved.transport.device_type) else { return };
    if let Ok(transport) = MmioTransport::restore_saved(device, saved.clone()) {
        let again = decode(&transport.save_state()).expect("a restored device's state decodes");
        assert_eq!(again.transport.device_type, saved.transport.device_type);
        assert_eq!(again.transport.queues.len(), saved.transport.queues.len());
    }
});
