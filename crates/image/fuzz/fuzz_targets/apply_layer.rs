//! libFuzzer target: any bytes as a layer tar (checksums fixed up so that mutated headers are
//! parsed), applied in a scratch tree. `airlock_image::fuzzing::check_one` panics if anything
//! appeared outside the layer's directory or a device node or FIFO inside it. The zstd
//! decoder's own panics unwind into a malformed-layer error, as they do in the image store.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: airlock_image::fuzzing::let_decoder_panics_unwind(),
    |data: &[u8]| {
        let _ = airlock_image::fuzzing::check_one(data);
    }
);
