//! libFuzzer target: any bytes as every request body of the daemon (native and E2B), as a
//! route path and as routing headers. `airlock_server::fuzzing::request_bodies` panics on a
//! broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_server::fuzzing::request_bodies(data);
});
