//! What the runner asks of a sandbox's agent: write a file, read one (bounded), and start a
//! shell script whose end it waits for. Everything happens inside the sandbox's own view,
//! through its agent: the daemon never opens a path the sandbox controls (Judge0's 2024
//! escapes wrote and chowned host paths that code in the box had turned into symlinks).

use std::collections::BTreeMap;

use airlock_api::v1::ErrorCode;
use http_body_util::BodyExt;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};

use super::status::{Exit, signal_from_status};
use crate::agent::{Agent, Connection, Envelope, EnvelopeReader, connect_error, envelope};
use crate::error::ApiError;
use crate::http::{empty, encode_query_value, full};

fn agent_error(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::AgentError, message)
}

/// Writes `bytes` to `path` in the sandbox (parents created, an existing file replaced).
pub async fn write_file(agent: &Agent, path: &str, bytes: Vec<u8>) -> Result<(), ApiError> {
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("/files?path={}", encode_query_value(path)))
        .header(CONTENT_TYPE, "application/octet-stream")
        .body(full(bytes))
        .map_err(|e| ApiError::internal(format!("cannot build the upload of {path}: {e}")))?;
    let response = agent.send(request).await?;
    let status = response.status();
    let body = read_capped(response.into_body(), 64 << 10).await?;
    if status != StatusCode::OK {
        return Err(connect_error(status, None, &body.0));
    }
    Ok(())
}

/// The first `cap` bytes of the file at `path` and whether there was more; `None` when it
/// does not exist.
pub async fn read_file(
    agent: &Agent,
    path: &str,
    cap: usize,
) -> Result<Option<(Vec<u8>, bool)>, ApiError> {
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("/files?path={}", encode_query_value(path)))
        .body(empty())
        .map_err(|e| ApiError::internal(format!("cannot build the download of {path}: {e}")))?;
    let response = agent.send(request).await?;
    let status = response.status();
    if status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let (bytes, more) = read_capped(response.into_body(), cap).await?;
    if status != StatusCode::OK {
        return Err(connect_error(status, None, &bytes));
    }
    Ok(Some((bytes, more)))
}

/// Reads a body up to `cap` bytes, then stops (dropping the rest, which ends the stream).
async fn read_capped(
    mut body: hyper::body::Incoming,
    cap: usize,
) -> Result<(Vec<u8>, bool), ApiError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| agent_error(format!("cannot read from the agent: {e}")))?;
        if let Ok(data) = frame.into_data() {
            let room = cap - out.len();
            if data.len() > room {
                out.extend_from_slice(&data[..room]);
                return Ok((out, true));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok((out, false))
}

/// A script started in the sandbox: `/bin/bash -c SCRIPT` in `/workspace`.
#[derive(Debug)]
pub struct Started {
    reader: EnvelopeReader,
    _connection: Connection,
    /// What the script printed on the agent's pipes before redirecting its own descriptors
    /// (a failed `ulimit`, say): kept for the daemon's diagnostics only, bounded.
    pub early_output: Vec<u8>,
}

/// Starts `/bin/bash -c script` with exactly `env`, stdin closed.
pub async fn start(
    agent: &Agent,
    script: &str,
    env: &BTreeMap<String, String>,
) -> Result<Started, ApiError> {
    let process = json!({
        "cmd": "/bin/bash",
        "args": ["-c", script],
        "envs": env,
        "cwd": "/workspace",
    });
    let message = json!({ "process": process, "stdin": false });
    let request = Request::builder()
        .method(Method::POST)
        .uri("/process.Process/Start")
        .header(CONTENT_TYPE, "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(full(envelope(&message)))
        .map_err(|e| ApiError::internal(format!("cannot build the start request: {e}")))?;
    let (response, connection) = agent.send_attached(request).await?;
    if response.status() != StatusCode::OK {
        let status = response.status();
        let (body, _) = read_capped(response.into_body(), 64 << 10).await?;
        return Err(connect_error(status, None, &body));
    }
    let mut started = Started {
        reader: EnvelopeReader::new(response.into_body()),
        _connection: connection,
        early_output: Vec::new(),
    };
    loop {
        match started.reader.next().await? {
            Some(Envelope::Message(value)) => {
                let event = value.get("event").unwrap_or(&Value::Null);
                if event.get("start").is_some() {
                    return Ok(started);
                }
                if event.get("keepalive").is_none() {
                    return Err(agent_error("the agent sent output before the start event"));
                }
            }
            Some(Envelope::End(Some(err))) => return Err(err),
            Some(Envelope::End(None)) | None => {
                return Err(agent_error(
                    "the agent ended the stream before the script started",
                ));
            }
        }
    }
}

impl Started {
    /// Waits for the script's end (cancel-safe: a dropped call loses no event).
    pub async fn end(&mut self) -> Result<Exit, ApiError> {
        loop {
            match self.reader.next().await? {
                Some(Envelope::Message(value)) => {
                    let event = value.get("event").unwrap_or(&Value::Null);
                    if let Some(data) = event.get("data") {
                        self.keep_early(data);
                        continue;
                    }
                    if let Some(end) = event.get("end") {
                        return Ok(exit_of(end));
                    }
                }
                Some(Envelope::End(Some(err))) => return Err(err),
                Some(Envelope::End(None)) | None => {
                    return Err(agent_error(
                        "the agent ended the stream without an end event",
                    ));
                }
            }
        }
    }

    fn keep_early(&mut self, data: &Value) {
        use base64::Engine;
        for key in ["stdout", "stderr"] {
            if let Some(bytes) = data
                .get(key)
                .and_then(Value::as_str)
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            {
                let room = (4usize << 10).saturating_sub(self.early_output.len());
                self.early_output
                    .extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
        }
    }
}

/// An envd end event as an exit: its code, or the signal its `status` names.
fn exit_of(end: &Value) -> Exit {
    let status = end.get("status").and_then(Value::as_str).unwrap_or("");
    if let Some(signal) = signal_from_status(status) {
        return Exit::Signal(signal);
    }
    let code = end
        .get("exitCode")
        .or_else(|| end.get("exit_code"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    Exit::Code(i32::try_from(code).unwrap_or(-1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_end_events_become_exits() {
        assert_eq!(
            exit_of(&json!({"exitCode": 3, "exited": true, "status": "exit status 3"})),
            Exit::Code(3)
        );
        assert_eq!(
            exit_of(&json!({"exited": true, "status": "exit status 0"})),
            Exit::Code(0)
        );
        assert_eq!(
            exit_of(&json!({"exitCode": -1, "status": "signal: segmentation fault (core dumped)"})),
            Exit::Signal(11)
        );
    }
}
