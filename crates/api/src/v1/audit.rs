//! What crosses a sandbox's boundary, as the native API reports it: the daemon's events and
//! logs, audit lines, policy changes in force, and requests held for approval.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One entry of the daemon's event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub seq: i64,
    /// Unix time in milliseconds.
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// `create`, `ready`, `create_failed`, `delete`, `timeout`, `ended`, `adopted`,
    /// `orphan_destroyed`, ...
    pub kind: String,
    pub message: String,
}

/// `GET /v1/sandboxes/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxLogs {
    pub events: Vec<Event>,
    /// The last 64 KiB of the agent's own log.
    pub agent_log: String,
}

/// One audit line: a boundary decision (`egress`, `credential`, `approval`, `policy`, `file`)
/// or a `lifecycle` event. Secrets and credential placeholders never appear in any field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// Unix time in milliseconds.
    pub time_unix_ms: u64,
    pub sandbox_id: String,
    /// `egress`, `credential`, `approval`, `policy`, `file`, `eval` or `lifecycle`.
    pub kind: String,
    /// What happened: `allowed`, `denied`, `injected`, `mismatched`, `asked`,
    /// `approved_once`, `approved_always`, `timed_out`, `changed`, `rejected`, or a lifecycle
    /// event's kind (`create`, `ready`, `delete`, `timeout`, `adopted`, ...).
    pub outcome: String,
    /// The rule that allowed the request, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The error code the client saw, for denials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `CONNECT` for tunnels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Without its query string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `passthrough` or `inspect`, for tunnels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<String>,
    /// A credential's name (never its value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The sandbox process behind the decision, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
}

/// `GET /v1/sandboxes/{id}/events`: audit lines and lifecycle events, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxEvents {
    pub events: Vec<AuditRecord>,
    /// Set when more events follow: ask again with `since_ms` set to it (events of that very
    /// millisecond already returned may repeat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_since_ms: Option<u64>,
}

/// A change a new policy makes that widens what the sandbox can do (`airlock policy diff`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyFinding {
    /// `credential-reach`, `private-reach`, `egress`, `approvals`, ...
    pub kind: String,
    /// Whether the change is applied only with `approve=true`.
    pub needs_review: bool,
    pub message: String,
    /// A concrete request the new policy allows and the old one does not.
    pub witness: String,
}

/// `PUT /v1/sandboxes/{id}/policy` answer: the policy is in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyApplied {
    /// The egress plan's generation now in force (1 is the sandbox's first).
    pub generation: u64,
    /// Every widening of the change (those needing review were approved).
    pub findings: Vec<PolicyFinding>,
}

/// A request held under `approvals: ask`, waiting for a decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// Unique across the daemon's sandboxes: `<sandbox id>-<proxy's id>`.
    pub id: String,
    pub sandbox_id: String,
    pub host: String,
    pub port: u16,
    /// `CONNECT` for a tunnel.
    pub method: String,
    /// Absent for a tunnel; never carries a query string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Unix time in milliseconds.
    pub requested_at_ms: u64,
    /// When the request is denied if nobody answers (Unix time in milliseconds).
    pub expires_at_ms: u64,
}

/// `GET /v1/approvals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalList {
    pub approvals: Vec<Approval>,
}

/// An answer to a held request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Let this request through.
    Once,
    /// Let this and every identical later request through (a tunnel: its whole destination)
    /// while the sandbox lives.
    Always,
    Deny,
}

/// `POST /v1/approvals/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideApprovalRequest {
    pub decision: ApprovalDecision,
}
