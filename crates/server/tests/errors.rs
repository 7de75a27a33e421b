//! Error answers follow the spec (`api/openapi.json`): every error is an `ErrorBody` with its
//! documented status and code, the caller's mistakes are 4xx (never `agent_error`), a full disk
//! is 507, a sandbox being removed is 409, a capped create says when to retry, a refused
//! upload is answered before its body has been sent, and an oversized JSON body gets its 413
//! instead of a reset connection. Needs root, `cargo build --workspace` and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use airlock_api::v1::{
    CreateSandboxRequest, ErrorBody, ErrorCode, ExecRequest, Resources, Workspace,
};
use airlock_server::client::Client;
use common::TestDaemon;
use hyper::{HeaderMap, Method, StatusCode};

/// A raw request's status, headers and `ErrorBody`, checked against the expected pair.
async fn expect(
    client: &Client,
    method: Method,
    path: &str,
    body: &str,
    status: StatusCode,
    code: ErrorCode,
) -> (HeaderMap, ErrorBody) {
    let (got, headers, bytes) = client
        .raw(method.clone(), path, &[], body.to_owned())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(got, status, "{method} {path}: {text}");
    let error: ErrorBody =
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"));
    assert_eq!(error.code, code, "{method} {path}: {text}");
    (headers, error)
}

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

fn with_disk(disk_bytes: u64) -> CreateSandboxRequest {
    CreateSandboxRequest {
        resources: Resources {
            disk_bytes: Some(disk_bytes),
            ..Resources::default()
        },
        ..CreateSandboxRequest::default()
    }
}

#[tokio::test]
async fn test_envd_proxy_errors_are_error_bodies_with_string_codes() {
    common::require_binaries();
    let daemon = TestDaemon::start("envd-errors", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let envd = |rest: &str| format!("/v1/sandboxes/{id}/envd/{rest}");
    // A path the agent does not serve is the daemon's 404, not the agent's `{"code": 404}`.
    for rest in ["0", "files/x", "process.Process", "airlock/tcp"] {
        let (_, error) = expect(
            &client,
            Method::GET,
            &envd(rest),
            "",
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
        )
        .await;
        assert!(error.message.contains("serves no"), "{}", error.message);
    }
    // A served path with another method: 405 naming the methods.
    let (headers, _) = expect(
        &client,
        Method::PUT,
        &envd("files"),
        "",
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
    )
    .await;
    assert_eq!(headers["allow"], "GET, POST");
    // The agent's plain-HTTP errors (/files) become ours, with the caller's codes.
    expect(
        &client,
        Method::POST,
        &envd("files?path=/usr/airlock-x"),
        "data",
        StatusCode::FORBIDDEN,
        ErrorCode::ReadOnly,
    )
    .await;
    expect(
        &client,
        Method::GET,
        &envd("files?path=/etc/shadow"),
        "",
        StatusCode::FORBIDDEN,
        ErrorCode::PermissionDenied,
    )
    .await;
    expect(
        &client,
        Method::GET,
        &envd("files?path=/workspace/missing"),
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    // An unknown sandbox, on the same route.
    expect(
        &client,
        Method::GET,
        "/v1/sandboxes/nosuch0sandbox/envd/health",
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    // The Connect RPCs keep Connect's error bodies (their clients parse those).
    let (status, _, bytes) = client
        .raw(
            Method::POST,
            &envd("filesystem.Filesystem/MakeDir"),
            &[("content-type", "application/json")],
            r#"{"path":"/workspace"}"#,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CONFLICT);
    let connect: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(connect["code"], "already_exists", "{connect}");
}

#[tokio::test]
async fn test_caller_file_mistakes_are_4xx_and_a_full_disk_is_507() {
    common::require_binaries();
    let daemon = TestDaemon::start("file-errors", &[]);
    let client = daemon.client();
    let id = client.create(&with_disk(8 << 20)).await.unwrap().sandbox.id;
    let files = |path: &str| format!("/v1/sandboxes/{id}/files?path={path}");
    let call = |method, path: String, body: &'static str, status, code| {
        let client = client.clone();
        async move { expect(&client, method, &path, body, status, code).await }
    };
    // Read-only parts of the view, and paths Landlock or a mask denies.
    for path in ["/usr/airlock-x", "/etc/airlock-x"] {
        call(
            Method::PUT,
            files(path),
            "x",
            StatusCode::FORBIDDEN,
            ErrorCode::ReadOnly,
        )
        .await;
    }
    call(
        Method::DELETE,
        files("/etc/hostname"),
        "",
        StatusCode::FORBIDDEN,
        ErrorCode::ReadOnly,
    )
    .await;
    call(
        Method::PUT,
        files("/etc/shadow"),
        "x",
        StatusCode::FORBIDDEN,
        ErrorCode::PermissionDenied,
    )
    .await;
    // A directory where a file is wanted, and the reverse: conflicts with what exists.
    call(
        Method::PUT,
        files("/tmp"),
        "x",
        StatusCode::CONFLICT,
        ErrorCode::Conflict,
    )
    .await;
    client
        .write_file(&id, "/tmp/plain", &b"x"[..])
        .await
        .unwrap();
    call(
        Method::GET,
        format!("/v1/sandboxes/{id}/files/list?path=/tmp/plain"),
        "",
        StatusCode::CONFLICT,
        ErrorCode::Conflict,
    )
    .await;
    call(
        Method::POST,
        format!("/v1/sandboxes/{id}/files/mkdir"),
        r#"{"path":"/tmp/plain"}"#,
        StatusCode::CONFLICT,
        ErrorCode::Conflict,
    )
    .await;
    // A program or working directory the sandbox lacks.
    let exec = format!("/v1/sandboxes/{id}/exec");
    call(
        Method::POST,
        exec.clone(),
        r#"{"argv":["no-such-program-airlock"]}"#,
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    call(
        Method::POST,
        exec,
        r#"{"shell":"true","cwd":"/no/such/dir"}"#,
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    // A full disk: /tmp holds 8 MiB; 6 MiB are taken from inside, then 4 MiB are uploaded.
    let out = client
        .exec_collect(
            &id,
            &shell("dd if=/dev/zero of=/tmp/fill bs=1M count=6 2>&1"),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stdout));
    let payload = vec![b'z'; 4 << 20];
    let (status, _, bytes) = client
        .raw(Method::PUT, &files("/tmp/more"), &[], payload)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(status.as_u16(), 507, "{text}");
    let error: ErrorBody = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(error.code, ErrorCode::InsufficientStorage, "{text}");
    // The sandbox lives on, with its files.
    let out = client
        .exec_collect(&id, &shell("cat /tmp/plain; stat -c %s /tmp/fill"))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x6291456\n");
}

#[tokio::test]
async fn test_file_size_limit_is_413_file_too_large() {
    common::require_binaries();
    // A host workspace is not a tmpfs: only the file-size limit (disk_bytes) stops a write.
    let root = common::scratch_dir("efbig-root");
    let root_arg = root.to_string_lossy().into_owned();
    let daemon = TestDaemon::start("efbig", &["--workspace-root", &root_arg]);
    let client = daemon.client();
    let mut request = with_disk(2 << 20);
    request.workspace = Workspace::Host {
        path: root_arg.clone(),
    };
    let id = client.create(&request).await.unwrap().sandbox.id;
    let (status, _, bytes) = client
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/workspace/big"),
            &[],
            vec![b'b'; 3 << 20],
        )
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    let error: ErrorBody = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(error.code, ErrorCode::FileTooLarge, "{text}");
    // The limit held on the host too, and a file within it is fine.
    assert_eq!(std::fs::metadata(root.join("big")).unwrap().len(), 2 << 20);
    client
        .write_file(&id, "/workspace/small", vec![b's'; 1 << 20])
        .await
        .unwrap();
    client.delete(&id).await.unwrap();
    drop(daemon);
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test]
async fn test_capped_create_answers_503_with_retry_after() {
    common::require_binaries();
    let daemon = TestDaemon::start("capped", &["--max-sandboxes", "1"]);
    let client = daemon.client();
    client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap();
    let (headers, error) = expect(
        &client,
        Method::POST,
        "/v1/sandboxes",
        "{}",
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Capacity,
    )
    .await;
    assert!(
        error.message.contains("--max-sandboxes"),
        "{}",
        error.message
    );
    assert_eq!(headers["retry-after"], "5");
    // E2B's control plane says the same with its 429, which the SDKs retry after that long.
    let e2b_key = daemon.key.replacen("ak_", "e2b_", 1);
    let (status, headers, _) = daemon
        .anonymous()
        .raw(
            Method::POST,
            "/sandboxes",
            &[
                ("x-api-key", &e2b_key),
                ("content-type", "application/json"),
            ],
            r#"{"templateID":"base"}"#,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "5");
}

#[tokio::test]
async fn test_sandbox_being_removed_answers_409_or_404_never_503() {
    common::require_binaries();
    let daemon = TestDaemon::start("stopping", &[]);
    let client = daemon.client();
    let mut stopping_seen = 0;
    for _ in 0..3 {
        let id = client
            .create(&CreateSandboxRequest::default())
            .await
            .unwrap()
            .sandbox
            .id;
        let done = Arc::new(AtomicBool::new(false));
        let poller = {
            let (client, id, done) = (client.clone(), id.clone(), done.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    for (method, path) in [
                        (
                            Method::GET,
                            format!("/v1/sandboxes/{id}/files/stat?path=/tmp"),
                        ),
                        (Method::GET, format!("/v1/sandboxes/{id}/envd/health")),
                        (Method::DELETE, format!("/v1/sandboxes/{id}")),
                    ] {
                        let (status, _, bytes) = client.raw(method, &path, &[], "").await.unwrap();
                        answers.push((status, bytes));
                    }
                }
                answers
            })
        };
        client.delete(&id).await.unwrap_or(());
        done.store(true, Ordering::Relaxed);
        for (status, bytes) in poller.await.unwrap() {
            if status.is_success() {
                continue;
            }
            let error: ErrorBody = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{status}: {e}: {}", String::from_utf8_lossy(&bytes)));
            match (status.as_u16(), error.code) {
                (409, ErrorCode::SandboxStopping) => stopping_seen += 1,
                (404, ErrorCode::NotFound) => {}
                other => panic!(
                    "a sandbox being removed answered {other:?}: {}",
                    error.message
                ),
            }
        }
        expect(
            &client,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            "",
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
        )
        .await;
    }
    eprintln!("answers 409 sandbox_stopping seen while removing: {stopping_seen}");
}

/// The outcome of a raw upload that declares `declared` bytes and sends until answered.
struct EarlyAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// What the client had written when the answer's status line arrived.
    sent_at_answer: u64,
    /// Whether the daemon closed the connection after the answer (EOF).
    closed: bool,
}

/// PUTs `declared` bytes of zeros over a plain TCP connection from one thread while another
/// reads the answer; the writer stops once the answer is in.
fn upload_until_answered(addr: &str, key: &str, path: &str, declared: u64) -> EarlyAnswer {
    let stream = TcpStream::connect(addr).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicBool::new(false));
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nX-API-Key: {key}\r\nContent-Type: application/octet-stream\r\nContent-Length: {declared}\r\n\r\n"
    );
    let sender = {
        let (sent, answered) = (sent.clone(), answered.clone());
        std::thread::spawn(move || {
            writer.write_all(head.as_bytes()).unwrap();
            let chunk = vec![0u8; 64 << 10];
            while !answered.load(Ordering::Relaxed) && sent.load(Ordering::Relaxed) < declared {
                if writer.write_all(&chunk).is_err() {
                    break;
                }
                sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            // The rest is never sent: end the request stream so that the daemon stops waiting.
            let _ = writer.shutdown(Shutdown::Write);
        })
    };
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let sent_at_answer = sent.load(Ordering::Relaxed);
    answered.store(true, Ordering::Relaxed);
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).unwrap();
    let mut rest = Vec::new();
    let closed = reader.read_to_end(&mut rest).is_ok_and(|_| rest.is_empty());
    sender.join().unwrap();
    EarlyAnswer {
        status,
        headers,
        body,
        sent_at_answer,
        closed,
    }
}

#[tokio::test]
async fn test_refused_upload_is_answered_before_its_body_is_sent() {
    common::require_binaries();
    let daemon = TestDaemon::start("early-answer", &[]);
    let client = daemon.client();
    let id = client.create(&with_disk(8 << 20)).await.unwrap().sandbox.id;
    // /tmp holds 8 MiB: with 6 MiB taken, an upload fills it after 2 MiB (below the 8 MiB
    // file-size limit, so the disk is what refuses it).
    let out = client
        .exec_collect(
            &id,
            &shell("dd if=/dev/zero of=/tmp/fill bs=1M count=6 2>&1"),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stdout));
    // 256 MiB declared; far less can be in flight (socket buffers) when the answer comes.
    const DECLARED: u64 = 256 << 20;
    const IN_FLIGHT_AT_MOST: u64 = 64 << 20;
    let cases = [
        ("/usr/airlock-early", 403, ErrorCode::ReadOnly),
        ("/tmp/too-big", 507, ErrorCode::InsufficientStorage),
    ];
    for (path, status, code) in cases {
        let (addr, key) = (daemon.addr.clone(), daemon.key.clone());
        let target = format!("/v1/sandboxes/{id}/files?path={path}");
        let answer = tokio::task::spawn_blocking(move || {
            upload_until_answered(&addr, &key, &target, DECLARED)
        })
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&answer.body).into_owned();
        assert_eq!(answer.status, status, "{path}: {text}");
        let error: ErrorBody = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(error.code, code, "{path}: {text}");
        assert!(
            answer
                .headers
                .iter()
                .any(|(name, value)| name == "connection" && value == "close"),
            "{path}: {:?}",
            answer.headers
        );
        assert!(
            answer.sent_at_answer < IN_FLIGHT_AT_MOST,
            "{path}: the answer came after {} of {DECLARED} bytes",
            answer.sent_at_answer
        );
        assert!(answer.closed, "{path}: the connection stayed open");
        eprintln!(
            "{path}: answered after {} of {DECLARED} bytes",
            answer.sent_at_answer
        );
    }
    // The daemon and the sandbox are fine afterwards.
    let out = client.exec_collect(&id, &shell("echo ok")).await.unwrap();
    assert_eq!(out.stdout, b"ok\n");
}

/// A JSON body over the daemon's limit, declared and sent whole over a plain TCP connection:
/// the client must finish sending and read the 413, never a reset connection. (The daemon
/// answers at once and reads the rest of the body while the answer goes out.)
fn post_oversized_json(addr: &str, key: &str, declared: usize) -> (Result<(), String>, String) {
    let stream = TcpStream::connect(addr).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: {addr}\r\nX-API-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    let sender = std::thread::spawn(move || -> Result<(), String> {
        writer
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut body = br#"{"metadata":{"x":""#.to_vec();
        body.resize(declared - 3, b'a');
        body.extend_from_slice(br#""}}"#);
        writer.write_all(&body).map_err(|e| e.to_string())
    });
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    let read = reader.read_line(&mut status_line);
    let sent = sender.join().unwrap();
    match read {
        Ok(_) => (sent, status_line),
        Err(err) => (sent, format!("no answer: {err}")),
    }
}

#[tokio::test]
async fn test_oversized_json_body_is_answered_413_not_reset() {
    common::require_binaries();
    let daemon = TestDaemon::start("oversized-json", &[]);
    for attempt in 0..5 {
        let (addr, key) = (daemon.addr.clone(), daemon.key.clone());
        let (sent, status_line) =
            tokio::task::spawn_blocking(move || post_oversized_json(&addr, &key, 4 << 20))
                .await
                .unwrap();
        assert!(
            status_line.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {status_line:?}"
        );
        assert_eq!(sent, Ok(()), "attempt {attempt}: the whole body was sent");
    }
    assert_eq!(daemon.client().health().await.unwrap().status, "ok");
}
