//! The worker's request and outcome lines (also the daemon's `eval` answer).

use serde::{Deserialize, Serialize};

/// Which engine runs the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// QuickJS-NG (ES2023), in process.
    Javascript,
    /// CPython 3.12 for WASI, on wasmtime.
    Python,
}

/// One snippet to evaluate in a fresh isolate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalRequest {
    pub language: Language,
    pub code: String,
    /// Wall-clock budget; the worker's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// What an evaluation gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalOutcome {
    /// The value of the snippet's last expression as JSON, if it had one and no error.
    pub result: Option<serde_json::Value>,
    pub stdout: String,
    pub stderr: String,
    /// Why the snippet did not finish normally.
    pub error: Option<EvalError>,
    /// Wall time of the evaluation inside the worker, from request to result.
    pub duration_us: u64,
}

/// A failed evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalError {
    pub kind: EvalErrorKind,
    pub message: String,
}

/// The class of a failed evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The request itself was refused (bad JSON, unknown language, timeout out of range).
    Invalid,
    /// The engine failed (no guest module, a trap of the engine).
    Engine,
}

impl EvalOutcome {
    /// A finished evaluation (output is filled in by the engine).
    pub fn ok(result: Option<serde_json::Value>) -> EvalOutcome {
        EvalOutcome {
            result,
            stdout: String::new(),
            stderr: String::new(),
            error: None,
            duration_us: 0,
        }
    }

    /// An outcome with only an error.
    pub fn failed(kind: EvalErrorKind, message: impl Into<String>) -> EvalOutcome {
        EvalOutcome {
            result: None,
            stdout: String::new(),
            stderr: String::new(),
            error: Some(EvalError {
                kind,
                message: message.into(),
            }),
            duration_us: 0,
        }
    }
}
