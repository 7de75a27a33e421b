//! Byte-level tests of `GET /airlock/tcp` (the daemon's tunnel to a port on the sandbox's
//! loopback) against the real binary. The agent runs on the host here, so its loopback is the
//! test's own.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

#[cfg(test)]
mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{Body, TestAgent};
use serde_json::Value;

const UPGRADE: &[(&str, &str)] = &[("Connection", "Upgrade"), ("Upgrade", "airlock-tcp")];

/// Reads a response head byte by byte, so that nothing after it is consumed.
fn read_head(stream: &mut UnixStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).unwrap();
        assert_eq!(n, 1, "the connection closed inside the head: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

fn open_tunnel(agent: &TestAgent, port: u16) -> (UnixStream, String) {
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "GET /airlock/tcp?port={port} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: airlock-tcp\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut stream);
    (stream, head)
}

/// A one-connection TCP server that answers each chunk with its bytes reversed, and sends
/// `bye` after the peer's end of file.
fn reversing_server() -> (u16, std::thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let thread = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            let mut reply = buf[..n].to_vec();
            reply.reverse();
            conn.write_all(&reply).unwrap();
        }
        conn.write_all(b"bye").unwrap();
        seen
    });
    (port, thread)
}

#[test]
fn tunnel_splices_bytes_both_ways_and_passes_half_close() {
    let agent = TestAgent::start("tunnel-splice");
    let (port, server) = reversing_server();
    let (mut stream, head) = open_tunnel(&agent, port);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("\r\nupgrade: airlock-tcp\r\n"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");

    // Arbitrary bytes, not HTTP: the tunnel carries them untouched.
    let payload: Vec<u8> = (0..=255u8)
        .chain(b"\r\n\r\nGET / HTTP/1.1\r\n".iter().copied())
        .collect();
    stream.write_all(&payload).unwrap();
    let mut back = vec![0u8; payload.len()];
    stream.read_exact(&mut back).unwrap();
    back.reverse();
    assert_eq!(back, payload);

    // Our end of file reaches the server, and what it sends afterwards still comes back.
    stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"bye");
    assert_eq!(server.join().unwrap(), payload);
}

#[test]
fn a_closed_port_is_a_502_connect_error_and_the_connection_stays_usable() {
    let agent = TestAgent::start("tunnel-closed");
    // A port that was just free: bind, note it, release it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut conn = agent.connect();
    conn.send(
        "GET",
        &format!("/airlock/tcp?port={port}"),
        UPGRADE,
        Body::None,
    );
    let (head, body) = conn.response();
    assert_eq!(head.status, 502);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["code"], "unavailable");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("port {port} is not open")),
        "{message}"
    );
    // No upgrade happened: the same connection serves the next request.
    conn.send("GET", "/health", &[], Body::None);
    assert_eq!(conn.response().0.status, 204);
}

#[test]
fn malformed_tunnel_requests_are_refused_with_400() {
    let agent = TestAgent::start("tunnel-bad");
    let mut conn = agent.connect();
    for (path, headers) in [
        ("/airlock/tcp?port=80", &[][..]),
        (
            "/airlock/tcp?port=80",
            &[("Connection", "Upgrade"), ("Upgrade", "websocket")][..],
        ),
        ("/airlock/tcp", UPGRADE),
        ("/airlock/tcp?port=0", UPGRADE),
        ("/airlock/tcp?port=70000", UPGRADE),
        ("/airlock/tcp?port=http", UPGRADE),
    ] {
        conn.send("GET", path, headers, Body::None);
        let (head, body) = conn.response();
        assert_eq!(head.status, 400, "{path} {headers:?}");
        let error: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error["code"], "invalid_argument", "{path}");
    }
    // Only GET opens a tunnel; other methods find no route.
    conn.send("POST", "/airlock/tcp?port=80", UPGRADE, Body::Fixed(b"x"));
    assert_eq!(conn.response().0.status, 404);
}
