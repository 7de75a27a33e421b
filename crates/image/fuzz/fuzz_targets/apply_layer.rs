//! libFuzzer target: any bytes as a layer tar (checksums fixed up so that mutated headers are
//! parsed), applied in a scratch tree. `airlock_image::fuzzing::check_one` panics if anything
//! appeared outside the layer's directory or a device node or FIFO inside it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = airlock_image::fuzzing::check_one(data);
});
