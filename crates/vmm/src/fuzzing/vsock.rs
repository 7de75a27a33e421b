//! The vsock device's queues with guest-chosen descriptors, rings and packets (see the parent
//! module). A host socket pair is attached first, so the device has a connection in flight
//! whose packets the guest's input may answer, feed or corrupt; and host port
//! [`FORWARD_PORT`] is forwarded to a Unix listener, so the guest's own requests reach a
//! forwarded port or (any other) an unforwarded one.

use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::virtio::vsock::{self, Header};
use crate::virtio::{Device, Forward, MmioTransport, TransportError, Vsock};

pub const GUEST_CID: u64 = 3;
pub const GUEST_PORT: u32 = 49983;
/// The first host port the device hands out (its `CONNECT` counter starts there).
pub const HOST_PORT: u32 = 1 << 30;
/// The host port forwarded to a listener; the seeds' unforwarded one.
pub const FORWARD_PORT: u32 = 3128;
pub const UNFORWARDED_PORT: u32 = 8080;
/// The guest's source port in the forward seed.
pub const GUEST_SOURCE_PORT: u32 = 50_000;
pub const QUEUE_SIZE: u32 = 8;
/// Guest buffers (what descriptors point at, if the input is well formed).
pub const BUFFERS: u32 = 0x10000;

/// Queue q's descriptor table; its avail ring is 4 KiB above, its used ring 8 KiB above.
pub fn queue_base(q: u32) -> u32 {
    0x1000 + q * 0x3000
}

fn check_error(err: &TransportError) {
    let text = err.to_string();
    assert!(text.starts_with("virtio-vsock: "), "unclear error: {text}");
}

/// Sets up the three queues (a correct driver's sequence); `false` on a device error.
fn set_up(transport: &mut MmioTransport, memory: &GuestMemoryMmap, sizes: [u32; 3]) -> bool {
    let mut writes = vec![(0x70, 3), (0x24, 1), (0x20, 1), (0x70, 0xb)];
    for q in 0..3u32 {
        let base = queue_base(q);
        writes.extend_from_slice(&[
            (0x30, q),
            (0x38, sizes[q as usize]),
            (0x80, base),
            (0x90, base + 0x1000),
            (0xa0, base + 0x2000),
            (0x44, 1),
        ]);
    }
    writes.push((0x70, 0xf));
    for (offset, value) in writes {
        if let Err(err) = transport.write(offset, &u32::to_le_bytes(value), memory) {
            check_error(&err);
            return false;
        }
    }
    true
}

fn notify(transport: &mut MmioTransport, memory: &GuestMemoryMmap, queue: u32) -> bool {
    match transport.write(0x50, &queue.to_le_bytes(), memory) {
        Ok(_) => true,
        Err(err) => {
            check_error(&err);
            assert_ne!(transport.status() & 0x40, 0, "no NEEDS_RESET after {err}");
            false
        }
    }
}

/// What [`vsock_queues`] observed, for tests that check a well-formed input was served.
#[derive(Debug, Default)]
pub struct Observed {
    /// Bytes the host socket received.
    pub host_received: Vec<u8>,
    /// Packets the device put in the guest's receive buffers, in order.
    pub to_guest: Vec<Header>,
    /// Bytes the forward's listener received, over all the connections the VMM made to it.
    pub forwarded: Vec<u8>,
    /// Connections the VMM made to the forward's listener.
    pub forward_connections: usize,
}

/// A fresh listener for the forward, at a path of its own (fuzz threads run side by side).
fn forward_listener() -> (UnixListener, std::path::PathBuf) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "airlock-fuzz-vsock-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    match UnixListener::bind(&path) {
        Ok(listener) => (listener, path),
        Err(err) => panic!("a listener for the fuzzed forward: {err}"),
    }
}

/// Accepts what the VMM connected to the forward and reads what it wrote (all non-blocking).
fn drain_forward(listener: &UnixListener, observed: &mut Observed) {
    let _ = listener.set_nonblocking(true);
    while let Ok((mut stream, _)) = listener.accept() {
        observed.forward_connections += 1;
        let _ = stream.set_nonblocking(true);
        let _ = stream.read_to_end(&mut observed.forwarded);
    }
}

/// Input: one byte of queue size (rx and tx, 1..=8), then guest memory in order: the tx
/// descriptor table (16 × 8 bytes), tx avail ring (6 + 2 × 8), rx table, rx avail ring, then
/// buffers at [`BUFFERS`]. The host connects, the guest notifies tx, rx, tx, rx. Either the
/// device fails naming itself, or: used indexes stay in step, the host socket never gets more
/// bytes than the guest's packets could carry plus the device's `OK` line, the forward's
/// listener no more than the guest's packets, no connection exists on a host port that is
/// neither forwarded nor the host's own, nothing panics.
pub fn vsock_queues(data: &[u8]) -> Observed {
    let (listener, path) = forward_listener();
    let observed = vsock_queues_with(data, &path, &listener);
    let _ = std::fs::remove_file(&path);
    observed
}

fn vsock_queues_with(data: &[u8], forward: &std::path::Path, listener: &UnixListener) -> Observed {
    let memory = super::memory();
    let (size, rest) = data.split_at(data.len().min(1));
    let queue_size = size.first().map_or(QUEUE_SIZE, |&s| u32::from(s % 8) + 1);
    let mut rest = rest;
    let mut put = |address: u32, len: usize| {
        let (chunk, tail) = rest.split_at(rest.len().min(len));
        let _ = memory.write_slice(chunk, GuestAddress(u64::from(address)));
        rest = tail;
    };
    put(queue_base(1), 16 * 8);
    put(queue_base(1) + 0x1000, 22);
    put(queue_base(0), 16 * 8);
    put(queue_base(0) + 0x1000, 22);
    put(BUFFERS, super::MEMORY_BYTES - BUFFERS as usize);
    let mut vsock = Vsock::new(GUEST_CID, None);
    let (host, device_side) = match UnixStream::pair() {
        Ok(pair) => pair,
        Err(err) => panic!("a socket pair for the fuzzed device: {err}"),
    };
    vsock.open(device_side, GUEST_PORT);
    vsock.set_forwards(vec![Forward {
        port: FORWARD_PORT,
        path: forward.to_path_buf(),
    }]);
    let mut transport = MmioTransport::new(Device::Vsock(vsock));
    let mut observed = Observed::default();
    if !set_up(&mut transport, &memory, [queue_size, queue_size, 1]) {
        return observed;
    }
    for queue in [
        vsock::TX_QUEUE,
        vsock::RX_QUEUE,
        vsock::TX_QUEUE,
        vsock::RX_QUEUE,
    ] {
        if !notify(&mut transport, &memory, queue as u32) {
            return observed;
        }
    }
    for q in [vsock::RX_QUEUE, vsock::TX_QUEUE] {
        let queue = &transport.queues()[q];
        let used_idx: u16 = memory
            .read_obj(GuestAddress(u64::from(queue_base(q as u32) + 0x2002)))
            .unwrap_or_default();
        if queue.ready() && queue.size().is_power_of_two() {
            assert_eq!(
                used_idx,
                queue.next_used(),
                "queue {q}: used index out of step"
            );
            // Each used element names a buffer the device wrote a header into.
            for i in 0..used_idx.min(queue.size()) {
                let element = u64::from(queue_base(q as u32) + 0x2004) + u64::from(i) * 8;
                let id: u32 = memory.read_obj(GuestAddress(element)).unwrap_or_default();
                if q != vsock::RX_QUEUE || id >= queue.size().into() {
                    continue;
                }
                let descriptor = u64::from(queue_base(0)) + u64::from(id) * 16;
                let address: u64 = memory
                    .read_obj(GuestAddress(descriptor))
                    .unwrap_or_default();
                let mut bytes = [0u8; 44];
                if memory.read_slice(&mut bytes, GuestAddress(address)).is_ok() {
                    observed.to_guest.push(Header::parse(&bytes));
                }
            }
        }
    }
    let _ = host.set_nonblocking(true);
    let _ = (&host).read_to_end(&mut observed.host_received);
    let limit = format!("OK {HOST_PORT}\n").len() + 2 * 8 * vsock::MAX_PACKET_BYTES as usize;
    assert!(
        observed.host_received.len() <= limit,
        "the host got {} bytes",
        observed.host_received.len()
    );
    if let Device::Vsock(vsock) = transport.device() {
        for (host_port, guest_port) in vsock.connection_ports() {
            assert!(
                host_port == FORWARD_PORT || host_port >= HOST_PORT,
                "a connection on unforwarded host port {host_port} (guest port {guest_port})"
            );
        }
    }
    drop(transport);
    drain_forward(listener, &mut observed);
    assert!(
        observed.forwarded.len() <= 2 * 8 * vsock::MAX_PACKET_BYTES as usize,
        "the forward got {} bytes",
        observed.forwarded.len()
    );
    assert!(observed.forward_connections <= vsock::MAX_CONNECTIONS);
    observed
}

/// A split-ring descriptor in the guest's bytes: address, length, flags, no next.
fn descriptor(address: u32, len: u32, flags: u16) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&u64::from(address).to_le_bytes());
    d.extend_from_slice(&len.to_le_bytes());
    d.extend_from_slice(&flags.to_le_bytes());
    d.extend_from_slice(&0u16.to_le_bytes());
    d
}

/// An available ring of a size-8 queue offering its first `count` descriptors.
fn avail(count: u16) -> Vec<u8> {
    let mut ring = vec![0, 0];
    ring.extend_from_slice(&count.to_le_bytes());
    for i in 0..8u16 {
        ring.extend_from_slice(&i.to_le_bytes());
    }
    ring.extend_from_slice(&[0, 0]); // used_event
    ring
}

/// A well-formed exchange: the guest accepts the host's connection (RESPONSE) and sends
/// "hello" (RW), and gives two receive buffers (for the device's REQUEST and a credit update).
pub fn vsock_queues_seed() -> Vec<u8> {
    let header = |op: u16, len: u32| Header {
        src_cid: GUEST_CID,
        dst_cid: vsock::HOST_CID,
        src_port: GUEST_PORT,
        dst_port: HOST_PORT,
        len,
        type_: 1,
        op,
        flags: 0,
        buf_alloc: 65536,
        fwd_cnt: 0,
    };
    let mut seed = vec![7]; // queue size 8
    let mut tx_table = descriptor(BUFFERS, 44, 0);
    tx_table.extend(descriptor(BUFFERS + 0x100, 49, 0));
    tx_table.resize(128, 0);
    seed.extend(tx_table);
    seed.extend(avail(2));
    let mut rx_table = descriptor(BUFFERS + 0x1000, 4096, 2);
    rx_table.extend(descriptor(BUFFERS + 0x2000, 4096, 2));
    rx_table.resize(128, 0);
    seed.extend(rx_table);
    seed.extend(avail(2));
    let mut buffers = header(2, 0).bytes().to_vec(); // RESPONSE
    buffers.resize(0x100, 0);
    buffers.extend_from_slice(&header(5, 5).bytes()); // RW "hello"
    buffers.extend_from_slice(b"hello");
    seed.extend(buffers);
    seed
}

/// The guest's own connections: a REQUEST to [`FORWARD_PORT`], "GET /" on it, a REQUEST to
/// [`UNFORWARDED_PORT`], and three receive buffers (the host's REQUEST, the RESPONSE, the
/// reset).
pub fn vsock_forward_seed() -> Vec<u8> {
    let header = |dst_port: u32, op: u16, len: u32| Header {
        src_cid: GUEST_CID,
        dst_cid: vsock::HOST_CID,
        src_port: GUEST_SOURCE_PORT,
        dst_port,
        len,
        type_: 1,
        op,
        flags: 0,
        buf_alloc: 65536,
        fwd_cnt: 0,
    };
    let mut seed = vec![7];
    let mut tx_table = descriptor(BUFFERS, 44, 0);
    tx_table.extend(descriptor(BUFFERS + 0x100, 49, 0));
    tx_table.extend(descriptor(BUFFERS + 0x200, 44, 0));
    tx_table.resize(128, 0);
    seed.extend(tx_table);
    seed.extend(avail(3));
    let mut rx_table = Vec::new();
    for i in 0..3 {
        rx_table.extend(descriptor(BUFFERS + 0x1000 * (i + 1), 4096, 2));
    }
    rx_table.resize(128, 0);
    seed.extend(rx_table);
    seed.extend(avail(3));
    let mut buffers = header(FORWARD_PORT, 1, 0).bytes().to_vec(); // REQUEST
    buffers.resize(0x100, 0);
    buffers.extend_from_slice(&header(FORWARD_PORT, 5, 5).bytes()); // RW
    buffers.extend_from_slice(b"GET /");
    buffers.resize(0x200, 0);
    buffers.extend_from_slice(&header(UNFORWARDED_PORT, 1, 0).bytes()); // REQUEST
    seed.extend(buffers);
    seed
}
