//! Fuzzing of what host, VMM and agent decode from each other (property-based: proptest, so CI
//! runs it on stable in bounded time; `PROPTEST_CASES` raises the count): agent frames and
//! requests, control-socket lines and launch configurations. Any bytes give a value or a typed
//! error, never a panic or an allocation past the caps; every request carries its strings
//! through unchanged, newlines, quotes and all.

use brig_vmm_api::agent::{self, AgentRequest, ProcessRun};
use brig_vmm_api::control::{decode_line, ControlReply, ControlRequest};
use brig_vmm_api::launch::LaunchConfig;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..24).prop_map(|c| c.into_iter().collect())
}

fn process() -> impl Strategy<Value = ProcessRun> {
    (
        proptest::collection::vec(text(), 1..5),
        proptest::collection::vec((text(), text()), 0..4),
        proptest::option::of(text()),
    )
        .prop_map(|(argv, env, cwd)| ProcessRun { argv, env, cwd })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_read_as_frames_stay_within_the_cap(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut r = &bytes[..];
        while let Ok((_, data)) = agent::read_frame(&mut r) {
            prop_assert!(data.len() <= agent::MAX_FRAME);
        }
        let _ = AgentRequest::read(&mut &bytes[..]);
        let _ = agent::status_of(&bytes);
    }

    #[test]
    fn a_request_frame_of_any_json_is_a_request_or_an_error(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let frame = agent::encode_frame(agent::REQUEST, &body);
        let _ = AgentRequest::read(&mut &frame[..]);
    }

    #[test]
    fn exec_and_session_requests_carry_their_strings_unchanged(run in process(), stdin in any::<bool>()) {
        for request in [
            AgentRequest::Exec { process: run.clone(), stdin_frames: stdin, keep: None },
            AgentRequest::Session { process: run.clone(), keep: None },
            AgentRequest::Session { process: run.clone(), keep: run.argv.first().cloned() },
        ] {
            let back = AgentRequest::read(&mut &request.to_frame()[..]).expect("round trip");
            prop_assert_eq!(back, request);
        }
    }

    #[test]
    fn any_control_line_is_a_message_or_an_error(line in text()) {
        let _ = decode_line::<ControlRequest>(&line);
        let _ = decode_line::<ControlReply>(&line);
    }

    #[test]
    fn any_launch_line_is_a_config_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = LaunchConfig::read_line(&mut &bytes[..]);
    }
}
