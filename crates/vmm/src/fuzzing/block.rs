//! The block device's request queue with guest-chosen descriptors, rings and request bytes
//! (see the parent module), over a 16 KiB disk in a memfd that starts with a known pattern.
//! [`Requests`] lays well-formed requests out in guest memory, for the seeds and for the
//! tests that drive the device from a freestanding guest.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::virtio::block::{Block, Disk};
use crate::virtio::{Device, MmioTransport, TransportError};

pub const DESC_TABLE: u32 = 0x1000;
pub const AVAIL_RING: u32 = 0x2000;
pub const USED_RING: u32 = 0x3000;
/// Guest buffers (what descriptors point at, if the input is well formed).
pub const BUFFERS: u32 = 0x4000;
pub const MAX_QUEUE_SIZE: u32 = 16;
pub const DISK_BYTES: usize = 16 << 10;
pub const SERIAL: &str = "fuzz-disk";

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

/// The disk's content before the guest runs: each sector filled with its own number.
pub fn disk_pattern() -> &'static [u8] {
    static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| (0..DISK_BYTES).map(|i| (i / 512) as u8).collect())
}

/// A virtio-blk request header (type, sector).
pub fn header(type_: u32, sector: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&type_.to_le_bytes());
    bytes[8..16].copy_from_slice(&sector.to_le_bytes());
    bytes
}

/// Descriptor chains and the avail ring that offers them, in guest memory's layout.
#[derive(Debug, Default, Clone)]
pub struct Requests {
    descriptors: Vec<(u64, u32, u16, u16)>,
    heads: Vec<u16>,
}

impl Requests {
    pub fn new() -> Requests {
        Requests::default()
    }

    /// A chain of `parts` (guest address, length, device-writable), offered next.
    pub fn push(&mut self, parts: &[(u32, u32, bool)]) -> &mut Self {
        let first = self.descriptors.len() as u16;
        self.heads.push(first);
        for (i, &(address, len, writable)) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let mut flags = if writable { F_WRITE } else { 0 };
            let mut next = 0;
            if !last {
                flags |= F_NEXT;
                next = first + i as u16 + 1;
            }
            self.descriptors
                .push((u64::from(address), len, flags, next));
        }
        self
    }

    /// The descriptor table's bytes.
    pub fn table(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for &(address, len, flags, next) in &self.descriptors {
            out.extend_from_slice(&address.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&next.to_le_bytes());
        }
        out
    }

    /// The avail ring for a queue of `queue_size`: flags 0, the index, the heads, used_event.
    pub fn avail(&self, queue_size: u32) -> Vec<u8> {
        let mut out = vec![0, 0];
        out.extend_from_slice(&(self.heads.len() as u16).to_le_bytes());
        for i in 0..queue_size as usize {
            let head = self.heads.get(i).copied().unwrap_or(0);
            out.extend_from_slice(&head.to_le_bytes());
        }
        out.extend_from_slice(&[0, 0]);
        out
    }
}

fn check_error(err: &TransportError) {
    let text = err.to_string();
    assert!(text.starts_with("virtio-blk: "), "unclear error: {text}");
}

fn memfd_disk(content: &[u8]) -> File {
    // SAFETY: memfd_create takes a NUL-terminated name (a C string literal) and flags; the
    // result is checked before it is owned by a File.
    let fd = unsafe { libc::memfd_create(c"airlock-fuzz-disk".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        panic!("memfd_create: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    if let Err(err) = file.write_all_at(content, 0) {
        panic!("filling the fuzzed disk: {err}");
    }
    file
}

/// What [`block_queue`] observed, for tests that check a well-formed input was served.
#[derive(Debug)]
pub struct Observed {
    /// The disk's content afterwards.
    pub disk: Vec<u8>,
    /// Guest memory afterwards (status bytes, read buffers).
    pub memory: GuestMemoryMmap,
    /// The used ring's (id, len) elements.
    pub used: Vec<(u32, u32)>,
}

/// Input: one byte (bit 0: read-only disk; bits 1-4: queue size - 1), then guest memory in
/// order: the descriptor table (16 × 16 bytes), the avail ring (4 + 2 × 16 + 2), then buffers
/// at [`BUFFERS`]. A driver sets queue 0 up correctly and notifies it twice. Either the
/// device fails naming itself and asks for a reset, or the used index is in step; and always:
/// the disk keeps its size (nothing written past its end) and a read-only disk keeps its
/// content. (Used lengths are bounded by construction:
/// [`crate::virtio::block::request::MAX_DATA_BYTES`] plus the status.)
pub fn block_queue(data: &[u8]) -> Observed {
    let memory = super::memory();
    let (flags, rest) = data.split_at(data.len().min(1));
    let flags = flags.first().copied().unwrap_or(0);
    let read_only = flags & 1 != 0;
    let queue_size = u32::from((flags >> 1) & 0xf) + 1;
    let mut rest = rest;
    let mut put = |address: u32, len: usize| {
        let (chunk, tail) = rest.split_at(rest.len().min(len));
        let _ = memory.write_slice(chunk, GuestAddress(u64::from(address)));
        rest = tail;
    };
    put(DESC_TABLE, 16 * MAX_QUEUE_SIZE as usize);
    put(AVAIL_RING, 6 + 2 * MAX_QUEUE_SIZE as usize);
    put(BUFFERS, super::MEMORY_BYTES - BUFFERS as usize);

    let pattern = disk_pattern();
    let file = memfd_disk(pattern);
    let view = match file.try_clone() {
        Ok(view) => view,
        Err(err) => panic!("duplicating the fuzzed disk: {err}"),
    };
    let Some(disk) = Disk::from_file(file, read_only) else {
        panic!("the fuzzed disk is not a disk");
    };
    let mut transport = MmioTransport::new(Device::Block(Block::new(disk, SERIAL.into())));
    let mut writes = vec![
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
    ];
    writes.extend([(0x50, 0), (0x50, 0)]);
    for (offset, value) in writes {
        if let Err(err) = transport.write(offset, &u32::to_le_bytes(value), &memory) {
            check_error(&err);
            assert_ne!(transport.status() & 0x40, 0, "no NEEDS_RESET after {err}");
            break;
        }
    }

    let mut after = vec![0u8; DISK_BYTES + 1];
    let read = view.read_at(&mut after, 0).unwrap_or(0);
    assert_eq!(read, DISK_BYTES, "the disk changed size");
    after.truncate(DISK_BYTES);
    if read_only {
        assert!(after == pattern, "a read-only disk was written");
    }
    let mut used = Vec::new();
    let queue = &transport.queues()[0];
    if queue.ready() && queue.size().is_power_of_two() {
        let used_idx: u16 = memory
            .read_obj(GuestAddress(u64::from(USED_RING) + 2))
            .unwrap_or_default();
        assert_eq!(used_idx, queue.next_used(), "used index out of step");
        for i in 0..used_idx.min(queue.size()) {
            let element = u64::from(USED_RING) + 4 + u64::from(i) * 8;
            let id: u32 = memory.read_obj(GuestAddress(element)).unwrap_or_default();
            let len: u32 = memory
                .read_obj(GuestAddress(element + 4))
                .unwrap_or_default();
            // No bound on these: a later request's buffers may point at the used ring, and
            // the device writes where the guest said (the index is written after each).
            used.push((id, len));
        }
    }
    Observed {
        disk: after,
        memory,
        used,
    }
}

/// Where [`block_queue_seed`]'s requests put their status bytes, read data and id.
pub mod seed_layout {
    use super::BUFFERS;
    pub const STATUS: u32 = BUFFERS + 0x800;
    pub const WRITE_DATA: u32 = BUFFERS + 0x1000;
    pub const READ_DATA: u32 = BUFFERS + 0x2000;
    pub const ID: u32 = BUFFERS + 0x3000;
    /// The sector the seed writes and reads back.
    pub const SECTOR: u64 = 3;
}

/// A well-formed input: write sector 3, read it back, get the id, flush (queue size 16);
/// with `read_only`, the same against a read-only disk.
pub fn block_queue_seed(read_only: bool) -> Vec<u8> {
    use seed_layout::*;
    let queue_size = MAX_QUEUE_SIZE;
    let mut requests = Requests::new();
    requests
        .push(&[
            (BUFFERS, 16, false),
            (WRITE_DATA, 512, false),
            (STATUS, 1, true),
        ])
        .push(&[
            (BUFFERS + 0x10, 16, false),
            (READ_DATA, 512, true),
            (STATUS + 1, 1, true),
        ])
        .push(&[
            (BUFFERS + 0x20, 16, false),
            (ID, 20, true),
            (STATUS + 2, 1, true),
        ])
        .push(&[(BUFFERS + 0x30, 16, false), (STATUS + 3, 1, true)]);
    let mut seed = vec![u8::from(read_only) | (((queue_size - 1) as u8) << 1)];
    let mut table = requests.table();
    table.resize(16 * MAX_QUEUE_SIZE as usize, 0);
    seed.extend(table);
    seed.extend(requests.avail(MAX_QUEUE_SIZE));
    let mut buffers = vec![0u8; 0x1000 + 512];
    for (i, (type_, sector)) in [(1, SECTOR), (0, SECTOR), (8, 0), (4, 0)]
        .into_iter()
        .enumerate()
    {
        buffers[i * 16..i * 16 + 16].copy_from_slice(&header(type_, sector));
    }
    for (i, byte) in buffers[0x1000..].iter_mut().enumerate() {
        *byte = b"written by the seed "[i % 20];
    }
    seed.extend(buffers);
    seed
}
