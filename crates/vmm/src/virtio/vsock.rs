//! virtio-vsock (virtio 1.2, section 5.10), stream sockets only, with its host side on Unix
//! sockets in Firecracker's convention: a host process connects to the VMM's socket, writes
//! `CONNECT <guest port>\n`, gets `OK <host port>\n` once the guest accepted, then a byte
//! stream. A listener given a guest port ([`HostListener::guest_port`]) skips the handshake:
//! each of its connections goes to that port, with no `OK` line, so that a client speaks the
//! agent's HTTP on it at once (the microvm tier's agent socket, which the daemon reaches
//! exactly as the process tier's). The guest's own connection requests go to the host port's
//! forward ([`vsock_forward`](super::vsock_forward), the egress proxy's socket on the microvm
//! tier) if it has one, and get a reset otherwise.
//!
//! Everything in a packet is the guest's: a header that names no connection, claims more
//! data than it carries or overruns the credit this device gave gets that connection reset,
//! never a panic. Descriptors outside guest memory end the VM ([`DeviceError`]).
//!
//! Flow control is virtio-vsock's credit: this device tells the guest how much it buffers
//! per connection ([`BUFFER_BYTES`]) and how much it has passed on to the host socket; it
//! sends the guest no more than the guest's own buffer allows. Host sockets are non-blocking;
//! [`crate::virtio::vsock_host`] polls them on its own thread. A guest's half-close (shutdown
//! of its sending side only) reaches the host socket as one once its bytes are written, and
//! the host's answer still flows back.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::DeviceError;
use super::vsock_forward::{self, Forward};

pub const QUEUE_SIZE: u16 = 256;
pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
pub const EVENT_QUEUE: usize = 2;
/// The host's CID.
pub const HOST_CID: u64 = 2;
/// What this device buffers per connection between the guest and the host socket.
pub const BUFFER_BYTES: u32 = 256 * 1024;
/// The largest payload this device reads from the guest in one packet.
pub const MAX_PACKET_BYTES: u32 = 64 * 1024;
/// The largest payload this device puts in one packet to the guest (Linux's receive
/// buffers are 4 KiB).
const MAX_RX_PAYLOAD: usize = 4096;
/// At most this many host connections at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 64;
const HEADER_BYTES: usize = 44;
const TYPE_STREAM: u16 = 1;
const OP_REQUEST: u16 = 1;
const OP_RESPONSE: u16 = 2;
const OP_RST: u16 = 3;
const OP_SHUTDOWN: u16 = 4;
const OP_RW: u16 = 5;
const OP_CREDIT_UPDATE: u16 = 6;
const OP_CREDIT_REQUEST: u16 = 7;
/// The guest will receive no more (`VIRTIO_VSOCK_SHUTDOWN_RCV`) and send no more (`_SEND`).
const SHUTDOWN_RCV: u32 = 1;
const SHUTDOWN_SEND: u32 = 2;
const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;
const FIRST_HOST_PORT: u32 = 1 << 30;

/// A packet header (little-endian on the wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl Header {
    pub fn parse(bytes: &[u8; HEADER_BYTES]) -> Header {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or([0; 4]));
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    pub fn bytes(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        out[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        out[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        out[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        out[24..28].copy_from_slice(&self.len.to_le_bytes());
        out[28..30].copy_from_slice(&self.type_.to_le_bytes());
        out[30..32].copy_from_slice(&self.op.to_le_bytes());
        out[32..36].copy_from_slice(&self.flags.to_le_bytes());
        out[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        out[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The host asked for the guest port; waiting for the guest's response.
    Connecting,
    Established,
}

#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    host_port: u32,
    guest_port: u32,
    state: State,
    /// Guest bytes not yet written to the host socket (at most [`BUFFER_BYTES`]).
    to_host: Vec<u8>,
    /// Leading bytes of `to_host` that are this device's own (the `OK` line), not guest data.
    own_bytes: usize,
    /// Whether the host side is told `OK <host port>` once the guest accepted.
    announce: bool,
    /// Host bytes read but not yet sent to the guest.
    from_host: Vec<u8>,
    host_eof: bool,
    /// The guest shut its sending side: once `to_host` is written, the host socket's is shut.
    guest_sent_eof: bool,
    host_write_shut: bool,
    /// Bytes this device passed to the host socket, and the count the guest last heard.
    fwd_cnt: u32,
    fwd_cnt_told: u32,
    /// Bytes sent to the guest, and the guest's buffer and forward count.
    tx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
}

impl Connection {
    /// A connection with nothing carried yet, nothing announced and no credit from the guest.
    fn new(stream: UnixStream, host_port: u32, guest_port: u32, state: State) -> Connection {
        Connection {
            stream,
            host_port,
            guest_port,
            state,
            to_host: Vec::new(),
            own_bytes: 0,
            announce: false,
            from_host: Vec::new(),
            host_eof: false,
            guest_sent_eof: false,
            host_write_shut: false,
            fwd_cnt: 0,
            fwd_cnt_told: 0,
            tx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
        }
    }

    fn guest_credit(&self) -> u32 {
        self.peer_buf_alloc
            .saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }
}

/// A host socket that has connected but not yet said which port it wants (or, accepted on
/// a listener with a fixed guest port, is waiting to be opened).
#[derive(Debug)]
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
    fixed_port: Option<u32>,
}

/// The host side's listening Unix socket.
#[derive(Debug)]
pub struct HostListener {
    pub listener: UnixListener,
    /// `None`: Firecracker's `CONNECT <port>` handshake. `Some(port)`: every connection goes
    /// to this guest port, without a handshake or an `OK` line.
    pub guest_port: Option<u32>,
}

/// The vsock device: its guest CID, the host's listening socket, and the connections.
#[derive(Debug)]
pub struct Vsock {
    guest_cid: u64,
    listener: Option<HostListener>,
    /// Host ports the guest may connect to, and the Unix socket each one reaches.
    forwards: Vec<Forward>,
    handshakes: Vec<Handshake>,
    connections: Vec<Connection>,
    /// Control packets (no payload) queued for the guest.
    control: VecDeque<Header>,
    next_host_port: u32,
    /// A transport reset event is owed to the guest (after a restore).
    reset_event: bool,
    /// The reset event was delivered but the guest has not handed the buffer back yet (it
    /// does, with a notification, once it has dropped its old connections): until then no
    /// host connection is opened, or the guest's reset would drop it too.
    reset_unacknowledged: bool,
    /// Written when the host thread should look at the sockets again.
    wake: Option<EventFd>,
}

impl Vsock {
    /// A device for guest `guest_cid` whose host side accepts on `listener` (non-blocking).
    pub fn new(guest_cid: u64, listener: Option<HostListener>) -> Vsock {
        Vsock {
            guest_cid,
            listener,
            forwards: Vec::new(),
            handshakes: Vec::new(),
            connections: Vec::new(),
            control: VecDeque::new(),
            next_host_port: FIRST_HOST_PORT,
            reset_event: false,
            reset_unacknowledged: false,
            wake: None,
        }
    }

    /// The device after a restore: no connection survives a snapshot, and the guest is told
    /// so with a transport reset event, as Firecracker does.
    pub fn restored(guest_cid: u64) -> Vsock {
        Vsock {
            reset_event: true,
            ..Vsock::new(guest_cid, None)
        }
    }

    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Gives the device its host socket (after a restore) and the host thread's wake-up.
    pub fn attach(&mut self, listener: Option<HostListener>, wake: EventFd) {
        if listener.is_some() {
            self.listener = listener;
        }
        self.wake = Some(wake);
    }

    /// The host ports the guest may connect to (given again after a restore: they are the
    /// VMM's configuration, not the guest's state).
    pub fn set_forwards(&mut self, forwards: Vec<Forward>) {
        self.forwards = forwards;
    }

    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// Each connection's (host port, guest port).
    pub fn connection_ports(&self) -> Vec<(u32, u32)> {
        self.connections
            .iter()
            .map(|c| (c.host_port, c.guest_port))
            .collect()
    }

    /// The descriptors the host thread polls, with whether to wait for reading or writing.
    pub fn poll_set(&self) -> Vec<(i32, i16)> {
        use std::os::fd::AsRawFd;
        let mut set = Vec::new();
        if let Some(host) = &self.listener {
            set.push((host.listener.as_raw_fd(), libc::POLLIN));
        }
        // Held after a restore until the guest's reset is acknowledged (no busy loop on them).
        if !self.reset_event && !self.reset_unacknowledged {
            for handshake in &self.handshakes {
                set.push((handshake.stream.as_raw_fd(), libc::POLLIN));
            }
        }
        for c in &self.connections {
            let mut events = 0;
            if c.state == State::Established
                && !c.host_eof
                && c.from_host.is_empty()
                && c.guest_credit() > 0
            {
                events |= libc::POLLIN;
            }
            if !c.to_host.is_empty() {
                events |= libc::POLLOUT;
            }
            if events != 0 {
                set.push((c.stream.as_raw_fd(), events));
            }
        }
        set
    }

    fn wake_host(&self) {
        if let Some(wake) = &self.wake {
            let _ = wake.write(1);
        }
    }

    fn header(&self, host_port: u32, guest_port: u32, op: u16) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: host_port,
            dst_port: guest_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: BUFFER_BYTES,
            ..Header::default()
        }
    }

    fn reset(&mut self, host_port: u32, guest_port: u32) {
        let header = self.header(host_port, guest_port, OP_RST);
        self.control.push_back(header);
    }

    /// Accepts host connections, reads their `CONNECT` lines, writes what the guest sent and
    /// reads what the host sent (all non-blocking). Called by the host thread and after
    /// every guest notification.
    pub fn service_host(&mut self) {
        self.accept();
        if !self.reset_event && !self.reset_unacknowledged {
            self.read_handshakes();
        }
        let mut closed = Vec::new();
        for (index, c) in self.connections.iter_mut().enumerate() {
            if !flush(c) {
                closed.push(index);
                continue;
            }
            if c.guest_sent_eof && c.to_host.is_empty() && !c.host_write_shut {
                c.host_write_shut = true;
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
            if c.fwd_cnt != c.fwd_cnt_told {
                c.fwd_cnt_told = c.fwd_cnt;
                let mut update = Header {
                    src_cid: HOST_CID,
                    dst_cid: self.guest_cid,
                    src_port: c.host_port,
                    dst_port: c.guest_port,
                    type_: TYPE_STREAM,
                    op: OP_CREDIT_UPDATE,
                    buf_alloc: BUFFER_BYTES,
                    ..Header::default()
                };
                update.fwd_cnt = c.fwd_cnt;
                self.control.push_back(update);
            }
            if c.state == State::Established && !c.host_eof && c.from_host.is_empty() {
                let want = (c.guest_credit() as usize).min(MAX_RX_PAYLOAD * 16);
                if want > 0 {
                    let mut buffer = vec![0u8; want];
                    match c.stream.read(&mut buffer) {
                        Ok(0) => c.host_eof = true,
                        Ok(n) => c.from_host.extend_from_slice(&buffer[..n]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(_) => c.host_eof = true,
                    }
                }
            }
        }
        for index in closed.into_iter().rev() {
            let c = self.connections.remove(index);
            self.reset(c.host_port, c.guest_port);
        }
    }

    fn accept(&mut self) {
        let Some(host) = &self.listener else {
            return;
        };
        while let Ok((stream, _)) = host.listener.accept() {
            if self.handshakes.len() + self.connections.len() >= MAX_CONNECTIONS
                || set_nonblocking(&stream, true).is_err()
            {
                continue;
            }
            self.handshakes.push(Handshake {
                stream,
                line: Vec::new(),
                fixed_port: host.guest_port,
            });
        }
    }

    fn read_handshakes(&mut self) {
        let mut index = 0;
        while index < self.handshakes.len() {
            let handshake = &mut self.handshakes[index];
            if let Some(port) = handshake.fixed_port {
                let handshake = self.handshakes.swap_remove(index);
                self.open_with(handshake.stream, port, false);
                continue;
            }
            let mut byte = [0u8; 1];
            let mut done = None;
            loop {
                match handshake.stream.read(&mut byte) {
                    Ok(1) if byte[0] == b'\n' => {
                        done = Some(parse_connect(&handshake.line));
                        break;
                    }
                    Ok(1) if handshake.line.len() < 32 => handshake.line.push(byte[0]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    _ => {
                        done = Some(None);
                        break;
                    }
                }
            }
            match done {
                None => index += 1,
                Some(port) => {
                    let handshake = self.handshakes.swap_remove(index);
                    if let Some(guest_port) = port {
                        self.open(handshake.stream, guest_port);
                    }
                }
            }
        }
    }

    /// Asks the guest for a connection to `guest_port` on behalf of `stream` (what a host
    /// socket's `CONNECT` line does; also how the fuzzer and tests attach a socket pair).
    pub fn open(&mut self, stream: UnixStream, guest_port: u32) {
        self.open_with(stream, guest_port, true);
    }

    /// [`Vsock::open`]; `announce` says whether the host side gets the `OK` line.
    fn open_with(&mut self, stream: UnixStream, guest_port: u32, announce: bool) {
        let _ = set_nonblocking(&stream, true);
        let host_port = self.next_host_port;
        self.next_host_port = self.next_host_port.wrapping_add(1).max(FIRST_HOST_PORT);
        let mut connection = Connection::new(stream, host_port, guest_port, State::Connecting);
        connection.announce = announce;
        self.connections.push(connection);
        let request = self.header(host_port, guest_port, OP_REQUEST);
        self.control.push_back(request);
    }

    /// The guest's transmit queue: packets to the host.
    pub fn process_tx(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let chains: Vec<_> = queue
            .iter(memory)
            .map_err(DeviceError::AvailRing)?
            .collect();
        let used = !chains.is_empty();
        for chain in chains {
            let head = chain.head_index();
            let mut packet = Vec::new();
            let limit = HEADER_BYTES + MAX_PACKET_BYTES as usize;
            for descriptor in chain.readable() {
                let take = (descriptor.len() as usize).min(limit - packet.len());
                let start = packet.len();
                packet.resize(start + take, 0);
                memory
                    .read_slice(&mut packet[start..], descriptor.addr())
                    .map_err(|source| DeviceError::Descriptor { head, source })?;
                if packet.len() == limit {
                    break;
                }
            }
            queue
                .add_used(memory, head, 0)
                .map_err(DeviceError::UsedRing)?;
            self.handle_packet(&packet);
        }
        self.service_host();
        self.wake_host();
        Ok(used)
    }

    fn handle_packet(&mut self, packet: &[u8]) {
        let Some(header_bytes) = packet.get(..HEADER_BYTES) else {
            return;
        };
        let header = Header::parse(header_bytes.try_into().unwrap_or(&[0; HEADER_BYTES]));
        let payload = &packet[HEADER_BYTES..];
        if header.dst_cid != HOST_CID || header.src_cid != self.guest_cid {
            return;
        }
        let reply_reset = |this: &mut Vsock| {
            if header.op != OP_RST {
                this.reset(header.dst_port, header.src_port);
            }
        };
        if header.type_ != TYPE_STREAM || header.len as usize != payload.len() {
            reply_reset(self);
            return;
        }
        let Some(index) = self
            .connections
            .iter()
            .position(|c| c.host_port == header.dst_port && c.guest_port == header.src_port)
        else {
            if header.op == OP_REQUEST {
                self.accept_guest(&header);
            } else {
                reply_reset(self);
            }
            return;
        };
        let c = &mut self.connections[index];
        c.peer_buf_alloc = header.buf_alloc;
        c.peer_fwd_cnt = header.fwd_cnt;
        match (header.op, c.state) {
            (OP_RESPONSE, State::Connecting) => {
                c.state = State::Established;
                if c.announce {
                    let line = format!("OK {}\n", c.host_port);
                    c.own_bytes += line.len();
                    c.to_host.extend_from_slice(line.as_bytes());
                }
            }
            (OP_RW, State::Established)
                if !c.guest_sent_eof
                    && c.to_host.len() - c.own_bytes + payload.len() <= BUFFER_BYTES as usize =>
            {
                c.to_host.extend_from_slice(payload);
            }
            (OP_CREDIT_UPDATE, _) => {}
            (OP_CREDIT_REQUEST, _) => {
                let mut update = self.header(header.dst_port, header.src_port, OP_CREDIT_UPDATE);
                update.fwd_cnt = self.connections[index].fwd_cnt;
                self.control.push_back(update);
            }
            (OP_SHUTDOWN, State::Established) if header.flags & SHUTDOWN_BOTH == SHUTDOWN_SEND => {
                c.guest_sent_eof = true;
            }
            // The guest will read no more but may still send: a hint only (its credit stops
            // the host's bytes anyway).
            (OP_SHUTDOWN, State::Established) if header.flags & SHUTDOWN_BOTH == SHUTDOWN_RCV => {}
            (OP_SHUTDOWN, State::Established) => {
                // Pass on what the guest sent, then close; the reset tells the guest.
                let mut c = self.connections.remove(index);
                let _ = set_nonblocking(&c.stream, false);
                let _ = c.stream.write_all(&c.to_host);
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                self.reset(header.dst_port, header.src_port);
            }
            (OP_RST, _) => {
                self.connections.remove(index);
            }
            _ => {
                // A request to a host port, or data beyond the credit given: reset.
                self.connections.remove(index);
                reply_reset(self);
            }
        }
    }

    /// A guest's connection request to a host port: connected to the port's forward, or reset
    /// (no forward, too many connections, or the forward's socket refuses).
    fn accept_guest(&mut self, request: &Header) {
        let (host_port, guest_port) = (request.dst_port, request.src_port);
        let stream = self
            .forwards
            .iter()
            .find(|f| f.port == host_port)
            .filter(|_| self.handshakes.len() + self.connections.len() < MAX_CONNECTIONS)
            .and_then(|f| vsock_forward::connect(&f.path).ok());
        let Some(stream) = stream else {
            self.reset(host_port, guest_port);
            return;
        };
        let mut connection = Connection::new(stream, host_port, guest_port, State::Established);
        connection.peer_buf_alloc = request.buf_alloc;
        connection.peer_fwd_cnt = request.fwd_cnt;
        self.connections.push(connection);
        let response = self.header(host_port, guest_port, OP_RESPONSE);
        self.control.push_back(response);
    }

    /// Fills the guest's receive buffers with control packets and host data; `Ok(true)` when
    /// buffers were used.
    pub fn process_rx(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut used = false;
        while self.has_packet() {
            let Some(chain) = queue.pop_descriptor_chain(memory) else {
                break;
            };
            let head = chain.head_index();
            let buffers: Vec<(vm_memory::GuestAddress, usize)> = chain
                .writable()
                .map(|d| (d.addr(), d.len() as usize))
                .collect();
            let capacity: usize = buffers.iter().map(|(_, len)| len).sum();
            if capacity < HEADER_BYTES {
                return Err(DeviceError::BadChain { head });
            }
            let Some((header, payload)) = self.next_packet(capacity - HEADER_BYTES) else {
                queue.go_to_previous_position();
                break;
            };
            let mut bytes = header.bytes().to_vec();
            bytes.extend_from_slice(&payload);
            let mut written = 0usize;
            for (address, len) in buffers {
                if written == bytes.len() {
                    break;
                }
                let take = len.min(bytes.len() - written);
                memory
                    .write_slice(&bytes[written..written + take], address)
                    .map_err(|source| DeviceError::Descriptor { head, source })?;
                written += take;
            }
            queue
                .add_used(memory, head, written as u32)
                .map_err(DeviceError::UsedRing)?;
            used = true;
        }
        Ok(used)
    }

    /// The transport reset event (virtio 1.2, 5.10.6.8), once after a restore.
    pub fn process_event(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        if !self.reset_event {
            return Ok(false);
        }
        let Some(chain) = queue.pop_descriptor_chain(memory) else {
            return Ok(false);
        };
        let head = chain.head_index();
        let Some(descriptor) = chain.writable().next() else {
            return Err(DeviceError::BadChain { head });
        };
        if descriptor.len() < 4 {
            return Err(DeviceError::BadChain { head });
        }
        memory
            .write_slice(&0u32.to_le_bytes(), descriptor.addr())
            .map_err(|source| DeviceError::Descriptor { head, source })?;
        queue
            .add_used(memory, head, 4)
            .map_err(DeviceError::UsedRing)?;
        self.reset_event = false;
        self.reset_unacknowledged = true;
        Ok(true)
    }

    /// The guest notified the event queue: it gave a buffer back (after handling a reset).
    pub fn event_notified(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        if !self.reset_event {
            self.reset_unacknowledged = false;
        }
        let used = self.process_event(queue, memory)?;
        self.service_host();
        Ok(used)
    }

    fn has_packet(&self) -> bool {
        !self.control.is_empty()
            || self.connections.iter().any(|c| {
                c.state == State::Established
                    && ((!c.from_host.is_empty() && c.guest_credit() > 0)
                        || (c.host_eof && c.from_host.is_empty()))
            })
    }

    /// The next packet for the guest, its payload at most `max_payload` bytes.
    fn next_packet(&mut self, max_payload: usize) -> Option<(Header, Vec<u8>)> {
        if let Some(header) = self.control.pop_front() {
            return Some((header, Vec::new()));
        }
        let guest_cid = self.guest_cid;
        for c in &mut self.connections {
            if c.state != State::Established {
                continue;
            }
            let mut header = Header {
                src_cid: HOST_CID,
                dst_cid: guest_cid,
                src_port: c.host_port,
                dst_port: c.guest_port,
                type_: TYPE_STREAM,
                op: OP_RW,
                buf_alloc: BUFFER_BYTES,
                fwd_cnt: c.fwd_cnt,
                ..Header::default()
            };
            let credit = c.guest_credit() as usize;
            if !c.from_host.is_empty() && credit > 0 {
                let take = c
                    .from_host
                    .len()
                    .min(MAX_RX_PAYLOAD)
                    .min(credit)
                    .min(max_payload);
                if take == 0 {
                    continue;
                }
                let payload: Vec<u8> = c.from_host.drain(..take).collect();
                c.tx_cnt = c.tx_cnt.wrapping_add(take as u32);
                c.fwd_cnt_told = c.fwd_cnt;
                header.len = take as u32;
                return Some((header, payload));
            }
            if c.host_eof && c.from_host.is_empty() {
                // No more reads; the guest's reset removes the connection.
                c.host_eof = false;
                c.state = State::Connecting;
                header.op = OP_SHUTDOWN;
                header.flags = SHUTDOWN_BOTH;
                return Some((header, Vec::new()));
            }
        }
        None
    }
}

/// Writes what the guest sent to the host socket; `false` when the host socket is gone.
fn flush(c: &mut Connection) -> bool {
    while !c.to_host.is_empty() {
        match c.stream.write(&c.to_host) {
            Ok(0) => return false,
            Ok(n) => {
                c.to_host.drain(..n);
                let own = n.min(c.own_bytes);
                c.own_bytes -= own;
                c.fwd_cnt = c.fwd_cnt.wrapping_add((n - own) as u32);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// O_NONBLOCK through fcntl: std's `set_nonblocking` uses the FIONBIO ioctl, which the VMM's
/// allow-list refuses (only KVM ioctls pass).
fn set_nonblocking(stream: &UnixStream, on: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor the stream owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL with an integer on the same descriptor; the result is checked.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `CONNECT <port>` → the port.
fn parse_connect(line: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(line).ok()?;
    let port = text.trim_end_matches('\r').strip_prefix("CONNECT ")?;
    port.parse().ok()
}

#[cfg(test)]
#[path = "vsock_tests.rs"]
mod tests;
