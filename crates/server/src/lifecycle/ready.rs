//! A template's start command and ready check, at every create and at every resume after a
//! filesystem-only pause (the container tier has no memory snapshot to keep a process in).
//!
//! The start command runs in the background through the sandbox's agent, as the sandbox's
//! user in its working directory with its environment; its output is kept (the last 4 KiB)
//! for the error a failed ready check reports. The ready check is a shell command run
//! repeatedly until it exits 0, each attempt bounded; create answers only then, or fails
//! after the template's bound (default 60 s) with the last attempt's exit and output, and the
//! sandbox is removed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_api::v1::{DEFAULT_READY_TIMEOUT_MS, ErrorCode, Template};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::Daemon;
use crate::agent::{Agent, Envelope, EnvelopeReader};
use crate::error::ApiError;

/// The most output kept of the start command and of one ready attempt.
const TAIL_BYTES: usize = 4096;
/// Pause between ready attempts.
const READY_INTERVAL: Duration = Duration::from_millis(200);
/// The longest one ready attempt may run.
const ATTEMPT_MS: u64 = 10_000;

/// The last [`TAIL_BYTES`] of a command's output.
#[derive(Debug, Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > TAIL_BYTES {
            self.0.drain(..self.0.len() - TAIL_BYTES);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).trim_end().to_owned()
    }
}

/// Starts `sh -c command`; returns the event stream after its `start` event.
async fn start(
    agent: &Agent,
    command: &str,
    cwd: &str,
    timeout_ms: Option<u64>,
) -> Result<EnvelopeReader, ApiError> {
    let process = json!({ "cmd": "/bin/sh", "args": ["-c", command], "envs": {}, "cwd": cwd });
    agent
        .start_process(&json!({ "process": process }), timeout_ms, None)
        .await
}

/// Reads a command's events to its end into `tail`; returns its exit code (-1: a signal, or
/// the stream broke).
async fn drain(mut reader: EnvelopeReader, tail: &Mutex<Tail>) -> i32 {
    loop {
        match reader.next().await {
            Ok(Some(Envelope::Message(value))) => {
                let event = value.get("event").unwrap_or(&Value::Null);
                if let Some(data) = event.get("data") {
                    for stream in ["stdout", "stderr"] {
                        if let Some(bytes) = data
                            .get(stream)
                            .and_then(Value::as_str)
                            .and_then(|b| BASE64.decode(b).ok())
                        {
                            tail.lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push(&bytes);
                        }
                    }
                } else if let Some(end) = event.get("end") {
                    let exited = end.get("exited").and_then(Value::as_bool).unwrap_or(false);
                    let code = end
                        .get("exitCode")
                        .or_else(|| end.get("exit_code"))
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    return if exited {
                        i32::try_from(code).unwrap_or(-1)
                    } else {
                        -1
                    };
                }
            }
            _ => return -1,
        }
    }
}

impl Daemon {
    /// Runs `template`'s start command and waits for its ready check in sandbox `id`, whose
    /// working directory is `cwd`. Err: the sandbox is not ready (the caller removes it).
    pub(super) async fn start_template(
        &self,
        id: &str,
        template: &Template,
        cwd: &str,
    ) -> Result<(), ApiError> {
        if template.start_cmd.is_none() && template.ready_cmd.is_none() {
            return Ok(());
        }
        let socket = self.running(id)?.record.socket.clone();
        self.start_template_at(id, &socket, template, cwd).await
    }

    /// [`Daemon::start_template`] through the agent at `socket` (a warm pool's member, which
    /// has no slot yet).
    pub(super) async fn start_template_at(
        &self,
        id: &str,
        socket: &std::path::Path,
        template: &Template,
        cwd: &str,
    ) -> Result<(), ApiError> {
        if template.start_cmd.is_none() && template.ready_cmd.is_none() {
            return Ok(());
        }
        let agent = Agent::new(socket);
        let started = Arc::new(Mutex::new(Tail::default()));
        if let Some(command) = &template.start_cmd {
            let reader = start(&agent, command, cwd, None).await.map_err(|err| {
                ApiError::new(
                    err.code,
                    format!(
                        "sandbox {id}: the template's start command `{command}` did not start: {}",
                        err.message
                    ),
                )
            })?;
            let tail = started.clone();
            tokio::spawn(async move {
                let code = drain(reader, &tail).await;
                tail.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(format!("\n[the start command ended with exit code {code}]").as_bytes());
            });
            self.event(Some(id), "start_command", command);
        }
        let Some(ready) = &template.ready_cmd else {
            return Ok(());
        };
        let bound_ms = template
            .ready_timeout_ms
            .unwrap_or(DEFAULT_READY_TIMEOUT_MS);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(bound_ms);
        let mut attempts = 0u64;
        let last = loop {
            attempts += 1;
            let tail = Mutex::new(Tail::default());
            let code = match start(&agent, ready, cwd, Some(ATTEMPT_MS)).await {
                Ok(reader) => drain(reader, &tail).await,
                Err(err) => {
                    tail.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(err.message.as_bytes());
                    -1
                }
            };
            if code == 0 {
                self.event(
                    Some(id),
                    "ready",
                    &format!("the template's ready check passed (attempt {attempts})"),
                );
                return Ok(());
            }
            let text = tail
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .text();
            if tokio::time::Instant::now() + READY_INTERVAL >= deadline {
                break (code, text);
            }
            tokio::time::sleep(READY_INTERVAL).await;
        };
        let started = started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .text();
        let mut message = format!(
            "sandbox {id} is not ready: the template's ready check `{ready}` did not exit 0 within {bound_ms} ms ({attempts} attempts; the last exited {}{})",
            last.0,
            if last.1.is_empty() {
                String::new()
            } else {
                format!(" and printed: {}", last.1)
            }
        );
        if let Some(command) = &template.start_cmd {
            message.push_str(&format!(
                "; the start command `{command}` printed: {}",
                if started.is_empty() {
                    "nothing"
                } else {
                    &started
                }
            ));
        }
        Err(ApiError::new(ErrorCode::Timeout, message))
    }
}
