use std::io::Read as _;

use super::*;

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
