//! The E2B-compatible API: the unmodified E2B SDKs (Python `e2b`, npm `e2b`) drive Airlock
//! with `E2B_API_URL` and `E2B_SANDBOX_URL` both set to the daemon's address and `E2B_API_KEY`
//! set to an Airlock key written `e2b_<hex>`.
//!
//! # One port, three surfaces
//!
//! The daemon's listener serves the native `/v1` API, E2B's control plane (REST, JSON) and
//! E2B's data plane (envd's Connect RPCs and `/files`, and any other port of a sandbox).
//! [`classify`] decides, first match wins:
//!
//! 1. a `Host` of the form `<port>-<id>.<anything>` (what `sandbox.get_host(port)` returns) →
//!    data plane;
//! 2. a control-plane path (`/sandboxes…`, `/v2/sandboxes…`, `/templates…`) with an API key
//!    (`X-API-Key` or `Authorization: Bearer`) → control plane. The SDKs never send a key to
//!    the data plane, and SDK 2.10 sends `E2b-Sandbox-Id` on control-plane calls too;
//! 3. an `E2b-Sandbox-Id` header (with `E2b-Sandbox-Port`) → data plane;
//! 4. `/v1/…` → the native API;
//! 5. anything else → control plane (401 without a key, 404 for unknown paths).
//!
//! A body that a handler did not read is read in the background while the answer goes out,
//! so that a keep-alive connection stays usable and no answer waits for a body.
//!
//! # Control plane ([`control`])
//!
//! Create on both route versions, get, list (v2 with metadata, state, template and
//! `startedAfter` filters, `limit` and `x-next-token` paging; and the legacy list), kill,
//! set-timeout, connect on both versions, refreshes, pause and legacy resume. Timeouts are
//! seconds: `timeout` at create sets the lifetime (E2B's defaults: 300 s on v2, 15 s on v1),
//! set-timeout resets it from now, connect and refreshes extend it and never shorten it.
//! A create whose metadata has `airlock.git.url` (with `airlock.git.ref` and
//! `airlock.git.branch`) gets a repository workspace (`lifecycle::git`): E2B's create body has
//! no workspace, and its metadata is the one field the SDKs pass through as given.
//! Templates name the daemon's templates (`NAME`, `NAME:TAG`, a snapshot); `base` is the
//! process tier with the host's root, read-only (or the daemon's `--base-image`). An unknown
//! template is E2B's 404 `template '<name>' not found`. `Template.build` is [`templates`]. Pause is not
//! implemented: it answers what E2B answers when a pause fails, `500 Error pausing sandbox`,
//! and the sandbox keeps running. Errors are E2B's `{"code": <status>, "message"}`.
//!
//! # Keys and tokens ([`access`])
//!
//! API keys are the native ones: `e2b_<hex>` is accepted as another spelling of `ak_<hex>`
//! (the prefix is mapped before hashing), in `X-API-Key` or as a bearer token. Every v2
//! sandbox, and a v1 sandbox created with `secure: true`, gets an `envdAccessToken` (its native
//! access token); its data plane then needs it as `X-Access-Token`, except `GET /health`, and
//! `/files`, which also takes E2B's URL signature. Connect must return the token again, so it
//! is kept in `e2b.json` (0600) in the sandbox's private directory, which the sandbox cannot
//! see and which disappears with it. An API key is accepted on the data plane too.
//!
//! # Data plane ([`data`], [`tunnel`])
//!
//! Port 49983 is the sandbox's agent (the envd), reached through [`crate::proxy::forward`].
//! Any other port goes through a tunnel that the agent opens to that port on the sandbox's
//! loopback; the daemon speaks HTTP/1.1 over it, and a WebSocket (or any `Upgrade`) is spliced
//! byte for byte once both sides agree. `E2b-*` headers are stripped. An unknown or ended
//! sandbox is a 502 whose message contains `was not found`; a closed port, `port is not open`.
//! Port 9222, Chrome's debugging port, gets the three changes Chrome's rules need ([`cdp`]).
//! Ports other than the envd's need no credential, as on E2B where traffic is public unless a
//! sandbox asks otherwise: the sandbox id is the capability.
//!
//! `domain` in create and connect answers is derived from the request's `Host`: for
//! `127.0.0.1:3000` (any IP or `localhost`) it is `localhost:3000`, because SDKs from 2.50 on,
//! browsers and curl resolve `*.localhost` to loopback; any other host name is returned as it
//! is, for a wildcard DNS name pointing at the daemon.

pub mod access;
pub mod cdp;
pub mod control;
pub mod data;
pub mod persistence;
pub mod templates;
pub mod time;
pub mod tunnel;
mod wasm_commands;
pub(crate) mod wasm_interpreter;
pub mod wire;

use std::sync::Arc;

use airlock_api::v1::ErrorCode;
use hyper::body::Incoming;
use hyper::header::HOST;
use hyper::{HeaderMap, Request, Response, StatusCode, Uri};

use crate::error::ApiError;
use crate::http::{Body, json_response, linger};
use crate::lifecycle::Daemon;

/// The envd's port: the SDKs name it in `E2b-Sandbox-Port`.
pub const ENVD_PORT: u16 = 49983;
/// The envd version the agent implements (`envdVersion`). The SDKs gate features on it:
/// 0.3.0 stdin, 0.4.0 default user, 0.5.2 close-stdin, 0.5.7 octet-stream upload; 0.6.2 would
/// promise file metadata (xattrs), which the agent does not store.
pub const ENVD_VERSION: &str = "0.5.7";
/// `clientID` in every answer: E2B's name of the node that runs a sandbox.
pub const CLIENT_ID: &str = "airlock";

pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Surface {
    Native,
    Control,
    Data(Target),
    /// Routing headers that cannot be routed (a bad `E2b-Sandbox-Port`).
    Invalid(String),
}

/// A sandbox's port on the data plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub port: u16,
}

/// E2B's control-plane paths: with an API key they win over routing headers.
pub fn is_control_path(path: &str) -> bool {
    [
        "/sandboxes",
        "/v2/sandboxes",
        "/templates",
        "/v2/templates",
        "/v3/templates",
        "/snapshots",
    ]
    .iter()
    .any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

fn has_api_key(headers: &HeaderMap) -> bool {
    access::presented_key(headers).is_some()
}

/// `<port>-<id>.<domain>` (an optional `:port` of the daemon after the domain).
pub fn host_target(host: &str) -> Option<Target> {
    let (label, domain) = host.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    if domain.is_empty()
        || !port.bytes().all(|b| b.is_ascii_digit())
        || !crate::auth::plausible_sandbox_id(id)
    {
        return None;
    }
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    Some(Target {
        sandbox_id: id.to_owned(),
        port,
    })
}

/// The routing decision of the module docs.
pub fn classify(uri: &Uri, headers: &HeaderMap) -> Surface {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    if let Some(target) = host.and_then(host_target) {
        return Surface::Data(target);
    }
    let path = uri.path();
    if is_control_path(path) && has_api_key(headers) {
        return Surface::Control;
    }
    if let Some(id) = headers.get(SANDBOX_ID_HEADER) {
        let id = id.to_str().unwrap_or_default().trim();
        let port = headers
            .get(SANDBOX_PORT_HEADER)
            .map(|p| p.to_str().unwrap_or_default().trim());
        return match port.map(str::parse::<u16>) {
            Some(Ok(port)) if port != 0 => Surface::Data(Target {
                sandbox_id: id.to_owned(),
                port,
            }),
            Some(_) => Surface::Invalid(format!(
                "E2b-Sandbox-Port must be a port number, got {:?}",
                port.unwrap_or_default()
            )),
            None => Surface::Invalid("E2b-Sandbox-Id needs E2b-Sandbox-Port".to_owned()),
        };
    }
    if path == "/v1" || path.starts_with("/v1/") || path == "/metrics" {
        Surface::Native
    } else {
        Surface::Control
    }
}

/// Serves one request of any surface: the daemon's connection handler calls this.
pub async fn serve(daemon: Arc<Daemon>, request: Request<Incoming>) -> Response<Body> {
    let surface = classify(request.uri(), request.headers());
    if request.uri().path() == crate::mcp::PATH && !matches!(surface, Surface::Data(_)) {
        return crate::mcp::serve_http(daemon, request).await;
    }
    match surface {
        Surface::Native => crate::routes::dispatch(daemon, request).await,
        Surface::Control => control::dispatch(daemon, request).await,
        Surface::Data(target) => data::dispatch(daemon, request, target).await,
        Surface::Invalid(message) => {
            discard(Some(request.into_body()));
            E2bError::new(StatusCode::BAD_REQUEST, message).response()
        }
    }
}

/// Reads away a body nobody consumed, in the background while the answer goes out
/// (`http::linger`), so that the connection can carry the next request.
pub fn discard(body: Option<Incoming>) {
    if let Some(body) = body {
        linger(body);
    }
}

/// A control-plane error: the status, and E2B's `{"code", "message"}` body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn sandbox_not_found(id: &str) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, format!("sandbox '{id}' not found"))
    }

    pub fn response(&self) -> Response<Body> {
        let mut response = json_response(
            self.status,
            &wire::ErrorBody {
                code: self.status.as_u16(),
                message: self.message.clone(),
            },
        );
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                crate::error::CAPACITY_RETRY_AFTER_SECONDS.into(),
            );
        }
        response
    }
}

/// Native errors in E2B's terms: malformed and impossible requests are both 400, the
/// sandbox cap is E2B's 429, a sandbox on its way out is gone, a full disk is envd's 507.
impl From<ApiError> for E2bError {
    fn from(err: ApiError) -> E2bError {
        let status = match err.code {
            ErrorCode::InvalidRequest | ErrorCode::Unprocessable => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCode::PermissionDenied | ErrorCode::ReadOnly => StatusCode::FORBIDDEN,
            ErrorCode::NotFound | ErrorCode::SandboxStopping => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Conflict | ErrorCode::SandboxPaused => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge | ErrorCode::FileTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
            ErrorCode::Capacity => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Internal
            | ErrorCode::AgentError
            | ErrorCode::Timeout
            | ErrorCode::ForgeError => StatusCode::INTERNAL_SERVER_ERROR,
        };
        E2bError::new(status, err.message)
    }
}

/// The proxy's 502 for a sandbox that is not running (`was not found` is what the SDKs look
/// for to raise `SandboxNotRunningException`).
pub fn sandbox_gone(id: &str) -> Response<Body> {
    json_response(
        StatusCode::BAD_GATEWAY,
        &wire::ProxyErrorBody {
            code: 502,
            sandbox_id: id.to_owned(),
            message: format!("The sandbox {id} was not found"),
            port: None,
        },
    )
}

/// The proxy's 502 for a running sandbox whose port refuses connections (`port is not open`).
pub fn port_closed(id: &str, port: u16, detail: &str) -> Response<Body> {
    json_response(
        StatusCode::BAD_GATEWAY,
        &wire::ProxyErrorBody {
            code: 502,
            sandbox_id: id.to_owned(),
            message: format!("The sandbox is running but port is not open ({detail})"),
            port: Some(port.to_string()),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    fn route(path: &str, pairs: &[(&str, &str)]) -> Surface {
        classify(&path.parse().unwrap(), &headers(pairs))
    }

    fn data(id: &str, port: u16) -> Surface {
        Surface::Data(Target {
            sandbox_id: id.into(),
            port,
        })
    }

    #[test]
    fn test_routing_precedence() {
        let routed = [("E2b-Sandbox-Id", "abc123"), ("E2b-Sandbox-Port", "49983")];
        // 1. Host routing beats everything, even a control-plane path with a key.
        assert_eq!(
            route(
                "/sandboxes",
                &[("Host", "8080-abc123.localhost:3000"), ("X-API-Key", "k")]
            ),
            data("abc123", 8080)
        );
        // 2. A control-plane path with a key beats routing headers (SDK 2.10's connect).
        let mut with_key = routed.to_vec();
        with_key.push(("X-API-Key", "e2b_00"));
        assert_eq!(
            route("/sandboxes/abc123/connect", &with_key),
            Surface::Control
        );
        assert_eq!(route("/v2/sandboxes", &with_key), Surface::Control);
        let mut with_bearer = routed.to_vec();
        with_bearer.push(("Authorization", "Bearer e2b_00"));
        assert_eq!(route("/templates/x", &with_bearer), Surface::Control);
        // ... but a Basic authorization is envd's user, not a key.
        let mut with_basic = routed.to_vec();
        with_basic.push(("Authorization", "Basic dXNlcjo="));
        assert_eq!(route("/sandboxes", &with_basic), data("abc123", 49983));
        // 3. Routing headers: the data plane, whatever the path (even /v1).
        assert_eq!(
            route("/process.Process/Start", &routed),
            data("abc123", 49983)
        );
        assert_eq!(route("/v1/health", &routed), data("abc123", 49983));
        assert_eq!(route("/sandboxesX", &with_key), data("abc123", 49983));
        // 4. and 5.
        assert_eq!(
            route("/v1/sandboxes", &[("X-API-Key", "k")]),
            Surface::Native
        );
        assert_eq!(route("/v1", &[]), Surface::Native);
        assert_eq!(route("/v10", &[]), Surface::Control);
        assert_eq!(
            route("/sandboxes", &[("Host", "127.0.0.1:3000")]),
            Surface::Control
        );
        assert_eq!(route("/health", &[("Host", "localhost")]), Surface::Control);
    }

    #[test]
    fn test_bad_routing_headers_are_named() {
        for port in ["", "0", "65536", "http"] {
            let got = route(
                "/health",
                &[("E2b-Sandbox-Id", "abc"), ("E2b-Sandbox-Port", port)],
            );
            assert!(matches!(got, Surface::Invalid(ref m) if m.contains("E2b-Sandbox-Port")));
        }
        let got = route("/health", &[("E2b-Sandbox-Id", "abc")]);
        assert!(matches!(got, Surface::Invalid(ref m) if m.contains("E2b-Sandbox-Port")));
    }

    #[test]
    fn test_host_targets() {
        let target = |host| host_target(host).map(|t| (t.port, t.sandbox_id));
        assert_eq!(target("49983-abc.example.com"), Some((49983, "abc".into())));
        assert_eq!(
            target("8123-x1y2.localhost:3000"),
            Some((8123, "x1y2".into()))
        );
        for host in [
            "localhost:3000",
            "127.0.0.1:3000",
            "api-1.example.com",
            "80-ABC.example.com",
            "0-abc.example.com",
            "70000-abc.example.com",
            "80-abc",
            "80-abc.",
            "-abc.example.com",
            "80-.example.com",
            "80-a-b.example.com",
        ] {
            assert_eq!(target(host), None, "{host}");
        }
    }

    #[test]
    fn test_native_errors_take_e2b_statuses() {
        let status = |code| E2bError::from(ApiError::new(code, "x")).status.as_u16();
        assert_eq!(status(ErrorCode::Unprocessable), 400);
        assert_eq!(status(ErrorCode::NotFound), 404);
        assert_eq!(status(ErrorCode::SandboxStopping), 404);
        assert_eq!(status(ErrorCode::InsufficientStorage), 507);
        assert_eq!(status(ErrorCode::Capacity), 429);
        assert_eq!(status(ErrorCode::AgentError), 500);
    }
}
