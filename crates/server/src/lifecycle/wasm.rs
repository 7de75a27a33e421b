//! The wasm tier (templates `wasm-js` and `wasm-python`): a process-tier sandbox whose one
//! command is the wasm worker (`airlock-wasm serve`, crates/wasm), started through the agent
//! once the agent serves, exactly like the code interpreter. The worker runs inside the
//! sandbox's jail (its namespaces, Landlock, seccomp and cgroup), so an engine escape lands in
//! a jail with the guest's policy. Its view holds nothing of the host but what the worker
//! needs ([`view_binds`]): its binary, the guest modules and the read-only preopens, beside
//! the workspace, `/tmp`, `/dev`, `/proc` and the agent. Evaluations reach it through the
//! agent's TCP tunnel on loopback, one JSON line each way.
//!
//! The policy is mapped, not weakened: filesystem rules become WASI preopens; a rule the
//! worker cannot express, and anything that needs processes, sockets or the host's network, is
//! refused at create with the reason.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use airlock_api::ViewBind;
use airlock_api::policy::{NetworkMode, PathAccess, PolicyDocument};
use airlock_api::v1::{
    DropContextLine, ErrorCode, EvalRequest, EvalResponse, ToolCallLine, ToolResult, ToolResultLine,
};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::Daemon;
use crate::e2b::tunnel::{self, TunnelError};
use crate::error::ApiError;

/// JavaScript only (QuickJS): the worker starts in milliseconds.
pub const WASM_JS_TEMPLATE: &str = "wasm-js";
/// JavaScript and Python (CPython 3.12 for WASI on wasmtime).
pub const WASM_PYTHON_TEMPLATE: &str = "wasm-python";
pub const WASM_JS_DESCRIPTION: &str = "The wasm tier: JavaScript snippets in QuickJS isolates (POST /v1/sandboxes/{id}/eval), no processes";
pub const WASM_PYTHON_DESCRIPTION: &str = "The wasm tier: Python (CPython 3.12 for WASI on wasmtime) and JavaScript snippets in isolates, no processes";
/// The worker's loopback port inside the sandbox.
pub const WASM_PORT: u16 = 49998;
/// The agent's process tag for the worker.
const TAG: &str = "wasm-worker";
/// The workspace, always preopened read-write.
const WORKSPACE: &str = "/workspace";
/// Where the worker's binary and its guest modules appear in the sandbox's view.
const WORKER_PATH: &str = "/opt/airlock/airlock-wasm";
const GUESTS_PATH: &str = "/opt/airlock/wasm-guests";
/// The view's directories that are the sandbox's own, not the host's.
const SANDBOX_OWN: &[&str] = &["/workspace", "/tmp", "/dev", "/proc", "/sys", "/run"];
/// How long the worker may take to load its engines on a loaded machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(10);
/// The most of a worker's answer read (its output caps are 1 MiB each, JSON-escaped).
const MAX_ANSWER_BYTES: u64 = 16 << 20;

pub fn is_wasm_template(name: &str) -> bool {
    name == WASM_JS_TEMPLATE || name == WASM_PYTHON_TEMPLATE
}

/// A directory the guest sees, at the same path as in the sandbox's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preopen {
    pub path: String,
    pub writable: bool,
}

impl Preopen {
    /// The worker's `--preopen` argument.
    fn arg(&self) -> String {
        let access = if self.writable { "rw" } else { "ro" };
        format!("{0}:{0}:{access}", self.path)
    }
}

/// The worker's preopens for `policy`, or why the wasm tier cannot honour it.
pub fn preopens(policy: Option<&PolicyDocument>) -> Result<Vec<Preopen>, String> {
    let mut preopens = vec![Preopen {
        path: WORKSPACE.to_owned(),
        writable: true,
    }];
    let Some(policy) = policy else {
        return Ok(preopens);
    };
    let refuse = |what: &str| Err(format!("the wasm tier cannot honour this policy: {what}"));
    if let Some(tier) = policy.tier
        && tier != airlock_api::Tier::Process
    {
        return refuse(&format!(
            "it asks for the {} tier (a wasm template runs on the wasm tier)",
            tier.as_str()
        ));
    }
    if policy.network.mode == Some(NetworkMode::Full) {
        return refuse(
            "network mode `full` needs sockets; a wasm guest has none (use `proxy` rules for a host fetch, or the process tier)",
        );
    }
    if !policy.process.syscalls.allow_extra.is_empty() {
        return refuse(
            "process.syscalls.allow_extra: a wasm guest makes no system calls and starts no processes",
        );
    }
    if policy.process.user.is_some() {
        return refuse("process.user: a wasm guest runs no process to run as a user");
    }
    for (path, access) in &policy.filesystem.rules {
        let guest = match path.as_str() {
            ":workspace" => WORKSPACE.to_owned(),
            other if other.starts_with(":workspace/") => {
                format!("{WORKSPACE}{}", &other[":workspace".len()..])
            }
            other if other.starts_with('/') && !other.contains('*') => other.to_owned(),
            other => {
                return refuse(&format!(
                    "filesystem rule {other:?}: only absolute directories and :workspace become WASI preopens"
                ));
            }
        };
        match access {
            PathAccess::Ro if guest == "/" => {
                return refuse(
                    "`/` ro: the wasm tier shows the guest directories, not the host's root",
                );
            }
            PathAccess::Ro if guest != WORKSPACE => preopens.push(Preopen {
                path: guest,
                writable: false,
            }),
            PathAccess::Ro => {
                return refuse(":workspace ro: the workspace is the guest's one writable preopen");
            }
            PathAccess::Rw if guest == WORKSPACE => {}
            PathAccess::Rw => {
                return refuse(&format!(
                    "filesystem rule {guest:?} rw: a writable path outside the workspace preopen"
                ));
            }
            // Nothing outside the preopens is visible, so a deny outside them holds already;
            // one inside a preopen cannot be cut out of it.
            PathAccess::Deny
                if guest == WORKSPACE || guest.starts_with(&format!("{WORKSPACE}/")) =>
            {
                return refuse(&format!(
                    "filesystem rule {guest:?} deny: a hole inside the workspace preopen"
                ));
            }
            PathAccess::Deny => {}
        }
    }
    Ok(preopens)
}

/// The worker binary: `$AIRLOCK_WASM_BIN`, else `airlock-wasm` beside the daemon's binary.
fn worker_binary() -> Result<PathBuf, ApiError> {
    let candidate = match std::env::var_os("AIRLOCK_WASM_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .map_err(|e| ApiError::internal(format!("cannot find the daemon's own path: {e}")))?
            .with_file_name("airlock-wasm"),
    };
    if !candidate.is_file() {
        return Err(not_installed(format!(
            "no {} (build the airlock-wasm crate, or set AIRLOCK_WASM_BIN)",
            candidate.display()
        )));
    }
    Ok(candidate)
}

/// The guest modules: the first `wasm-guests` among the worker's ancestors, where the worker
/// itself looks (the install step puts it in `target/`, the binary in `target/<triple>/<profile>/`).
fn guests_dir(worker: &Path) -> Result<PathBuf, ApiError> {
    worker
        .ancestors()
        .skip(1)
        .take(4)
        .map(|dir| dir.join("wasm-guests"))
        .find(|dir| dir.is_dir())
        .ok_or_else(|| {
            not_installed(format!(
                "no wasm-guests directory near {} (run scripts/wasm-guests.sh)",
                worker.display()
            ))
        })
}

fn not_installed(what: String) -> ApiError {
    ApiError::new(
        ErrorCode::Unprocessable,
        format!("the wasm tier is not installed: {what}"),
    )
}

/// The whole of the host a wasm sandbox sees, as its view's binds: the worker's binary and
/// the guest modules (with their compiled cache) at fixed paths, and each read-only preopen at
/// its own path (one inside another comes with it). The workspace is the sandbox's own.
pub fn view_binds(preopens: &[Preopen]) -> Result<Vec<ViewBind>, ApiError> {
    let worker = worker_binary()?;
    let guests = guests_dir(&worker)?;
    let mut binds = vec![
        ViewBind {
            host: worker,
            guest: WORKER_PATH.into(),
        },
        ViewBind {
            host: guests,
            guest: GUESTS_PATH.into(),
        },
    ];
    // A preopen in a directory Airlock mounts itself (`:workspace/docs`) is the sandbox's own.
    let own = |dir: &Path| SANDBOX_OWN.iter().any(|own| dir.starts_with(own));
    let read_only: Vec<&Path> = preopens
        .iter()
        .filter(|preopen| !preopen.writable)
        .map(|preopen| Path::new(&preopen.path))
        .filter(|dir| !own(dir))
        .collect();
    for dir in &read_only {
        let covered = read_only
            .iter()
            .any(|other| other != dir && dir.starts_with(other));
        if !covered && !binds.iter().any(|bind| bind.guest == *dir) {
            binds.push(ViewBind {
                host: dir.to_path_buf(),
                guest: dir.to_path_buf(),
            });
        }
    }
    Ok(binds)
}

impl Daemon {
    /// Starts the worker in running sandbox `id` and waits until it answers an evaluation.
    pub(super) async fn start_wasm_worker(
        self: &Arc<Self>,
        id: &str,
        template: &str,
        preopens: &[Preopen],
    ) -> Result<(), ApiError> {
        let agent = self.agent(id).await?;
        // The proxy variables of `network: proxy` are how the worker's `fetch` finds the proxy.
        let env = self.sandbox_env(id)?;
        let mut args = vec![
            "serve".to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{WASM_PORT}"),
            "--guests".to_owned(),
            GUESTS_PATH.to_owned(),
        ];
        for preopen in preopens {
            args.push("--preopen".to_owned());
            args.push(preopen.arg());
        }
        if template == WASM_JS_TEMPLATE {
            args.push("--no-python".to_owned());
        }
        // The guest knows the tools' names only; the daemon performs the calls.
        let tools = self
            .store
            .get_sandbox(id)?
            .map(|row| row.request.tools)
            .unwrap_or_default();
        for tool in &tools {
            args.push("--tool".to_owned());
            args.push(tool.name().to_owned());
        }
        let process = json!({
            "cmd": WORKER_PATH,
            "args": args,
            "envs": env,
            "cwd": WORKSPACE,
        });
        let mut reader = agent
            .start_process(&json!({ "process": process, "tag": TAG }), None, None)
            .await?;
        crate::routes::exec::first_event(&mut reader).await?;
        drop(reader);
        let started = Instant::now();
        let probe = EvalRequest {
            language: airlock_api::v1::EvalLanguage::Javascript,
            code: "1".into(),
            timeout_ms: Some(1_000),
            context_id: None,
        };
        loop {
            match ask(agent.socket(), &probe, None).await {
                Ok(answer) if answer.error.is_none() => return Ok(()),
                Ok(answer) => {
                    return Err(ApiError::internal(format!(
                        "the wasm worker answered its probe with an error: {:?}",
                        answer.error
                    )));
                }
                Err(Ask::NotListening) if started.elapsed() < READY_TIMEOUT => {
                    if !self.is_running(id) {
                        return Err(ApiError::no_sandbox(id));
                    }
                    tokio::time::sleep(POLL).await;
                }
                Err(Ask::NotListening) => {
                    return Err(ApiError::internal(format!(
                        "the wasm worker was not ready after {} s (see the sandbox's logs)",
                        READY_TIMEOUT.as_secs()
                    )));
                }
                Err(Ask::Failed(err)) => return Err(err),
            }
        }
    }

    /// Starts the worker again in a sandbox started again on its files (a resume).
    pub(super) async fn restart_wasm_worker(
        self: &Arc<Self>,
        id: &str,
        template: &str,
        request: &airlock_api::v1::CreateSandboxRequest,
    ) -> Result<(), ApiError> {
        let preopens = preopens(request.policy.as_deref()).map_err(ApiError::unprocessable)?;
        self.start_wasm_worker(id, template, &preopens).await
    }

    /// Whether sandbox `id` is on the wasm tier (its template is `wasm-js` or `wasm-python`).
    pub fn is_wasm_sandbox(&self, id: &str) -> bool {
        self.store
            .get_sandbox(id)
            .ok()
            .flatten()
            .and_then(|row| row.request.template)
            .is_some_and(|name| is_wasm_template(&name))
    }

    /// Writes the audit line of one evaluation.
    pub fn audit_eval(&self, id: &str, request: &EvalRequest, answer: &EvalResponse) {
        let language = match request.language {
            airlock_api::v1::EvalLanguage::Javascript => "javascript",
            airlock_api::v1::EvalLanguage::Python => "python",
        };
        let outcome = match &answer.error {
            None => "ok".to_owned(),
            Some(error) => serde_json::to_value(error.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "error".to_owned()),
        };
        let digest = crate::auth::hash_secret(&request.code);
        self.audit.eval(id, language, &digest, &outcome);
    }

    /// Evaluates one snippet in wasm sandbox `id`.
    pub async fn eval(
        self: &Arc<Self>,
        id: &str,
        request: &EvalRequest,
    ) -> Result<EvalResponse, ApiError> {
        let template = self
            .store
            .get_sandbox(id)?
            .and_then(|row| row.request.template)
            .unwrap_or_default();
        if !is_wasm_template(&template) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "sandbox {id} is on template {template:?}, not the wasm tier (create it with template wasm-js or wasm-python; use exec on the process tier)"
                ),
            ));
        }
        let agent = self.agent(id).await?;
        match ask(agent.socket(), request, Some((self, id))).await {
            Ok(answer) => Ok(answer),
            Err(Ask::NotListening) => Err(ApiError::new(
                ErrorCode::AgentError,
                "the sandbox's wasm worker is not running",
            )),
            Err(Ask::Failed(err)) => Err(err),
        }
    }
}

impl Daemon {
    /// Forgets evaluation context `context` of wasm sandbox `id` (its kept instances end).
    pub async fn drop_eval_context(
        self: &Arc<Self>,
        id: &str,
        context: &str,
    ) -> Result<(), ApiError> {
        let agent = self.agent(id).await?;
        let line = DropContextLine {
            drop_context: context.to_owned(),
        };
        match ask(agent.socket(), &line, None).await {
            Ok(_) => Ok(()),
            Err(Ask::NotListening) => Err(ApiError::new(
                ErrorCode::AgentError,
                "the sandbox's wasm worker is not running",
            )),
            Err(Ask::Failed(err)) => Err(err),
        }
    }
}

enum Ask {
    NotListening,
    Failed(ApiError),
}

/// One request line to the worker through the agent's tunnel, one answer line back. Before
/// it, the worker may send tool calls (`ToolCallLine`): `tools` (the daemon and the sandbox)
/// performs each and sends its result; without it (the readiness probe) each is refused.
async fn ask(
    socket: &std::path::Path,
    request: &impl serde::Serialize,
    tools: Option<(&Arc<Daemon>, &str)>,
) -> Result<EvalResponse, Ask> {
    let agent_error = |what: String| Ask::Failed(ApiError::new(ErrorCode::AgentError, what));
    let upgraded = match tunnel::open(socket, WASM_PORT).await {
        Ok(upgraded) => upgraded,
        Err(TunnelError::PortClosed(_)) => return Err(Ask::NotListening),
        Err(err) => return Err(agent_error(err.to_string())),
    };
    let mut stream = tokio::io::BufReader::new(TokioIo::new(upgraded));
    send_line(stream.get_mut(), request, "cannot send to the wasm worker").await?;
    loop {
        let mut answer = Vec::new();
        (&mut stream)
            .take(MAX_ANSWER_BYTES)
            .read_until(b'\n', &mut answer)
            .await
            .map_err(|e| agent_error(format!("the wasm worker's answer broke: {e}")))?;
        if answer.is_empty() {
            // Accepted and closed before the engines were up: still starting.
            return Err(Ask::NotListening);
        }
        let Ok(ToolCallLine { tool_call }) = serde_json::from_slice::<ToolCallLine>(&answer) else {
            return serde_json::from_slice(&answer)
                .map_err(|e| agent_error(format!("the wasm worker answered nonsense: {e}")));
        };
        let tool_result = match tools {
            Some((daemon, id)) => daemon.perform_tool(id, tool_call).await,
            None => ToolResult::Error {
                message: "no tools during the readiness probe".to_owned(),
            },
        };
        let answer = ToolResultLine { tool_result };
        send_line(stream.get_mut(), &answer, "cannot answer the wasm worker").await?;
    }
}

/// Writes `value` as one JSON line to the worker.
async fn send_line(
    stream: &mut (impl tokio::io::AsyncWrite + Unpin),
    value: &impl serde::Serialize,
    failed: &str,
) -> Result<(), Ask> {
    let mut line = serde_json::to_vec(value)
        .map_err(|e| Ask::Failed(ApiError::internal(format!("cannot encode: {e}"))))?;
    line.push(b'\n');
    stream.write_all(&line).await.map_err(|e| {
        Ask::Failed(ApiError::new(
            ErrorCode::AgentError,
            format!("{failed}: {e}"),
        ))
    })
}
