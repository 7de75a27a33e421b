//! What the daemon itself does inside a sandbox, through its agent and as its default user:
//! run a command to its end and collect its output, and copy a host file in. Used for the
//! repository hand-over and pushes (`lifecycle::git`); everything it runs is confined like the
//! workload, since it is the sandbox's own agent that runs it.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;

use airlock_api::v1::ErrorCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

use crate::agent::{Agent, Envelope, connect_error};
use crate::error::ApiError;
use crate::http::{ChannelBody, encode_query_value, full};

/// The most output kept of a command the daemon runs (the tail, for messages).
const MAX_OUTPUT_BYTES: usize = 64 << 10;
/// File copies go in chunks of this size.
const CHUNK_BYTES: usize = 256 << 10;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.exit_code == 0
    }

    /// The last lines of stderr (else stdout), for an error message.
    pub fn tail(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(6)..].join(" / ")
    }
}

fn keep_tail(buffer: &mut Vec<u8>, chunk: &[u8]) {
    buffer.extend_from_slice(chunk);
    if buffer.len() > MAX_OUTPUT_BYTES {
        buffer.drain(..buffer.len() - MAX_OUTPUT_BYTES);
    }
}

/// Runs `argv` in the sandbox (with `env` on top of the sandbox's own) until it exits or
/// `timeout_ms` passes.
pub async fn run(
    agent: &Agent,
    argv: &[&str],
    env: &BTreeMap<String, String>,
    cwd: &str,
    timeout_ms: u64,
) -> Result<Ran, ApiError> {
    let (cmd, args) = argv
        .split_first()
        .ok_or_else(|| ApiError::internal("an empty command"))?;
    let process = json!({ "cmd": cmd, "args": args, "envs": env, "cwd": cwd });
    let mut reader = agent
        .start_process(&json!({ "process": process }), Some(timeout_ms), None)
        .await?;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        match reader.next().await? {
            Some(Envelope::Message(value)) => {
                let Some(event) = value.get("event") else {
                    continue;
                };
                if let Some(data) = event.get("data") {
                    for (name, buffer) in [("stdout", &mut stdout), ("stderr", &mut stderr)] {
                        if let Some(chunk) = data.get(name).and_then(Value::as_str) {
                            keep_tail(buffer, &BASE64.decode(chunk).unwrap_or_default());
                        }
                    }
                } else if let Some(end) = event.get("end") {
                    let exit_code = end
                        .get("exitCode")
                        .or_else(|| end.get("exit_code"))
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    return Ok(Ran {
                        exit_code,
                        stdout: String::from_utf8_lossy(&stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    });
                }
            }
            Some(Envelope::End(Some(err))) => return Err(err),
            Some(Envelope::End(None)) | None => {
                return Err(ApiError::new(
                    ErrorCode::AgentError,
                    format!("the agent ended `{cmd}` without an exit event"),
                ));
            }
        }
    }
}

/// Copies the host file `source` to `path` in the sandbox (parents are made), streamed.
pub async fn copy_in(agent: &Agent, source: &Path, path: &str) -> Result<(), ApiError> {
    let file = std::fs::File::open(source)
        .map_err(|e| ApiError::internal(format!("cannot open {}: {e}", source.display())))?;
    let length = file
        .metadata()
        .map_err(|e| ApiError::internal(format!("cannot stat {}: {e}", source.display())))?
        .len();
    let (tx, body) = ChannelBody::new(4);
    let reader = tokio::task::spawn_blocking(move || {
        let mut file = file;
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            match file.read(&mut buffer) {
                Ok(0) => return,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buffer[..n])))
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(Box::new(e)));
                    return;
                }
            }
        }
    });
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("/files?path={}", encode_query_value(path)))
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, length)
        .body(body.boxed_unsync())
        .map_err(|e| ApiError::internal(format!("cannot build the upload of {path}: {e}")))?;
    let (response, connection) = agent.send_attached(request).await?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    drop(connection);
    let _ = reader.await;
    if status != StatusCode::OK {
        return Err(connect_error(status, None, &answer));
    }
    Ok(())
}

/// Writes `bytes` to `path` in the sandbox.
pub async fn write(agent: &Agent, path: &str, bytes: Vec<u8>) -> Result<(), ApiError> {
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("/files?path={}", encode_query_value(path)))
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, bytes.len())
        .body(full(bytes))
        .map_err(|e| ApiError::internal(format!("cannot build the upload of {path}: {e}")))?;
    let response = agent.send(request).await?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if status != StatusCode::OK {
        return Err(connect_error(status, None, &answer));
    }
    Ok(())
}
