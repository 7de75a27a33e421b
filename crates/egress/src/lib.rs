//! Airlock's egress proxy: what a sandbox in `network: proxy` mode reaches, and how.
//!
//! One [`Proxy`] per sandbox enforces an [`EgressPlan`](airlock_policy::egress::EgressPlan):
//!
//! - **Protocols**: HTTP forward (absolute-form `http://` requests) and CONNECT. A tunnel's TLS
//!   server name must name its CONNECT host (domain fronting closes it).
//! - **Interception**: only destinations with L7 rules or a bound credential are terminated,
//!   with a per-sandbox CA ([`Proxy::ca_certificate_pem`]); other tunnels pass through.
//! - **Credentials**: the sandbox holds placeholders; the real secret is put into a request
//!   only where the credential is bound, and turned back into the placeholder in responses.
//! - **Git pushes**: where a rule sets `git_push_refs`, every `git-receive-pack` request to
//!   that host is intercepted and its ref update commands are checked before it goes on.
//! - **Hard block**: loopback, link-local, private, shared, multicast and reserved addresses,
//!   in every spelling, checked after resolution on the address actually connected to.
//! - **Approvals**, **hot reload** ([`Proxy::replace_plan`]) and **audit** ([`AuditSink`]).
//!
//! Module map: `address` (host parsing, hard block), `resolve` (DNS, vetting, test resolver),
//! `policy` (plan validation and matching), `credentials` (injection, redaction), `git` (pushes under
//! `git_push_refs`: the ref update commands read and checked), `tls` (CA,
//! upstream trust, ClientHello), `http` (server and forwarding), `tunnel` (CONNECT),
//! `approvals`, `audit`, `proxy` ([`Proxy`]), `bench` (`airlock bench egress`).

mod address;
mod approvals;
mod audit;
pub mod bench;
mod credentials;
mod git;
mod http;
mod policy;
mod proxy;
mod resolve;
mod tls;
mod tunnel;

pub use address::{AddressError, Host, blocked_reason, parse_host};
pub use approvals::{
    ApprovalError, Approvals, Decision, Grant, MAX_PENDING, PendingApproval, Webhook, WebhookError,
};
pub use audit::{AuditError, AuditEvent, AuditKind, AuditSink};
pub use credentials::{CredentialError, Placeholders, Secrets, generate_placeholder};
pub use http::ERROR_HEADER;
pub use policy::{PathError, PolicyError};
pub use proxy::{ConnectionInfo, EgressError, Proxy, ProxyOptions};
pub use resolve::{ResolveError, TestAnswer, TestResolver};
pub use tls::{SYSTEM_TRUST_BUNDLE, TlsError, client_config};

use airlock_policy::egress::EgressPlan;

/// Where the sandbox finds the proxy and its trust files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxProxySetup<'a> {
    /// The loopback port inside the sandbox that relays to the proxy's Unix socket.
    pub proxy_port: u16,
    /// The trust bundle with the sandbox CA ([`Proxy::trust_bundle_pem`]), as seen inside.
    pub trust_bundle_path: &'a str,
    /// The sandbox CA alone ([`Proxy::ca_certificate_pem`]), as seen inside.
    pub ca_certificate_path: &'a str,
}

/// The environment a `proxy`-mode sandbox needs: the proxy variables (both cases), the CA
/// variables, and each credential's placeholder under its `env` name.
pub fn sandbox_environment(
    plan: &EgressPlan,
    placeholders: &Placeholders,
    setup: &SandboxProxySetup<'_>,
) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{}", setup.proxy_port);
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", &proxy),
        ("HTTPS_PROXY", &proxy),
        ("http_proxy", &proxy),
        ("https_proxy", &proxy),
        ("NO_PROXY", &no_proxy),
        ("no_proxy", &no_proxy),
    ] {
        env.push((name.to_owned(), value.clone()));
    }
    for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
        env.push((name.to_owned(), setup.trust_bundle_path.to_owned()));
    }
    env.push((
        "NODE_EXTRA_CA_CERTS".to_owned(),
        setup.ca_certificate_path.to_owned(),
    ));
    for credential in &plan.credentials {
        if let Some(placeholder) = placeholders.get(&credential.name) {
            env.push((credential.env.clone(), placeholder.clone()));
        }
    }
    env
}
