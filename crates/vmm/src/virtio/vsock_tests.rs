use std::io::Read as _;

use super::*;
use crate::virtio::Forward;

const GUEST_CID: u64 = 3;
const AGENT_PORT: u32 = 49983;

/// A device whose host side listens on a fresh socket, and a client connected to it.
fn device(guest_port: Option<u32>, name: &str) -> (Vsock, UnixStream, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "airlock-vsock-test-{}-{name}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let vsock = Vsock::new(
        GUEST_CID,
        Some(HostListener {
            listener,
            guest_port,
        }),
    );
    let client = UnixStream::connect(&path).unwrap();
    (vsock, client, path)
}

/// The guest accepts the device's pending request.
fn guest_accepts(vsock: &mut Vsock) -> Header {
    let request = vsock.control.pop_front().expect("no request for the guest");
    assert_eq!(request.op, OP_REQUEST);
    let response = Header {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port: request.dst_port,
        dst_port: request.src_port,
        type_: TYPE_STREAM,
        op: OP_RESPONSE,
        buf_alloc: BUFFER_BYTES,
        ..Header::default()
    };
    vsock.handle_packet(&response.bytes());
    request
}

#[test]
fn test_vsock_fixed_port_listener_connects_without_a_handshake_or_ok_line() {
    let (mut vsock, mut client, path) = device(Some(AGENT_PORT), "fixed");
    vsock.service_host();
    let request = guest_accepts(&mut vsock);
    assert_eq!(
        request.dst_port, AGENT_PORT,
        "the connection goes to the fixed port"
    );
    assert_eq!(vsock.connection_count(), 1);
    assert!(
        vsock.connections[0].to_host.is_empty(),
        "no OK line is owed"
    );
    // The guest's first bytes are the first the client reads.
    let data = Header {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port: AGENT_PORT,
        dst_port: request.src_port,
        len: 5,
        type_: TYPE_STREAM,
        op: OP_RW,
        buf_alloc: BUFFER_BYTES,
        ..Header::default()
    };
    let mut packet = data.bytes().to_vec();
    packet.extend_from_slice(b"HTTP/");
    vsock.handle_packet(&packet);
    vsock.service_host();
    let mut first = [0u8; 5];
    client.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn test_vsock_handshake_listener_still_waits_for_connect_and_answers_ok() {
    let (mut vsock, mut client, path) = device(None, "handshake");
    vsock.service_host();
    assert!(
        vsock.control.is_empty(),
        "no request before the CONNECT line"
    );
    use std::io::Write as _;
    client
        .write_all(format!("CONNECT {AGENT_PORT}\n").as_bytes())
        .unwrap();
    vsock.service_host();
    let request = guest_accepts(&mut vsock);
    assert_eq!(request.dst_port, AGENT_PORT);
    vsock.service_host();
    let mut line = vec![0u8; format!("OK {}\n", request.src_port).len()];
    client.read_exact(&mut line).unwrap();
    assert_eq!(line, format!("OK {}\n", request.src_port).into_bytes());
    std::fs::remove_file(path).unwrap();
}

#[test]
fn test_vsock_fixed_port_connections_wait_for_a_restored_guest_s_reset() {
    let (mut vsock, _client, path) = device(Some(AGENT_PORT), "restored");
    vsock.reset_event = true;
    vsock.service_host();
    assert_eq!(vsock.connection_count(), 0, "held until the guest's reset");
    assert!(vsock.control.is_empty());
    vsock.reset_event = false;
    vsock.service_host();
    assert_eq!(vsock.connection_count(), 1);
    std::fs::remove_file(path).unwrap();
}

const FORWARD_PORT: u32 = 3128;
const GUEST_SOURCE_PORT: u32 = 50_000;

/// A device without a host listener, forwarding [`FORWARD_PORT`] to a fresh Unix listener.
fn forwarding(name: &str) -> (Vsock, UnixListener, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "airlock-vsock-fwd-{}-{name}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut vsock = Vsock::new(GUEST_CID, None);
    vsock.set_forwards(vec![Forward {
        port: FORWARD_PORT,
        path: path.clone(),
    }]);
    (vsock, listener, path)
}

/// A packet from the guest's port [`GUEST_SOURCE_PORT`] to host port `port`.
fn from_guest(port: u32, op: u16, payload: &[u8], buf_alloc: u32, fwd_cnt: u32) -> Vec<u8> {
    let header = Header {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port: GUEST_SOURCE_PORT,
        dst_port: port,
        len: payload.len() as u32,
        type_: TYPE_STREAM,
        op,
        buf_alloc,
        fwd_cnt,
        ..Header::default()
    };
    let mut packet = header.bytes().to_vec();
    packet.extend_from_slice(payload);
    packet
}

/// Every packet the device has for the guest now, payloads joined.
fn drain(vsock: &mut Vsock) -> (Vec<Header>, Vec<u8>) {
    let (mut headers, mut data) = (Vec::new(), Vec::new());
    while let Some((header, payload)) = vsock.next_packet(MAX_RX_PAYLOAD) {
        headers.push(header);
        data.extend(payload);
    }
    (headers, data)
}

#[test]
fn test_vsock_guest_request_to_a_forwarded_port_connects_its_socket_and_carries_both_ways() {
    let (mut vsock, listener, path) = forwarding("both-ways");
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_REQUEST, b"", BUFFER_BYTES, 0));
    let (mut proxy, _) = listener.accept().expect("the VMM connected to the forward");
    let (replies, _) = drain(&mut vsock);
    assert_eq!(
        replies
            .iter()
            .map(|h| (h.op, h.src_port, h.dst_port))
            .collect::<Vec<_>>(),
        [(OP_RESPONSE, FORWARD_PORT, GUEST_SOURCE_PORT)]
    );
    // Guest to host, then the host's answer back to the guest.
    vsock.handle_packet(&from_guest(
        FORWARD_PORT,
        OP_RW,
        b"CONNECT x",
        BUFFER_BYTES,
        0,
    ));
    vsock.service_host();
    let mut request = [0u8; 9];
    proxy.read_exact(&mut request).unwrap();
    assert_eq!(&request, b"CONNECT x");
    use std::io::Write as _;
    proxy.write_all(b"HTTP/1.1 200").unwrap();
    vsock.service_host();
    let (packets, data) = drain(&mut vsock);
    assert_eq!(data, b"HTTP/1.1 200");
    // The guest is told its 9 bytes were passed on.
    assert!(packets.iter().all(|h| h.fwd_cnt == 9), "{packets:?}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn test_vsock_guest_request_to_an_unforwarded_port_or_a_gone_socket_is_reset() {
    let (mut vsock, listener, path) = forwarding("reset");
    vsock.handle_packet(&from_guest(8080, OP_REQUEST, b"", BUFFER_BYTES, 0));
    drop(listener);
    std::fs::remove_file(&path).unwrap();
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_REQUEST, b"", BUFFER_BYTES, 0));
    let (replies, _) = drain(&mut vsock);
    assert_eq!(
        replies
            .iter()
            .map(|h| (h.op, h.src_port))
            .collect::<Vec<_>>(),
        [(OP_RST, 8080), (OP_RST, FORWARD_PORT)]
    );
    assert_eq!(vsock.connection_count(), 0);
}

#[test]
fn test_vsock_forward_honours_the_guest_s_credit_and_its_own() {
    let (mut vsock, listener, path) = forwarding("credit");
    // The guest can take 10 bytes.
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_REQUEST, b"", 10, 0));
    let (mut proxy, _) = listener.accept().unwrap();
    drain(&mut vsock);
    use std::io::Write as _;
    proxy.write_all(&[7u8; 100]).unwrap();
    for _ in 0..3 {
        vsock.service_host();
    }
    let (_, data) = drain(&mut vsock);
    assert_eq!(data.len(), 10, "no more than the guest's buffer");
    // The guest read them: 10 more.
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_CREDIT_UPDATE, b"", 10, 10));
    vsock.service_host();
    let (_, data) = drain(&mut vsock);
    assert_eq!(data.len(), 10);
    // Beyond this device's buffer, the guest's data resets the connection.
    let too_much = vec![0u8; BUFFER_BYTES as usize + 1];
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_RW, &too_much, 10, 20));
    let (replies, _) = drain(&mut vsock);
    assert_eq!(replies.last().map(|h| h.op), Some(OP_RST));
    assert_eq!(vsock.connection_count(), 0);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn test_vsock_guest_half_close_reaches_the_socket_and_the_answer_still_flows() {
    let (mut vsock, listener, path) = forwarding("half-close");
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_REQUEST, b"", BUFFER_BYTES, 0));
    let (mut proxy, _) = listener.accept().unwrap();
    vsock.handle_packet(&from_guest(FORWARD_PORT, OP_RW, b"ping", BUFFER_BYTES, 0));
    let mut shutdown = from_guest(FORWARD_PORT, OP_SHUTDOWN, b"", BUFFER_BYTES, 0);
    shutdown[32..36].copy_from_slice(&SHUTDOWN_SEND.to_le_bytes());
    vsock.handle_packet(&shutdown);
    vsock.service_host();
    let mut request = Vec::new();
    proxy.read_to_end(&mut request).unwrap();
    assert_eq!(request, b"ping", "the guest's bytes, then end of stream");
    use std::io::Write as _;
    proxy.write_all(b"pong").unwrap();
    vsock.service_host();
    let (_, data) = drain(&mut vsock);
    assert_eq!(data, b"pong");
    assert_eq!(vsock.connection_count(), 1);
    std::fs::remove_file(path).unwrap();
}
