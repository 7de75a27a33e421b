//! libFuzzer target: every RPC's JSON request message and the proto3 helpers.
//! `airlock_agent::fuzzing::json_messages` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_agent::fuzzing::json_messages(data);
});
