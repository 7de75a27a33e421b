//! `POST /v1/sandboxes/{id}/eval` on the wasm tier (templates `wasm-js` and `wasm-python`):
//! one snippet in a fresh isolate. The wasm worker (`crates/wasm`) reads and answers the same
//! bodies, one JSON line each.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::whole;

/// The longest timeout an evaluation may ask for.
pub const MAX_EVAL_TIMEOUT_MS: u64 = 600_000;
/// An evaluation's timeout when the request names none.
pub const DEFAULT_EVAL_TIMEOUT_MS: u64 = 10_000;

/// Which engine runs the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EvalLanguage {
    /// QuickJS-NG (ES2023).
    Javascript,
    /// CPython 3.12 for WASI.
    Python,
}

/// One snippet to evaluate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalRequest {
    pub language: EvalLanguage,
    /// The source; a trailing expression (Python) or the completion value (JavaScript) is the
    /// result.
    pub code: String,
    /// Wall-clock budget of the evaluation; 10 000 when absent.
    #[serde(
        default,
        deserialize_with = "whole::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = MAX_EVAL_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,
    /// Run in the kept instance of this context (made by its first use) instead of a fresh
    /// one: what the context's earlier evaluations defined is still there, as in a notebook.
    /// A timeout ends a Python context's instance, and its state with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), extend("pattern" = "^[A-Za-z0-9_.-]+$"))]
    pub context_id: Option<String>,
}

/// Whether `id` can name an evaluation context.
pub fn valid_context_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// What an evaluation gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalResponse {
    /// The result as JSON (values without a JSON form become their `repr` in Python, and are
    /// absent in JavaScript); null on error.
    pub result: Option<serde_json::Value>,
    pub stdout: String,
    pub stderr: String,
    /// Why the snippet did not finish normally; null when it did.
    pub error: Option<EvalError>,
    /// The evaluation's wall time inside the worker, request to result.
    pub duration_us: u64,
}

/// A failed evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalError {
    pub kind: EvalErrorKind,
    pub message: String,
}

/// The class of a failed evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalErrorKind {
    /// The code threw or raised (a syntax error included).
    Exception,
    /// The timeout passed; the isolate was interrupted.
    Timeout,
    /// The memory limit refused an allocation.
    MemoryLimit,
    /// stdout or stderr went past the output cap.
    OutputLimit,
    /// The guest exited with a non-zero status (Python's `sys.exit(n)`).
    Exit,
    /// The request was refused (bad JSON, a language this sandbox has no engine for).
    Invalid,
    /// The engine failed.
    Engine,
}

impl EvalResponse {
    /// A finished evaluation; the engine fills in its output.
    pub fn ok(result: Option<serde_json::Value>) -> EvalResponse {
        EvalResponse {
            result,
            stdout: String::new(),
            stderr: String::new(),
            error: None,
            duration_us: 0,
        }
    }

    /// An evaluation with only an error.
    pub fn failed(kind: EvalErrorKind, message: impl Into<String>) -> EvalResponse {
        EvalResponse {
            error: Some(EvalError {
                kind,
                message: message.into(),
            }),
            ..EvalResponse::ok(None)
        }
    }
}
