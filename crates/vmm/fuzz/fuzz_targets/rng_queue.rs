//! libFuzzer target: the entropy device's queue with guest-chosen descriptors, rings and
//! queue size. `airlock_vmm::fuzzing::rng_queue` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_vmm::fuzzing::rng_queue(data);
});
