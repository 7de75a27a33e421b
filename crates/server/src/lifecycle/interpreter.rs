//! The `code-interpreter-v1` template: once such a sandbox's agent serves, the daemon starts
//! E2B's code interpreter in it (`/run/airlock/agent interpreter`, through the agent, as a
//! command of the sandbox) and answers the create only when its `GET /health` says the
//! default python kernel runs, as E2B's template engine waits on its ready check. So the first
//! `run_code` after a create pays no kernel start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_api::v1::ErrorCode;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Daemon;
use crate::e2b::tunnel::{self, TunnelError};
use crate::error::ApiError;

/// E2B's name for the template, and the SDK's default.
pub const INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";
/// The interpreter's port (E2B's `JUPYTER_PORT`).
pub const INTERPRETER_PORT: u16 = 49999;
/// The agent's process tag for it (`commands.list()` shows it).
const TAG: &str = "code-interpreter";
/// The interpreter's working directory, and so its contexts' default `cwd`.
const CWD: &str = "/workspace";
/// How long a kernel start may take on a loaded machine before the create fails.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Between two health checks while the kernel starts.
const POLL: Duration = Duration::from_millis(25);
/// The most of a health answer read.
const MAX_HEALTH_BYTES: u64 = 16 << 10;

/// What one health check saw.
enum Health {
    Ready,
    /// Not listening yet, or the kernel still starting.
    Starting,
    /// The interpreter says its default kernel cannot start.
    Failed(String),
}

impl Daemon {
    /// Starts the interpreter in running sandbox `id` and waits until its default kernel runs.
    pub(super) async fn start_interpreter(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        let agent = self.agent(id).await?;
        let env = self.sandbox_env(id)?;
        start_in(&agent, &env, || self.is_running(id))
            .await
            .map_err(|err| match err {
                Gone => ApiError::no_sandbox(id),
                Failed(err) => err,
            })
    }
}

/// Why [`start_in`] failed.
pub(super) enum StartError {
    /// The sandbox ended meanwhile.
    Gone,
    Failed(ApiError),
}
use StartError::{Failed, Gone};

impl From<ApiError> for StartError {
    fn from(err: ApiError) -> StartError {
        Failed(err)
    }
}

/// Starts the interpreter through `agent` with `env` (a warm pool's member has none yet: its
/// claim's env reaches only what starts after it, so a create with env is not served from the
/// pool) and waits for its default kernel; `alive` says whether the sandbox still runs.
pub(super) async fn start_in(
    agent: &crate::agent::Agent,
    env: &std::collections::BTreeMap<String, String>,
    alive: impl Fn() -> bool,
) -> Result<(), StartError> {
    let process = json!({
        "cmd": airlock_jail::spec::AGENT_PATH,
        "args": ["interpreter", "--listen", format!("127.0.0.1:{INTERPRETER_PORT}")],
        "envs": env,
        "cwd": CWD,
    });
    let mut reader = agent
        .start_process(&json!({ "process": process, "tag": TAG }), None, None)
        .await?;
    crate::routes::exec::first_event(&mut reader).await?;
    // The process outlives this stream (envd's rule); its output is not kept.
    drop(reader);
    let started = Instant::now();
    loop {
        match health(agent.socket()).await {
            Health::Ready => return Ok(()),
            Health::Failed(reason) => {
                return Err(Failed(ApiError::internal(format!(
                    "the code interpreter cannot start: {reason}"
                ))));
            }
            Health::Starting if started.elapsed() > READY_TIMEOUT => {
                return Err(Failed(ApiError::new(
                    ErrorCode::Internal,
                    format!(
                        "the code interpreter was not ready after {} s",
                        READY_TIMEOUT.as_secs()
                    ),
                )));
            }
            Health::Starting if !alive() => return Err(Gone),
            Health::Starting => tokio::time::sleep(POLL).await,
        }
    }
}

/// One `GET /health` on the interpreter's port, through the agent's tunnel.
async fn health(socket: &std::path::Path) -> Health {
    let upgraded = match tunnel::open(socket, INTERPRETER_PORT).await {
        Ok(upgraded) => upgraded,
        Err(TunnelError::PortClosed(_)) => return Health::Starting,
        Err(err) => return Health::Failed(err.to_string()),
    };
    let mut stream = TokioIo::new(upgraded);
    let request = b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return Health::Starting;
    }
    let mut answer = Vec::new();
    if (&mut stream)
        .take(MAX_HEALTH_BYTES)
        .read_to_end(&mut answer)
        .await
        .is_err()
    {
        return Health::Starting;
    }
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    match status {
        "200" => Health::Ready,
        "500" => Health::Failed(body.trim().to_owned()),
        _ => Health::Starting,
    }
}
