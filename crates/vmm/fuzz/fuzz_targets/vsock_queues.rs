//! libFuzzer target: the vsock device's transmit and receive queues with guest-chosen
//! descriptors, rings and packets, a host connection in flight and a forwarded host port.
//! `airlock_vmm::fuzzing::vsock::vsock_queues` panics on a broken invariant.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    airlock_vmm::fuzzing::vsock::vsock_queues(data);
});
