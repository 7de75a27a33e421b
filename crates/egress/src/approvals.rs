//! Approvals: under `approvals: ask`, a request no rule allows is held and listed until someone
//! approves it once or always, or denies it (through [`Approvals::decide`], which the CLI and
//! the API call, or a reviewer webhook), or until the plan's timeout, which denies it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::audit::{AuditEvent, AuditKind, Auditor};
use crate::credentials::random_hex;

/// The most requests one sandbox may have waiting at once; more are denied at once.
pub const MAX_PENDING: usize = 64;
/// The largest webhook answer read.
const MAX_WEBHOOK_ANSWER_BYTES: usize = 64 * 1024;

/// A held request, as listed by `airlock approvals ls` and `GET /v1/approvals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingApproval {
    pub id: String,
    pub sandbox_id: String,
    pub host: String,
    pub port: u16,
    /// `CONNECT` for a tunnel.
    pub method: String,
    /// `None` for a tunnel; never carries a query string.
    pub path: Option<String>,
    pub requested_at_unix_ms: u64,
    pub expires_at_unix_ms: u64,
}

/// An answer to a held request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Let this request through.
    Once,
    /// Let this request and every later identical one through (a tunnel: the whole
    /// destination), until [`Approvals::clear_grants`].
    Always,
    Deny,
}

impl Decision {
    fn outcome(self) -> &'static str {
        match self {
            Decision::Once => "approved_once",
            Decision::Always => "approved_always",
            Decision::Deny => "denied",
        }
    }
}

/// A standing "always" approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub host: String,
    pub port: u16,
    /// `None`: any request to the destination (a tunnel was approved).
    pub method: Option<String>,
    pub path: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApprovalError {
    #[error("no pending approval has id {0:?} (it may have been answered or timed out)")]
    NotFound(String),
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the reviewer webhook URL {0:?} must be http://host[:port]/path")]
    BadUrl(String),
}

/// A reviewer reached by a plain HTTP POST of `{"approval": PendingApproval}`; an answer of
/// `{"decision": "once" | "always" | "deny"}` decides. Any other answer leaves the request
/// waiting for someone else. The URL is the operator's, so the hard block does not apply.
#[derive(Debug, Clone)]
pub struct Webhook {
    uri: Uri,
    authority: String,
}

impl Webhook {
    pub fn new(url: &str) -> Result<Self, WebhookError> {
        let bad = || WebhookError::BadUrl(url.to_owned());
        let uri: Uri = url.parse().map_err(|_| bad())?;
        if uri.scheme_str() != Some("http") {
            return Err(bad());
        }
        let authority = uri.authority().ok_or_else(bad)?;
        let authority = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        Ok(Self { uri, authority })
    }

    async fn ask(&self, pending: &PendingApproval) -> Option<Decision> {
        #[derive(Deserialize)]
        struct Answer {
            decision: Decision,
        }
        let body = serde_json::to_vec(&serde_json::json!({ "approval": pending })).ok()?;
        let stream = tokio::net::TcpStream::connect(&self.authority).await.ok()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(connection);
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let request = Request::post(path)
            .header(hyper::header::HOST, self.uri.authority()?.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let bytes = Limited::new(response.into_body(), MAX_WEBHOOK_ANSWER_BYTES)
            .collect()
            .await
            .ok()?
            .to_bytes();
        serde_json::from_slice::<Answer>(&bytes)
            .ok()
            .map(|a| a.decision)
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Debug)]
struct Entry {
    pending: PendingApproval,
    answer: oneshot::Sender<Decision>,
}

#[derive(Debug)]
struct Inner {
    sandbox_id: String,
    pending: Mutex<BTreeMap<String, Entry>>,
    grants: Mutex<Vec<Grant>>,
    webhook: Option<Webhook>,
    auditor: Auditor,
}

/// The approval queue and the standing grants of one proxy.
#[derive(Debug, Clone)]
pub struct Approvals {
    inner: Arc<Inner>,
}

/// What a held request is.
#[derive(Debug, Clone)]
pub(crate) struct AskRequest {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) method: String,
    pub(crate) path: Option<String>,
}

/// How a held request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AskOutcome {
    Approved,
    Denied,
    TimedOut,
    QueueFull,
}

/// Removes a request that stops waiting (its client went away) from the list.
struct PendingGuard<'a> {
    approvals: &'a Approvals,
    id: String,
    armed: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.armed && self.approvals.take(&self.id).is_some() {
            let mut event = AuditEvent::new(AuditKind::Approval, "cancelled");
            event.approval_id = Some(self.id.clone());
            event.detail = Some("the client stopped waiting".into());
            self.approvals.inner.auditor.record(event);
        }
    }
}

impl Approvals {
    pub(crate) fn new(sandbox_id: &str, webhook: Option<Webhook>, auditor: Auditor) -> Self {
        Self {
            inner: Arc::new(Inner {
                sandbox_id: sandbox_id.to_owned(),
                pending: Mutex::new(BTreeMap::new()),
                grants: Mutex::new(Vec::new()),
                webhook,
                auditor,
            }),
        }
    }

    /// The requests waiting for an answer, oldest first.
    pub fn list(&self) -> Vec<PendingApproval> {
        let pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<PendingApproval> = pending.values().map(|e| e.pending.clone()).collect();
        list.sort_by_key(|p| p.requested_at_unix_ms);
        list
    }

    /// Answers a held request.
    pub fn decide(&self, id: &str, decision: Decision) -> Result<(), ApprovalError> {
        self.decide_by(id, decision, "operator")
    }

    /// The standing "always" approvals.
    pub fn grants(&self) -> Vec<Grant> {
        self.inner
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets every "always" approval.
    pub fn clear_grants(&self) {
        self.inner
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn take(&self, id: &str) -> Option<Entry> {
        self.inner
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }

    fn decide_by(&self, id: &str, decision: Decision, by: &str) -> Result<(), ApprovalError> {
        let entry = self
            .take(id)
            .ok_or_else(|| ApprovalError::NotFound(id.to_owned()))?;
        if decision == Decision::Always {
            let pending = &entry.pending;
            let tunnel = pending.method == "CONNECT";
            self.inner
                .grants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Grant {
                    host: pending.host.clone(),
                    port: pending.port,
                    method: (!tunnel).then(|| pending.method.clone()),
                    path: if tunnel { None } else { pending.path.clone() },
                });
        }
        let mut event = AuditEvent::new(AuditKind::Approval, decision.outcome());
        event.approval_id = Some(id.to_owned());
        event.host = Some(entry.pending.host.clone());
        event.port = Some(entry.pending.port);
        event.method = Some(entry.pending.method.clone());
        event.path = entry.pending.path.clone();
        event.detail = Some(format!("by {by}"));
        self.inner.auditor.record(event);
        // The requester may have gone in the meantime; nothing to do then.
        let _ = entry.answer.send(decision);
        Ok(())
    }

    /// Holds a call the daemon makes on the sandbox's behalf (a wasm guest's tool, see the
    /// server's `wasm_tools`) exactly like a held request: listed, answered once, always or
    /// denied, timed out, audited, and an "always" grant covers the same call later. `detail`
    /// says what is held. Whether it may go ahead.
    pub async fn hold(
        &self,
        destination: (&str, u16),
        method: &str,
        path: &str,
        timeout: Duration,
        detail: &str,
    ) -> bool {
        let (host, port) = destination;
        if self.granted(host, port, method, Some(path)) {
            return true;
        }
        let mut event = AuditEvent::new(AuditKind::Approval, "asked");
        event.host = Some(host.to_owned());
        event.port = Some(port);
        event.method = Some(method.to_owned());
        event.path = Some(path.to_owned());
        event.detail = Some(detail.to_owned());
        let request = AskRequest {
            host: host.to_owned(),
            port,
            method: method.to_owned(),
            path: Some(path.to_owned()),
        };
        self.ask(request, timeout, event).await == AskOutcome::Approved
    }

    /// Whether a standing grant covers this request (`path: None` for a tunnel).
    pub(crate) fn granted(&self, host: &str, port: u16, method: &str, path: Option<&str>) -> bool {
        let grants = self.inner.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.iter().any(|grant| {
            grant.host == host
                && grant.port == port
                && match (&grant.method, &grant.path) {
                    (None, _) => true,
                    (Some(m), p) => m == method && p.as_deref() == path,
                }
        })
    }

    /// Holds the request until it is answered or `timeout` passes.
    pub(crate) async fn ask(
        &self,
        request: AskRequest,
        timeout: Duration,
        mut event: AuditEvent,
    ) -> AskOutcome {
        let id = format!(
            "apr-{}",
            random_hex(8).unwrap_or_else(|_| format!("{:016x}", now_unix_ms()))
        );
        let now = now_unix_ms();
        let pending = PendingApproval {
            id: id.clone(),
            sandbox_id: self.inner.sandbox_id.clone(),
            host: self.inner.auditor.redact(&request.host),
            port: request.port,
            method: request.method,
            path: request.path.map(|p| {
                self.inner
                    .auditor
                    .redact(p.split('?').next().unwrap_or_default())
            }),
            requested_at_unix_ms: now,
            expires_at_unix_ms: now
                .saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        let (sender, receiver) = oneshot::channel();
        {
            let mut queue = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() >= MAX_PENDING {
                // The caller logs the denial.
                return AskOutcome::QueueFull;
            }
            queue.insert(
                id.clone(),
                Entry {
                    pending: pending.clone(),
                    answer: sender,
                },
            );
        }
        let mut guard = PendingGuard {
            approvals: self,
            id: id.clone(),
            armed: true,
        };
        event.kind = Some(AuditKind::Approval);
        event.outcome = "asked".into();
        event.approval_id = Some(id.clone());
        self.inner.auditor.record(event);
        if let Some(webhook) = self.inner.webhook.clone() {
            let approvals = self.clone();
            tokio::spawn(async move {
                let answer = tokio::time::timeout(timeout, webhook.ask(&pending)).await;
                if let Ok(Some(decision)) = answer {
                    let _ = approvals.decide_by(&pending.id, decision, "webhook");
                }
            });
        }
        let outcome = match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(Decision::Once | Decision::Always)) => AskOutcome::Approved,
            Ok(Ok(Decision::Deny)) | Ok(Err(_)) => AskOutcome::Denied,
            Err(_) => {
                if let Some(entry) = self.take(&id) {
                    let mut event = AuditEvent::new(AuditKind::Approval, "timed_out");
                    event.approval_id = Some(id.clone());
                    event.host = Some(entry.pending.host);
                    event.port = Some(entry.pending.port);
                    event.method = Some(entry.pending.method);
                    event.path = entry.pending.path;
                    self.inner.auditor.record(event);
                }
                AskOutcome::TimedOut
            }
        };
        guard.armed = false;
        outcome
    }
}
