//! `airlockd`, the Airlock daemon: long-lived sandboxes behind an HTTP API (`/v1`).
//!
//! # Layout
//!
//! - [`config`]: flags (`ServeArgs`, shared with `airlock serve`), defaults, the state directory.
//! - [`store`]: one SQLite file (`<state>/airlock.db`, WAL): sandboxes, templates, hashed API
//!   keys, events; versioned with `PRAGMA user_version`. The event log is trimmed while the
//!   daemon runs: `--events-retention` (168 h) and `--events-max` (100 000 rows), oldest first.
//! - [`auth`]: API keys (`X-API-Key`) and per-sandbox access tokens (`X-Access-Token`), both
//!   stored as SHA-256; ids. [`keys_cmd`]: `keys create|ls|revoke` on the store directly.
//! - [`lifecycle`]: create, timeout, delete, watch, and the reconciliation after a restart
//!   (its module docs give the crash-safety argument).
//! - `routes`: the route table (also the source of the OpenAPI paths) and the handlers;
//!   [`proxy`]: the streaming reverse proxy to a sandbox's agent; [`agent`]: the Connect client
//!   for the agent's Unix socket.
//! - [`openapi`]: generates `api/openapi.json`; [`client`]: the typed async client;
//!   [`fuzzing`]: the invariants of request handling that the fuzzers check.
//! - [`e2b`]: the E2B-compatible API on the same port (control plane, data plane, the routing
//!   between them and `/v1`); its module docs give the routing rules. [`tls`]: TLS on the
//!   same listener for host-routed traffic (an operator's certificate or a local CA).
//! - [`mcp`]: MCP tools for sandboxes (rmcp), over stdio for `airlock mcp` and over streamable
//!   HTTP at `/mcp` (API key auth); the tools call `/v1` and the data plane as a client.
//! - [`egress`]: `network: proxy` sandboxes' egress proxies (hot reload, approvals);
//!   [`audit`]: the audit logs and the events API.
//! - [`templates`]: the template build engine (steps from the native API and from E2B's
//!   `Template.build`), file contexts, and the image store's routes' logic; the daemon's
//!   image store is `<state>/images`.
//! - [`judge0`]: the Judge0 CE 1.13.1-compatible API on a listener of its own
//!   (`--judge0-listen`); its module docs give its decisions.
//!
//! # Decisions
//!
//! - **Defaults.** Listens on `127.0.0.1:3000`. State in `/var/lib/airlock` (root), else
//!   `$XDG_STATE_HOME/airlock` or `~/.local/state/airlock`; per-sandbox directories are
//!   `<state>/sandboxes/<id>` (0700) and hold the agent's socket and log. The state directory
//!   is masked from every sandbox (`Runtime::set_state_dirs`). One daemon per state
//!   directory (an exclusive lock on `airlockd.lock`).
//! - **Errors.** Every error is `{"code", "message"}` with a stable code
//!   ([`airlock_api::v1::ErrorCode`]): malformed input 400, bad credentials 401, refusals 403
//!   (`read_only` paths, `permission_denied` by Landlock, a mask or `--workspace-root`),
//!   unknown sandbox/route/template/file/program 404, state conflicts 409 (file exists, a
//!   directory where a file is wanted, sandbox still creating, `sandbox_stopping` while it is
//!   removed), body caps 413 (and `file_too_large` past the sandbox's file-size limit),
//!   well-formed but impossible requests 422 (unavailable tier with the probe's reason, an
//!   invalid policy, a timeout above `--max-timeout`), capacity 503 with `Retry-After`, a full
//!   disk 507. File errors are mapped by the errno the agent names (`airlock-errno`), so
//!   `agent_error` (502) is only an agent that failed. `api/openapi.json` states what the
//!   handlers enforce (minimums, patterns, enums); `scripts/schemathesis.sh` checks it.
//! - **Auth.** Control-plane routes need an API key; data-plane routes (exec, files, envd)
//!   accept an API key or that sandbox's access token, shown once at create.
//!   `--insecure-no-auth` is refused unless the listen address is loopback.
//! - **Limits.** `--max-sandboxes` (1024) → 503 `capacity`; `--max-body-bytes` (1 MiB) for
//!   JSON bodies → 413; `--max-upload-bytes` (10 GiB) for streamed uploads → 413, checked
//!   against Content-Length first and then while streaming. Request headers must arrive
//!   within 30 s. No answer waits for a body: what a handler left unread (an early error) is
//!   read in the background, at most 64 MiB or 10 s, while the answer goes out; the connection
//!   then carries the next request, or closes if the body never came. An upload the agent
//!   refuses is answered at once with `Connection: close` (`proxy`).
//! - **Lifetimes.** A sandbox has a deadline (default `--default-timeout`, 5 min; at most
//!   `--max-timeout`, 24 h); a watcher task destroys it then, or as soon as its helper exits
//!   (pidfd). Sandboxes outlive the daemon: SIGTERM/SIGINT stop the listener, give in-flight
//!   requests up to 10 s, and leave every sandbox running for the next daemon to adopt.
//! - **Exec.** `POST .../exec` answers `application/x-ndjson`: `start`, `stdout`/`stderr`
//!   (base64), then one `exit` (or `error`). Semantics are envd's `Start`: `timeout_ms` kills
//!   the command, a client disconnect does not.
//! - **Egress.** A `proxy`-mode sandbox's proxy runs on the daemon's runtime; its
//!   `network`, `credentials` and `approvals` can be replaced (`PUT .../policy`, 409 when a
//!   change needs review and is not approved), and held requests are answered through
//!   `/v1/approvals` with an API key only (never a sandbox's own token) or the
//!   `--reviewer-webhook`. Every boundary decision is a JSON line in `<state>/audit.jsonl` and
//!   the sandbox's `audit.jsonl`. `--test-egress-resolve`/`--test-egress-roots` are hidden
//!   test equipment, refused unless listening on loopback.
//! - **Files.** Paths resolve inside the sandbox's own view (the agent runs there), so
//!   traversal reaches only what the sandbox sees, and writes outside `/workspace` and `/tmp`
//!   fail. The edge rejects empty paths and NUL bytes.

pub mod agent;
pub mod audit;
pub mod auth;
pub mod client;
pub mod config;
pub mod e2b;
pub mod egress;
pub mod error;
pub mod forge;
pub mod fuzzing;
pub mod http;
pub mod inside;
pub mod judge0;
pub mod keys_cmd;
pub mod lifecycle;
pub mod logging;
pub mod lsp;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod proxy;
pub mod routes;
pub mod server;
pub mod store;
pub mod templates;
pub mod testing;
pub mod tls;
pub mod websocket;

pub use config::ServeArgs;
pub use keys_cmd::KeysArgs;
pub use server::{ServeError, run as serve};
