//! The E2B-compatible surface end to end, in raw HTTP/1.1 against a real airlockd: key
//! spellings, routing precedence, the data plane's credentials (token, signature, insecure
//! v1 sandboxes), the proxy's 502 answers, the tunnel to a server inside a sandbox, pause, and
//! keep-alive after an error. The Python and npm SDK suite (scripts/e2b-tests.sh) covers the
//! SDKs' view. Needs root and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use airlock_server::e2b::access::file_signature;
use common::TestDaemon;
use serde_json::{Value, json};

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{e}: {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One keep-alive connection to the daemon.
struct Conn {
    reader: BufReader<TcpStream>,
    addr: String,
}

impl Conn {
    fn open(addr: &str) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        Conn {
            reader: BufReader::new(stream),
            addr: addr.to_owned(),
        }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        line.trim_end_matches(['\r', '\n']).to_owned()
    }

    fn call(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();

        let status_line = self.line();
        let status = status_line[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let line = self.line();
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').unwrap();
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        let mut reply = Reply {
            status,
            headers,
            body: Vec::new(),
        };
        if reply
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let size = usize::from_str_radix(&self.line(), 16).unwrap();
                let mut chunk = vec![0u8; size + 2];
                self.reader.read_exact(&mut chunk).unwrap();
                if size == 0 {
                    break;
                }
                reply.body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(len) = reply.header("content-length") {
            let mut body = vec![0u8; len.parse().unwrap()];
            self.reader.read_exact(&mut body).unwrap();
            reply.body = body;
        }
        reply
    }
}

fn call(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    Conn::open(addr).call(method, path, headers, body)
}

struct E2b<'a> {
    daemon: &'a TestDaemon,
    key: String,
}

impl E2b<'_> {
    fn api(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        let data = body.map(|b| b.to_string()).unwrap_or_default();
        call(
            &self.daemon.addr,
            method,
            path,
            &[
                ("X-API-Key", &self.key),
                ("Content-Type", "application/json"),
            ],
            data.as_bytes(),
        )
    }

    fn create(&self, path: &str, extra: Value) -> Value {
        let mut body = json!({"templateID": "base", "timeout": 300});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let reply = self.api("POST", path, Some(body));
        assert_eq!(
            reply.status,
            201,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.json()
    }

    fn envd(
        &self,
        id: &str,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        self.routed(id, "49983", method, path, extra, body)
    }

    fn routed(
        &self,
        id: &str,
        port: &str,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut headers = vec![("E2b-Sandbox-Id", id), ("E2b-Sandbox-Port", port)];
        headers.extend_from_slice(extra);
        call(&self.daemon.addr, method, path, &headers, body)
    }
}

const RPC: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn test_keys_routing_credentials_and_errors() {
    common::require_binaries();
    let daemon = TestDaemon::start("e2b-surface", &[]);
    assert!(daemon.key.starts_with("ak_"));
    let e2b = E2b {
        daemon: &daemon,
        key: format!("e2b_{}", &daemon.key[3..]),
    };

    // Both spellings of one key, in X-API-Key or as a bearer token; nothing else.
    let created = e2b.create("/v2/sandboxes", json!({"metadata": {"suite": "rust"}}));
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let token = created["envdAccessToken"].as_str().unwrap().to_owned();
    assert_eq!(created["envdVersion"], "0.5.7");
    assert_eq!(
        created["domain"],
        format!("localhost:{}", daemon.addr.rsplit_once(':').unwrap().1)
    );
    let bearer = format!("Bearer {}", daemon.key);
    let listed = call(
        &daemon.addr,
        "GET",
        "/v2/sandboxes",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()[0]["sandboxID"], id.as_str());
    for wrong in ["e2b_00", "ak_00", ""] {
        let refused = call(
            &daemon.addr,
            "GET",
            "/v2/sandboxes",
            &[("X-API-Key", wrong)],
            b"",
        );
        assert_eq!(refused.status, 401, "{wrong:?}");
        assert_eq!(refused.json()["code"], 401);
    }
    // The native API takes the E2B spelling too.
    let native = call(
        &daemon.addr,
        "GET",
        "/v1/sandboxes",
        &[("X-API-Key", &e2b.key)],
        b"",
    );
    assert_eq!(native.status, 200);

    // A control-plane path with a key wins over routing headers (SDK 2.10's connect).
    let connect = e2b.routed(
        &id,
        "49983",
        "POST",
        &format!("/sandboxes/{id}/connect"),
        &[("X-API-Key", &e2b.key), RPC],
        br#"{"timeout": 60}"#,
    );
    assert_eq!(
        connect.status,
        200,
        "{}",
        String::from_utf8_lossy(&connect.body)
    );
    assert_eq!(connect.json()["envdAccessToken"], token.as_str());
    // Without a key, the same path with routing headers is the sandbox's (its agent has no
    // such route); so is /v1.
    assert_eq!(
        e2b.envd(&id, "GET", "/v1/health", &[("X-Access-Token", &token)], b"")
            .status,
        404
    );

    // The access token guards the envd, except /health; the E2b-* headers never reach it.
    assert_eq!(e2b.envd(&id, "GET", "/health", &[], b"").status, 204);
    let list_rpc = |extra: &[(&str, &str)]| {
        let mut headers = vec![RPC];
        headers.extend_from_slice(extra);
        e2b.envd(&id, "POST", "/process.Process/List", &headers, b"{}")
    };
    let refused = list_rpc(&[]);
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["code"], "unauthenticated");
    assert_eq!(list_rpc(&[("X-Access-Token", "at_wrong")]).status, 401);
    assert_eq!(list_rpc(&[("X-Access-Token", &token)]).status, 200);
    assert_eq!(
        list_rpc(&[("X-API-Key", &e2b.key)]).status,
        200,
        "an API key works too"
    );

    // /files also takes E2B's signature, bound to path, operation, user and expiry.
    let file = |query: &str| e2b.envd(&id, "GET", &format!("/files?{query}"), &[], b"");
    let read_sig = file_signature("/etc/hostname", false, "", &token, None);
    let encoded = read_sig.replace('+', "%2B").replace('/', "%2F");
    assert_eq!(
        file(&format!("path=%2Fetc%2Fhostname&signature={encoded}")).status,
        200
    );
    assert_eq!(file("path=%2Fetc%2Fhostname").status, 401);
    assert_eq!(
        file(&format!("path=%2Fetc%2Fpasswd&signature={encoded}")).status,
        401
    );
    let expired = file_signature("/etc/hostname", false, "", &token, Some("1000"));
    let expired = expired.replace('+', "%2B").replace('/', "%2F");
    let late = file(&format!(
        "path=%2Fetc%2Fhostname&signature={expired}&signature_expiration=1000"
    ));
    assert_eq!(late.status, 401);
    assert!(late.json()["message"].as_str().unwrap().contains("expired"));

    // A v1 sandbox created without `secure` has no token and an open data plane.
    let open = e2b.create("/sandboxes", json!({"secure": false}));
    let open_id = open["sandboxID"].as_str().unwrap();
    assert!(open.get("envdAccessToken").is_none(), "{open}");
    let listed = e2b.envd(open_id, "POST", "/process.Process/List", &[RPC], b"{}");
    assert_eq!(listed.status, 200);

    // Unknown sandboxes, by header or by host, and closed ports: the proxy's 502s.
    for reply in [
        e2b.envd("nosuchsandbox0000000", "GET", "/health", &[], b""),
        call(
            &daemon.addr,
            "GET",
            "/",
            &[("Host", "8080-nosuchsandbox0000000.localhost:1")],
            b"",
        ),
    ] {
        assert_eq!(reply.status, 502);
        let body = reply.json();
        assert_eq!(body["sandboxId"], "nosuchsandbox0000000");
        assert!(
            body["message"].as_str().unwrap().contains("was not found"),
            "{body}"
        );
    }
    let closed = e2b.routed(&id, "8999", "GET", "/", &[], b"");
    assert_eq!(closed.status, 502);
    assert!(
        closed.json()["message"]
            .as_str()
            .unwrap()
            .contains("port is not open")
    );
    assert_eq!(closed.json()["port"], "8999");
    let bad = e2b.routed(&id, "port", "GET", "/", &[], b"");
    assert_eq!(bad.status, 400);

    // Unknown templates; pause (204, then 409), the state, legacy resume (201, then 409).
    let missing = e2b.api("POST", "/v2/sandboxes", Some(json!({"templateID": "nope"})));
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["message"], "template 'nope' not found");
    let pause = |body| e2b.api("POST", &format!("/sandboxes/{id}/pause"), Some(body));
    assert_eq!(pause(json!({})).status, 204);
    assert_eq!(pause(json!({})).status, 409, "already paused");
    let detail = e2b.api("GET", &format!("/sandboxes/{id}"), None).json();
    assert_eq!(
        (detail["state"].as_str(), detail["pauseMode"].as_str()),
        (Some("paused"), Some("full"))
    );
    let resume = || e2b.api("POST", &format!("/sandboxes/{id}/resume"), Some(json!({})));
    assert_eq!(resume().status, 201);
    assert_eq!(resume().status, 409, "already running");
    assert_eq!(
        e2b.api("GET", &format!("/sandboxes/{id}"), None).json()["state"],
        "running"
    );
    assert_eq!(
        e2b.api(
            "POST",
            "/sandboxes/nosuchsandbox0000000/pause",
            Some(json!({}))
        )
        .status,
        404
    );

    // An error with an unread body leaves the keep-alive connection usable.
    let mut conn = Conn::open(&daemon.addr);
    let auth = [("X-API-Key", e2b.key.as_str()), RPC];
    let ghost = conn.call(
        "POST",
        "/v2/sandboxes/nosuchsandbox0000000/connect",
        &auth,
        br#"{"timeout": 60}"#,
    );
    assert_eq!(ghost.status, 404);
    let detail = conn.call("GET", &format!("/sandboxes/{id}"), &auth, b"");
    assert_eq!(detail.status, 200);
    for key in [
        "sandboxID",
        "startedAt",
        "endAt",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "clientID",
    ] {
        assert!(detail.json().get(key).is_some(), "{key}");
    }

    for sandbox in [id.as_str(), open_id] {
        assert_eq!(
            e2b.api("DELETE", &format!("/sandboxes/{sandbox}"), None)
                .status,
            204
        );
        assert_eq!(
            e2b.api("DELETE", &format!("/sandboxes/{sandbox}"), None)
                .status,
            404
        );
    }
    let gone = e2b.envd(&id, "GET", "/health", &[], b"");
    assert_eq!(gone.status, 502);
    assert!(
        gone.json()["message"]
            .as_str()
            .unwrap()
            .contains("was not found")
    );
}

#[test]
fn test_other_ports_are_reached_through_the_agents_tunnel() {
    common::require_binaries();
    let daemon = TestDaemon::start("e2b-tunnel", &[]);
    let e2b = E2b {
        daemon: &daemon,
        key: daemon.key.clone(),
    };
    let created = e2b.create("/v2/sandboxes", json!({}));
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let token = created["envdAccessToken"].as_str().unwrap().to_owned();
    // A server inside the sandbox, on its loopback only, started through the envd.
    let script = "mkdir -p /tmp/www && echo inside > /tmp/www/marker.txt && \
                  exec python3 -m http.server 8123 --bind 127.0.0.1 --directory /tmp/www";
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}});
    let mut framed = vec![0u8];
    let message = start.to_string();
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(message.as_bytes());
    let mut stream_conn = Conn::open(&daemon.addr);
    let stream_head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: {}\r\nE2b-Sandbox-Id: {id}\r\n\
         E2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}\r\n\
         Content-Type: application/connect+json\r\nContent-Length: {}\r\n\r\n",
        daemon.addr,
        framed.len()
    );
    let stream = stream_conn.reader.get_mut();
    stream.write_all(stream_head.as_bytes()).unwrap();
    stream.write_all(&framed).unwrap();
    assert!(
        stream_conn.line().starts_with("HTTP/1.1 200"),
        "Start was refused"
    );

    let host = format!(
        "8123-{id}.localhost:{}",
        daemon.addr.rsplit_once(':').unwrap().1
    );
    let give_up = Instant::now() + Duration::from_secs(60);
    let by_header = loop {
        let reply = e2b.routed(&id, "8123", "GET", "/marker.txt", &[], b"");
        if reply.status == 200 || Instant::now() > give_up {
            break reply;
        }
        assert_eq!(
            reply.status, 502,
            "only 'port is not open' while the server starts"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(by_header.status, 200);
    assert_eq!(by_header.body, b"inside\n");
    // The same server by host name, a larger answer, and several requests on one connection.
    let mut conn = Conn::open(&daemon.addr);
    for _ in 0..3 {
        let listing = conn.call("GET", "/", &[("Host", &host)], b"");
        assert_eq!(listing.status, 200);
        assert!(String::from_utf8_lossy(&listing.body).contains("marker.txt"));
    }
    let missing = conn.call("GET", "/absent", &[("Host", &host)], b"");
    assert_eq!(
        missing.status, 404,
        "the server's own answer passes through"
    );
    assert_eq!(
        e2b.api("DELETE", &format!("/sandboxes/{id}"), None).status,
        204
    );
    let gone = call(&daemon.addr, "GET", "/", &[("Host", &host)], b"");
    assert_eq!(gone.status, 502);
}
