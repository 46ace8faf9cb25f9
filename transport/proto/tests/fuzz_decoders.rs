//! Fuzzing of the wire decoders (property-based: proptest, so CI runs it on stable in bounded
//! time; `PROPTEST_CASES` raises the count): whatever bytes a peer sends, decoding returns a
//! value or a typed error, never panics, never allocates past the frame, and what decodes
//! encodes back to a value that decodes the same.

use brig_proto::frame::{body_len, HEADER_BYTES};
use brig_proto::hello::{ClientHello, ServerHello, CLIENT_FIXED_BYTES};
use brig_proto::{decode, encode, Reply, Request, MAX_FRAME_BYTES};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn any_body_decodes_or_is_refused(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(request) = decode::<Request>(&body) {
            let again = encode(&request).expect("a decoded request encodes");
            let back: Request = decode(&again[HEADER_BYTES..]).expect("and decodes again");
            prop_assert_eq!(format!("{back:?}"), format!("{request:?}"));
        }
        if let Ok(reply) = decode::<Reply>(&body) {
            let again = encode(&reply).expect("a decoded reply encodes");
            let back: Reply = decode(&again[HEADER_BYTES..]).expect("and decodes again");
            prop_assert_eq!(format!("{back:?}"), format!("{reply:?}"));
        }
    }

    #[test]
    fn a_frame_header_never_admits_more_than_the_cap(header in any::<[u8; HEADER_BYTES]>()) {
        match body_len(header) {
            Ok(len) => prop_assert!(len <= MAX_FRAME_BYTES),
            Err(_) => prop_assert!(u32::from_le_bytes(header) as usize > MAX_FRAME_BYTES),
        }
    }

    #[test]
    fn any_hello_decodes_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = ClientHello::decode(&bytes);
        let _ = ServerHello::decode(&bytes);
        if let Ok(fixed) = <[u8; CLIENT_FIXED_BYTES]>::try_from(bytes.get(..CLIENT_FIXED_BYTES).unwrap_or(&[])) {
            let _ = ClientHello::parse_fixed(&fixed);
        }
    }
}
