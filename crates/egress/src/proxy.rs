//! [`Proxy`]: one per sandbox. It owns the current plan generation (swapped atomically), the
//! per-sandbox CA, the approval queue and the audit sink, and serves the sandbox's
//! connections.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_policy::egress::EgressPlan;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::approvals::{Approvals, Webhook};
use crate::audit::{AuditEvent, AuditKind, AuditSink, Auditor};
use crate::credentials::{Placeholders, Secrets};
use crate::http::{Destination, Upstream};
use crate::policy::{Policy, PolicyError};
use crate::resolve::{Resolver, TestResolver};
use crate::tls::{Authority, SYSTEM_TRUST_BUNDLE, TlsError, client_config};

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("the egress plan is invalid")]
    InvalidPlan(#[source] PolicyError),
    #[error("setting up TLS for the egress proxy failed")]
    Tls(#[from] TlsError),
    #[error("cannot read the trust store {path}")]
    TrustStore {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Construction options. The runtime leaves them at their defaults, except `reviewer_webhook`.
#[derive(Debug, Default)]
pub struct ProxyOptions {
    /// TESTS AND BENCHMARKS ONLY: resolve names with this table instead of DNS. Its
    /// [`crate::TestAnswer::Upstream`] addresses skip the hard block.
    pub test_resolver: Option<Arc<TestResolver>>,
    /// The PEM bundle that upstream certificates are verified against
    /// (default: [`SYSTEM_TRUST_BUNDLE`]).
    pub trust_bundle: Option<PathBuf>,
    /// More PEM roots for upstream verification (tests: the test upstreams' CA).
    pub extra_upstream_roots_pem: Vec<String>,
    /// Where held requests are also sent for review.
    pub reviewer_webhook: Option<Webhook>,
}

/// What the caller knows about the sandbox process behind one connection (for audit lines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub pid: Option<u32>,
    pub exe: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sandbox_id: String,
    policy: watch::Sender<Arc<Policy>>,
    /// Serializes plan replacements so that generations are published in order.
    replace: Mutex<u64>,
    pub(crate) resolver: Resolver,
    pub(crate) authority: Authority,
    pub(crate) client_tls: Arc<ClientConfig>,
    trust_bundle: PathBuf,
    pub(crate) approvals: Approvals,
    pub(crate) auditor: Auditor,
    closed: watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn current_policy(&self) -> Arc<Policy> {
        self.policy.borrow().clone()
    }

    pub(crate) fn subscribe_policy(&self) -> watch::Receiver<Arc<Policy>> {
        self.policy.subscribe()
    }

    /// Resolves when the proxy is closed.
    pub(crate) async fn closed(&self) {
        let mut closed = self.closed.subscribe();
        // The sender lives as long as `self`, so `wait_for` only returns once closed.
        let _ = closed.wait_for(|closed| *closed).await;
    }
}

/// One sandbox connection (or one inspected tunnel) and its upstream connection.
#[derive(Debug)]
pub(crate) struct ConnState {
    pub(crate) shared: Arc<Shared>,
    pub(crate) info: ConnectionInfo,
    pub(crate) upstream: tokio::sync::Mutex<Upstream>,
}

impl ConnState {
    pub(crate) fn new(shared: Arc<Shared>, info: ConnectionInfo, upstream: Upstream) -> Arc<Self> {
        Arc::new(Self {
            shared,
            info,
            upstream: tokio::sync::Mutex::new(upstream),
        })
    }

    /// An audit event stamped with this connection's process, if known.
    pub(crate) fn event(&self, kind: AuditKind, outcome: &str) -> AuditEvent {
        let mut event = AuditEvent::new(kind, outcome);
        event.pid = self.info.pid;
        event.exe = self.info.exe.clone();
        event
    }

    pub(crate) async fn put_back(
        &self,
        destination: &Destination,
        sender: hyper::client::conn::http1::SendRequest<crate::http::ProxyBody>,
    ) {
        let key = (
            destination.host.canonical(),
            destination.port,
            destination.tls,
        );
        *self.upstream.lock().await = Upstream::Ready { key, sender };
    }

    /// Serves HTTP/1.1 on `stream` until it ends or the proxy closes.
    pub(crate) async fn serve_http<S>(self: Arc<Self>, stream: S, destination: Option<Destination>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let shared = self.shared.clone();
        let conn = self;
        let service = service_fn(move |request| {
            let conn = conn.clone();
            let destination = destination.clone();
            async move {
                match destination {
                    None => crate::http::handle(conn, request).await,
                    Some(destination) => {
                        Ok(crate::http::forward(&conn, &destination, request).await)
                    }
                }
            }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::select! {
            // A client that goes away mid-request is not the proxy's error.
            _ = connection => {}
            () = shared.closed() => {}
        }
    }
}

/// The egress proxy of one sandbox. Cheap to clone; every clone is the same proxy.
#[derive(Debug, Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

impl Proxy {
    /// Validates `plan` (with the credentials' `secrets` and `placeholders`, by credential
    /// name) and generates the sandbox's CA.
    pub fn new(
        sandbox_id: &str,
        plan: &EgressPlan,
        secrets: &Secrets,
        placeholders: &Placeholders,
        audit: AuditSink,
        options: ProxyOptions,
    ) -> Result<Self, EgressError> {
        let auditor = Auditor::new(audit, sandbox_id);
        let policy = match Policy::compile(plan, secrets, placeholders, 1) {
            Ok(policy) => policy,
            Err(error) => {
                let mut event = AuditEvent::new(AuditKind::Policy, "rejected");
                event.detail = Some(auditor.redact(&error.to_string()));
                auditor.record(event);
                return Err(EgressError::InvalidPlan(error));
            }
        };
        auditor.add_sensitive(policy.sensitive_strings());
        let trust_bundle = options
            .trust_bundle
            .unwrap_or_else(|| PathBuf::from(SYSTEM_TRUST_BUNDLE));
        let client_tls = client_config(&trust_bundle, &options.extra_upstream_roots_pem)?;
        let authority = Authority::generate(sandbox_id)?;
        let approvals = Approvals::new(sandbox_id, options.reviewer_webhook, auditor.clone());
        let mut event = AuditEvent::new(AuditKind::Policy, "changed");
        event.policy_generation = Some(1);
        event.detail = Some("initial plan".into());
        auditor.record(event);
        let (policy, _) = watch::channel(Arc::new(policy));
        let (closed, _) = watch::channel(false);
        Ok(Self {
            shared: Arc::new(Shared {
                sandbox_id: sandbox_id.to_owned(),
                policy,
                replace: Mutex::new(1),
                resolver: Resolver::new(options.test_resolver),
                authority,
                client_tls,
                trust_bundle,
                approvals,
                auditor,
                closed,
            }),
        })
    }

    pub fn sandbox_id(&self) -> &str {
        &self.shared.sandbox_id
    }

    /// The sandbox's CA certificate (PEM). Trust it inside the sandbox, and nowhere else.
    pub fn ca_certificate_pem(&self) -> &str {
        self.shared.authority.ca_pem()
    }

    /// The host's trust bundle with the sandbox CA appended: the file to show the sandbox as
    /// its system bundle (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`).
    pub fn trust_bundle_pem(&self) -> Result<String, EgressError> {
        let path = &self.shared.trust_bundle;
        let mut bundle = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(EgressError::TrustStore {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(self.ca_certificate_pem());
        Ok(bundle)
    }

    /// Replaces the plan, credentials and approval mode at once. Requests decided from now on
    /// use the new plan; tunnels it no longer allows are closed. An invalid plan is rejected
    /// (and audited) and the old one stays in force. Returns the new generation.
    pub fn replace_plan(
        &self,
        plan: &EgressPlan,
        secrets: &Secrets,
        placeholders: &Placeholders,
    ) -> Result<u64, EgressError> {
        let mut generation = self
            .shared
            .replace
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let auditor = &self.shared.auditor;
        let next = *generation + 1;
        match Policy::compile(plan, secrets, placeholders, next) {
            Ok(policy) => {
                auditor.add_sensitive(policy.sensitive_strings());
                self.shared.policy.send_replace(Arc::new(policy));
                *generation = next;
                let mut event = AuditEvent::new(AuditKind::Policy, "changed");
                event.policy_generation = Some(next);
                auditor.record(event);
                Ok(next)
            }
            Err(error) => {
                let mut event = AuditEvent::new(AuditKind::Policy, "rejected");
                event.policy_generation = Some(*generation);
                event.detail = Some(auditor.redact(&error.to_string()));
                auditor.record(event);
                Err(EgressError::InvalidPlan(error))
            }
        }
    }

    /// The generation of the plan in force (1 for the plan given to [`Proxy::new`]).
    pub fn generation(&self) -> u64 {
        self.shared.current_policy().generation
    }

    /// The approval queue: list held requests, decide them, manage "always" grants.
    pub fn approvals(&self) -> &Approvals {
        &self.shared.approvals
    }

    /// Accepts connections until [`Proxy::close`]. Transient accept errors (such as running
    /// out of descriptors) pause briefly instead of ending the proxy.
    pub async fn serve(&self, listener: UnixListener) {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let proxy = self.clone();
                        tokio::spawn(async move {
                            proxy.serve_connection(stream, ConnectionInfo::default()).await;
                        });
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                },
                () = self.shared.closed() => return,
            }
        }
    }

    /// Serves one sandbox connection (any byte stream: the relayed Unix socket, or TCP).
    pub async fn serve_connection<S>(&self, stream: S, info: ConnectionInfo)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let conn = ConnState::new(self.shared.clone(), info, Upstream::Empty);
        conn.serve_http(stream, None).await;
    }

    /// Stops accepting, and ends every connection and tunnel of this proxy.
    pub fn close(&self) {
        self.shared.closed.send_replace(true);
    }
}
