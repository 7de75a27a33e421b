//! Tool bindings of the wasm tier (`CreateSandboxRequest::tools`): the daemon performs every
//! call a guest makes with `tools.NAME(args)`. The worker sends the call on the evaluation's
//! connection (`wasm::ask`); this module finds the binding, holds an approval-gated call in
//! the sandbox's egress approval queue (so `GET /v1/approvals` lists it and the usual
//! answers, timeout, webhook and "always" grants apply, while the guest stays suspended),
//! performs it (an HTTP request with the operator's headers, or MCP `tools/call` through
//! another sandbox's data plane) and writes one audit record per call.

use std::sync::Arc;
use std::time::Duration;

use airlock_api::policy::NetworkMode;
use airlock_api::v1::{
    CreateSandboxRequest, DEFAULT_TOOL_TIMEOUT_MS, MAX_TOOLS, ToolBinding, ToolCall, ToolResult,
    valid_tool_name,
};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::Daemon;
use crate::audit::ToolAudit;
use crate::e2b::tunnel;

/// The largest tool answer read.
const MAX_TOOL_ANSWER_BYTES: usize = 8 << 20;
/// How long an MCP call may take.
const MCP_TIMEOUT: Duration = Duration::from_secs(60);

/// The E2B metadata key whose value (a JSON array of bindings) declares a create's tools:
/// E2B's create has no field for them. It is taken out of the metadata, which sandbox
/// listings return, so that the tools' header values are not shown again.
pub const META_TOOLS: &str = "airlock.tools";

/// The tools `metadata` declares (and the key removed), or why its value is not bindings.
pub fn tools_from_metadata(
    metadata: &mut std::collections::BTreeMap<String, String>,
) -> Result<Vec<ToolBinding>, String> {
    let Some(text) = metadata.remove(META_TOOLS) else {
        return Ok(Vec::new());
    };
    serde_json::from_str(&text)
        .map_err(|e| format!("metadata {META_TOOLS:?} is not a JSON array of tool bindings: {e}"))
}

/// Why a create's tools are refused (422), if they are.
pub fn check_tools(
    request: &CreateSandboxRequest,
    wasm: bool,
    sandbox_exists: impl Fn(&str) -> bool,
) -> Result<(), String> {
    if request.tools.is_empty() {
        return Ok(());
    }
    if !wasm {
        return Err(
            "tools are host functions of the wasm tier: use template wasm-js or wasm-python"
                .to_owned(),
        );
    }
    if request.tools.len() > MAX_TOOLS {
        return Err(format!("at most {MAX_TOOLS} tools"));
    }
    let proxy = request
        .policy
        .as_deref()
        .is_some_and(|p| p.network.mode == Some(NetworkMode::Proxy));
    let mut names = std::collections::BTreeSet::new();
    for tool in &request.tools {
        let name = tool.name();
        if !valid_tool_name(name) {
            return Err(format!(
                "tool name {name:?}: letters, digits and _ only, not starting with a digit, at most 64"
            ));
        }
        if !names.insert(name) {
            return Err(format!("tool name {name:?} appears twice"));
        }
        if tool.needs_approval() && !proxy {
            return Err(format!(
                "tool {name:?} needs approval: that needs a policy with `network: proxy` (the approvals live in the sandbox's egress proxy)"
            ));
        }
        match tool {
            ToolBinding::Http {
                url,
                method,
                headers,
                ..
            } => {
                http_target(url).map_err(|why| format!("tool {name:?}: {why}"))?;
                if let Some(method) = method
                    && (method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()))
                {
                    return Err(format!(
                        "tool {name:?}: method {method:?} is not an upper-case HTTP method"
                    ));
                }
                for (header, value) in headers {
                    if hyper::header::HeaderName::from_bytes(header.as_bytes()).is_err()
                        || hyper::header::HeaderValue::from_str(value).is_err()
                    {
                        return Err(format!("tool {name:?}: header {header:?} is not valid"));
                    }
                }
            }
            ToolBinding::Mcp {
                path,
                tool: remote,
                sandbox_id,
                ..
            } => {
                if !sandbox_exists(sandbox_id) {
                    return Err(format!("tool {name:?}: no sandbox {sandbox_id:?}"));
                }
                if remote.is_empty() {
                    return Err(format!("tool {name:?}: the MCP tool's name is empty"));
                }
                if path.as_deref().is_some_and(|p| !p.starts_with('/')) {
                    return Err(format!("tool {name:?}: path must start with /"));
                }
            }
        }
    }
    Ok(())
}

/// The URI and `host:port` of an `http://` tool URL.
fn http_target(url: &str) -> Result<(Uri, String, u16), String> {
    let uri: Uri = url
        .parse()
        .map_err(|_| format!("url {url:?} is not a URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "url {url:?}: only http:// endpoints (the daemon calls them)"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("url {url:?} has no host"))?;
    let host = authority.host().to_owned();
    let port = authority.port_u16().unwrap_or(80);
    Ok((uri, host, port))
}

/// Where a call goes, for its approval and its audit line.
struct Target {
    host: String,
    port: u16,
    method: String,
    path: String,
}

fn target_of(binding: &ToolBinding) -> Target {
    match binding {
        ToolBinding::Http { url, method, .. } => {
            let (uri, host, port) =
                http_target(url).unwrap_or_else(|_| (Uri::from_static("/"), String::new(), 0));
            Target {
                host,
                port,
                method: method.clone().unwrap_or_else(|| "POST".to_owned()),
                path: uri.path().to_owned(),
            }
        }
        ToolBinding::Mcp {
            sandbox_id,
            port,
            tool,
            ..
        } => Target {
            host: format!("mcp.{sandbox_id}"),
            port: *port,
            method: "MCP".to_owned(),
            path: format!("/tools/{tool}"),
        },
    }
}

impl Daemon {
    /// Performs one tool call of wasm sandbox `id`'s guest and audits it.
    pub async fn perform_tool(self: &Arc<Self>, id: &str, call: ToolCall) -> ToolResult {
        let digest = crate::auth::hash_secret(&call.args.to_string());
        let binding = self.store.get_sandbox(id).ok().flatten().and_then(|row| {
            row.request
                .tools
                .into_iter()
                .find(|t| t.name() == call.name)
        });
        let Some(binding) = binding else {
            self.audit.tool(
                id,
                &ToolAudit {
                    name: &call.name,
                    outcome: "denied",
                    host: None,
                    port: None,
                    path: None,
                    args_sha256: &digest,
                    why: Some("no such tool"),
                },
            );
            return ToolResult::Error {
                message: format!("this sandbox has no tool {:?}", call.name),
            };
        };
        let target = target_of(&binding);
        let audit = |outcome: &str, why: Option<&str>| {
            self.audit.tool(
                id,
                &ToolAudit {
                    name: &call.name,
                    outcome,
                    host: Some(&target.host),
                    port: Some(target.port),
                    path: Some(&target.path),
                    args_sha256: &digest,
                    why,
                },
            );
        };
        if binding.needs_approval() {
            let queue = self
                .running(id)
                .ok()
                .and_then(|live| live.egress.clone())
                .and_then(|egress| egress.approvals());
            let Some((approvals, timeout)) = queue else {
                audit(
                    "denied",
                    Some("the egress proxy that holds approvals is not running"),
                );
                return ToolResult::Error {
                    message: "the call needs an approval, and the sandbox's egress proxy (which holds approvals) is not running".to_owned(),
                };
            };
            let detail = format!("tool {} (wasm guest)", call.name);
            let approved = approvals
                .hold(
                    (&target.host, target.port),
                    &target.method,
                    &target.path,
                    timeout,
                    &detail,
                )
                .await;
            if !approved {
                audit("denied", Some("the approval was denied or timed out"));
                return ToolResult::Error {
                    message: "the call was not approved (denied, or the approval timed out)"
                        .to_owned(),
                };
            }
        }
        let performed = match &binding {
            ToolBinding::Http {
                url,
                headers,
                timeout_ms,
                ..
            } => {
                let timeout = Duration::from_millis(timeout_ms.unwrap_or(DEFAULT_TOOL_TIMEOUT_MS));
                let request = HttpCall {
                    url,
                    method: &target.method,
                    headers,
                    body: &call.args,
                };
                match tokio::time::timeout(timeout, http_call(&request)).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
                }
            }
            ToolBinding::Mcp {
                sandbox_id,
                port,
                path,
                tool,
                ..
            } => {
                let mcp = self.mcp_call(
                    sandbox_id,
                    *port,
                    path.as_deref().unwrap_or("/mcp"),
                    tool,
                    &call.args,
                );
                match tokio::time::timeout(MCP_TIMEOUT, mcp).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("no answer within {} s", MCP_TIMEOUT.as_secs())),
                }
            }
        };
        match performed {
            Ok(value) => {
                audit("ok", None);
                ToolResult::Ok { value }
            }
            Err(message) => {
                audit("failed", Some(&message));
                ToolResult::Error { message }
            }
        }
    }

    /// MCP's `tools/call` on the server at `port` inside sandbox `sandbox_id`, through that
    /// sandbox's data plane (initialise, then call, in one session).
    async fn mcp_call(
        self: &Arc<Self>,
        sandbox_id: &str,
        port: u16,
        path: &str,
        tool: &str,
        args: &Value,
    ) -> Result<Value, String> {
        let agent = self
            .agent(sandbox_id)
            .await
            .map_err(|e| format!("sandbox {sandbox_id}: {}", e.message))?;
        let arguments = if args.is_null() {
            json!({})
        } else {
            args.clone()
        };
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "airlock-wasm-tools", "version": env!("CARGO_PKG_VERSION")}}});
        let (session, _) = mcp_post(agent.socket(), port, path, None, &initialize).await?;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        mcp_post(agent.socket(), port, path, session.as_deref(), &initialized).await?;
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        let (_, answer) = mcp_post(agent.socket(), port, path, session.as_deref(), &call).await?;
        let answer = answer.ok_or("the MCP server gave no answer to tools/call")?;
        if let Some(error) = answer.get("error") {
            return Err(format!("the MCP server refused the call: {error}"));
        }
        let result = answer.get("result").cloned().unwrap_or_default();
        let text = || {
            result["content"]
                .as_array()
                .and_then(|items| items.iter().find_map(|i| i["text"].as_str()))
                .map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_owned())))
        };
        let value = result
            .get("structuredContent")
            .cloned()
            .or_else(text)
            .unwrap_or(Value::Null);
        if result["isError"].as_bool() == Some(true) {
            return Err(format!("the MCP tool failed: {value}"));
        }
        Ok(value)
    }
}

/// One HTTP tool call.
struct HttpCall<'a> {
    url: &'a str,
    method: &'a str,
    headers: &'a std::collections::BTreeMap<String, String>,
    body: &'a Value,
}

/// Sends the call's argument as the JSON body; the answer's JSON (else its text) is the value.
async fn http_call(call: &HttpCall<'_>) -> Result<Value, String> {
    let (uri, host, port) = http_target(call.url)?;
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot reach {host}:{port}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("cannot speak HTTP to {host}:{port}: {e}"))?;
    tokio::spawn(connection);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = Request::builder()
        .method(call.method)
        .uri(path)
        .header(hyper::header::HOST, format!("{host}:{port}"))
        .header(hyper::header::CONTENT_TYPE, "application/json");
    for (name, value) in call.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let body = if matches!(call.method, "GET" | "HEAD") {
        Bytes::new()
    } else {
        Bytes::from(call.body.to_string())
    };
    let request = request
        .body(Full::new(body))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the request to {host}:{port} failed: {e}"))?;
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_TOOL_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| format!("cannot read the answer: {e}"))?
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    if !status.is_success() {
        let excerpt: String = text.chars().take(200).collect();
        return Err(format!("the endpoint answered {status}: {excerpt}"));
    }
    Ok(serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(text.into_owned())))
}

/// One JSON-RPC message to an MCP server through the data plane: the session id it gave and
/// its JSON-RPC answer (from a JSON body or the first `data:` line of an event stream).
async fn mcp_post(
    socket: &std::path::Path,
    port: u16,
    path: &str,
    session: Option<&str>,
    message: &Value,
) -> Result<(Option<String>, Option<Value>), String> {
    let upgraded = tunnel::open(socket, port)
        .await
        .map_err(|e| format!("cannot reach port {port}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(upgraded)
        .await
        .map_err(|e| format!("cannot speak HTTP to port {port}: {e}"))?;
    tokio::spawn(connection);
    let mut request = Request::post(path)
        .header(hyper::header::HOST, format!("localhost:{port}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let request = request
        .body(Full::new(Bytes::from(message.to_string())))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the MCP request failed: {e}"))?;
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = Limited::new(response.into_body(), MAX_TOOL_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| format!("cannot read the MCP answer: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!(
            "the MCP server answered {status}: {}",
            String::from_utf8_lossy(&bytes)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    let text = String::from_utf8_lossy(&bytes);
    let answer = serde_json::from_str::<Value>(&text).ok().or_else(|| {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .find_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
    });
    Ok((session, answer))
}
