//! Bounded resources, end to end against a real airlockd: no answer waits for a request body
//! the client never sends, and the event log is trimmed (by age and by count) while the daemon
//! runs. Needs root, `cargo build --workspace` and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use airlock_api::v1::{CreateSandboxRequest, ErrorCode};
use airlock_server::client::Client;
use common::TestDaemon;

/// Generous: the machine is shared and noisy. Never a measured bound, only a give-up point.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a poll for a background effect may take before the test gives up.
const LIMIT: Duration = Duration::from_secs(60);

/// A raw HTTP/1.1 connection that reads answers framed by Content-Length.
struct RawConn {
    stream: TcpStream,
    /// Bytes read past the last answer.
    pending: Vec<u8>,
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawConn {
    fn open(addr: &str) -> RawConn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        RawConn {
            stream,
            pending: Vec::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("cannot send ({e}): the daemon closed the connection"));
    }

    /// Reads more bytes; panics on a timeout, returns false at end of file.
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let n = self
            .stream
            .read(&mut chunk)
            .unwrap_or_else(|e| panic!("no answer within {READ_TIMEOUT:?}: {e}"));
        self.pending.extend_from_slice(&chunk[..n]);
        n > 0
    }

    fn answer(&mut self) -> Answer {
        let head_end = loop {
            if let Some(at) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            assert!(self.fill(), "the connection closed before an answer");
        };
        let head = String::from_utf8(self.pending[..head_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap()[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|line| {
                let (name, value) = line.split_once(':').unwrap();
                (name.trim().to_ascii_lowercase(), value.trim().to_owned())
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(name, _)| name == "content-length")
            .map_or(0, |(_, value)| value.parse().unwrap());
        let body_start = head_end + 4;
        while self.pending.len() < body_start + length {
            assert!(self.fill(), "the connection closed inside an answer");
        }
        let body = self.pending[body_start..body_start + length].to_vec();
        self.pending.drain(..body_start + length);
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Whether the server closes the connection (end of file) before READ_TIMEOUT.
    fn closes(&mut self) -> bool {
        loop {
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

/// A create with a bad key on the native API and on E2B's control plane, announcing a body of
/// 1000 bytes and sending none of it: the 401 arrives while the body is still unsent. The body
/// sent after the answer is read as that request's body (the next request on the connection
/// is answered as itself, so nothing desynchronised), and a body that never comes closes the
/// connection.
#[test]
fn test_error_answer_with_unsent_body_arrives_before_the_body() {
    common::require_binaries();
    let daemon = TestDaemon::start("unsent-body", &[]);
    let body = vec![b' '; 1000];
    let mut abandoned = Vec::new();
    for (path, key) in [
        (
            "/v1/sandboxes",
            "ak_0000000000000000000000000000000000000000",
        ),
        ("/sandboxes", "e2b_0000000000000000000000000000000000000000"),
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nX-API-Key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            daemon.addr,
            body.len()
        );

        let mut conn = RawConn::open(&daemon.addr);
        conn.send(head.as_bytes());
        let refused = conn.answer();
        assert_eq!(
            refused.status,
            401,
            "{path}: {}",
            String::from_utf8_lossy(&refused.body)
        );
        assert!(!refused.body.is_empty(), "{path}: the error has a body");
        // Only now does the body go out, followed by another request on the same connection.
        conn.send(&body);
        conn.send(format!("GET /v1/health HTTP/1.1\r\nHost: {}\r\n\r\n", daemon.addr).as_bytes());
        let health = conn.answer();
        assert_eq!(
            health.status, 200,
            "{path}: the late body was not read as the body ({:?})",
            health.headers
        );

        // A body that never comes: the answer still arrives.
        let mut conn = RawConn::open(&daemon.addr);
        conn.send(head.as_bytes());
        assert_eq!(conn.answer().status, 401, "{path}");
        abandoned.push((path, conn));
    }
    // And then the daemon closes those connections (both wait at once).
    for (path, mut conn) in abandoned {
        assert!(
            conn.closes(),
            "{path}: the connection stays open without its body"
        );
    }
}

/// The kinds of a sandbox's stored events, or None once the daemon knows nothing of it.
async fn event_kinds(client: &Client, id: &str) -> Option<Vec<String>> {
    match client.logs(id).await {
        Ok(logs) => Some(logs.events.into_iter().map(|e| e.kind).collect()),
        Err(err) if err.code() == Some(ErrorCode::NotFound) => None,
        Err(err) => panic!("logs of {id}: {err}"),
    }
}

/// A deleted sandbox's events are kept, and then trimmed by age while the daemon runs.
#[tokio::test]
async fn test_events_older_than_retention_are_trimmed_while_running() {
    common::require_binaries();
    let daemon = TestDaemon::start("events-age", &["--events-retention", "1s"]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    client.delete(&id).await.unwrap();
    let kinds = event_kinds(&client, &id).await.unwrap_or_default();
    // Unless the machine stalled past the retention already, the events are there first.
    if !kinds.is_empty() {
        assert!(kinds.contains(&"delete".to_owned()), "{kinds:?}");
    }
    assert!(
        common::eventually(LIMIT, || async {
            event_kinds(&client, &id).await.is_none()
        })
        .await,
        "the events of {id} were never trimmed"
    );
    assert!(client.health().await.is_ok());
}

/// Past `--events-max`, the oldest events go while the daemon runs, and the newest stay.
#[tokio::test]
async fn test_events_past_max_rows_are_trimmed_oldest_first() {
    common::require_binaries();
    let daemon = TestDaemon::start("events-rows", &["--events-max", "2"]);
    let client = daemon.client();
    let request = CreateSandboxRequest::default();
    let old = client.create(&request).await.unwrap().sandbox.id;
    client.delete(&old).await.unwrap();
    // Two events (create, ready): the newest two of the log once trimmed.
    let new = client.create(&request).await.unwrap().sandbox.id;
    assert!(
        common::eventually(LIMIT, || async {
            event_kinds(&client, &old).await.is_none()
        })
        .await,
        "the events of {old} were never trimmed"
    );
    assert_eq!(
        event_kinds(&client, &new).await.unwrap(),
        ["create", "ready"],
        "the newest events must stay"
    );
    client.delete(&new).await.unwrap();
}
