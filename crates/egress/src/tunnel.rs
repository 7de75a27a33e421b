//! CONNECT tunnels. The target must be allowed (or approved), its addresses vetted and
//! connected before the client hears `200`. Then the client's first bytes decide: a TLS
//! ClientHello must name the CONNECT host (a different SNI is domain fronting and closes the
//! tunnel); port 443 must carry TLS. Destinations with L7 rules or a bound credential are
//! intercepted with the sandbox CA; the rest pass through as a byte stream, which a plan change
//! that no longer allows them closes.

use std::sync::Arc;
use std::time::Duration;

use airlock_policy::egress::{ApprovalMode, NetworkMode};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWriteExt as _, copy_bidirectional_with_sizes};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::address::{Host, parse_host};
use crate::approvals::{AskOutcome, AskRequest};
use crate::audit::{AuditEvent, AuditKind};
use crate::http::{Destination, ProxyBody, Upstream, empty, refuse};
use crate::proxy::{ConnState, Shared};
use crate::resolve::Resolver;
use crate::tls::{Greeting, Prefixed, sniff};

/// How long a tunnel's client may take to send its first bytes (tunnels are client-first).
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(30);
/// Copy buffers for pass-through tunnels: large enough for GB/s on loopback.
const TUNNEL_BUFFER: usize = 256 * 1024;

/// How a tunnel was allowed.
#[derive(Debug, Clone)]
struct Admission {
    rule: String,
    inspect: bool,
    /// Allowed by a person, not by a rule: plan changes do not close it.
    approved: bool,
}

fn tunnel_event(conn: &ConnState, host: &str, port: u16) -> AuditEvent {
    let mut event = conn.event(AuditKind::Egress, "denied");
    event.host = Some(host.to_owned());
    event.port = Some(port);
    event.method = Some("CONNECT".into());
    event
}

/// Handles a CONNECT request. The future is boxed as `Send` by name: tunnels serve HTTP whose
/// requests may open tunnels, and the compiler cannot prove `Send` through that cycle itself.
pub(crate) fn open(
    conn: Arc<ConnState>,
    request: Request<Incoming>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ProxyBody>> + Send>> {
    Box::pin(open_tunnel(conn, request))
}

async fn open_tunnel(conn: Arc<ConnState>, mut request: Request<Incoming>) -> Response<ProxyBody> {
    let shared = conn.shared.clone();
    let Some(authority) = request.uri().authority().cloned() else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            "CONNECT needs host:port",
        );
    };
    let Some(port) = authority.port_u16().filter(|p| *p != 0) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            "CONNECT needs host:port",
        );
    };
    let host = match parse_host(authority.host()) {
        Ok(host) => host,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, "invalid_host", &error.to_string()),
    };
    let name = host.canonical();
    let event = tunnel_event(&conn, &name, port);
    let deny = |mut event: AuditEvent, status: StatusCode, code: &str, message: &str| {
        event.code = Some(code.to_owned());
        event.detail = Some(message.to_owned());
        shared.auditor.record(event);
        refuse(status, code, message)
    };
    if let Err(error) = Resolver::check_literal(&host) {
        return deny(
            event,
            StatusCode::FORBIDDEN,
            error.code(),
            &error.to_string(),
        );
    }
    let admission = match admit(&shared, &name, port, event.clone()).await {
        Ok(admission) => admission,
        Err((code, message)) => return deny(event, StatusCode::FORBIDDEN, code, &message),
    };
    let upstream = match shared.resolver.connect(&host, port).await {
        Ok(stream) => stream,
        Err(error) => {
            let status = if error.code() == "destination_blocked" {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::BAD_GATEWAY
            };
            return deny(event, status, error.code(), &error.to_string());
        }
    };
    let mut allowed = event;
    allowed.outcome = "allowed".into();
    allowed.rule = Some(admission.rule.clone());
    allowed.tunnel = Some(
        if admission.inspect {
            "inspect"
        } else {
            "passthrough"
        }
        .into(),
    );
    shared.auditor.record(allowed);

    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            run(
                conn,
                TokioIo::new(upgraded),
                host,
                port,
                admission,
                upstream,
            )
            .await;
        }
    });
    Response::new(empty())
}

/// Whether a tunnel to `host:port` may open: a rule, a standing grant, or a person's answer.
async fn admit(
    shared: &Arc<Shared>,
    host: &str,
    port: u16,
    event: AuditEvent,
) -> Result<Admission, (&'static str, String)> {
    let policy = shared.current_policy();
    if let Some(allowed) = policy.connect_decision(host, port) {
        return Ok(Admission {
            rule: allowed.rule,
            inspect: allowed.inspect,
            approved: false,
        });
    }
    let approved = || Admission {
        rule: "approval".into(),
        inspect: policy.must_inspect(host, port),
        approved: true,
    };
    if policy.mode == NetworkMode::Proxy && shared.approvals.granted(host, port, "CONNECT", None) {
        return Ok(approved());
    }
    let message = format!("no rule allows {host}:{port}");
    match (policy.mode, policy.approvals) {
        (NetworkMode::Proxy, ApprovalMode::Ask { timeout_ms }) => {
            let ask = AskRequest {
                host: host.to_owned(),
                port,
                method: "CONNECT".into(),
                path: None,
            };
            match shared
                .approvals
                .ask(ask, Duration::from_millis(timeout_ms), event)
                .await
            {
                AskOutcome::Approved => Ok(approved()),
                AskOutcome::Denied => Err((
                    "approval_denied",
                    format!("{message}, and the request was denied"),
                )),
                AskOutcome::TimedOut => Err((
                    "approval_timed_out",
                    format!("{message}, and nobody answered in time"),
                )),
                AskOutcome::QueueFull => Err((
                    "approval_queue_full",
                    format!("{message}, and too many requests are waiting"),
                )),
            }
        }
        (NetworkMode::None, _) => Err(("egress_denied", "this sandbox has no network".to_owned())),
        _ => Err(("egress_denied", message)),
    }
}

/// Why a tunnel's opening bytes are refused, if they are.
fn check_greeting(
    greeting: &Greeting,
    host: &Host,
    port: u16,
) -> Result<(), (&'static str, String)> {
    match greeting {
        Greeting::Tls {
            server_name: Some(sni),
        } => match parse_host(sni) {
            Ok(named) if &named == host => Ok(()),
            _ => Err((
                "sni_mismatch",
                format!("CONNECT {host} but the TLS server name is {sni:?} (domain fronting)"),
            )),
        },
        Greeting::Tls { server_name: None } => match host {
            Host::Ip(_) => Ok(()),
            Host::Name(_) => Err((
                "sni_missing",
                format!("CONNECT {host} but the ClientHello names no server"),
            )),
        },
        // Also when inspected: a credential must never travel in clear to an HTTPS port.
        Greeting::Plain if port == 443 => {
            Err(("tls_required", format!("CONNECT {host}:443 must carry TLS")))
        }
        Greeting::Plain => Ok(()),
    }
}

async fn run(
    conn: Arc<ConnState>,
    mut client: TokioIo<hyper::upgrade::Upgraded>,
    host: Host,
    port: u16,
    admission: Admission,
    mut upstream: TcpStream,
) {
    let shared = conn.shared.clone();
    let mut buffer = Vec::new();
    let greeting =
        match tokio::time::timeout(FIRST_BYTES_TIMEOUT, sniff(&mut client, &mut buffer)).await {
            Ok(Ok(greeting)) => greeting,
            // A client that opens a tunnel and sends nothing (or garbage TLS) gets nothing.
            _ => return,
        };
    if let Err((code, message)) = check_greeting(&greeting, &host, port) {
        let mut event = tunnel_event(&conn, &host.canonical(), port);
        event.code = Some(code.into());
        event.detail = Some(message);
        event.rule = Some(admission.rule.clone());
        shared.auditor.record(event);
        return;
    }
    if admission.inspect {
        let tls = matches!(greeting, Greeting::Tls { .. });
        let destination = Destination {
            host: host.clone(),
            port,
            tls,
            approved_tunnel: admission.approved,
        };
        let inner = ConnState::new(shared.clone(), conn.info.clone(), Upstream::Fresh(upstream));
        let stream = Prefixed::new(buffer, client);
        if tls {
            let config = match shared.authority.server_config(&host) {
                Ok(config) => config,
                Err(_) => return,
            };
            let Ok(tls_stream) = TlsAcceptor::from(config).accept(stream).await else {
                // The client did not trust the sandbox CA, or went away.
                return;
            };
            inner.serve_http(tls_stream, Some(destination)).await;
        } else {
            inner.serve_http(stream, Some(destination)).await;
        }
        return;
    }
    if upstream.write_all(&buffer).await.is_err() {
        return;
    }
    let name = host.canonical();
    tokio::select! {
        _ = copy_bidirectional_with_sizes(&mut client, &mut upstream, TUNNEL_BUFFER, TUNNEL_BUFFER) => {}
        () = revoked(&shared, &name, port, &admission) => {
            let mut event = tunnel_event(&conn, &name, port);
            event.code = Some("policy_revoked".into());
            event.detail = Some("a new plan no longer allows this tunnel as it is".into());
            event.rule = Some(admission.rule.clone());
            shared.auditor.record(event);
        }
        () = shared.closed() => {}
    }
}

/// Resolves when a plan change means this pass-through tunnel may no longer stay open: its
/// destination is no longer allowed, or must now be inspected.
async fn revoked(shared: &Arc<Shared>, host: &str, port: u16, admission: &Admission) {
    let mut updates = shared.subscribe_policy();
    loop {
        if updates.changed().await.is_err() {
            return std::future::pending().await;
        }
        let policy = updates.borrow_and_update().clone();
        if policy.mode != NetworkMode::Proxy {
            return;
        }
        let still = if admission.approved {
            !policy.must_inspect(host, port)
        } else {
            policy
                .connect_decision(host, port)
                .is_some_and(|a| !a.inspect)
        };
        if !still {
            return;
        }
    }
}
