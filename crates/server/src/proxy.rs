//! A reverse proxy from any request to a sandbox's agent: the method, path and end-to-end
//! headers pass through, both bodies stream, credentials for the daemon are stripped.
//!
//! It serves `/v1/sandboxes/{id}/envd/{rest}` and the envd port of the E2B data plane
//! ([`crate::e2b::data`]).

use hyper::body::Incoming;
use hyper::header::{HOST, HeaderName};
use hyper::http::request::Parts;
use hyper::{Request, Response};

use crate::agent::Agent;
use crate::auth::{ACCESS_TOKEN_HEADER, API_KEY_HEADER};
use crate::error::ApiError;
use crate::http::{Body, boxed};

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus ours.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Sends `parts` + `body` to the agent as `path_and_query` (which must start with `/`) and
/// returns the agent's answer, streaming. The agent sees neither the API key nor the access
/// token: the daemon has checked them, and the agent trusts its socket.
pub async fn forward(
    agent: &Agent,
    parts: &Parts,
    body: Incoming,
    path_and_query: &str,
) -> Result<Response<Body>, ApiError> {
    let mut builder = Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query);
    for (name, value) in &parts.headers {
        let ours = name == API_KEY_HEADER || name == ACCESS_TOKEN_HEADER || name == HOST;
        if !ours && !is_hop_by_hop(name) {
            builder = builder.header(name, value);
        }
    }
    let request = builder
        .body(boxed(body))
        .map_err(|e| ApiError::invalid(format!("cannot forward the request: {e}")))?;
    let response = agent.send(request).await?;
    let (parts, body) = response.into_parts();
    let mut answer = Response::new(boxed(body));
    *answer.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name) {
            answer.headers_mut().append(name, value.clone());
        }
    }
    Ok(answer)
}

/// The path and query the agent should see for a request whose path ends in `rest`.
pub fn agent_path(rest: &str, query: Option<&str>) -> String {
    match query {
        Some(query) => format!("/{rest}?{query}"),
        None => format!("/{rest}"),
    }
}
