//! `POST /v1/sandboxes/{id}/exec`: envd's `process.Process/Start`, re-framed as NDJSON.
//!
//! The answer waits for the agent's first event. If the command cannot start (bad cwd,
//! unknown user) the agent's error becomes an HTTP error; once `start` has arrived the status
//! is 200 and the stream carries `stdout`/`stderr` lines and exactly one `exit` line, or an
//! `error` line if the agent's stream breaks. A client that disconnects does not kill the
//! command, as with envd; `timeout_ms` bounds it (`Connect-Timeout-Ms`).

use airlock_api::v1::{ErrorCode, ExecEvent, ExecRequest, MAX_ENV_ENTRIES};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Ctx;
use crate::agent::{Agent, Envelope, EnvelopeReader};
use crate::error::ApiError;
use crate::http::{BoxError, ChannelBody, NDJSON, with_type};
use crate::lifecycle::env_key_ok;

/// Where commands start unless the request says otherwise: the one directory that is
/// always there and writable (home directories are masked in the sandbox's view).
const DEFAULT_CWD: &str = "/workspace";

pub async fn exec(ctx: &mut Ctx) -> Result<Response<crate::http::Body>, ApiError> {
    let request: ExecRequest = ctx.json().await?;
    if ctx.daemon.is_wasm_sandbox(&ctx.id) {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "exec is not available on the wasm tier (no processes): use POST /v1/sandboxes/{id}/eval, or the process tier",
        ));
    }
    let agent = ctx.daemon.agent(&ctx.id).await?;
    ctx.daemon.metrics.exec(crate::metrics::Surface::V1);
    let oom_kills_before = ctx.daemon.oom_kills(&ctx.id)?;
    let (cmd, args) = match (&request.argv, &request.shell) {
        (Some(argv), None) if argv.first().is_some_and(|program| !program.is_empty()) => {
            (argv[0].clone(), argv[1..].to_vec())
        }
        (None, Some(shell)) => ("/bin/sh".to_owned(), vec!["-c".to_owned(), shell.clone()]),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of `argv` (with a program) and `shell`",
            ));
        }
    };
    if std::iter::once(&cmd).chain(&args).any(|a| a.contains('\0')) {
        return Err(ApiError::invalid("the command contains a NUL byte"));
    }
    for (name, value) in [("cwd", &request.cwd), ("user", &request.user)] {
        if let Some(value) = value {
            super::files::check_path(name, value)?;
        }
    }
    crate::lifecycle::check_map("env", &request.env, MAX_ENV_ENTRIES, env_key_ok)
        .map_err(ApiError::invalid)?;
    let stdin = match &request.stdin_base64 {
        Some(encoded) => Some(
            BASE64
                .decode(encoded)
                .map_err(|e| ApiError::invalid(format!("stdin_base64 is not base64: {e}")))?,
        ),
        None => None,
    };
    let mut envs = ctx.daemon.sandbox_env(&ctx.id)?;
    envs.extend(request.env.clone());
    let cwd = request
        .cwd
        .clone()
        .unwrap_or_else(|| DEFAULT_CWD.to_owned());
    let process = json!({ "cmd": cmd, "args": args, "envs": envs, "cwd": cwd });
    let message = json!({ "process": process, "stdin": stdin.is_some() });
    let mut reader = agent
        .start_process(&message, request.timeout_ms, request.user.as_deref())
        .await?;
    let pid = first_event(&mut reader).await?;
    let daemon = ctx.daemon.clone();
    let id = ctx.id.clone();
    let oom_kills = move || daemon.oom_kills(&id).unwrap_or(0);
    let (tx, body) = ChannelBody::new(32);
    let _ = tx.send(Ok(line(&ExecEvent::Start { pid }))).await;
    if let Some(bytes) = stdin {
        tokio::spawn(feed_stdin(agent, pid, bytes, tx.clone()));
    }
    tokio::spawn(pump(reader, tx, move || oom_kills() > oom_kills_before));
    Ok(with_type(StatusCode::OK, NDJSON, body.boxed_unsync()))
}

/// Waits for `start`, skipping keepalives.
pub(crate) async fn first_event(reader: &mut EnvelopeReader) -> Result<u32, ApiError> {
    loop {
        match reader.next().await? {
            Some(Envelope::Message(value)) => {
                let event = value.get("event").unwrap_or(&Value::Null);
                if let Some(start) = event.get("start") {
                    let pid = start.get("pid").and_then(Value::as_u64).unwrap_or(0);
                    return Ok(u32::try_from(pid).unwrap_or(0));
                }
                if event.get("keepalive").is_none() {
                    return Err(ApiError::new(
                        ErrorCode::AgentError,
                        "the agent sent output before the start event",
                    ));
                }
            }
            Some(Envelope::End(Some(err))) => return Err(start_refusal(err)),
            Some(Envelope::End(None)) | None => {
                return Err(ApiError::new(
                    ErrorCode::AgentError,
                    "the agent ended the stream before the command started",
                ));
            }
        }
    }
}

/// A command that cannot start because its program or its working directory does not exist
/// is 404 here. The agent says `invalid_argument` (envd's code: the E2B SDKs raise
/// `InvalidArgumentException` for it), and the daemon's own checks have already refused every
/// malformed request, so that code names what the sandbox lacks.
fn start_refusal(err: ApiError) -> ApiError {
    let missing = ["not found in PATH", "does not exist"];
    if err.code == ErrorCode::InvalidRequest && missing.iter().any(|m| err.message.contains(m)) {
        ApiError::new(ErrorCode::NotFound, err.message)
    } else {
        err
    }
}

fn line(event: &ExecEvent) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Relays the rest of the agent's stream as NDJSON lines until `exit` or a failure;
/// `oom_killed` says, at the end, whether the OOM killer acted while the command ran.
async fn pump(
    mut reader: EnvelopeReader,
    tx: mpsc::Sender<Result<Bytes, BoxError>>,
    oom_killed: impl Fn() -> bool,
) {
    loop {
        let event = match reader.next().await {
            Ok(Some(Envelope::Message(value))) => match translate(&value) {
                Some(ExecEvent::Exit {
                    exit_code,
                    exited,
                    status,
                    ..
                }) => ExecEvent::Exit {
                    exit_code,
                    exited,
                    status,
                    oom_killed: oom_killed(),
                },
                Some(event) => event,
                None => continue,
            },
            Ok(Some(Envelope::End(Some(err)))) | Err(err) => ExecEvent::Error {
                code: err.code,
                message: err.message,
            },
            Ok(Some(Envelope::End(None)) | None) => ExecEvent::Error {
                code: ErrorCode::AgentError,
                message: "the agent ended the stream without an exit event".to_owned(),
            },
        };
        let last = matches!(event, ExecEvent::Exit { .. } | ExecEvent::Error { .. });
        if tx.send(Ok(line(&event))).await.is_err() || last {
            return;
        }
    }
}

/// One envd `ProcessEvent` as ours; `None` for keepalives and unknown events.
fn translate(value: &Value) -> Option<ExecEvent> {
    let event = value.get("event")?;
    if let Some(data) = event.get("data") {
        if let Some(out) = data.get("stdout").and_then(Value::as_str) {
            return Some(ExecEvent::Stdout {
                data_base64: out.to_owned(),
            });
        }
        if let Some(err) = data.get("stderr").and_then(Value::as_str) {
            return Some(ExecEvent::Stderr {
                data_base64: err.to_owned(),
            });
        }
        return None;
    }
    let end = event.get("end")?;
    let exit_code = end
        .get("exitCode")
        .or_else(|| end.get("exit_code"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    Some(ExecEvent::Exit {
        exit_code: i32::try_from(exit_code).unwrap_or(-1),
        exited: end.get("exited").and_then(Value::as_bool).unwrap_or(false),
        status: end
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        oom_killed: false,
    })
}

/// Writes stdin through `SendInput`, then closes it; a failure becomes an `error` line.
async fn feed_stdin(
    agent: Agent,
    pid: u32,
    bytes: Vec<u8>,
    tx: mpsc::Sender<Result<Bytes, BoxError>>,
) {
    let process = json!({ "pid": pid });
    let mut result = Ok(());
    if !bytes.is_empty() {
        let message = json!({ "process": process, "input": { "stdin": BASE64.encode(&bytes) } });
        result = agent
            .unary::<Value>("process.Process/SendInput", &message)
            .await
            .map(drop);
    }
    if result.is_ok() {
        result = agent
            .unary::<Value>("process.Process/CloseStdin", &json!({ "process": process }))
            .await
            .map(drop);
    }
    if let Err(err) = result {
        let event = ExecEvent::Error {
            code: err.code,
            message: format!("cannot write stdin: {}", err.message),
        };
        let _ = tx.send(Ok(line(&event))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_translate_fills_proto3_defaults() {
        let end =
            translate(&json!({"event": {"end": {"exited": true, "status": "exit status 0"}}}));
        assert_eq!(
            end,
            Some(ExecEvent::Exit {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                oom_killed: false,
            })
        );
        let out = translate(&json!({"event": {"data": {"stderr": "aGk="}}}));
        assert_eq!(
            out,
            Some(ExecEvent::Stderr {
                data_base64: "aGk=".into()
            })
        );
        assert_eq!(translate(&json!({"event": {"keepalive": {}}})), None);
    }
}
