//! libFuzzer target: the block device's request queue with guest-chosen descriptors, rings,
//! request headers and queue size, over a writable or read-only disk.
//! `airlock_vmm::fuzzing::block::block_queue` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_vmm::fuzzing::block::block_queue(data);
});
