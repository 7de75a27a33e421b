//! Pause and resume, snapshots and forks on the native API.

use serde::{Deserialize, Serialize};

use schemars::JsonSchema;

use super::{ErrorBody, MAX_TIMEOUT_MS, Sandbox};
use crate::whole;

/// What a pause keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// The sandbox's cgroup is frozen: every process keeps its memory, descriptors and
    /// sockets, and resume thaws them where they stopped.
    #[default]
    Frozen,
    /// The processes end; the workspace (and `/tmp`'s directory, emptied) stays on disk, and
    /// resume starts the sandbox again with the same id, token, files and metadata. On the
    /// microvm tier the VM is written to disk (memory, vCPU and device state; its disk kept)
    /// and its VMM ends; resume restores it, and the guest's processes go on.
    Filesystem,
}

impl PauseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Frozen => "frozen",
            PauseMode::Filesystem => "filesystem",
        }
    }
}

/// What happens when a sandbox reaches its deadline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// It is destroyed.
    #[default]
    Kill,
    /// It is paused (with `pause_mode`) instead.
    Pause,
}

/// A sandbox's lifecycle, set at create and kept through every pause and resume.
/// `auto_resume` needs `on_timeout: pause` and `pause_mode: frozen`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "if" = {"properties": {"auto_resume": {"const": true}}, "required": ["auto_resume"]},
    "then" = {
        "properties": {"on_timeout": {"const": "pause"}, "pause_mode": {"const": "frozen"}},
        "required": ["on_timeout"]
    }
))]
pub struct Lifecycle {
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// How a pause at the deadline pauses.
    #[serde(default)]
    pub pause_mode: PauseMode,
    /// A data-plane request (exec, files, envd, any port) to the sandbox while it is paused
    /// resumes it first. Only with `on_timeout: pause` and `pause_mode: frozen`.
    #[serde(default)]
    pub auto_resume: bool,
}

impl Lifecycle {
    /// Why the combination cannot be, if it cannot (E2B's SDK refuses the same ones).
    pub fn problem(&self) -> Option<&'static str> {
        if self.auto_resume && self.on_timeout != OnTimeout::Pause {
            return Some("auto_resume needs on_timeout: pause");
        }
        if self.auto_resume && self.pause_mode != PauseMode::Frozen {
            return Some("auto_resume needs pause_mode: frozen");
        }
        None
    }
}

/// `POST /v1/sandboxes/{id}/pause`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    #[serde(default)]
    pub mode: PauseMode,
}

/// `POST /v1/sandboxes/{id}/resume`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// The sandbox lives at least this long from now (its deadline only ever moves later).
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// A name to create sandboxes from it by (`template` on create); the snapshot's id works
    /// too. Lower-case letters, digits, `-` and `_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(r"^[a-z0-9][a-z0-9_-]*$"))]
    pub name: Option<String>,
}

/// A snapshot of a sandbox's filesystem (its `/workspace` and `/tmp`): a template that new
/// sandboxes start from. Processes are not captured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The sandbox it was taken from (which may be gone since).
    pub source_id: String,
    /// The template the source was created from; new sandboxes use its root filesystem.
    pub template: String,
    pub created_at_ms: u64,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// The most sandboxes one fork makes.
pub const MAX_FORKS: u32 = 20;

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes, 1 to 20.
    #[serde(default = "one", deserialize_with = "whole::integer")]
    #[schemars(range(min = 1, max = MAX_FORKS))]
    pub count: u32,
    /// Each fork's lifetime; the daemon's default when absent.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,
}

impl Default for ForkRequest {
    fn default() -> ForkRequest {
        ForkRequest {
            count: 1,
            timeout_ms: None,
        }
    }
}

fn one() -> u32 {
    1
}

/// One fork: its sandbox and access token, or why it could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `POST /v1/sandboxes/{id}/fork` answer: one entry per fork asked for, each independent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkResponse {
    pub forks: Vec<Fork>,
}
