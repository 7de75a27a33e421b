//! libFuzzer target: virtio-mmio register accesses of any width over hostile guest memory.
//! `airlock_vmm::fuzzing::mmio_transport` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_vmm::fuzzing::mmio_transport(data);
});
