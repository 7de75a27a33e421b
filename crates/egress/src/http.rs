//! The HTTP side of the proxy: the sandbox-facing server (absolute-form requests and CONNECT),
//! and forwarding of each inspected request: host agreement, rules, approvals, credentials,
//! then the upstream exchange with hop-by-hop headers removed and secrets redacted on the way
//! back.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::address::{Host, parse_host};
use crate::approvals::{AskOutcome, AskRequest};
use crate::audit::{AuditEvent, AuditKind};
use crate::credentials::{RedactedBody, Redactor, RequestFacts, apply_credentials};
use crate::policy::{Policy, normalize_path};
use crate::proxy::ConnState;
use crate::resolve::Resolver;
use airlock_policy::egress::{ApprovalMode, NetworkMode};

pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// How long the TLS handshake with an upstream may take.
const UPSTREAM_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The header that carries the error code on every refusal.
pub const ERROR_HEADER: &str = "x-airlock-error";

/// A refusal with a JSON body `{"error": {"code", "message"}}`.
pub(crate) fn refuse(status: StatusCode, code: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = HeaderValue::from_str(code) {
        headers.insert(ERROR_HEADER, value);
    }
    response
}

pub(crate) fn empty() -> ProxyBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// Where requests on a connection (or inside a tunnel) go.
#[derive(Debug, Clone)]
pub(crate) struct Destination {
    pub(crate) host: Host,
    pub(crate) port: u16,
    pub(crate) tls: bool,
    /// Set inside a tunnel that a person approved as a whole: its requests need no rule.
    pub(crate) approved_tunnel: bool,
}

impl Destination {
    fn default_port(&self) -> u16 {
        if self.tls { 443 } else { 80 }
    }

    fn host_header(&self) -> String {
        if self.port == self.default_port() {
            self.host.to_string()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The upstream connection kept for a sandbox connection, reused while the destination stays.
#[derive(Debug, Default)]
pub(crate) enum Upstream {
    #[default]
    Empty,
    /// Connected (and vetted) when the tunnel was opened, not yet used.
    Fresh(TcpStream),
    Ready {
        key: (String, u16, bool),
        sender: SendRequest<ProxyBody>,
    },
}

/// Serves one request from the sandbox-facing server.
pub(crate) async fn handle(
    conn: Arc<ConnState>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    if request.method() == Method::CONNECT {
        return Ok(crate::tunnel::open(conn, request).await);
    }
    let uri = request.uri();
    let response = match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(authority)) => match parse_host(authority.host()) {
            Ok(host) => {
                let destination = Destination {
                    host,
                    port: authority.port_u16().unwrap_or(80),
                    tls: false,
                    approved_tunnel: false,
                };
                forward(&conn, &destination, request).await
            }
            Err(error) => refuse(StatusCode::BAD_REQUEST, "invalid_host", &error.to_string()),
        },
        (Some(_), _) => refuse(
            StatusCode::BAD_REQUEST,
            "use_connect",
            "only http:// URLs are forwarded; use CONNECT (HTTPS_PROXY) for https",
        ),
        _ => refuse(
            StatusCode::BAD_REQUEST,
            "not_a_proxy_request",
            "this is Airlock's egress proxy: send absolute-form requests or CONNECT",
        ),
    };
    Ok(response)
}

/// Whether a `Host` header (or an absolute-form authority) names the destination.
fn names_destination(value: &str, destination: &Destination) -> bool {
    let (host, port) = match value.rsplit_once(':') {
        Some((host, port))
            if !port.contains(']') && (value.starts_with('[') || !host.contains(':')) =>
        {
            (host, port.parse::<u16>().ok())
        }
        _ => (value, Some(destination.default_port())),
    };
    port == Some(destination.port) && parse_host(host).is_ok_and(|h| h == destination.host)
}

/// Checks, then forwards one request to `destination`.
pub(crate) async fn forward(
    conn: &Arc<ConnState>,
    destination: &Destination,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let shared = &conn.shared;
    let policy: Arc<Policy> = shared.current_policy();
    let host = destination.host.canonical();
    let port = destination.port;
    let method = request.method().as_str().to_owned();
    let target = request
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let mut event = conn.event(AuditKind::Egress, "denied");
    event.host = Some(host.clone());
    event.port = Some(port);
    event.method = Some(method.clone());
    event.path = Some(target.clone());
    let deny = |mut event: AuditEvent, status: StatusCode, code: &str, message: &str| {
        event.code = Some(code.to_owned());
        event.detail = Some(message.to_owned());
        shared.auditor.record(event);
        refuse(status, code, message)
    };

    let path = match normalize_path(request.uri().path()) {
        Ok(path) => path,
        Err(error) => {
            return deny(
                event,
                StatusCode::BAD_REQUEST,
                "invalid_path",
                &error.to_string(),
            );
        }
    };
    let host_header = request
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{0}"));
    let authority = request.uri().authority().map(|a| a.as_str());
    for named in [host_header, authority].into_iter().flatten() {
        if !names_destination(named, destination) {
            let message = format!(
                "the request names {named:?} but goes to {}",
                destination.host_header()
            );
            return deny(event, StatusCode::FORBIDDEN, "host_mismatch", &message);
        }
    }
    if let Err(error) = Resolver::check_literal(&destination.host) {
        return deny(
            event,
            StatusCode::FORBIDDEN,
            error.code(),
            &error.to_string(),
        );
    }

    if policy.mode != NetworkMode::Proxy {
        return deny(
            event,
            StatusCode::FORBIDDEN,
            "egress_denied",
            "this sandbox has no network",
        );
    }
    let allowed_by = if destination.approved_tunnel {
        Some("approval".to_owned())
    } else if let Some(rule) = policy.request_rule(&host, port, &method, &path) {
        Some(rule.to_owned())
    } else if shared.approvals.granted(&host, port, &method, Some(&path)) {
        Some("approval".to_owned())
    } else {
        None
    };
    let allowed_by = match allowed_by {
        Some(rule) => rule,
        None => {
            let code = if policy.connect_decision(&host, port).is_some() {
                "http_rule_denied"
            } else {
                "egress_denied"
            };
            let message = format!(
                "no rule allows {method} {path} on {}",
                destination.host_header()
            );
            match (policy.mode, policy.approvals) {
                (NetworkMode::Proxy, ApprovalMode::Ask { timeout_ms }) => {
                    let ask = AskRequest {
                        host: host.clone(),
                        port,
                        method: method.clone(),
                        path: Some(path.clone()),
                    };
                    let timeout = std::time::Duration::from_millis(timeout_ms);
                    match shared.approvals.ask(ask, timeout, event.clone()).await {
                        AskOutcome::Approved => "approval".to_owned(),
                        outcome => {
                            let (code, message) = refusal_for(outcome);
                            return deny(event, StatusCode::FORBIDDEN, code, message);
                        }
                    }
                }
                _ => return deny(event, StatusCode::FORBIDDEN, code, &message),
            }
        }
    };

    let (mut parts, body) = request.into_parts();
    let body: ProxyBody =
        if crate::git::is_receive_pack(&method, &path) && policy.git_guarded(&host, port) {
            let globs = policy.git_push_refs(&host, port, &method, &path);
            match crate::git::guard_push(&parts.headers, body, &globs).await {
                Ok((body, refs)) => {
                    event.detail = Some(format!("git push of {}", refs.join(", ")));
                    body
                }
                Err(error) => {
                    return deny(event, error.status(), error.code(), &error.to_string());
                }
            }
        } else {
            body.boxed()
        };
    let facts = RequestFacts {
        host: &host,
        port,
        method: &method,
        path: &path,
        target: &target,
    };
    let injected = match apply_credentials(&policy, &facts, &mut parts.headers) {
        Ok(injected) => injected,
        Err(mismatch) => {
            let mut credential = conn.event(AuditKind::Credential, "mismatched");
            credential.credential = Some(mismatch.credential.clone());
            credential.host = Some(host.clone());
            credential.port = Some(port);
            credential.method = Some(method.clone());
            credential.path = Some(path.clone());
            credential.detail = Some(format!("placeholder found in the {}", mismatch.location));
            credential.code = Some("credential_endpoint_mismatch".into());
            shared.auditor.record(credential);
            let message = format!(
                "credential {:?} may not be used for {method} {path} on {} (placeholder in the {})",
                mismatch.credential,
                destination.host_header(),
                mismatch.location
            );
            return deny(
                event,
                StatusCode::FORBIDDEN,
                "credential_endpoint_mismatch",
                &message,
            );
        }
    };

    let redactor = Redactor::for_destination(&policy, &host, port).map(Arc::new);
    strip_hop_by_hop(&mut parts.headers);
    if let Ok(value) = HeaderValue::from_str(&destination.host_header()) {
        parts.headers.insert(header::HOST, value);
    }
    if redactor.is_some() {
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    parts.uri = match target.parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                "the request target is not a valid URI",
            );
        }
    };
    parts.version = hyper::Version::HTTP_11;
    let upstream_request = Request::from_parts(parts, body);

    // Logged once the upstream is reached: a destination that fails the hard block after
    // resolution gets its own denial line instead.
    let mut sender = match upstream_sender(conn, destination).await {
        Ok(sender) => sender,
        Err(response) => return response,
    };
    for name in injected {
        let mut credential = conn.event(AuditKind::Credential, "injected");
        credential.credential = Some(name);
        credential.rule = Some(allowed_by.clone());
        credential.host = Some(host.clone());
        credential.port = Some(port);
        credential.method = Some(method.clone());
        credential.path = Some(path.clone());
        shared.auditor.record(credential);
    }
    event.outcome = "allowed".into();
    event.rule = Some(allowed_by);
    shared.auditor.record(event);
    let response = match sender.send_request(upstream_request).await {
        Ok(response) => response,
        Err(error) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                "upstream_failed",
                &format!("the upstream {} failed: {error}", destination.host_header()),
            );
        }
    };
    conn.put_back(destination, sender).await;
    relay_response(response, redactor)
}

fn refusal_for(outcome: AskOutcome) -> (&'static str, &'static str) {
    match outcome {
        AskOutcome::Denied | AskOutcome::Approved => (
            "approval_denied",
            "the request was held for approval and denied",
        ),
        AskOutcome::TimedOut => (
            "approval_timed_out",
            "the request was held for approval and nobody answered in time",
        ),
        AskOutcome::QueueFull => (
            "approval_queue_full",
            "too many requests of this sandbox are already waiting for approval",
        ),
    }
}

fn relay_response(
    response: Response<Incoming>,
    redactor: Option<Arc<Redactor>>,
) -> Response<ProxyBody> {
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return refuse(
            StatusCode::BAD_GATEWAY,
            "upgrade_refused",
            "protocol upgrades are not relayed on inspected connections",
        );
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = match redactor {
        None => body.boxed(),
        Some(redactor) => {
            let encoded = parts
                .headers
                .get(header::CONTENT_ENCODING)
                .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
            if encoded {
                return refuse(
                    StatusCode::BAD_GATEWAY,
                    "response_not_inspectable",
                    "a destination with a bound credential sent a compressed response, which cannot be checked for the secret",
                );
            }
            redactor.redact_headers(&mut parts.headers);
            parts.headers.remove(header::CONTENT_LENGTH);
            RedactedBody::new(body, redactor).boxed()
        }
    };
    Response::from_parts(parts, body)
}

/// Headers that describe one hop, never forwarded (RFC 9110, 7.6.1), plus the ones that name
/// headers `Connection` lists.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

/// A ready sender to `destination`: the connection's own if it still fits, else a new one
/// (resolved and vetted again).
async fn upstream_sender(
    conn: &Arc<ConnState>,
    destination: &Destination,
) -> Result<SendRequest<ProxyBody>, Response<ProxyBody>> {
    let key = (
        destination.host.canonical(),
        destination.port,
        destination.tls,
    );
    let previous = std::mem::take(&mut *conn.upstream.lock().await);
    let fresh = match previous {
        Upstream::Ready {
            key: old,
            mut sender,
        } if old == key => {
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
            None
        }
        Upstream::Fresh(stream) => Some(stream),
        _ => None,
    };
    let stream = match fresh {
        Some(stream) => stream,
        None => conn
            .shared
            .resolver
            .connect(&destination.host, destination.port)
            .await
            .map_err(|error| {
                let status = if error.code() == "destination_blocked" {
                    StatusCode::FORBIDDEN
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let mut event = conn.event(AuditKind::Egress, "denied");
                event.host = Some(key.0.clone());
                event.port = Some(key.1);
                event.code = Some(error.code().into());
                event.detail = Some(error.to_string());
                conn.shared.auditor.record(event);
                refuse(status, error.code(), &error.to_string())
            })?,
    };
    let failed = |error: String| {
        refuse(
            StatusCode::BAD_GATEWAY,
            "upstream_failed",
            &format!(
                "connecting to {} failed: {error}",
                destination.host_header()
            ),
        )
    };
    let sender = if destination.tls {
        let name = ServerName::try_from(key.0.clone()).map_err(|e| failed(e.to_string()))?;
        let connector = TlsConnector::from(conn.shared.client_tls.clone());
        let handshake_done =
            tokio::time::timeout(UPSTREAM_HANDSHAKE_TIMEOUT, connector.connect(name, stream));
        let tls = match handshake_done.await {
            Ok(Ok(tls)) => tls,
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => "the handshake timed out".to_owned(),
                };
                return Err(refuse(
                    StatusCode::BAD_GATEWAY,
                    "upstream_tls_failed",
                    &format!("TLS to {} failed: {error}", destination.host_header()),
                ));
            }
        };
        handshake(tls).await.map_err(failed)?
    } else {
        handshake(stream).await.map_err(failed)?
    };
    Ok(sender)
}

async fn handshake<S>(stream: S) -> Result<SendRequest<ProxyBody>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        // The upstream closing is the normal end of a kept-alive connection.
        let _ = connection.await;
    });
    Ok(sender)
}
