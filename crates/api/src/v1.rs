//! The daemon's native HTTP API (`/v1`): request and response bodies.
//!
//! `airlockd` serves these and `airlock_server::client` sends them; `api/openapi.json` is
//! generated from their JSON Schemas. Every struct rejects unknown fields, and units are in
//! field names.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::Tier;

impl JsonSchema for Tier {
    fn schema_name() -> Cow<'static, str> {
        "Tier".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "The isolation tier. Only `process` runs in this build; the others are refused with 422 and the reason.",
            "type": "string",
            "enum": ["process", "container", "microvm"],
        })
    }
}

/// The stable error codes of the API, each with one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed (bad JSON, bad query, bad path).
    InvalidRequest,
    /// 401: no valid API key or access token.
    Unauthenticated,
    /// 403: the sandbox refused the operation (a write outside `/workspace` and `/tmp`).
    PermissionDenied,
    /// 404: no such sandbox, route, template or file.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 409: the request conflicts with the current state (the file exists, the sandbox is
    /// still starting).
    Conflict,
    /// 413: the body is larger than the configured cap.
    PayloadTooLarge,
    /// 422: well-formed but not possible (unknown template, unavailable tier, bad limits).
    Unprocessable,
    /// 500: a bug or a host failure; the message says which.
    Internal,
    /// 502: the sandbox's agent did not answer or answered nonsense.
    AgentError,
    /// 503: the daemon is at its cap on concurrent sandboxes.
    Capacity,
    /// 503: the daemon is shutting down or the sandbox is being removed.
    Unavailable,
    /// 504: the command's own `timeout_ms` expired.
    Timeout,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Unprocessable,
        ErrorCode::Internal,
        ErrorCode::AgentError,
        ErrorCode::Capacity,
        ErrorCode::Unavailable,
        ErrorCode::Timeout,
    ];

    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Unprocessable => 422,
            ErrorCode::Internal => 500,
            ErrorCode::AgentError => 502,
            ErrorCode::Capacity | ErrorCode::Unavailable => 503,
            ErrorCode::Timeout => 504,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unprocessable => "unprocessable",
            ErrorCode::Internal => "internal",
            ErrorCode::AgentError => "agent_error",
            ErrorCode::Capacity => "capacity",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
        }
    }
}

/// Every error response: `{"code": "not_found", "message": "no sandbox abc"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// Resource limits of a sandbox. In a request, an absent field takes Airlock's default
/// (2 GiB memory, 1024 pids, 1 GiB disk, no CPU cap); in a response, absent means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// Thousandths of a CPU (1500 = 1.5 CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    /// The scratch space that `/tmp` and a fresh `/workspace` share, which is also the largest
    /// file the workload may write. On disk (airlockd's default) it is a budget of its own; in
    /// memory it is at most half of `memory_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
}

/// Where `/workspace` comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Workspace {
    /// A fresh, private tmpfs that disappears with the sandbox.
    #[default]
    Fresh,
    /// An absolute host directory, bound read-write.
    Host { path: String },
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    #[serde(default)]
    pub tier: Tier,
    /// A template name (`GET /v1/templates`); default `base`, the host's root read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default)]
    pub resources: Resources,
    /// Lifetime from now; the daemon's default when absent. The sandbox is destroyed then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Environment added to every command run in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given and usable as list filters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub workspace: Workspace,
    /// A policy document (the YAML format's JSON form, `api/policy.schema.json`). Its
    /// resources, user and timeout apply where the request leaves them out; the sandbox runs
    /// on at least its tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Box<crate::policy::PolicyDocument>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being started; not yet usable.
    Creating,
    /// Its agent answers; exec and files work.
    Running,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
        }
    }
}

/// A sandbox as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    pub id: String,
    pub state: SandboxState,
    pub tier: Tier,
    pub template: String,
    /// The limits in force.
    pub resources: Resources,
    pub workspace: Workspace,
    pub metadata: BTreeMap<String, String>,
    /// Unix time in milliseconds.
    pub created_at_ms: u64,
    /// When the sandbox will be destroyed (Unix time in milliseconds).
    pub expires_at_ms: u64,
}

/// `POST /v1/sandboxes` answer. The access token is shown only here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxResponse {
    pub sandbox: Sandbox,
    /// Authenticates this sandbox's data plane (exec, files, envd) as `X-Access-Token`.
    pub access_token: String,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// `POST /v1/sandboxes/{id}/timeout`: the sandbox now ends `timeout_ms` from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeoutRequest {
    pub timeout_ms: u64,
}

/// `POST /v1/sandboxes/{id}/exec`. Give exactly one of `argv` (run directly, no shell) and
/// `shell` (run with `/bin/sh -c`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Added to the sandbox's environment for this command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; `/workspace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User name to run as, passed to the agent; its default user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The command is killed after this long (exit event with `exited: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Bytes written to the command's stdin, which is then closed. Without it stdin is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
}

/// One line of the exec response (`application/x-ndjson`): `start` first, then output, then
/// exactly one `exit`, or an `error` if the stream broke after it began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecEvent {
    Start {
        pid: u32,
    },
    Stdout {
        data_base64: String,
    },
    Stderr {
        data_base64: String,
    },
    Exit {
        /// The exit status; -1 when killed by a signal.
        exit_code: i32,
        /// False when a signal ended the command.
        exited: bool,
        /// `exit status N` or `signal: killed`.
        status: String,
        /// The kernel's OOM killer ended a process of the sandbox while the command ran (the
        /// command itself, or a child of it, reached the memory limit). Only the workload's
        /// processes are ever chosen: the sandbox keeps running.
        #[serde(default)]
        oom_killed: bool,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// A file in the sandbox's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    #[serde(rename = "type")]
    pub kind: FileKind,
    pub size_bytes: u64,
    /// Unix mode bits, including the file type bits as the agent reports them.
    pub mode: u32,
    /// `-rw-r--r--` style.
    pub permissions: String,
    pub owner: String,
    pub group: String,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileList {
    pub entries: Vec<FileEntry>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`: creates parents too; 409 if it exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
}

/// `POST /v1/sandboxes/{id}/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

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
    /// `egress`, `credential`, `approval`, `policy`, `file` or `lifecycle`.
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub name: String,
    pub description: String,
    /// Host directory used as the read-only root; absent for the host's `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
    pub builtin: bool,
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateList {
    pub templates: Vec<Template>,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    pub status: String,
    pub version: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_create_request_defaults_and_rejects_unknown_fields() {
        let request: CreateSandboxRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(request, CreateSandboxRequest::default());
        let err = serde_json::from_str::<CreateSandboxRequest>(r#"{"timeout":3}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `timeout`"), "{err}");
        let err = serde_json::from_str::<Resources>(r#"{"memory":3}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `memory`"), "{err}");
    }

    #[test]
    fn test_exec_events_are_tagged_lines() {
        let exit = ExecEvent::Exit {
            exit_code: 3,
            exited: true,
            status: "exit status 3".into(),
            oom_killed: false,
        };
        let line = serde_json::to_string(&exit).unwrap();
        assert_eq!(
            line,
            r#"{"type":"exit","exit_code":3,"exited":true,"status":"exit status 3","oom_killed":false}"#
        );
        assert_eq!(serde_json::from_str::<ExecEvent>(&line).unwrap(), exit);
        assert!(serde_json::from_str::<ExecEvent>(r#"{"type":"start","pid":1,"x":1}"#).is_err());
    }

    #[test]
    fn test_error_codes_match_their_names_and_statuses() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert!((400..600).contains(&code.http_status()));
        }
        assert_eq!(ErrorCode::Capacity.http_status(), 503);
        assert_eq!(ErrorCode::PayloadTooLarge.http_status(), 413);
    }
}
