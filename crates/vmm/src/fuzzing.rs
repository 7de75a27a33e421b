//! What the cargo-fuzz targets (crates/vmm/fuzz) run, kept here so that `tests/fuzz.rs`
//! replays the same invariants on stable Rust without libFuzzer. No KVM is involved: the
//! transport and the devices are driven directly with guest-chosen register writes and
//! guest-chosen memory (descriptor tables, rings, buffers). Each function panics when an
//! invariant breaks; a guest error must come back as a [`TransportError`] naming the device.

pub mod block;
pub mod vsock;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest_code::queue_layout;
use crate::virtio::{Device, MmioTransport, Rng, TransportError};

/// The fuzzed guest's RAM: enough to hold the rings and some buffers.
pub const MEMORY_BYTES: usize = 0x20000;

fn memory() -> GuestMemoryMmap {
    match GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEMORY_BYTES)]) {
        Ok(memory) => memory,
        Err(err) => panic!("allocating the fuzz guest's memory: {err}"),
    }
}

fn read32(transport: &MmioTransport, offset: u64) -> u32 {
    let mut out = [0u8; 4];
    transport.read(offset, &mut out);
    u32::from_le_bytes(out)
}

fn check_error(err: &TransportError) {
    let text = err.to_string();
    assert!(text.starts_with("virtio-rng: "), "unclear error: {text}");
}

/// Register accesses from the second half of `data`: each 7 bytes are (kind, offset u16 LE,
/// value u32 LE); an even kind writes with a width of 1, 2 or 4 bytes, an odd one reads. The
/// first half is guest memory from the descriptor table on, so notifications see hostile
/// rings. Identity registers never change, FEATURES_OK never sticks without VERSION_1, and
/// after a failure the device says it needs a reset.
pub fn mmio_transport(data: &[u8]) {
    let memory = memory();
    let (ram, ops) = data.split_at(data.len() / 2);
    let _ = memory.write_slice(ram, GuestAddress(u64::from(queue_layout::DESC_TABLE)));
    let mut transport = MmioTransport::new(Device::Rng(Rng::new()));
    for op in ops.chunks_exact(7) {
        let offset = u64::from(u16::from_le_bytes([op[1], op[2]])) & 0xfff;
        let value = [op[3], op[4], op[5], op[6]];
        if op[0] % 2 == 0 {
            let width = [1usize, 2, 4, 4][usize::from(op[0] / 2 % 4)];
            if let Err(err) = transport.write(offset, &value[..width], &memory) {
                check_error(&err);
                assert_ne!(
                    read32(&transport, 0x70) & 0x40,
                    0,
                    "no NEEDS_RESET after {err}"
                );
                return;
            }
        } else {
            let mut out = [0u8; 4];
            transport.read(offset, &mut out);
        }
        assert_eq!(read32(&transport, 0x000), 0x7472_6976);
        assert_eq!(read32(&transport, 0x004), 2);
        assert_eq!(read32(&transport, 0x008), 4);
        let state = transport.state();
        if state.status & 0x8 != 0 {
            assert_ne!(
                state.driver_features & 1 << 32,
                0,
                "FEATURES_OK without VERSION_1"
            );
        }
    }
}

/// A driver that sets queue 0 up correctly, then guest-chosen content in the descriptor
/// table, the avail ring (flags, index, entries) and the used ring, and a queue size from
/// the input, then a notification. Either the device used some chains (the used index in
/// guest memory matches the device's count, each within the queue size) or it failed with
/// an error naming the device.
pub fn rng_queue(data: &[u8]) {
    use queue_layout::*;
    let memory = memory();
    let (size, rest) = data.split_at(data.len().min(1));
    let queue_size = size.first().map_or(QUEUE_SIZE, |&s| u32::from(s) + 1);
    let (table, avail) = rest.split_at(rest.len().min(16 * queue_size as usize));
    let _ = memory.write_slice(table, GuestAddress(u64::from(DESC_TABLE)));
    let _ = memory.write_slice(avail, GuestAddress(u64::from(AVAIL_RING)));
    let mut transport = MmioTransport::new(Device::Rng(Rng::new()));
    for (offset, value) in [
        (0x70, 3),
        (0x24, 1),
        (0x20, 1),
        (0x70, 0xb),
        (0x30, 0),
        (0x38, queue_size),
        (0x80, DESC_TABLE),
        (0x90, AVAIL_RING),
        (0xa0, USED_RING),
        (0x44, 1),
        (0x70, 0xf),
        (0x50, 0),
    ] {
        if let Err(err) = transport.write(offset, &u32::to_le_bytes(value), &memory) {
            check_error(&err);
            return;
        }
    }
    let queue = &transport.queues()[0];
    let used_idx: u16 = memory
        .read_obj(GuestAddress(u64::from(USED_RING) + 2))
        .unwrap_or_default();
    if queue.ready() && queue.size().is_power_of_two() {
        assert_eq!(used_idx, queue.next_used(), "used index out of step");
    }
}

/// A small deterministic generator for the stable-Rust replay (xorshift64*).
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Mutates `input` in place: flips, overwrites with interesting values, inserts, cuts.
    pub fn mutate(&mut self, input: &mut Vec<u8>) {
        const INTERESTING: [u32; 8] = [0, 1, 2, 0xf, 0x40, 0xffff, 0x8000_0000, 0xffff_ffff];
        for _ in 0..=self.below(4) {
            let len = input.len();
            match self.below(5) {
                0 if len > 0 => {
                    let at = self.below(len);
                    input[at] ^= 1 << self.below(8);
                }
                1 if len >= 4 => {
                    let at = self.below(len - 3);
                    let value = INTERESTING[self.below(INTERESTING.len())].to_le_bytes();
                    input[at..at + 4].copy_from_slice(&value);
                }
                2 if len < 4096 => {
                    let at = self.below(len + 1);
                    input.insert(at, self.next_u64() as u8);
                }
                3 if len > 0 => input.truncate(self.below(len)),
                _ => input.push(self.next_u64() as u8),
            }
        }
    }
}

/// A well-formed input for [`rng_queue`]: queue size 8, one writable 64-byte buffer.
pub fn rng_queue_seed() -> Vec<u8> {
    use queue_layout::*;
    let mut seed = vec![(QUEUE_SIZE - 1) as u8];
    let mut table = vec![0u8; 16 * QUEUE_SIZE as usize];
    table[0..8].copy_from_slice(&u64::from(BUFFER).to_le_bytes());
    table[8..12].copy_from_slice(&BUFFER_LEN.to_le_bytes());
    table[12..14].copy_from_slice(&2u16.to_le_bytes());
    seed.extend_from_slice(&table);
    seed.extend_from_slice(&[0, 0, 1, 0, 0, 0]); // flags 0, idx 1, ring[0] = 0
    seed
}
