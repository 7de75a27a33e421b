//! The wasm tier's worker: short model-written snippets in an isolate, not a process.
//!
//! JavaScript runs in QuickJS-NG in this process (`rquickjs`); Python runs as CPython 3.12 for
//! WASI on wasmtime 48 (Cranelift, precompiled once per module hash into a `.cwasm` cache).
//! The guest starts with no authority: no syscalls, only what the host links in. Filesystem
//! access is WASI preopens given at the worker's start (the policy's rules), never per request;
//! time is bounded by QuickJS's interrupt handler and wasmtime's epoch interruption; memory by
//! QuickJS's allocator limit and a wasmtime `ResourceLimiter`; output by capped buffers.
//!
//! The worker itself runs inside the process tier's jail (the daemon starts it as the
//! sandbox's one command), so an engine escape lands in a jail with the guest's policy.
//! `serve` answers one JSON request line per connection with one JSON outcome line; before
//! it, the worker may send tool-call lines on the same connection and read their results
//! (`host.rs`), which is how the guest's `tools.NAME(args)` reach the daemon.

mod channel;
mod confine;
mod fetch;
mod guests;
mod host;
mod js;
mod python;
mod wire;

pub use confine::{ConfineError, ENGINE_SYSCALLS, confine, seccomp_rules};
pub use fetch::{Network, proxy_from_env, tls_config};
pub use guests::{GuestError, Guests, PYTHON_WASM_SHA256};
pub use host::{ConnectionHost, Host, NoHost};
pub use js::{JsEngine, Prepared};
pub use python::{Preopen, PythonEngine, PythonError, PythonOptions, precompile};
pub use wire::{EvalError, EvalErrorKind, EvalOutcome, EvalRequest, Language};

/// The most of stdout, and separately of stderr, kept per evaluation.
pub const DEFAULT_OUTPUT_CAP_BYTES: usize = 1 << 20;
/// Memory one evaluation may use unless the worker was started with another limit.
pub const DEFAULT_MEMORY_BYTES: u64 = 256 << 20;
/// An evaluation's timeout unless the request names one.
pub const DEFAULT_TIMEOUT_MS: u64 = airlock_api::v1::DEFAULT_EVAL_TIMEOUT_MS;
/// The longest timeout a request may ask for.
pub const MAX_TIMEOUT_MS: u64 = airlock_api::v1::MAX_EVAL_TIMEOUT_MS;
