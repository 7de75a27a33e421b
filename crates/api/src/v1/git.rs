//! Repository workspaces, pushes, pull requests and language servers on the native API.

use serde::{Deserialize, Serialize};

use schemars::JsonSchema;

/// A smart-HTTP repository URL: `https://` or `http://`, a host, a path of plain segments, no
/// credentials, query or fragment.
pub const REPO_URL_PATTERN: &str = r"^https?://[^/@?#\s]+/[A-Za-z0-9._~+/-]+$";
/// A branch or ref name as git accepts it (checked further by the daemon).
pub const REF_PATTERN: &str = r"^[^-\s~^:?*\[\\][^\s~^:?*\[\\]*$";

/// `workspace: {"type": "git", "git": {...}}`: `/workspace` starts as a clone of `url` at
/// `ref`, on the new branch `branch`. The clone goes through the sandbox's egress proxy; the
/// sandbox's policy gains the repository's rule (fetch, and pushes to `branch` only) and, for
/// the host of the daemon's forge, the forge token as a credential the sandbox never sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitWorkspace {
    #[schemars(extend("pattern" = REPO_URL_PATTERN))]
    pub url: String,
    /// A branch, tag or commit id to start from; the repository's default branch when absent.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = REF_PATTERN))]
    pub reference: Option<String>,
    /// The sandbox's branch, created from `ref`; `airlock/<sandbox id>` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = REF_PATTERN))]
    pub branch: Option<String>,
}

/// `POST /v1/sandboxes/{id}/git/push`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitPushRequest {
    /// Replace the remote branch even when it is not an ancestor (`--force-with-lease`).
    #[serde(default)]
    pub force: bool,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GitPushResult {
    /// The sandbox's branch, now on the remote.
    pub branch: String,
    /// The commit the remote branch points at.
    pub commit: String,
    /// The repository URL.
    pub url: String,
}

/// `POST /v1/sandboxes/{id}/git/pull-request`: push the sandbox's branch, then open a pull
/// request from it on the daemon's forge (`--forge-api`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequestRequest {
    #[schemars(length(min = 1, max = 1024), extend("pattern" = crate::v1::NON_EMPTY_NO_NUL))]
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536), extend("pattern" = crate::v1::NO_NUL))]
    pub body: Option<String>,
    /// The branch to merge into; the branch the workspace started from when absent (the
    /// repository's default branch if it started from a tag or commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = REF_PATTERN))]
    pub base: Option<String>,
}

/// An opened pull request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// The pull request's page (the forge's `html_url`).
    pub url: String,
    pub number: u64,
    pub head: String,
    pub base: String,
    pub push: GitPushResult,
}

/// `POST /v1/sandboxes/{id}/lsp`: a language server the sandbox has, started on the stdio of
/// a process inside it and served as JSON-RPC over a WebSocket (one message per text frame).
/// Exactly one of `language` and `argv`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [
    {"required": ["language"], "properties": {"language": {"type": "string"}}},
    {"required": ["argv"], "properties": {"argv": {"type": "array"}}},
]))]
pub struct LspRequest {
    /// `python` (pylsp), `rust` (rust-analyzer), `typescript` or `javascript`
    /// (typescript-language-server --stdio), `go` (gopls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["python", "rust", "typescript", "javascript", "go"]))]
    pub language: Option<String>,
    /// The server's command line, for a server not in that list: 1 to 64 non-empty
    /// arguments without NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1), regex(pattern = crate::v1::NON_EMPTY_NO_NUL)))]
    pub argv: Option<Vec<String>>,
    /// The project's directory inside the sandbox (the server's working directory);
    /// `/workspace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = r"^/[^\u0000]*$"))]
    pub root: Option<String>,
}

/// A started language server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LspServer {
    pub id: String,
    pub argv: Vec<String>,
    pub root: String,
    /// The process inside the sandbox.
    pub pid: u32,
    /// Open a WebSocket here (same credentials as the create's data plane) to speak to it;
    /// one client at a time. The server ends when its WebSocket closes, or after 60 s
    /// without one.
    pub websocket_path: String,
}
