//! Chrome's DevTools port (9222) through the data plane, so that CDP clients outside
//! (Playwright's `connectOverCDP`, Browser Harness' `/json/version` discovery) reach the
//! browser of a sandbox by `get_host(9222)` or by `E2b-Sandbox-*` headers. Chrome's rules
//! (docs/reference: its DevTools HTTP handler) need three things of a proxy:
//!
//! 1. the upstream `Host` must be an IP or `localhost` (any other name is a 500), so it is
//!    `127.0.0.1:9222`;
//! 2. Chrome echoes that Host into `webSocketDebuggerUrl` and the other ws URLs of its `/json*`
//!    answers, so they are rewritten to the client's own origin (`wss` over TLS);
//! 3. a WebSocket with any `Origin` is refused (403) unless `--remote-allow-origins` names it,
//!    so `Origin` is dropped, on this port only.
//!
//! Unlike the other ports, where the sandbox id is the capability, this one needs a credential
//! as the envd's does: the sandbox's access token (`X-Access-Token`) or an API key. The
//! debugging port drives the browser as its user (scripts in any page, `file://` reads inside
//! the sandbox), and the id is handed to whoever gets the stream URL. The credential headers
//! are not passed on to the sandbox.

use http_body_util::BodyExt as _;
use hyper::header::{CONTENT_LENGTH, HOST, HeaderValue, ORIGIN};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};

use crate::http::{Body, full};
use crate::lifecycle::Daemon;

/// The browser's debugging port inside the sandbox.
pub use crate::lifecycle::CDP_PORT;
/// The upstream `Host` Chrome accepts.
const UPSTREAM_HOST: &str = "127.0.0.1:9222";
/// The most of a `/json*` answer that is rewritten (a list of many tabs is a few KiB each).
const MAX_JSON_BYTES: usize = 4 << 20;

/// How the client reached the port: what its ws URLs must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOrigin {
    /// `host[:port]` as the client sent it.
    pub host: String,
    pub secure: bool,
    /// A discovery request whose answer carries ws URLs.
    rewrite: bool,
}

/// Whether the request may reach sandbox `id`'s debugging port: its access token or an API
/// key (or a daemon run with `--insecure-no-auth`); the reason otherwise.
pub fn authorize(daemon: &Daemon, parts: &Parts, id: &str) -> Result<(), String> {
    let headers = &parts.headers;
    if daemon.config.no_auth
        || super::access::has_valid_token(headers, daemon.token_hash(id).as_deref())
    {
        return Ok(());
    }
    if super::access::presented_key(headers).is_some() {
        return super::access::check_key(&daemon.store, headers, false)
            .map_err(|_| "the API key is unknown or revoked".to_owned());
    }
    Err(if headers.contains_key(crate::auth::ACCESS_TOKEN_HEADER) {
        "the access token does not belong to this sandbox".to_owned()
    } else {
        format!(
            "port {CDP_PORT} (the browser's debugging port) needs the sandbox's X-Access-Token or an API key"
        )
    })
}

/// Readies a request for Chrome and says how to rewrite its answer.
pub fn prepare(parts: &mut Parts) -> ClientOrigin {
    for credential in [
        crate::auth::ACCESS_TOKEN_HEADER,
        crate::auth::API_KEY_HEADER,
        hyper::header::AUTHORIZATION.as_str(),
    ] {
        parts.headers.remove(credential);
    }
    let host = parts
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let secure = parts.extensions.get::<crate::tls::OverTls>().is_some();
    parts
        .headers
        .insert(HOST, HeaderValue::from_static(UPSTREAM_HOST));
    parts.headers.remove(ORIGIN);
    let path = parts.uri.path();
    let rewrite = matches!(parts.method, Method::GET | Method::PUT)
        && (path == "/json" || path.starts_with("/json/"));
    ClientOrigin {
        host,
        secure,
        rewrite,
    }
}

/// Chrome's `/json*` answer with its ws URLs naming the client's origin instead of loopback.
pub async fn rewrite(response: Response<Body>, origin: ClientOrigin) -> Response<Body> {
    if !origin.rewrite || origin.host.is_empty() || response.status() != StatusCode::OK {
        return response;
    }
    let (mut head, mut body) = response.into_parts();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map(|f| f.into_data()) else {
            return Response::from_parts(head, full("the browser's answer broke off"));
        };
        bytes.extend_from_slice(&data.unwrap_or_default());
        if bytes.len() > MAX_JSON_BYTES {
            return Response::from_parts(head, full("a DevTools answer too large to rewrite"));
        }
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let rewritten = rewrite_urls(&text, &origin);
    head.headers.remove(CONTENT_LENGTH);
    if let Ok(length) = HeaderValue::from_str(&rewritten.len().to_string()) {
        head.headers.insert(CONTENT_LENGTH, length);
    }
    Response::from_parts(head, full(rewritten))
}

/// `ws://127.0.0.1:9222/…` and the frontend's `ws=127.0.0.1:9222/…` (also with `localhost`,
/// which Chrome names when asked that way) → the client's origin.
fn rewrite_urls(text: &str, origin: &ClientOrigin) -> String {
    let scheme = if origin.secure { "wss" } else { "ws" };
    let mut out = text.to_owned();
    for upstream in [UPSTREAM_HOST, "localhost:9222"] {
        out = out
            .replace(
                &format!("ws://{upstream}/"),
                &format!("{scheme}://{}/", origin.host),
            )
            .replace(
                &format!("ws={upstream}/"),
                &format!("{scheme}={}/", origin.host),
            );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(host: &str, path: &str, origin: Option<&str>) -> Parts {
        let mut builder = hyper::Request::builder().uri(path).header(HOST, host);
        if let Some(origin) = origin {
            builder = builder.header(ORIGIN, origin);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn test_cdp_request_gets_loopback_host_and_no_origin() {
        let mut request = parts(
            "9222-abc.localhost:3000",
            "/devtools/browser/x",
            Some("http://evil"),
        );
        let origin = prepare(&mut request);
        assert_eq!(request.headers[HOST], "127.0.0.1:9222");
        assert!(request.headers.get(ORIGIN).is_none());
        assert_eq!(origin.host, "9222-abc.localhost:3000");
        assert!(!origin.rewrite);
        assert!(prepare(&mut parts("h:1", "/json/version", None)).rewrite);
        assert!(prepare(&mut parts("h:1", "/json", None)).rewrite);
        assert!(!prepare(&mut parts("h:1", "/jsonx", None)).rewrite);
    }

    #[test]
    fn test_cdp_request_keeps_no_credential_for_the_sandbox() {
        let mut request = parts("h:1", "/json/version", None);
        for (name, value) in [
            ("x-access-token", "token"),
            ("x-api-key", "ak_1"),
            ("authorization", "Bearer ak_1"),
        ] {
            request
                .headers
                .insert(name, HeaderValue::from_static(value));
        }
        prepare(&mut request);
        for name in ["x-access-token", "x-api-key", "authorization"] {
            assert!(
                request.headers.get(name).is_none(),
                "{name} reached the sandbox"
            );
        }
    }

    #[test]
    fn test_cdp_ws_urls_name_the_client_origin() {
        let origin = ClientOrigin {
            host: "9222-abc.localhost:3000".to_owned(),
            secure: true,
            rewrite: true,
        };
        let body = r#"{"webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/1",
            "devtoolsFrontendUrl": "/devtools/inspector.html?ws=127.0.0.1:9222/devtools/page/2"}"#;
        let out = rewrite_urls(body, &origin);
        assert!(out.contains(r#""wss://9222-abc.localhost:3000/devtools/browser/1""#));
        assert!(out.contains("?wss=9222-abc.localhost:3000/devtools/page/2"));
        assert!(!out.contains("127.0.0.1:9222"));
    }
}
