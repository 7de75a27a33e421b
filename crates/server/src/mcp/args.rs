//! The tools' arguments: one struct each, whose JSON Schema is the tool's input schema.
//! Unknown fields are refused (a misspelt argument is a tool error, not silently dropped).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// The template: `base` (the default) or `code-interpreter-v1` (for run_code).
    pub template: Option<String>,
    /// Seconds until the sandbox is killed (the daemon's default when absent).
    pub timeout_s: Option<u64>,
    /// Environment variables of every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels to find the sandbox by.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Memory limit in MiB.
    pub memory_mib: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only sandboxes in this state: creating, running or paused.
    pub state: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutArgs {
    pub sandbox_id: String,
    /// Seconds from now until the sandbox is killed.
    pub timeout_s: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// A code-interpreter sandbox; absent: a fresh one for this call, killed after it.
    pub sandbox_id: Option<String>,
    /// The code (Jupyter syntax: the last expression is the result, `!cmd` and `%magic` work).
    pub code: String,
    /// python (default), javascript, typescript, bash, r or java: the sandbox's kernel for it.
    pub language: Option<String>,
    /// A context made earlier (E2B's `create_code_context`) instead of a language's default.
    pub context_id: Option<String>,
    /// Environment variables for this execution only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The execution is interrupted after this many seconds (default 300).
    pub timeout_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    pub sandbox_id: String,
    /// A command line for `/bin/sh -c`.
    pub command: String,
    /// Working directory (default /workspace).
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text given to the command on its standard input.
    pub stdin: Option<String>,
    /// The command is killed after this many seconds.
    pub timeout_s: Option<u64>,
    /// Start it and answer with its pid at once; its output goes to `process_output`.
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessArgs {
    pub sandbox_id: String,
    /// The pid `run_command` with `background` answered.
    pub pid: u32,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Utf8,
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    pub sandbox_id: String,
    /// An absolute path in the sandbox.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    pub sandbox_id: String,
    pub path: String,
    /// utf8 (default; invalid bytes are replaced) or base64.
    pub encoding: Option<Encoding>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    pub sandbox_id: String,
    /// Created or replaced, with its parent directories.
    pub path: String,
    pub content: String,
    /// How `content` is encoded: utf8 (default) or base64.
    pub encoding: Option<Encoding>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    pub sandbox_id: String,
    pub path: String,
    /// Text to find; it must occur exactly once unless `replace_all`.
    pub old: String,
    pub new: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    pub sandbox_id: String,
    pub path: String,
    /// How many levels down (default 1).
    pub depth: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveArgs {
    pub sandbox_id: String,
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    pub sandbox_id: String,
    /// The directory searched, recursively.
    pub path: String,
    /// A glob on file names (`*.py`).
    pub name_glob: Option<String>,
    /// A regular expression (grep -E) on file contents.
    pub content_regex: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UrlArgs {
    pub sandbox_id: String,
    /// A port a server in the sandbox listens on (its loopback).
    pub port: u16,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalArgs {
    /// A wasm-tier sandbox (template wasm-js or wasm-python); without it a fresh one is made
    /// for this call and removed after it.
    pub sandbox_id: Option<String>,
    /// `javascript` (QuickJS) or `python` (CPython 3.12 for WASI).
    pub language: airlock_api::v1::EvalLanguage,
    /// The snippet; its last expression (Python) or completion value (JavaScript) is the result.
    pub code: String,
    /// Wall-clock budget in milliseconds (10 000 when absent).
    pub timeout_ms: Option<u64>,
}

/// The `computer` tool's arguments: an action and the fields it takes, as computer-use models
/// call such a tool (`POST /v1/sandboxes/{id}/computer` checks them).
#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ComputerArgs {
    /// The sandbox's id (a `desktop` template sandbox).
    #[serde(skip_serializing)]
    pub sandbox_id: String,
    /// screenshot, click, double_click, move, drag, scroll, type, key, cursor_position,
    /// screen_size, clipboard_get or clipboard_set.
    pub action: String,
    /// The point of click, double_click, move and (optionally) scroll, in screen pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_px: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub y_px: Option<u32>,
    /// click: left (default), middle or right.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub button: Option<String>,
    /// drag: from this point to the `to_` one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_x_px: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_y_px: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_x_px: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_y_px: Option<u32>,
    /// scroll: up, down, left or right, by `clicks` notches (1 to 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clicks: Option<u32>,
    /// type and clipboard_set: the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// key: a key or chord, as `Return`, `ctrl+a`, `page_down`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<String>,
}
