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
use crate::whole;

mod audit;
pub use audit::{
    Approval, ApprovalDecision, ApprovalList, AuditRecord, DecideApprovalRequest, Event,
    PolicyApplied, PolicyFinding, SandboxEvents, SandboxLogs,
};
mod computer;
pub use computer::{
    ComputerAction, ComputerResult, MAX_COMPUTER_TEXT_CHARS, MAX_SCROLL_CLICKS, MAX_TYPED_CHARS,
    MouseButton, ScrollDirection,
};
mod eval;
pub use eval::{
    DEFAULT_EVAL_TIMEOUT_MS, EvalError, EvalErrorKind, EvalLanguage, EvalRequest, EvalResponse,
    MAX_EVAL_TIMEOUT_MS, valid_context_id,
};
mod git;
mod tools;
pub use git::{
    GitPushRequest, GitPushResult, GitWorkspace, LspRequest, LspServer, PullRequest,
    PullRequestRequest, REF_PATTERN, REPO_URL_PATTERN,
};
pub use tools::{
    DEFAULT_TOOL_TIMEOUT_MS, DropContextLine, MAX_TOOLS, ToolBinding, ToolCall, ToolCallLine,
    ToolResult, ToolResultLine, valid_tool_name,
};
mod images;
mod persistence;
mod templates;
pub use images::{
    ImageDetails, ImageLayer, ImageList, ImageSummary, ImportResponse, ImportedImage, LayerPhase,
    MAX_REFERENCE_CHARS, PruneResponse, PullEvent, PullImageRequest, RemovedImage,
};
pub use persistence::{
    CreateSnapshotRequest, Fork, ForkRequest, ForkResponse, Lifecycle, MAX_FORKS, OnTimeout,
    PauseMode, PauseRequest, ResumeRequest, Snapshot, SnapshotList,
};
pub use templates::{
    BuildFailure, BuildLogEntry, BuildState, BuildStep, BuildTemplateRequest,
    DEFAULT_READY_TIMEOUT_MS, DEFAULT_TAG, FILES_HASH_PATTERN, LogLevel, MAX_READY_TIMEOUT_MS,
    MAX_STEPS, StepKind, TEMPLATE_NAME_PATTERN, TemplateBuild, TemplateFiles,
};

/// The longest lifetime a sandbox may have: `timeout_ms` above it is refused, and so is a
/// daemon's `--max-timeout` (a daemon may set a lower cap; then longer requests get 422).
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;
/// The smallest limits a create accepts (below them a sandbox cannot start its agent).
pub const MIN_MEMORY_BYTES: u64 = 16 << 20;
pub const MIN_PIDS: u64 = 4;
/// The kernel's largest pid number (`PID_MAX_LIMIT` on 64-bit), and so the largest pid cap.
pub const MAX_PIDS: u64 = 4_194_303;
pub const MIN_DISK_BYTES: u64 = 1 << 20;
pub const MIN_CPU_MILLIS: u32 = 10;
/// The most entries of `metadata` and `env`, and the longest keys and values (in characters).
pub const MAX_METADATA_ENTRIES: usize = 64;
pub const MAX_ENV_ENTRIES: usize = 256;
pub const MAX_METADATA_KEY_CHARS: usize = 256;
pub const MAX_VALUE_CHARS: usize = 32 << 10;

/// A non-empty string without NUL: paths, names.
pub const NON_EMPTY_NO_NUL: &str = r"^[^\u0000]+$";
/// A string without NUL.
pub const NO_NUL: &str = r"^[^\u0000]*$";
/// Canonical standard base64 with padding (what `stdin_base64` must be).
pub const BASE64_PATTERN: &str =
    r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

/// The `tier` of a create request: the tiers this build runs.
fn available_tier(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "The isolation tier. `container` needs an image (`image`, or a template built from one; without, 422); `microvm` needs hardware KVM and a guest the operator configured; where either is missing it (and a policy whose tier needs it) is refused with 422 and the reason.",
        "type": "string",
        "enum": ["process", "container"],
        "default": "process",
    })
}

/// `metadata`: at most 64 labels, keys of 1 to 256 characters.
fn metadata_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Free-form labels, returned as given and usable as list filters: at most 64, keys of 1 to 256 characters, values of at most 32768 characters, no NUL anywhere.",
        "type": "object",
        "maxProperties": MAX_METADATA_ENTRIES,
        "propertyNames": { "minLength": 1, "maxLength": MAX_METADATA_KEY_CHARS, "pattern": NON_EMPTY_NO_NUL },
        "additionalProperties": { "type": "string", "maxLength": MAX_VALUE_CHARS, "pattern": NO_NUL },
    })
}

/// `env`: at most 256 variables, names without `=` or NUL.
fn env_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Environment variables: at most 256, names non-empty without `=` or NUL, values of at most 32768 characters without NUL.",
        "type": "object",
        "maxProperties": MAX_ENV_ENTRIES,
        "propertyNames": { "minLength": 1, "pattern": "^[^=\\u0000]+$" },
        "additionalProperties": { "type": "string", "maxLength": MAX_VALUE_CHARS, "pattern": NO_NUL },
    })
}

impl JsonSchema for Tier {
    fn schema_name() -> Cow<'static, str> {
        "Tier".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "The isolation tier. `process` and `container` run on any host this build supports; `microvm` needs hardware KVM and a guest the operator configured, and is refused with 422 and the reason elsewhere.",
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
    /// 403: the sandbox or the daemon refused the operation (a write the sandbox's Landlock
    /// rules forbid, a host workspace the daemon does not allow).
    PermissionDenied,
    /// 403: the path is on a read-only part of the sandbox's view (outside `/workspace` and
    /// `/tmp`).
    ReadOnly,
    /// 404: no such sandbox, route, template or file.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 409: the request conflicts with the current state (the file exists, the sandbox is
    /// still starting).
    Conflict,
    /// 409: the sandbox is being removed.
    SandboxStopping,
    /// 409: the sandbox is paused (resume it first, or create it with `lifecycle.auto_resume`).
    SandboxPaused,
    /// 413: the body is larger than the configured cap.
    PayloadTooLarge,
    /// 413: the file would pass the sandbox's file-size limit (`resources.disk_bytes`).
    FileTooLarge,
    /// 422: well-formed but not possible (unknown template, bad limits, an invalid policy).
    Unprocessable,
    /// 500: a bug or a host failure; the message says which.
    Internal,
    /// 502: the sandbox's agent did not answer or answered nonsense.
    AgentError,
    /// 503: the daemon is at its cap on concurrent sandboxes (`Retry-After` says when to try
    /// again).
    Capacity,
    /// 504: the command's own `timeout_ms` expired.
    Timeout,
    /// 507: the sandbox's disk is full (its `/tmp` or `/workspace` reached its size or quota).
    InsufficientStorage,
    /// 502: the daemon's forge (`--forge-api`) failed or refused a call.
    ForgeError,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::ReadOnly,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::SandboxStopping,
        ErrorCode::SandboxPaused,
        ErrorCode::PayloadTooLarge,
        ErrorCode::FileTooLarge,
        ErrorCode::Unprocessable,
        ErrorCode::Internal,
        ErrorCode::AgentError,
        ErrorCode::Capacity,
        ErrorCode::Timeout,
        ErrorCode::InsufficientStorage,
        ErrorCode::ForgeError,
    ];

    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied | ErrorCode::ReadOnly => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Conflict | ErrorCode::SandboxStopping | ErrorCode::SandboxPaused => 409,
            ErrorCode::PayloadTooLarge | ErrorCode::FileTooLarge => 413,
            ErrorCode::Unprocessable => 422,
            ErrorCode::Internal => 500,
            ErrorCode::AgentError | ErrorCode::ForgeError => 502,
            ErrorCode::Capacity => 503,
            ErrorCode::Timeout => 504,
            ErrorCode::InsufficientStorage => 507,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::ReadOnly => "read_only",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::SandboxStopping => "sandbox_stopping",
            ErrorCode::SandboxPaused => "sandbox_paused",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::FileTooLarge => "file_too_large",
            ErrorCode::Unprocessable => "unprocessable",
            ErrorCode::Internal => "internal",
            ErrorCode::AgentError => "agent_error",
            ErrorCode::Capacity => "capacity",
            ErrorCode::Timeout => "timeout",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::ForgeError => "forge_error",
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
    /// At least 16 MiB.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = MIN_MEMORY_BYTES, max = u64::MAX))]
    pub memory_bytes: Option<u64>,
    /// From 4 to 4194303.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = MIN_PIDS, max = MAX_PIDS))]
    pub pids_max: Option<u64>,
    /// Thousandths of a CPU (1500 = 1.5 CPUs), at least 10.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = MIN_CPU_MILLIS, max = u32::MAX))]
    pub cpu_millis: Option<u32>,
    /// The scratch space that `/tmp` and a fresh `/workspace` share, which is also the largest
    /// file the workload may write; at least 1 MiB. On disk (airlockd's default) it is a budget
    /// of its own; in memory it is at most half of `memory_bytes`.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = MIN_DISK_BYTES, max = u64::MAX))]
    pub disk_bytes: Option<u64>,
}

/// Where `/workspace` comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Workspace {
    /// A fresh, private tmpfs that disappears with the sandbox.
    #[default]
    Fresh,
    /// An absolute host directory, bound read-write. Allowed only beneath the daemon's
    /// `--workspace-root`: without it, or outside it, the create is refused with 403
    /// `permission_denied`; a path that is not a directory is 422.
    Host {
        #[schemars(extend("pattern" = "^/"))]
        path: String,
    },
    /// A clone of a git repository on a branch of its own, in a fresh workspace; its
    /// clone goes through the sandbox's egress proxy (see GitWorkspace).
    Git { git: GitWorkspace },
}

/// [`Workspace`] as it is read: `fresh` is a struct variant here, so that members beside the
/// tag are refused as for `host` (serde ignores them next to a unit variant's tag).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum WorkspaceWire {
    Fresh {},
    Host {
        path: String,
    },
    Git {
        #[serde(deserialize_with = "whole::object")]
        git: GitWorkspace,
    },
}

impl<'de> Deserialize<'de> for Workspace {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Workspace, D::Error> {
        Ok(match WorkspaceWire::deserialize(deserializer)? {
            WorkspaceWire::Fresh {} => Workspace::Fresh,
            WorkspaceWire::Host { path } => Workspace::Host { path },
            WorkspaceWire::Git { git } => Workspace::Git { git },
        })
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "not" = {"required": ["image", "template"], "properties": {"image": {"type": "string"}, "template": {"type": "string"}}},
    "if" = {"required": ["tier"], "properties": {"tier": {"const": "container"}}},
    "then" = {"anyOf": [{"required": ["image"], "properties": {"image": {"type": "string"}}}, {"required": ["template"], "properties": {"template": {"type": "string"}}}]}
))]
pub struct CreateSandboxRequest {
    #[serde(default)]
    #[schemars(schema_with = "available_tier")]
    pub tier: Tier,
    /// A template (`GET /v1/templates`) by `NAME:TAG`, `NAME` (its `latest` tag, else its
    /// newest), or a snapshot's id or name; default `base`, the host's root read-only (or the
    /// daemon's `--base-image`). An unknown one is 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = NON_EMPTY_NO_NUL))]
    pub template: Option<String>,
    /// An image of the daemon's store (`GET /v1/images`: a name or a digest): the sandbox runs
    /// on the container tier with the image as its whole filesystem, its env, working
    /// directory and user applied. Not with `template`. An unknown one is 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = images::MAX_REFERENCE_CHARS), extend("pattern" = NON_EMPTY_NO_NUL))]
    pub image: Option<String>,
    #[serde(default, deserialize_with = "whole::object")]
    pub resources: Resources,
    /// Lifetime from now, from 1 ms to 24 h (a daemon's `--max-timeout` may cap it lower:
    /// then longer is 422); the daemon's default when absent. The sandbox is destroyed then.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,
    /// Environment added to every command run in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "env_map")]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given and usable as list filters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "metadata_map")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "whole::object")]
    pub workspace: Workspace,
    /// A policy document (the YAML format's JSON form, `api/policy.schema.json`). Its
    /// resources, user and timeout apply where the request leaves them out; the sandbox runs
    /// on at least its tier.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "whole::policy"
    )]
    pub policy: Option<Box<crate::policy::PolicyDocument>>,
    /// What happens at the deadline, and whether a paused sandbox resumes on use.
    #[serde(
        default,
        skip_serializing_if = "is_default_lifecycle",
        deserialize_with = "whole::object"
    )]
    pub lifecycle: Lifecycle,
    /// Wasm templates only: host functions the guest calls as `tools.NAME(args)`, performed
    /// by the daemon (at most 64, names unique). Header values are never shown again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_TOOLS))]
    pub tools: Vec<ToolBinding>,
}

fn is_default_lifecycle(lifecycle: &Lifecycle) -> bool {
    *lifecycle == Lifecycle::default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being started; not yet usable.
    Creating,
    /// Its agent answers; exec and files work.
    Running,
    /// Paused (`pause_mode` says how): its timeout clock stands still until it resumes.
    Paused,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
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
    /// The image (digest) of a container-tier sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The limits in force.
    pub resources: Resources,
    pub workspace: Workspace,
    pub metadata: BTreeMap<String, String>,
    /// Unix time in milliseconds.
    pub created_at_ms: u64,
    /// When the sandbox will be destroyed, or paused under `lifecycle.on_timeout: pause`
    /// (Unix time in milliseconds). While it is paused, the time it had left is kept, and
    /// this moves with the clock. 0 for a warm pool's member, which lives until it is claimed.
    pub expires_at_ms: u64,
    /// How it is paused, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<PauseMode>,
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// A warm pool's member, not yet claimed (listed only with `?include=pool`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pool: bool,
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
    /// From 1 ms to 24 h (or the daemon's lower `--max-timeout`; then longer is 422).
    #[serde(deserialize_with = "whole::integer")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: u64,
}

/// `POST /v1/sandboxes/{id}/exec`. Give exactly one of `argv` (run directly, no shell) and
/// `shell` (run with `/bin/sh -c`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [
    {"required": ["argv"], "properties": {"argv": {"type": "array"}, "shell": {"type": "null"}}},
    {"required": ["shell"], "properties": {"shell": {"type": "string"}, "argv": {"type": "null"}}},
]))]
pub struct ExecRequest {
    /// The program (non-empty) and its arguments, without NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1),
        inner(regex(pattern = NO_NUL)),
        extend("prefixItems" = [{"type": "string", "pattern": NON_EMPTY_NO_NUL}])
    )]
    pub argv: Option<Vec<String>>,
    /// A command line for `/bin/sh -c`, without NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = NO_NUL))]
    pub shell: Option<String>,
    /// Added to the sandbox's environment for this command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "env_map")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; `/workspace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = NON_EMPTY_NO_NUL))]
    pub cwd: Option<String>,
    /// User name to run as, passed to the agent; its default user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = NON_EMPTY_NO_NUL))]
    pub user: Option<String>,
    /// The command is killed after this long (exit event with `exited: false`); 0 or absent
    /// means no limit.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = u64::MAX))]
    pub timeout_ms: Option<u64>,
    /// Bytes written to the command's stdin, which is then closed. Without it stdin is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = BASE64_PATTERN))]
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
    #[schemars(regex(pattern = NON_EMPTY_NO_NUL))]
    pub path: String,
}

/// `POST /v1/sandboxes/{id}/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    #[schemars(regex(pattern = NON_EMPTY_NO_NUL))]
    pub source: String,
    #[schemars(regex(pattern = NON_EMPTY_NO_NUL))]
    pub destination: String,
}

/// A template: the built-in `base`, or an image built from steps plus sandbox defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// `base`, or `NAME:TAG`.
    pub name: String,
    pub description: String,
    /// Host directory used as the read-only root; absent for the host's `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
    pub builtin: bool,
    /// The image (digest) its sandboxes run on, on the container tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The build that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_timeout_ms: Option<u64>,
    /// Default limits of its sandboxes.
    #[serde(default)]
    pub resources: Resources,
    /// Default policy of its sandboxes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "whole::policy"
    )]
    pub policy: Option<Box<crate::policy::PolicyDocument>>,
    /// Unix time in milliseconds (0 for the built-in one).
    #[serde(default)]
    pub updated_at_ms: u64,
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateList {
    pub templates: Vec<Template>,
}

/// The most sandboxes one template's warm pool may hold.
pub const MAX_POOL_SIZE: u32 = 1000;

/// `PUT /v1/templates/{name}/pool`: keep `size` sandboxes of the template started and ready;
/// 0 removes the pool. A create for the template that asks for nothing else (no policy,
/// resources or workspace of its own) is served from it. `name` may be a microvm snapshot's
/// name or id: its members are pre-created VM shells, restored by the fork that claims one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolRequest {
    /// How many started sandboxes to keep ready, 0 to 1000 (and at most the daemon's
    /// `--max-sandboxes`).
    #[serde(deserialize_with = "whole::integer")]
    #[schemars(range(min = 0, max = MAX_POOL_SIZE))]
    pub size: u32,
}

/// `GET` and `PUT /v1/templates/{name}/pool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolStatus {
    pub template: String,
    /// The size the pool is kept at.
    pub size: u32,
    /// Started sandboxes waiting to be claimed.
    pub ready: u32,
    /// Sandboxes being started to refill it.
    pub starting: u32,
    /// Creates served from the pool since the daemon started.
    pub claims_total: u64,
    /// Why the last fill failed, while fills fail (they are retried with a growing delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
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
        assert_eq!(ErrorCode::InsufficientStorage.http_status(), 507);
        assert_eq!(ErrorCode::SandboxStopping.http_status(), 409);
    }
}
