//! Tool bindings of the wasm tier: host functions a `wasm-js`/`wasm-python` sandbox's guest
//! calls as `tools.NAME(args)` (JavaScript and Python alike). The operator declares them at
//! create (`CreateSandboxRequest::tools`); the daemon performs every call, so what a tool
//! needs (its URL, its headers and secrets) stays on the host, and each call is an audit
//! record. The worker and the daemon exchange [`ToolCallLine`] and [`ToolResultLine`] on the
//! evaluation's connection, one JSON line each, before the evaluation's answer.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most tools one sandbox may have.
pub const MAX_TOOLS: usize = 64;
/// How long one HTTP tool call may take when its binding names no timeout.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 30_000;

/// One host function the guest may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolBinding {
    /// An HTTP endpoint the operator declares: a call is one request whose JSON body is the
    /// call's argument; the answer's JSON body (else its text) is the call's value.
    Http {
        /// The guest's name for it: `tools.NAME` (letters, digits, `_`; not starting with a
        /// digit).
        #[schemars(extend("pattern" = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"))]
        name: String,
        /// `http://HOST[:PORT]/PATH` (reached by the daemon, not the sandbox).
        #[schemars(extend("pattern" = "^http://"))]
        url: String,
        /// `POST` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        /// Sent with every call and never shown to the guest (an API key belongs here).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        /// Each call waits for an approval (`GET /v1/approvals`); the guest is suspended
        /// until it is answered, or until the policy's approval timeout denies it. Needs
        /// `network: proxy` (the approvals live in the sandbox's egress proxy).
        #[serde(default, skip_serializing_if = "is_false")]
        approval: bool,
        /// 30 000 when absent.
        #[serde(
            default,
            deserialize_with = "crate::whole::optional",
            skip_serializing_if = "Option::is_none"
        )]
        #[schemars(range(min = 1, max = 600_000))]
        timeout_ms: Option<u64>,
    },
    /// A tool of an MCP server (streamable HTTP) that runs in another Airlock sandbox: a call
    /// is MCP's `tools/call` with the call's argument as the tool's arguments, reached
    /// through that sandbox's data plane; its structured content (else its text) is the value.
    Mcp {
        #[schemars(extend("pattern" = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"))]
        name: String,
        /// The sandbox the MCP server runs in (one of this daemon's, checked at create).
        sandbox_id: String,
        /// The server's port inside that sandbox.
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(min = 1, max = 65535))]
        port: u16,
        /// `/mcp` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// The MCP tool's name on that server.
        tool: String,
        #[serde(default, skip_serializing_if = "is_false")]
        approval: bool,
    },
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl ToolBinding {
    pub fn name(&self) -> &str {
        match self {
            ToolBinding::Http { name, .. } | ToolBinding::Mcp { name, .. } => name,
        }
    }

    pub fn needs_approval(&self) -> bool {
        match self {
            ToolBinding::Http { approval, .. } | ToolBinding::Mcp { approval, .. } => *approval,
        }
    }

    /// The binding without what the guest and the API's readers must not see (header values).
    pub fn redacted(&self) -> ToolBinding {
        match self {
            ToolBinding::Http {
                name,
                url,
                method,
                headers,
                approval,
                timeout_ms,
            } => ToolBinding::Http {
                name: name.clone(),
                url: url.clone(),
                method: method.clone(),
                headers: headers
                    .keys()
                    .map(|k| (k.clone(), "[redacted]".to_owned()))
                    .collect(),
                approval: *approval,
                timeout_ms: *timeout_ms,
            },
            other => other.clone(),
        }
    }
}

/// Whether `name` can be a guest-side tool name.
pub fn valid_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 64
}

/// Worker to daemon, during an evaluation: the guest called a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallLine {
    pub tool_call: ToolCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub name: String,
    /// The guest's argument (null when it passed none).
    #[serde(default)]
    pub args: serde_json::Value,
}

/// Daemon to worker: the value of the call, or why it failed (the guest sees an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolResultLine {
    pub tool_result: ToolResult,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolResult {
    Ok { value: serde_json::Value },
    Error { message: String },
}

/// Daemon to worker, instead of an evaluation: forget a context's kept instances (both
/// languages'). The worker answers with an `EvalResponse` without error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropContextLine {
    pub drop_context: String,
}
