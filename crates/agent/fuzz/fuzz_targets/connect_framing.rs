//! libFuzzer target: the Connect envelope framing (arbitrary bytes, cut into arbitrary pieces).
//! `airlock_agent::fuzzing::connect_framing` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_agent::fuzzing::connect_framing(data);
});
