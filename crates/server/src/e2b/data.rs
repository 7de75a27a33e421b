//! The data plane: a request for port P of sandbox S (by `E2b-Sandbox-*` headers or by
//! `Host`) goes to S's agent when P is the envd's port, else through a tunnel to P on S's
//! loopback. See the module docs of [`super`] for who may call what.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HeaderName};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::tunnel::{self, TunnelError};
use super::{E2bError, ENVD_PORT, Target, access, discard, port_closed, sandbox_gone};
use crate::agent::Agent;
use crate::http::{Body, json_response};
use crate::lifecycle::Daemon;

/// Serves one data-plane request.
pub async fn dispatch(
    daemon: Arc<Daemon>,
    request: Request<Incoming>,
    target: Target,
) -> Response<Body> {
    let (mut parts, body) = request.into_parts();
    let mut body = Some(body);
    let response = route(&daemon, &mut parts, &mut body, &target).await;
    discard(body);
    response
}

async fn route(
    daemon: &Arc<Daemon>,
    parts: &mut Parts,
    body: &mut Option<Incoming>,
    target: &Target,
) -> Response<Body> {
    let id = target.sandbox_id.as_str();
    if !crate::auth::plausible_sandbox_id(id) {
        return sandbox_gone(id);
    }
    let Ok(agent) = daemon.agent(id).await else {
        return sandbox_gone(id);
    };
    // The routing headers are for the edge, not for the sandbox.
    let routing: Vec<HeaderName> = parts
        .headers
        .keys()
        .filter(|name| name.as_str().starts_with("e2b-"))
        .cloned()
        .collect();
    for name in routing {
        parts.headers.remove(name);
    }
    if target.port != ENVD_PORT {
        let Some(body) = body.take() else {
            return internal("the request body was already read");
        };
        // A wasm sandbox runs no Jupyter kernel: the daemon answers the code interpreter.
        if target.port == crate::lifecycle::INTERPRETER_PORT && daemon.is_wasm_sandbox(id) {
            return super::wasm_interpreter::serve(daemon, id, parts, body).await;
        }
        let cdp_port = target.port == super::cdp::CDP_PORT;
        if cdp_port && let Err(reason) = super::cdp::authorize(daemon, parts, id) {
            return unauthorized(parts.uri.path(), &reason);
        }
        let cdp = cdp_port.then(|| super::cdp::prepare(parts));
        return match tunnel::forward(agent.socket(), target.port, parts, body).await {
            Ok(response) => match cdp {
                Some(origin) => super::cdp::rewrite(response, origin).await,
                None => response,
            },
            Err(TunnelError::PortClosed(message)) => port_closed(id, target.port, &message),
            Err(err) => unreachable_sandbox(daemon, id, target.port, &err.to_string()),
        };
    }
    if let Err(reason) = authorize(daemon, parts, id) {
        return unauthorized(parts.uri.path(), &reason);
    }
    // The agent's own endpoints (a warm pool's claim) are the daemon's alone; envd has none.
    if parts.uri.path().starts_with("/airlock/") {
        return E2bError::new(
            StatusCode::NOT_FOUND,
            format!("envd serves no {}", parts.uri.path()),
        )
        .response();
    }
    // A bearer token is a daemon key here (envd's own Authorization is Basic): keep it out.
    let bearer = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("bearer "));
    if bearer {
        parts.headers.remove(AUTHORIZATION);
    }
    let Some(body) = body.take() else {
        return internal("the request body was already read");
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if parts.uri.path() == "/process.Process/Start" {
        daemon.metrics.exec(crate::metrics::Surface::E2b);
        if daemon.is_wasm_sandbox(id) {
            return super::wasm_commands::start(daemon, &agent, id, parts, body).await;
        }
    }
    forward_to_agent(daemon, &agent, parts, body, &path, id).await
}

async fn forward_to_agent(
    daemon: &Daemon,
    agent: &Agent,
    parts: &Parts,
    body: Incoming,
    path: &str,
    id: &str,
) -> Response<Body> {
    match crate::proxy::forward(agent, parts, body, path).await {
        Ok(response) => response,
        Err(err) => unreachable_sandbox(daemon, id, ENVD_PORT, &err.message),
    }
}

/// A sandbox whose agent did not answer: gone if it ended meanwhile, else its port is closed.
fn unreachable_sandbox(daemon: &Daemon, id: &str, port: u16, detail: &str) -> Response<Body> {
    if !daemon.is_running(id) {
        sandbox_gone(id)
    } else {
        port_closed(id, port, detail)
    }
}

fn internal(message: &str) -> Response<Body> {
    E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, message).response()
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// envd's rule: a secure sandbox's data plane needs its access token, except `GET /health`;
/// `/files` also takes a signed URL. An API key is accepted too. The error says why not.
fn authorize(daemon: &Daemon, parts: &Parts, id: &str) -> Result<(), String> {
    let path = parts.uri.path();
    if parts.method == Method::GET && path == "/health" {
        return Ok(());
    }
    let config = &daemon.config;
    if config.no_auth || access::has_valid_token(&parts.headers, daemon.token_hash(id).as_deref()) {
        return Ok(());
    }
    if access::presented_key(&parts.headers).is_some()
        && access::check_key(&daemon.store, &parts.headers, false).is_ok()
    {
        return Ok(());
    }
    let record = access::read_record(daemon, id);
    if record.as_ref().is_some_and(|r| !r.secure) {
        return Ok(());
    }
    let is_files =
        path == "/files" && (parts.method == Method::GET || parts.method == Method::POST);
    let has_token_header = parts.headers.contains_key(crate::auth::ACCESS_TOKEN_HEADER);
    let reason = match (&record, is_files && !has_token_header) {
        (Some(record), true) => {
            let query = crate::http::query_pairs(&parts.uri);
            let write = parts.method == Method::POST;
            match access::check_file_signature(&query, write, &record.access_token, now_s()) {
                Ok(()) => return Ok(()),
                Err(reason) => reason,
            }
        }
        _ if has_token_header => "the access token does not belong to this sandbox".to_owned(),
        _ => "missing X-Access-Token header: this sandbox is secured".to_owned(),
    };
    Err(reason)
}

/// envd's 401: a Connect error for the RPCs, E2B's `{"code", "message"}` elsewhere.
fn unauthorized(path: &str, reason: &str) -> Response<Body> {
    let message = format!("unauthorized access: {reason}");
    let is_rpc =
        path.starts_with("/process.Process/") || path.starts_with("/filesystem.Filesystem/");
    if is_rpc {
        json_response(
            StatusCode::UNAUTHORIZED,
            &json!({"code": "unauthenticated", "message": message}),
        )
    } else {
        E2bError::new(StatusCode::UNAUTHORIZED, message).response()
    }
}
