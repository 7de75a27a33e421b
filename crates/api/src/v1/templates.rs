//! Templates on the native API: builds from steps (`/v1/templates`, `/v1/builds`), their
//! file contexts (`/v1/template-files`) and what a template gives the sandboxes made from it.
//!
//! The steps are E2B's (`type`, `args`, `force`, a files hash for `COPY`), so that both APIs
//! feed one build engine; `airlock template build` turns a Dockerfile into them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{NON_EMPTY_NO_NUL, Resources};
use crate::whole;

/// `NAME[:TAG]`: a name of lower-case letters, digits, `.`, `_` and `-` (starting with a
/// letter or digit), and an optional tag of letters, digits, `.`, `_` and `-`.
pub const TEMPLATE_NAME_PATTERN: &str = r"^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$";
/// The tag of a template built without one.
pub const DEFAULT_TAG: &str = "latest";
/// A files hash: lower-case hex SHA-256.
pub const FILES_HASH_PATTERN: &str = "^[0-9a-f]{64}$";
/// The most steps one build takes.
pub const MAX_STEPS: usize = 500;
/// How long create waits for a template's ready check when it names no bound.
pub const DEFAULT_READY_TIMEOUT_MS: u64 = 60_000;
/// The longest a ready check may be waited for.
pub const MAX_READY_TIMEOUT_MS: u64 = 10 * 60_000;

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum StepKind {
    /// `args[0]`: a command for `/bin/sh -c`, run in a container-tier sandbox over the layers
    /// so far, as the current user or `args[1]`; what it changes is the step's layer.
    Run,
    /// `args`: source (relative to the uploaded context, globs allowed), destination
    /// (relative to the working directory), owner (`user[:group]`; empty: the current user),
    /// mode (four octal digits; empty: kept). Needs `files_hash`.
    Copy,
    /// `args`: name, value, name, value, ... (kept in the image's environment).
    Env,
    /// `args[0]`: the working directory, made if missing.
    Workdir,
    /// `args[0]`: `name[:group]` or `uid[:gid]`, which must be in the image's files.
    User,
}

/// One build step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildStep {
    #[serde(rename = "type")]
    pub kind: StepKind,
    pub args: Vec<String>,
    /// Ignore the build cache from this step on.
    #[serde(default)]
    pub force: bool,
    /// `COPY` only: the hash of its uploaded files (`PUT /v1/template-files/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = FILES_HASH_PATTERN))]
    pub files_hash: Option<String>,
}

/// `POST /v1/templates`: build a template. Give at most one of `from_image` (a store
/// reference, pulled when missing) and `from_template`; with neither the build starts from
/// an empty root. A step the engine cannot run fails the build at that step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("not" = {"required": ["from_image", "from_template"], "properties": {"from_image": {"type": "string"}, "from_template": {"type": "string"}}}))]
pub struct BuildTemplateRequest {
    /// `NAME[:TAG]`; the tag is `latest` when left out.
    #[schemars(regex(pattern = TEMPLATE_NAME_PATTERN))]
    pub name: String,
    /// More tags for the same build (`NAME:TAG` for each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(regex(pattern = r"^[A-Za-z0-9._-]{1,128}$")))]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = NON_EMPTY_NO_NUL))]
    pub from_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = TEMPLATE_NAME_PATTERN))]
    pub from_template: Option<String>,
    #[serde(default)]
    #[schemars(length(max = MAX_STEPS))]
    pub steps: Vec<BuildStep>,
    /// A shell command started in every sandbox made from the template (at each create and
    /// each resume after a filesystem-only pause), as its user in its working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = NON_EMPTY_NO_NUL))]
    pub start_cmd: Option<String>,
    /// A shell command that create runs until it exits 0 before it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = NON_EMPTY_NO_NUL))]
    pub ready_cmd: Option<String>,
    /// How long create waits for the ready check (default 60 s, at most 10 min).
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = MAX_READY_TIMEOUT_MS))]
    pub ready_timeout_ms: Option<u64>,
    /// Ignore the build cache for every step.
    #[serde(default)]
    pub force: bool,
    /// The sandboxes' default limits (a create's own win).
    #[serde(default, deserialize_with = "whole::object")]
    pub resources: Resources,
    /// What each `RUN` may reach: a policy document whose `network` section applies (default:
    /// no network at all; `network: {mode: proxy}` with egress rules allows, for example, the
    /// operator's package mirrors through the egress proxy).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::policy"
    )]
    pub build_policy: Option<Box<crate::policy::PolicyDocument>>,
    /// The sandboxes' default policy (a create's own wins).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::policy"
    )]
    pub policy: Option<Box<crate::policy::PolicyDocument>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub description: Option<String>,
}

/// Where a build stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BuildState {
    /// Accepted, not started (E2B: waiting for its files).
    Waiting,
    Building,
    /// The template exists.
    Ready,
    /// It failed; `reason` says where.
    Error,
}

impl BuildState {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildState::Waiting => "waiting",
            BuildState::Building => "building",
            BuildState::Ready => "ready",
            BuildState::Error => "error",
        }
    }

    pub fn finished(self) -> bool {
        matches!(self, BuildState::Ready | BuildState::Error)
    }
}

/// Why a build failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildFailure {
    pub message: String,
    /// `base` (the FROM), `1`..`N` (the steps, counted from 1) or `finalize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// A build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateBuild {
    /// A UUID.
    pub id: String,
    /// `NAME:TAG`.
    pub template: String,
    pub state: BuildState,
    /// Steps (the FROM counts as one) done so far, and how many of them the cache answered.
    pub steps_done: u64,
    pub steps_cached: u64,
    pub steps_total: u64,
    /// The built image's digest, once ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildFailure>,
    pub created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// One line of a build's log (`GET /v1/builds/{id}/logs`, NDJSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildLogEntry {
    /// Its position in the log, from 0: ask again with `offset` one past the last seen.
    pub offset: u64,
    /// Unix time in milliseconds.
    pub at_ms: u64,
    pub level: LogLevel,
    /// The step it belongs to, as in [`BuildFailure::step`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub message: String,
}

/// `GET /v1/template-files/{id}` and the answer to its `PUT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateFiles {
    pub hash: String,
    pub size_bytes: u64,
}
