//! libFuzzer target: any bytes through the policy parser, validator, compiler, explainer and
//! prover. `airlock_policy::fuzzing::check_one` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_policy::fuzzing::check_one(data);
});
