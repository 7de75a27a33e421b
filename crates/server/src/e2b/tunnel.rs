//! The daemon's side of a request to a port other than the envd's: a tunnel through the
//! sandbox's agent to that port on the sandbox's loopback (`GET /airlock/tcp?port=N`, upgraded
//! to `airlock-tcp`), then HTTP/1.1 over the tunnel to the server there. A request that asks
//! to switch protocols (a WebSocket) is passed on with its `Upgrade`; when the server answers
//! `101`, both connections are upgraded and spliced byte for byte.

use std::path::Path;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HOST, HeaderValue, UPGRADE};
use hyper::http::request::Parts;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use crate::auth::API_KEY_HEADER;
use crate::http::{Body, boxed, empty};
use crate::proxy::is_hop_by_hop;

/// The agent's tunnel endpoint and protocol name (see `airlock_agent::tunnel`).
const TUNNEL_PATH: &str = "/airlock/tcp";
const TUNNEL_PROTOCOL: &str = "airlock-tcp";
/// The most of an agent's refusal that is read, for its message.
const MAX_REFUSAL_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The agent answered, but nothing listens on the port.
    #[error("{0}")]
    PortClosed(String),
    /// The agent could not be reached or broke the tunnel.
    #[error("the sandbox's agent is unreachable ({0})")]
    Agent(String),
    /// The server in the sandbox did not answer with HTTP.
    #[error("the server in the sandbox did not answer: {0}")]
    Upstream(String),
}

/// Whether header `name` lists `token` (comma-separated, case-insensitive).
fn lists(headers: &HeaderMap, name: hyper::header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| item.trim().eq_ignore_ascii_case(token))
}

/// Asks the agent behind `socket` for a byte stream to `port` on the sandbox's loopback.
pub async fn open(socket: &Path, port: u16) -> Result<Upgraded, TunnelError> {
    let agent = |e: &dyn std::fmt::Display| TunnelError::Agent(e.to_string());
    let stream = UnixStream::connect(socket).await.map_err(|e| agent(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| agent(&e))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("{TUNNEL_PATH}?port={port}"))
        .header(HOST, "localhost")
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, TUNNEL_PROTOCOL)
        .body(empty())
        .map_err(|e| agent(&e))?;
    let response = sender.send_request(request).await.map_err(|e| agent(&e))?;
    match response.status() {
        StatusCode::SWITCHING_PROTOCOLS => {
            hyper::upgrade::on(response).await.map_err(|e| agent(&e))
        }
        StatusCode::BAD_GATEWAY => {
            let body = http_body_util::Limited::new(response.into_body(), MAX_REFUSAL_BYTES)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("message")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("port {port} refused the connection"));
            Err(TunnelError::PortClosed(message))
        }
        other => Err(TunnelError::Agent(format!("it answered {other}"))),
    }
}

/// Forwards one request to the server on `port` in the sandbox and returns its answer,
/// streaming; a `101` answer to an upgrade request splices the two connections.
pub async fn forward(
    socket: &Path,
    port: u16,
    parts: &mut Parts,
    body: Incoming,
) -> Result<Response<Body>, TunnelError> {
    let upgraded = open(socket, port).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(upgraded)
        .await
        .map_err(|e| TunnelError::Upstream(e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let wants_upgrade =
        lists(&parts.headers, CONNECTION, "upgrade") && parts.headers.contains_key(UPGRADE);
    let client_upgrade = if wants_upgrade {
        parts.extensions.remove::<OnUpgrade>()
    } else {
        None
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut builder = Request::builder().method(parts.method.clone()).uri(path);
    for (name, value) in &parts.headers {
        // The operator's key never enters a sandbox; the sandbox's own token may (E2B passes
        // it on, and it opens nothing but this sandbox's data plane).
        if !is_hop_by_hop(name) && name != API_KEY_HEADER {
            builder = builder.header(name, value);
        }
    }
    if !parts.headers.contains_key(HOST) {
        builder = builder.header(HOST, format!("localhost:{port}"));
    }
    if client_upgrade.is_some()
        && let Some(protocol) = parts.headers.get(UPGRADE)
    {
        builder = builder
            .header(CONNECTION, HeaderValue::from_static("upgrade"))
            .header(UPGRADE, protocol.clone());
    }
    let request = builder
        .body(boxed(body))
        .map_err(|e| TunnelError::Upstream(e.to_string()))?;
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| TunnelError::Upstream(e.to_string()))?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let mut answer = Response::new(empty());
        *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *answer.headers_mut() = response.headers().clone();
        let server_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let (Ok(server), Ok(client)) = (server_upgrade.await, client_upgrade.await) else {
                return;
            };
            let (mut server, mut client) = (TokioIo::new(server), TokioIo::new(client));
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
        return Ok(answer);
    }
    let (head, body) = response.into_parts();
    let mut answer = Response::new(boxed(body));
    *answer.status_mut() = head.status;
    for (name, value) in &head.headers {
        if !is_hop_by_hop(name) {
            answer.headers_mut().append(name, value.clone());
        }
    }
    Ok(answer)
}
