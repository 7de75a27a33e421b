//! Language servers over WebSocket: `pylsp` (Debian's python3-pylsp, which the process tier's
//! sandbox sees with the host's root) started in a sandbox, and an LSP `initialize` round
//! trip through the daemon with a WebSocket client written here on a raw socket; the server
//! ends with its WebSocket. Needs root, pylsp, and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use airlock_api::v1::{CreateSandboxRequest, ErrorCode, ExecRequest, LspRequest};
use airlock_server::client::{Client, ClientError};
use common::TestDaemon;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A WebSocket client's handshake on a fresh connection; returns the stream after `101`.
async fn open(daemon: &TestDaemon, path: &str) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect(&daemon.addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nX-API-Key: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        daemon.addr, daemon.key
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    let head = String::from_utf8(head).unwrap();
    if !head.starts_with("HTTP/1.1 101") {
        return Err(head);
    }
    assert!(
        head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "the accept key of RFC 6455's example: {head}"
    );
    Ok(stream)
}

/// One masked text frame, as a client must send it.
async fn send_text(stream: &mut TcpStream, value: &Value) {
    let payload = value.to_string().into_bytes();
    let mask = [0x37u8, 0xfa, 0x21, 0x3d];
    let mut frame = vec![0x81];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    stream.write_all(&frame).await.unwrap();
}

/// The next frame from the server: (opcode, payload).
async fn read_frame(stream: &mut TcpStream) -> (u8, Vec<u8>) {
    let first = stream.read_u8().await.unwrap();
    let second = stream.read_u8().await.unwrap();
    assert_eq!(second & 0x80, 0, "server frames are not masked");
    let length = match second & 0x7f {
        126 => u64::from(stream.read_u16().await.unwrap()),
        127 => stream.read_u64().await.unwrap(),
        n => u64::from(n),
    };
    let mut payload = vec![0u8; usize::try_from(length).unwrap()];
    stream.read_exact(&mut payload).await.unwrap();
    (first & 0x0f, payload)
}

/// Messages from the server until the response to request `id`.
async fn response_to(stream: &mut TcpStream, id: u64) -> Value {
    loop {
        let (opcode, payload) = read_frame(stream).await;
        assert_eq!(
            opcode,
            1,
            "a text frame: {}",
            String::from_utf8_lossy(&payload)
        );
        let message: Value = serde_json::from_slice(&payload).unwrap();
        if message["id"] == id {
            return message;
        }
    }
}

async fn sh(client: &Client, id: &str, command: &str) -> String {
    let request = ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    };
    let output = client.exec_collect(id, &request).await.unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn api_code(err: ClientError) -> ErrorCode {
    match err {
        ClientError::Api { code, .. } => code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pylsp_answers_initialize_over_the_websocket() {
    common::require_binaries();
    assert!(
        std::path::Path::new("/usr/bin/pylsp").exists(),
        "pylsp is missing: apt-get install python3-pylsp (scripts/test.sh installs it)"
    );
    let daemon = TestDaemon::start("lsp", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    client
        .write_file(&id, "/workspace/app.py", b"import os\nos.pat\n".to_vec())
        .await
        .unwrap();
    let server = client
        .start_lsp(
            &id,
            &LspRequest {
                language: Some("python".into()),
                ..LspRequest::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(server.argv, ["pylsp"]);
    assert_eq!(server.root, "/workspace");
    assert!(
        !sh(&client, &id, &format!("cat /proc/{}/comm", server.pid))
            .await
            .is_empty()
    );

    let mut socket = open(&daemon, &server.websocket_path).await.unwrap();
    send_text(
        &mut socket,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": null, "rootUri": "file:///workspace", "capabilities": {}}}),
    )
    .await;
    let initialized = response_to(&mut socket, 1).await;
    let capabilities = &initialized["result"]["capabilities"];
    assert!(capabilities.is_object(), "{initialized}");
    assert!(
        capabilities.get("completionProvider").is_some(),
        "pylsp offers completion: {initialized}"
    );
    assert_eq!(
        initialized["result"]["serverInfo"]["name"], "pylsp",
        "{initialized}"
    );
    // A completion, which pylsp can only answer by reading the file in the sandbox.
    send_text(
        &mut socket,
        &json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
    )
    .await;
    send_text(
        &mut socket,
        &json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": "file:///workspace/app.py", "languageId": "python", "version": 1,
            "text": "import os\nos.pat\n"}}}),
    )
    .await;
    send_text(
        &mut socket,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/completion", "params": {
            "textDocument": {"uri": "file:///workspace/app.py"}, "position": {"line": 1, "character": 6}}}),
    )
    .await;
    let completion = response_to(&mut socket, 2).await;
    let items = completion["result"]["items"]
        .as_array()
        .or_else(|| completion["result"].as_array())
        .cloned()
        .unwrap_or_default();
    assert!(
        items.iter().any(|item| item["label"]
            .as_str()
            .is_some_and(|l| l.starts_with("path"))),
        "{completion}"
    );

    // A second client of the same server is refused; closing ends the server.
    let second = open(&daemon, &server.websocket_path).await.unwrap_err();
    assert!(second.starts_with("HTTP/1.1 404"), "{second}");
    socket.write_all(&[0x88, 0x80, 0, 0, 0, 0]).await.unwrap();
    let ended = common::eventually(std::time::Duration::from_secs(30), || {
        let client = &client;
        let id = &id;
        let pid = server.pid;
        async move {
            sh(
                client,
                id,
                &format!("test -e /proc/{pid} && echo alive || echo gone"),
            )
            .await
                == "gone"
        }
    })
    .await;
    assert!(ended, "the language server ends with its WebSocket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_lsp_requests_are_checked() {
    common::require_binaries();
    let daemon = TestDaemon::start("lsp-errors", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let language = |name: &str| LspRequest {
        language: Some(name.into()),
        ..LspRequest::default()
    };
    assert_eq!(
        api_code(client.start_lsp(&id, &language("cobol")).await.unwrap_err()),
        ErrorCode::Unprocessable
    );
    let missing = LspRequest {
        argv: Some(vec!["no-such-language-server".into()]),
        ..LspRequest::default()
    };
    assert_eq!(
        api_code(client.start_lsp(&id, &missing).await.unwrap_err()),
        ErrorCode::NotFound
    );
    assert_eq!(
        api_code(
            client
                .start_lsp(&id, &LspRequest::default())
                .await
                .unwrap_err()
        ),
        ErrorCode::InvalidRequest
    );
    let unknown = open(&daemon, &format!("/v1/sandboxes/{id}/lsp/nope"))
        .await
        .unwrap_err();
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
    // Without the upgrade headers the route says what it is, and the server keeps waiting.
    let sleeper = LspRequest {
        argv: Some(vec!["sleep".into(), "600".into()]),
        ..LspRequest::default()
    };
    let waiting = client.start_lsp(&id, &sleeper).await.unwrap();
    let (status, _, body) = client
        .raw(hyper::Method::GET, &waiting.websocket_path, &[], "")
        .await
        .unwrap();
    assert_eq!(status, 400, "{body:?}");
    let (status, _, _) = client
        .raw(
            hyper::Method::GET,
            &format!("/v1/sandboxes/{id}/lsp/nope"),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(status, 404);
    open(&daemon, &waiting.websocket_path).await.unwrap();
}
