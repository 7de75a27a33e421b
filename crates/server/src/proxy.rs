//! A reverse proxy from any request to a sandbox's agent: the method, path and end-to-end
//! headers pass through, both bodies stream, credentials for the daemon are stripped.
//!
//! It serves `/v1/sandboxes/{id}/envd/{rest}` and the envd port of the E2B data plane
//! ([`crate::e2b::data`]). When the agent answers before it has read the whole request body
//! (a failed upload) and closes its connection, the answer goes out at once with
//! `Connection: close`, and the rest of the client's body is read away in the background
//! (`http::linger`) so that the client sees the answer rather than a reset.
//!
//! On `/v1`, the daemon answers for the agent's surface itself: a path the agent does not
//! serve is 404 and its plain-HTTP errors (`/files`) become [`airlock_api::v1::ErrorBody`];
//! the Connect RPCs keep the Connect protocol's error bodies, which their clients parse.

use std::pin::Pin;
use std::task::{Context, Poll};

use airlock_api::v1::ErrorCode;
use bytes::Bytes;
use hyper::body::{Frame, Incoming};
use hyper::header::{CONNECTION, HOST, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response};

use crate::agent::{Agent, connect_error};
use crate::auth::{ACCESS_TOKEN_HEADER, API_KEY_HEADER};
use crate::error::ApiError;
use crate::http::{Body, BoxError, boxed, linger};

/// A request body on its way to an agent. If the agent stops reading it (an early answer)
/// the rest is read away in the background once hyper drops it, instead of being left unread
/// on the client's connection.
#[derive(Debug)]
pub struct LingeringBody {
    inner: Option<Incoming>,
}

impl LingeringBody {
    pub fn new(body: Incoming) -> LingeringBody {
        LingeringBody { inner: Some(body) }
    }

    /// Gives the rest of the body up (to the background reader).
    pub fn release(&mut self) {
        if let Some(rest) = self.inner.take()
            && !hyper::body::Body::is_end_stream(&rest)
        {
            linger(rest);
        }
    }
}

impl Drop for LingeringBody {
    fn drop(&mut self) {
        self.release();
    }
}

impl hyper::body::Body for LingeringBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        Pin::new(inner)
            .poll_frame(cx)
            .map(|frame| frame.map(|r| r.map_err(Into::into)))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(hyper::body::SizeHint::default, |inner| inner.size_hint())
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|inner| inner.is_end_stream())
    }
}

/// Whether an agent's answer says it closes the connection (it did not read the whole body).
pub fn closes(response: &Response<Incoming>) -> bool {
    response
        .headers()
        .get(CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
}

/// Marks an answer as the connection's last.
pub fn set_close(response: &mut Response<Body>) {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// What the agent serves, as `/v1/sandboxes/{id}/envd/{rest}` exposes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentRoute {
    /// `process.Process/*` and `filesystem.Filesystem/*`: Connect answers pass through.
    Rpc,
    /// `files` and `health`: plain HTTP, whose errors the daemon renders as its own.
    Plain,
}

/// The agent's route at `rest` and the methods it takes, if the agent serves it.
pub fn agent_methods(rest: &str) -> Option<(AgentRoute, &'static [Method])> {
    if rest
        .strip_prefix("process.Process/")
        .or_else(|| rest.strip_prefix("filesystem.Filesystem/"))
        .is_some_and(|name| !name.is_empty() && !name.contains('/'))
    {
        Some((AgentRoute::Rpc, &[Method::POST]))
    } else if rest == "files" {
        Some((AgentRoute::Plain, &[Method::GET, Method::POST]))
    } else if rest == "health" {
        Some((AgentRoute::Plain, &[Method::GET]))
    } else {
        None
    }
}

/// The agent route `rest` names for `method`, or the daemon's 404/405.
pub fn agent_route(method: &Method, rest: &str) -> Result<AgentRoute, ApiError> {
    let Some((route, allowed)) = agent_methods(rest) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "the agent serves no {rest:?} (process.Process/*, filesystem.Filesystem/*, files, health)"
            ),
        ));
    };
    if allowed.contains(method) {
        Ok(route)
    } else {
        let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
        Err(ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("envd/{rest} allows {}, not {method}", names.join(", ")),
        ))
    }
}

/// `/v1/sandboxes/{id}/envd/{rest}`: [`forward`], with the agent's plain-HTTP errors as ours.
pub async fn forward_native(
    agent: &Agent,
    parts: &Parts,
    body: Incoming,
    rest: &str,
) -> Result<Response<Body>, ApiError> {
    let route = agent_route(&parts.method, rest)?;
    let path = agent_path(rest, parts.uri.query());
    let (response, connection) = send(agent, parts, body, &path).await?;
    if route == AgentRoute::Plain && !response.status().is_success() {
        let status = response.status();
        let errno = errno_of(&response);
        let bytes = read_small(response).await;
        drop(connection);
        return Err(connect_error(status, errno.as_deref(), &bytes));
    }
    Ok(finish(response, connection).await)
}

/// The agent's error answers are small; anything past this is cut.
const MAX_EARLY_ANSWER_BYTES: usize = 64 << 10;

async fn read_small(response: Response<Incoming>) -> Bytes {
    http_body_util::BodyExt::collect(http_body_util::Limited::new(
        response.into_body(),
        MAX_EARLY_ANSWER_BYTES,
    ))
    .await
    .map(|c| c.to_bytes())
    .unwrap_or_default()
}

/// Relays the agent's answer. An early one (the agent closes: it stopped reading the body) is
/// read whole, the agent's connection dropped, and the answer marked `Connection: close`.
async fn finish(
    response: Response<Incoming>,
    connection: crate::agent::Connection,
) -> Response<Body> {
    if !closes(&response) {
        connection.detach();
        return relay(response);
    }
    let (parts, body) = response.into_parts();
    let bytes = read_small(Response::from_parts(parts.clone(), body)).await;
    drop(connection);
    let mut answer = relay_parts(&parts, crate::http::full(bytes));
    set_close(&mut answer);
    answer
}

/// The errno an agent named for a failed file operation (`airlock-errno`).
pub fn errno_of(response: &Response<Incoming>) -> Option<String> {
    response
        .headers()
        .get(crate::agent::ERRNO_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

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
    let (response, connection) = send(agent, parts, body, path_and_query).await?;
    Ok(finish(response, connection).await)
}

/// Sends the request; the answer and its connection.
async fn send(
    agent: &Agent,
    parts: &Parts,
    body: Incoming,
    path_and_query: &str,
) -> Result<(Response<Incoming>, crate::agent::Connection), ApiError> {
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
        .body(boxed(LingeringBody::new(body)))
        .map_err(|e| ApiError::invalid(format!("cannot forward the request: {e}")))?;
    agent.send_attached(request).await
}

/// The agent's answer as the client's: status, end-to-end headers, the streaming body.
fn relay(response: Response<Incoming>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    relay_parts(&parts, boxed(body))
}

fn relay_parts(parts: &hyper::http::response::Parts, body: Body) -> Response<Body> {
    let mut answer = Response::new(body);
    *answer.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name) {
            answer.headers_mut().append(name, value.clone());
        }
    }
    answer
}

/// The path and query the agent should see for a request whose path ends in `rest`.
pub fn agent_path(rest: &str, query: Option<&str>) -> String {
    match query {
        Some(query) => format!("/{rest}?{query}"),
        None => format!("/{rest}"),
    }
}
