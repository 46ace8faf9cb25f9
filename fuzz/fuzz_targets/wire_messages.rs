//! What brigd decodes from a client and a client from brigd (`brig_proto`): any frame body is
//! a request, a reply or a typed error; a frame header past the cap is refused.
#![no_main]

use brig_proto::frame::{body_len, decode, HEADER_BYTES};
use brig_proto::{Reply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Some(head) = bytes.get(..HEADER_BYTES) {
        let head: [u8; HEADER_BYTES] = head.try_into().expect("header length");
        if let Ok(len) = body_len(head) {
            assert!(len <= brig_proto::frame::MAX_FRAME_BYTES);
        }
    }
    if let Ok(request) = decode::<Request>(bytes) {
        let again = postcard::to_allocvec(&request).expect("a decoded request encodes");
        assert_eq!(decode::<Request>(&again).expect("and decodes"), request);
    }
    let _ = decode::<Reply>(bytes);
});
