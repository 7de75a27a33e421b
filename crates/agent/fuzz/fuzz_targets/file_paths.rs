//! libFuzzer target: the file API's query decoding, path resolution and multipart file names.
//! `airlock_agent::fuzzing::file_paths` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_agent::fuzzing::file_paths(data);
});
