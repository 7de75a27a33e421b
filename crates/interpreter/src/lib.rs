//! `airlock-interpreter`: E2B's code interpreter (the HTTP protocol of port 49999) inside a
//! sandbox, over real Jupyter kernels driven through ZeroMQ. No Jupyter server and no Python
//! web stack: per context the service spawns the kernel its kernelspec names (ipykernel for
//! python) and speaks the Jupyter messaging protocol to it on loopback.
//!
//! It runs as `airlock-agent interpreter` (the agent's binary is in every sandbox, on every
//! tier, at `/run/airlock/agent`), started by a template's start command through the agent,
//! so it and its kernels live under the sandbox's own limits. See ARCHITECTURE.md.
//!
//! - [`wire`]: the request bodies and the NDJSON lines of `POST /execute`.
//! - [`languages`]: E2B's language names, kernelspec lookup, `env_vars` snippets.
//! - [`kernel`]: one kernel process and its channels.
//! - [`context`]: contexts, default contexts, one execution at a time, restart and remove.
//! - [`execute`]: one execution's messages as lines; interrupt on disconnect; keepalives.
//! - [`http`]: the routes and E2B's status codes.
//! - [`cli`]: `airlock-agent interpreter [--listen ADDR] | --ready [ADDR]`.

pub mod cli;
pub mod context;
pub mod execute;
pub mod http;
pub mod kernel;
pub mod languages;
pub mod wire;

pub use kernel::Kernel;

/// E2B's port for the code interpreter.
pub const PORT: u16 = 49999;

/// The IPython startup file the python kernels run (formatters, colours, the user site).
pub const IPYTHON_STARTUP: &str = include_str!("ipython_startup.py");
