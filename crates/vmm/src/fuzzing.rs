//! What the cargo-fuzz targets (crates/vmm/fuzz) run, kept here so that `tests/fuzz.rs`
//! replays the same invariants on stable Rust without libFuzzer. No KVM is involved: the
//! transport and the devices are driven directly with guest-chosen register writes and
//! guest-chosen memory (descriptor tables, rings, buffers).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest_code::queue_layout;
use crate::virtio::{Device, MMIO_BASE, MmioTransport, Rng};

/// The fuzzed guest's RAM: enough to hold the rings and some buffers.
pub const MEMORY_BYTES: usize = 0x20000;

fn memory() -> Option<GuestMemoryMmap> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEMORY_BYTES)]).ok()
}

/// Register accesses from `data`: each 7 bytes are (kind, offset u16 LE, value u32 LE);
/// an even kind writes, an odd one reads. The transport must never panic.
pub fn mmio_transport(data: &[u8]) {
    let Some(memory) = memory() else {
        return;
    };
    // Guest memory content comes from the input too, so notifications see hostile rings.
    let (ram, ops) = data.split_at(data.len() / 2);
    let _ = memory.write_slice(ram, GuestAddress(u64::from(queue_layout::DESC_TABLE)));
    let mut transport = MmioTransport::new(Device::Rng(Rng::new()));
    for op in ops.chunks_exact(7) {
        let offset = u64::from(u16::from_le_bytes([op[1], op[2]])) & 0xfff;
        let value = [op[3], op[4], op[5], op[6]];
        if op[0] % 2 == 0 {
            let width = [1usize, 2, 4, 4][usize::from(op[0] / 2 % 4)];
            if transport.write(offset, &value[..width], &memory).is_err() {
                // The VM would end here; the host side must still answer reads.
                let mut out = [0u8; 4];
                transport.read(0x70, &mut out);
                return;
            }
        } else {
            let mut out = [0u8; 4];
            transport.read(offset, &mut out);
        }
    }
    let _ = transport.state();
}

/// A driver that sets queue 0 up correctly, then a descriptor table, avail ring and used
/// ring filled from `data` (guest-chosen descriptors: addresses, lengths, flags, next
/// indices, the avail index), then a notification. It must end in `Ok` or a clear error,
/// and never write outside guest memory or panic.
pub fn rng_queue(data: &[u8]) -> Result<(), String> {
    use queue_layout::*;
    let Some(memory) = memory() else {
        return Ok(());
    };
    let (table, rest) = data.split_at(data.len().min(16 * QUEUE_SIZE as usize));
    let (avail, size) = rest.split_at(rest.len().saturating_sub(1));
    let _ = memory.write_slice(table, GuestAddress(u64::from(DESC_TABLE)));
    let _ = memory.write_slice(avail, GuestAddress(u64::from(AVAIL_RING)));
    let queue_size = size.first().map_or(QUEUE_SIZE, |&s| u32::from(s));
    let mut transport = MmioTransport::new(Device::Rng(Rng::new()));
    let mut write = |offset: u64, value: u32| {
        transport
            .write(offset, &value.to_le_bytes(), &memory)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
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
        write(offset, value)?;
    }
    let _ = MMIO_BASE;
    Ok(())
}
