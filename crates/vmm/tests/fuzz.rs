//! Bounded, deterministic mutation fuzzing of the virtio-mmio transport and the entropy,
//! vsock and block devices' queue handling on stable Rust, through the invariants of
//! `airlock_vmm::fuzzing`, which the cargo-fuzz targets in `crates/vmm/fuzz` check too. Each
//! target first replays the inputs kept in `fuzz/regressions/<target>/`.
//! `AIRLOCK_FUZZ_ITERATIONS` bounds the run (default 3000 per target); `AIRLOCK_FUZZ_SEED`
//! picks another deterministic sequence.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use airlock_vmm::fuzzing::{XorShift, block, mmio_transport, rng_queue, rng_queue_seed, vsock};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fuzz(target: &str, check: fn(&[u8]), seeds: &[Vec<u8>]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut kept: Vec<_> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    kept.sort();
    for path in kept {
        let input = std::fs::read(&path).unwrap();
        if std::panic::catch_unwind(|| check(&input)).is_err() {
            panic!(
                "{target}: the kept input {} breaks an invariant again",
                path.display()
            );
        }
    }
    let iterations = env_number("AIRLOCK_FUZZ_ITERATIONS", 3000);
    let mut rng = XorShift::new(env_number("AIRLOCK_FUZZ_SEED", 0x5eed_f00d) ^ target.len() as u64);
    let mut input = seeds[0].clone();
    for i in 0..iterations {
        if i % 4 == 0 {
            input = seeds[rng.below(seeds.len())].clone();
        }
        rng.mutate(&mut input);
        if std::panic::catch_unwind(|| check(&input)).is_err() {
            panic!("{target}: iteration {i} breaks an invariant; input {input:02x?}");
        }
    }
}

#[test]
fn test_fuzz_mmio_transport_register_writes_hold_invariants() {
    // A seed: guest memory holding a valid queue, then the driver's set-up writes.
    let mut ops = Vec::new();
    for (offset, value) in [
        (0x70u16, 3u32),
        (0x24, 1),
        (0x20, 1),
        (0x70, 0xb),
        (0x38, 8),
    ] {
        ops.push(4); // a 4-byte write
        ops.extend_from_slice(&offset.to_le_bytes());
        ops.extend_from_slice(&value.to_le_bytes());
    }
    let mut seed = rng_queue_seed();
    seed.resize(ops.len(), 0);
    seed.extend_from_slice(&ops);
    fuzz("mmio_transport", mmio_transport, &[seed, vec![0; 64]]);
}

#[test]
fn test_fuzz_rng_queue_guest_descriptors_hold_invariants() {
    fuzz("rng_queue", rng_queue, &[rng_queue_seed()]);
}

#[test]
fn test_rng_queue_seed_is_served() {
    // The seed is a valid request; if this stops being used, the fuzzing above is weaker.
    use airlock_vmm::guest_code::queue_layout::*;
    use airlock_vmm::virtio::{Device, MmioTransport, Rng};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
    let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x20000)]).unwrap();
    let seed = rng_queue_seed();
    memory
        .write_slice(&seed[1..1 + 128], GuestAddress(u64::from(DESC_TABLE)))
        .unwrap();
    memory
        .write_slice(&seed[129..], GuestAddress(u64::from(AVAIL_RING)))
        .unwrap();
    let mut transport = MmioTransport::new(Device::Rng(Rng::new()));
    for (offset, value) in [
        (0x70, 3),
        (0x24, 1),
        (0x20, 1),
        (0x70, 0xb),
        (0x38, 8),
        (0x80, DESC_TABLE),
        (0x90, AVAIL_RING),
        (0xa0, USED_RING),
        (0x44, 1),
        (0x70, 0xf),
    ] {
        transport
            .write(offset, &u32::to_le_bytes(value), &memory)
            .unwrap();
    }
    let action = transport.write(0x50, &0u32.to_le_bytes(), &memory).unwrap();
    assert_eq!(action, airlock_vmm::virtio::mmio::MmioAction::Interrupt);
    let used_len: u32 = memory
        .read_obj(GuestAddress(u64::from(USED_RING) + 8))
        .unwrap();
    assert_eq!(used_len, BUFFER_LEN);
}

fn vsock_check(input: &[u8]) {
    vsock::vsock_queues(input);
}

#[test]
fn test_fuzz_vsock_queues_guest_packets_hold_invariants() {
    fuzz(
        "vsock_queues",
        vsock_check,
        &[vsock::vsock_queues_seed(), vsock::vsock_forward_seed()],
    );
}

#[test]
fn test_vsock_forward_seed_connects_the_forwarded_port_and_resets_the_other() {
    // The seed is a valid exchange; if this stops being served, the fuzzing above is weaker.
    let observed = vsock::vsock_queues(&vsock::vsock_forward_seed());
    assert_eq!(observed.forward_connections, 1);
    assert_eq!(String::from_utf8_lossy(&observed.forwarded), "GET /");
    let ops: Vec<(u16, u32, u32)> = observed
        .to_guest
        .iter()
        .map(|h| (h.op, h.src_port, h.dst_port))
        .collect();
    // The host's own request, the forwarded port's response, the other port's reset.
    assert_eq!(
        ops,
        vec![
            (1, vsock::HOST_PORT, vsock::GUEST_PORT),
            (2, vsock::FORWARD_PORT, vsock::GUEST_SOURCE_PORT),
            (3, vsock::UNFORWARDED_PORT, vsock::GUEST_SOURCE_PORT),
        ]
    );
}

#[test]
fn test_vsock_queues_seed_connects_and_passes_data_both_ways() {
    // The seed is a valid exchange; if this stops being served, the fuzzing above is weaker.
    let observed = vsock::vsock_queues(&vsock::vsock_queues_seed());
    assert_eq!(
        String::from_utf8_lossy(&observed.host_received),
        format!("OK {}\nhello", vsock::HOST_PORT)
    );
    let ops: Vec<(u16, u32, u32)> = observed
        .to_guest
        .iter()
        .map(|h| (h.op, h.dst_port, h.fwd_cnt))
        .collect();
    // The host's connection request, then a credit update for the 5 bytes passed on.
    assert_eq!(
        ops,
        vec![(1, vsock::GUEST_PORT, 0), (6, vsock::GUEST_PORT, 5)]
    );
}

fn block_check(input: &[u8]) {
    block::block_queue(input);
}

#[test]
fn test_fuzz_block_queue_guest_requests_hold_invariants() {
    fuzz(
        "block_queue",
        block_check,
        &[
            block::block_queue_seed(false),
            block::block_queue_seed(true),
        ],
    );
}

fn seed_statuses(observed: &block::Observed) -> [u8; 4] {
    use vm_memory::{Bytes, GuestAddress};
    let mut statuses = [0xffu8; 4];
    observed
        .memory
        .read_slice(
            &mut statuses,
            GuestAddress(u64::from(block::seed_layout::STATUS)),
        )
        .unwrap();
    statuses
}

fn seed_read_back(observed: &block::Observed) -> Vec<u8> {
    use vm_memory::{Bytes, GuestAddress};
    let mut data = vec![0u8; 512];
    observed
        .memory
        .read_slice(
            &mut data,
            GuestAddress(u64::from(block::seed_layout::READ_DATA)),
        )
        .unwrap();
    data
}

#[test]
fn test_block_queue_seed_writes_reads_back_and_names_the_disk() {
    // The seed is a valid exchange; if this stops being served, the fuzzing above is weaker.
    use block::seed_layout::*;
    let observed = block::block_queue(&block::block_queue_seed(false));
    assert_eq!(seed_statuses(&observed), [0, 0, 0, 0]);
    assert_eq!(observed.used, vec![(0, 1), (3, 513), (6, 21), (9, 1)]);
    let sector = SECTOR as usize * 512;
    let written: Vec<u8> = (0..512).map(|i| b"written by the seed "[i % 20]).collect();
    assert_eq!(&observed.disk[sector..sector + 512], &written[..]);
    assert_eq!(seed_read_back(&observed), written);
    // Every other sector keeps its number.
    let pattern = block::disk_pattern();
    assert_eq!(&observed.disk[..sector], &pattern[..sector]);
    assert_eq!(&observed.disk[sector + 512..], &pattern[sector + 512..]);
    use vm_memory::{Bytes, GuestAddress};
    let mut id = [0u8; 20];
    observed
        .memory
        .read_slice(&mut id, GuestAddress(u64::from(ID)))
        .unwrap();
    assert_eq!(&id[..10], b"fuzz-disk\0");
}

#[test]
fn test_block_queue_seed_on_read_only_disk_refuses_the_write_only() {
    let observed = block::block_queue(&block::block_queue_seed(true));
    // VIRTIO_BLK_S_IOERR for the write; the read, id and flush succeed.
    assert_eq!(seed_statuses(&observed), [1, 0, 0, 0]);
    assert_eq!(observed.disk, block::disk_pattern());
    let sector = block::seed_layout::SECTOR as usize;
    assert_eq!(seed_read_back(&observed), vec![sector as u8; 512]);
}
