//! The VMM's control socket and launch line (`brig_vmm_api::control`, `launch`): any line is a
//! request, a reply, a launch configuration or a typed error.
#![no_main]

use brig_vmm_api::control::{decode_line, ControlReply, ControlRequest};
use brig_vmm_api::launch::LaunchConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(line) = std::str::from_utf8(bytes) else { return };
    let _ = decode_line::<ControlRequest>(line);
    let _ = decode_line::<ControlReply>(line);
    let _ = LaunchConfig::read_line(&mut std::io::Cursor::new(bytes));
});
