//! What the host reads from a guest's agent and the agent from the host: frames (within their
//! cap), requests, hello answers, exit statuses and file listings. Any bytes give values or
//! typed errors, never a panic or a frame past the cap.
#![no_main]

use brig_vmm_api::agent::{self, AgentHello, AgentRequest};
use brig_vmm_api::guest_files::parse_listing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let mut r = bytes;
    while let Ok((_, data)) = agent::read_frame(&mut r) {
        assert!(data.len() <= agent::MAX_FRAME);
        let _ = serde_json::from_slice::<AgentHello>(&data);
        let _ = agent::status_of(&data);
    }
    let _ = AgentRequest::read(&mut &bytes[..]);
    let _ = parse_listing(bytes);
});
