//! Tool bindings of the wasm tier through the daemon: a sandbox created with HTTP tools calls
//! them from JavaScript and Python (`tools.NAME(args)`), the daemon performs each call with
//! the operator's headers (the guest never sees them) and audits it, and an approval-gated
//! tool suspends the guest until `/v1/approvals` answers. Needs root, `cargo build
//! --workspace` and the guest modules (scripts/wasm-guests.sh).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{
    ApprovalDecision, CreateSandboxRequest, ErrorCode, EvalErrorKind, EvalLanguage, EvalRequest,
    ToolBinding,
};
use common::TestDaemon;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// What the upstream saw: path, the `x-api-key` header, the JSON body.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Value)>>>;

/// A loopback HTTP endpoint: echoes the JSON body and whether the operator's key came with it.
async fn tool_upstream(seen: Seen) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut first = String::new();
                reader.read_line(&mut first).await.unwrap_or_default();
                let path = first.split(' ').nth(1).unwrap_or_default().to_owned();
                let (mut length, mut key) = (0, None);
                loop {
                    let mut header = String::new();
                    reader.read_line(&mut header).await.unwrap_or_default();
                    let lower = header.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if lower.starts_with("x-api-key:") {
                        key = Some(header["x-api-key:".len()..].trim().to_owned());
                    }
                    if header.trim().is_empty() {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                let answer = json!({"echo": body, "authorized": key.as_deref() == Some("s3cret")})
                    .to_string();
                seen.lock().unwrap().push((path, key, body));
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = reader.get_mut().write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}

fn http_tool(name: &str, addr: std::net::SocketAddr, approval: bool) -> ToolBinding {
    ToolBinding::Http {
        name: name.to_owned(),
        url: format!("http://{addr}/{name}"),
        method: None,
        headers: [("x-api-key".to_owned(), "s3cret".to_owned())].into(),
        approval,
        timeout_ms: None,
    }
}

fn eval(language: EvalLanguage, code: &str) -> EvalRequest {
    EvalRequest {
        language,
        code: code.to_owned(),
        timeout_ms: Some(5_000),
        context_id: None,
    }
}

#[tokio::test]
async fn test_wasm_tools_are_called_from_javascript_and_python_and_audited() {
    common::require_binaries();
    let seen = Seen::default();
    let upstream = tool_upstream(seen.clone()).await;
    let daemon = TestDaemon::start("wasm-tools", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest {
            template: Some("wasm-python".into()),
            tools: vec![http_tool("lookup", upstream, false)],
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox
        .id;
    let js = client
        .eval(
            &id,
            &eval(
                EvalLanguage::Javascript,
                "(async () => await tools.lookup({q: 'js'}))()",
            ),
        )
        .await
        .unwrap();
    assert_eq!(js.error, None, "{js:?}");
    assert_eq!(
        js.result,
        Some(json!({"echo": {"q": "js"}, "authorized": true}))
    );
    let py = client
        .eval(
            &id,
            &eval(EvalLanguage::Python, "tools.lookup({'q': 'py'})['echo']"),
        )
        .await
        .unwrap();
    assert_eq!(py.error, None, "{py:?}");
    assert_eq!(py.result, Some(json!({"q": "py"})));
    // A name the operator did not bind is no call at all.
    let unknown = client
        .eval(&id, &eval(EvalLanguage::Python, "tools.drop_tables()"))
        .await
        .unwrap();
    assert_eq!(
        unknown.error.as_ref().map(|e| e.kind),
        Some(EvalErrorKind::Exception)
    );
    let calls = seen.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            (
                "/lookup".to_owned(),
                Some("s3cret".to_owned()),
                json!({"q": "js"})
            ),
            (
                "/lookup".to_owned(),
                Some("s3cret".to_owned()),
                json!({"q": "py"})
            ),
        ]
    );
    // The guest cannot read the operator's header: it is not in its environment or output.
    let env = client
        .eval(
            &id,
            &eval(EvalLanguage::Python, "import os; dict(os.environ)"),
        )
        .await
        .unwrap();
    assert!(!format!("{env:?}").contains("s3cret"), "{env:?}");
    let events = client.events(&id, None, None).await.unwrap();
    let tools: Vec<(Option<&str>, &str)> = events
        .events
        .iter()
        .filter(|e| e.kind == "tool")
        .map(|e| (e.method.as_deref(), e.outcome.as_str()))
        .collect();
    assert_eq!(tools, vec![(Some("lookup"), "ok"), (Some("lookup"), "ok")]);
    assert!(!format!("{events:?}").contains("s3cret"));
    client.delete(&id).await.unwrap();
}

#[tokio::test]
async fn test_wasm_tool_with_approval_suspends_the_guest_until_answered() {
    common::require_binaries();
    let seen = Seen::default();
    let upstream = tool_upstream(seen.clone()).await;
    let daemon = TestDaemon::start("wasm-tool-approval", &[]);
    let client = daemon.client();
    let policy: PolicyDocument =
        serde_json::from_value(json!({"version": 1, "network": {"mode": "proxy"}})).unwrap();
    let id = client
        .create(&CreateSandboxRequest {
            template: Some("wasm-python".into()),
            policy: Some(Box::new(policy)),
            tools: vec![http_tool("pay", upstream, true)],
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox
        .id;
    for (language, code, decision) in [
        (
            EvalLanguage::Javascript,
            "(async () => (await tools.pay({amount: 5})).echo.amount)()",
            ApprovalDecision::Once,
        ),
        (
            EvalLanguage::Python,
            "tools.pay({'amount': 7})['echo']['amount']",
            ApprovalDecision::Once,
        ),
        (
            EvalLanguage::Python,
            "try:\n    tools.pay({'amount': 9})\nexcept ToolError as e:\n    r = str(e)\nr",
            ApprovalDecision::Deny,
        ),
    ] {
        let before = seen.lock().unwrap().len();
        let waiting = {
            let client = client.clone();
            let id = id.clone();
            let request = EvalRequest {
                timeout_ms: Some(2_000),
                ..eval(language, code)
            };
            tokio::spawn(async move { client.eval(&id, &request).await })
        };
        let held = Arc::new(Mutex::new(Vec::new()));
        let listed = common::eventually(Duration::from_secs(60), || {
            let client = client.clone();
            let id = id.clone();
            let held = held.clone();
            async move {
                let list = client.approvals(Some(&id)).await.unwrap();
                let some = !list.is_empty();
                *held.lock().unwrap() = list;
                some
            }
        })
        .await;
        let held = held.lock().unwrap().clone();
        assert!(listed, "the call is held for approval");
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].path.as_deref(), Some("/pay"), "{held:?}");
        // Suspended: nothing reached the upstream, and the guest has not finished.
        assert_eq!(seen.lock().unwrap().len(), before);
        assert!(!waiting.is_finished());
        client.decide_approval(&held[0].id, decision).await.unwrap();
        let answer = waiting.await.unwrap().unwrap();
        assert_eq!(answer.error, None, "{answer:?}");
        match decision {
            ApprovalDecision::Deny => {
                let text = answer.result.unwrap();
                assert!(text.as_str().unwrap().contains("not approved"), "{text}");
                assert_eq!(seen.lock().unwrap().len(), before);
            }
            _ => {
                assert!(answer.result.is_some_and(|r| r == 5 || r == 7));
                assert_eq!(seen.lock().unwrap().len(), before + 1);
            }
        }
    }
    let events = client.events(&id, None, None).await.unwrap();
    let tools: Vec<&str> = events
        .events
        .iter()
        .filter(|e| e.kind == "tool")
        .map(|e| e.outcome.as_str())
        .collect();
    assert_eq!(tools, vec!["ok", "ok", "denied"], "{events:?}");
    let approvals: Vec<&str> = events
        .events
        .iter()
        .filter(|e| e.kind == "approval")
        .map(|e| e.outcome.as_str())
        .collect();
    assert!(
        approvals.contains(&"asked") && approvals.contains(&"denied"),
        "{approvals:?}"
    );
    client.delete(&id).await.unwrap();
}

#[tokio::test]
async fn test_wasm_tools_that_cannot_be_honoured_are_refused_at_create() {
    common::require_binaries();
    let daemon = TestDaemon::start("wasm-tool-refusals", &[]);
    let client = daemon.client();
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    for (request, reason) in [
        (
            CreateSandboxRequest {
                tools: vec![http_tool("lookup", addr, false)],
                ..Default::default()
            },
            "wasm tier",
        ),
        (
            CreateSandboxRequest {
                template: Some("wasm-js".into()),
                tools: vec![http_tool("pay", addr, true)],
                ..Default::default()
            },
            "network: proxy",
        ),
        (
            CreateSandboxRequest {
                template: Some("wasm-js".into()),
                tools: vec![http_tool("a", addr, false), http_tool("a", addr, false)],
                ..Default::default()
            },
            "twice",
        ),
        (
            CreateSandboxRequest {
                template: Some("wasm-js".into()),
                tools: vec![ToolBinding::Http {
                    name: "b".into(),
                    url: "https://example.test/".into(),
                    method: None,
                    headers: Default::default(),
                    approval: false,
                    timeout_ms: None,
                }],
                ..Default::default()
            },
            "only http://",
        ),
        (
            CreateSandboxRequest {
                template: Some("wasm-js".into()),
                tools: vec![ToolBinding::Mcp {
                    name: "m".into(),
                    sandbox_id: "sbx-nonexistent".into(),
                    port: 8000,
                    path: None,
                    tool: "t".into(),
                    approval: false,
                }],
                ..Default::default()
            },
            "no sandbox",
        ),
    ] {
        let err = client.create(&request).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::Unprocessable), "{err}");
        assert!(err.to_string().contains(reason), "{reason}: {err}");
    }
    assert!(
        client
            .list(&[], &Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

/// A minimal MCP server (streamable HTTP, JSON answers) for a process-tier sandbox: one tool,
/// `multiply`.
const MCP_SERVER: &str = r#"
import http.server, json
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in message:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if message["method"] == "initialize":
            result = {"protocolVersion": "2025-03-26", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "multiplier", "version": "1"}}
        elif message["params"]["name"] == "multiply":
            args = message["params"]["arguments"]
            product = args["a"] * args["b"]
            result = {"content": [{"type": "text", "text": json.dumps({"product": product})}],
                      "structuredContent": {"product": product}, "isError": False}
        else:
            result = {"content": [{"type": "text", "text": "no such tool"}], "isError": True}
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Mcp-Session-Id", "session-1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", 8765), Handler).serve_forever()
"#;

#[tokio::test]
async fn test_wasm_mcp_tool_of_another_sandbox_is_called_through_its_data_plane() {
    common::require_binaries();
    let daemon = TestDaemon::start("wasm-tool-mcp", &[]);
    let client = daemon.client();
    let server = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    client
        .write_file(&server, "/workspace/mcp_server.py", MCP_SERVER.as_bytes())
        .await
        .unwrap();
    // Held open for the test: the server runs as long as the command does.
    let _running = client
        .exec(
            &server,
            &airlock_api::v1::ExecRequest {
                argv: Some(vec![
                    "/usr/bin/python3".into(),
                    "/workspace/mcp_server.py".into(),
                ]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mcp = |name: &str, tool: &str| ToolBinding::Mcp {
        name: name.to_owned(),
        sandbox_id: server.clone(),
        port: 8765,
        path: None,
        tool: tool.to_owned(),
        approval: false,
    };
    let id = client
        .create(&CreateSandboxRequest {
            template: Some("wasm-js".into()),
            tools: vec![mcp("multiply", "multiply"), mcp("missing", "divide")],
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox
        .id;
    let call = eval(
        EvalLanguage::Javascript,
        "(async () => await tools.multiply({a: 6, b: 7}))()",
    );
    let answer = Arc::new(Mutex::new(None));
    let answered = common::eventually(Duration::from_secs(60), || {
        let client = client.clone();
        let (id, call, answer) = (id.clone(), call.clone(), answer.clone());
        async move {
            let got = client.eval(&id, &call).await.unwrap();
            let ok = got.error.is_none();
            *answer.lock().unwrap() = Some(got);
            ok
        }
    })
    .await;
    let answer = answer.lock().unwrap().clone();
    assert!(answered, "the MCP server answers: {answer:?}");
    assert_eq!(answer.unwrap().result, Some(json!({"product": 42})));
    let failed = client
        .eval(
            &id,
            &eval(
                EvalLanguage::Javascript,
                "(async () => { try { await tools.missing({}); } catch (e) { return e.message; } })()",
            ),
        )
        .await
        .unwrap();
    assert!(
        failed
            .result
            .as_ref()
            .and_then(Value::as_str)
            .is_some_and(|m| m.contains("no such tool")),
        "{failed:?}"
    );
    let events = client.events(&id, None, None).await.unwrap();
    let last = events
        .events
        .iter()
        .rev()
        .find(|e| e.kind == "tool")
        .unwrap();
    assert_eq!(last.host.as_deref(), Some(format!("mcp.{server}").as_str()));
    assert_eq!(last.outcome, "failed");
    for sandbox in [id, server] {
        client.delete(&sandbox).await.unwrap();
    }
}
