//! A client for one sandbox's agent, which speaks envd's Connect protocol (JSON codec) over
//! HTTP/1.1 on a Unix socket. One connection per call: connecting to a local socket costs
//! microseconds, and it keeps each exec stream independent.

use std::path::{Path, PathBuf};

use airlock_api::v1::{ErrorCode, FileEntry, FileKind};
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::UnixStream;

use crate::error::ApiError;
use crate::http::{Body, full};

/// The largest Connect message accepted from an agent (a big directory listing).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The header in which the agent names the errno of a failed file operation (`EROFS`,
/// `ENOSPC`, ...): Connect's codes and envd's statuses cannot tell a read-only path from a
/// Landlock denial, nor a full disk from a file-size limit.
pub const ERRNO_HEADER: &str = "airlock-errno";

#[derive(Debug, Clone)]
pub struct Agent {
    socket: PathBuf,
}

/// The task of one connection to an agent; dropping it closes the connection.
#[derive(Debug)]
pub struct Connection(Option<tokio::task::JoinHandle<()>>);

impl Connection {
    /// Lets the connection run until it ends by itself.
    pub fn detach(mut self) {
        self.0.take();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Agent {
    pub fn new(socket: &Path) -> Agent {
        Agent {
            socket: socket.to_owned(),
        }
    }

    /// The agent's Unix socket (the E2B data plane opens TCP tunnels through it).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request on a fresh connection; the response body streams.
    pub async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, ApiError> {
        let (response, connection) = self.send_attached(request).await?;
        connection.detach();
        Ok(response)
    }

    /// [`Agent::send`], keeping the connection: dropping it ends the connection, and with it
    /// the request body still being sent (after an early error answer).
    pub async fn send_attached(
        &self,
        mut request: Request<Body>,
    ) -> Result<(Response<Incoming>, Connection), ApiError> {
        let unreachable = |what: &str, err: &dyn std::fmt::Display| {
            ApiError::new(
                ErrorCode::AgentError,
                format!("the sandbox's agent is unreachable ({what}: {err})"),
            )
        };
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| unreachable("connect", &e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable("handshake", &e))?;
        let task = tokio::spawn(async move {
            // Ends when the response body is consumed or dropped.
            let _ = connection.await;
        });
        let connection = Connection(Some(task));
        request
            .headers_mut()
            .insert(HOST, HeaderValue::from_static("localhost"));
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable("request", &e))?;
        Ok((response, connection))
    }

    /// Sends envd's `process.Process/Start` with `message` (`{"process": {cmd, args, envs,
    /// cwd}, ...}`, and `tag` or `stdin` as envd takes them), envd's `connect-timeout-ms` when
    /// `timeout_ms` is given, and `user` as envd's Basic authorization. Answers the event
    /// stream; a refusal is the agent's error.
    pub async fn start_process(
        &self,
        message: &Value,
        timeout_ms: Option<u64>,
        user: Option<&str>,
    ) -> Result<EnvelopeReader, ApiError> {
        use base64::Engine as _;
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri("/process.Process/Start")
            .header(CONTENT_TYPE, "application/connect+json")
            .header("connect-protocol-version", "1");
        if let Some(ms) = timeout_ms {
            builder = builder.header("connect-timeout-ms", ms.to_string());
        }
        if let Some(user) = user {
            let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            builder = builder.header(hyper::header::AUTHORIZATION, format!("Basic {credentials}"));
        }
        let request = builder
            .body(full(envelope(message)))
            .map_err(|e| ApiError::internal(format!("cannot build the agent request: {e}")))?;
        let response = self.send(request).await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            return Err(connect_error(status, None, &bytes));
        }
        Ok(EnvelopeReader::new(response.into_body()))
    }

    /// Hands a warm pool's sandbox to its creator: from now on the agent gives `env` to every
    /// process it starts, as if the sandbox had been started with it. Once per sandbox.
    pub async fn claim(
        &self,
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let body = serde_json::to_vec(&serde_json::json!({ "env": env }))
            .map_err(|e| ApiError::internal(format!("cannot encode the claim: {e}")))?;
        let request = Request::builder()
            .method(Method::POST)
            .uri("/airlock/claim")
            .header(CONTENT_TYPE, "application/json")
            .body(full(body))
            .map_err(|e| ApiError::internal(format!("cannot build the agent request: {e}")))?;
        let response = self.send(request).await?;
        let status = response.status();
        let bytes = read_limited(response.into_body()).await?;
        if status == StatusCode::NO_CONTENT {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::AgentError,
            format!(
                "the agent refused the claim ({status}): {}",
                String::from_utf8_lossy(&bytes)
            ),
        ))
    }

    /// A Connect unary call with the JSON codec.
    pub async fn unary<T: DeserializeOwned>(
        &self,
        method: &str,
        message: &Value,
    ) -> Result<T, ApiError> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("/{method}"))
            .header(CONTENT_TYPE, "application/json")
            .header("connect-protocol-version", "1")
            .body(full(serde_json::to_vec(message).unwrap_or_default()))
            .map_err(|e| ApiError::internal(format!("cannot build the agent request: {e}")))?;
        let response = self.send(request).await?;
        let status = response.status();
        let errno = response
            .headers()
            .get(ERRNO_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = read_limited(response.into_body()).await?;
        if status != StatusCode::OK {
            return Err(connect_error(status, errno.as_deref(), &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                ErrorCode::AgentError,
                format!("the agent's answer to {method} is not valid JSON: {e}"),
            )
        })
    }
}

async fn read_limited(body: Incoming) -> Result<Bytes, ApiError> {
    http_body_util::Limited::new(body, MAX_MESSAGE_BYTES)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| {
            ApiError::new(
                ErrorCode::AgentError,
                format!("cannot read the agent's answer: {e}"),
            )
        })
}

/// Maps a Connect (or plain envd HTTP) error to ours: by the errno the agent named if it did,
/// else by the Connect code, else by the HTTP status. Only what is left is `agent_error`.
pub fn connect_error(status: StatusCode, errno: Option<&str>, body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let code_name = parsed
        .as_ref()
        .and_then(|v| v.get("code"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let message = parsed
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned());
    let by_errno = errno.and_then(errno_code);
    let code = match (by_errno, code_name.as_deref()) {
        (Some(code), _) => code,
        (None, Some(name)) => connect_code(name),
        (None, None) => match status.as_u16() {
            400 | 415 => ErrorCode::InvalidRequest,
            401 => ErrorCode::Unauthenticated,
            403 => ErrorCode::PermissionDenied,
            404 => ErrorCode::NotFound,
            409 => ErrorCode::Conflict,
            413 => ErrorCode::FileTooLarge,
            507 => ErrorCode::InsufficientStorage,
            _ => ErrorCode::AgentError,
        },
    };
    ApiError::new(code, message)
}

/// The caller's errors among the errnos of file operations; others are the agent's. A file
/// where a directory is wanted (or the reverse) conflicts with what exists: 409.
fn errno_code(errno: &str) -> Option<ErrorCode> {
    match errno {
        "EROFS" => Some(ErrorCode::ReadOnly),
        "EACCES" | "EPERM" => Some(ErrorCode::PermissionDenied),
        "ENOSPC" | "EDQUOT" => Some(ErrorCode::InsufficientStorage),
        "EFBIG" => Some(ErrorCode::FileTooLarge),
        "EISDIR" | "ENOTDIR" | "EEXIST" => Some(ErrorCode::Conflict),
        _ => None,
    }
}

/// Connect error code names to ours.
pub fn connect_code(name: &str) -> ErrorCode {
    match name {
        "not_found" => ErrorCode::NotFound,
        "already_exists" => ErrorCode::Conflict,
        "invalid_argument" | "failed_precondition" | "out_of_range" => ErrorCode::InvalidRequest,
        "permission_denied" => ErrorCode::PermissionDenied,
        "unauthenticated" => ErrorCode::Unauthenticated,
        "deadline_exceeded" => ErrorCode::Timeout,
        "resource_exhausted" => ErrorCode::Unprocessable,
        _ => ErrorCode::AgentError,
    }
}

/// Wraps a JSON message in a Connect envelope (flags 0, big-endian length).
pub fn envelope(message: &Value) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_default();
    let mut out = BytesMut::with_capacity(5 + json.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&json);
    out.freeze()
}

/// One envelope of a Connect stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Envelope {
    Message(Value),
    /// The end-of-stream frame: `None` for success, or the error it carried.
    End(Option<ApiError>),
}

/// Reads envelopes from a streaming response body.
#[derive(Debug)]
pub struct EnvelopeReader {
    body: Incoming,
    buffer: BytesMut,
}

impl EnvelopeReader {
    pub fn new(body: Incoming) -> EnvelopeReader {
        EnvelopeReader {
            body,
            buffer: BytesMut::new(),
        }
    }

    /// The next envelope; `None` at a clean end of the body.
    pub async fn next(&mut self) -> Result<Option<Envelope>, ApiError> {
        loop {
            if let Some(envelope) = self.parse()? {
                return Ok(Some(envelope));
            }
            match self.body.frame().await {
                None if self.buffer.is_empty() => return Ok(None),
                None => return Err(broken("the stream ended inside a message")),
                Some(Err(err)) => return Err(broken(&format!("the stream broke: {err}"))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    fn parse(&mut self) -> Result<Option<Envelope>, ApiError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let flags = self.buffer[0];
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > MAX_MESSAGE_BYTES {
            return Err(broken("the agent sent an oversized message"));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        self.buffer.advance(5);
        let payload = self.buffer.split_to(len);
        if flags & 0x01 != 0 {
            return Err(broken("the agent sent a compressed message"));
        }
        let value: Value = serde_json::from_slice(&payload)
            .map_err(|e| broken(&format!("the agent sent invalid JSON: {e}")))?;
        if flags & 0x02 != 0 {
            let error = value.get("error").map(|err| {
                let code = err.get("code").and_then(Value::as_str).unwrap_or("unknown");
                let message = err.get("message").and_then(Value::as_str).unwrap_or(code);
                ApiError::new(connect_code(code), message)
            });
            return Ok(Some(Envelope::End(error)));
        }
        Ok(Some(Envelope::Message(value)))
    }
}

fn broken(message: &str) -> ApiError {
    ApiError::new(ErrorCode::AgentError, message)
}

/// An envd `EntryInfo` (proto3 JSON: camelCase, 64-bit integers possibly as strings, enum
/// names) as our `FileEntry`.
pub fn file_entry(entry: &Value) -> FileEntry {
    let text = |key: &str| {
        entry
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let number = |key: &str| match entry.get(key) {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        _ => 0,
    };
    let kind = match entry.get("type") {
        Some(Value::String(s)) if s == "FILE_TYPE_FILE" => FileKind::File,
        Some(Value::String(s)) if s == "FILE_TYPE_DIRECTORY" => FileKind::Directory,
        Some(Value::String(s)) if s == "FILE_TYPE_SYMLINK" => FileKind::Symlink,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(1) => FileKind::File,
            Some(2) => FileKind::Directory,
            Some(3) => FileKind::Symlink,
            _ => FileKind::Other,
        },
        _ => FileKind::Other,
    };
    let optional = |a: &str, b: &str| {
        entry
            .get(a)
            .or_else(|| entry.get(b))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    FileEntry {
        name: text("name"),
        path: text("path"),
        kind,
        size_bytes: number("size"),
        mode: u32::try_from(number("mode")).unwrap_or(0),
        permissions: text("permissions"),
        owner: text("owner"),
        group: text("group"),
        modified_time: optional("modifiedTime", "modified_time"),
        symlink_target: optional("symlinkTarget", "symlink_target"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_entries_accept_proto3_json_spellings() {
        let entry = file_entry(&serde_json::json!({
            "name": "a", "type": "FILE_TYPE_DIRECTORY", "path": "/workspace/a",
            "size": "4096", "mode": 2147484141u64, "permissions": "drwxr-xr-x",
            "owner": "root", "group": "root", "modifiedTime": "2026-01-01T00:00:00Z"
        }));
        assert_eq!(entry.kind, FileKind::Directory);
        assert_eq!(entry.size_bytes, 4096);
        assert_eq!(entry.modified_time.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(
            file_entry(&serde_json::json!({"type": 1})).kind,
            FileKind::File
        );
    }

    #[test]
    fn test_connect_errors_map_to_stable_codes() {
        let err = connect_error(
            StatusCode::NOT_FOUND,
            None,
            br#"{"code":"not_found","message":"no file"}"#,
        );
        assert_eq!(err, ApiError::new(ErrorCode::NotFound, "no file"));
        let err = connect_error(
            StatusCode::CONFLICT,
            None,
            br#"{"code":"already_exists","message":"x"}"#,
        );
        assert_eq!(err.code, ErrorCode::Conflict);
        let err = connect_error(StatusCode::NOT_FOUND, None, b"plain text");
        assert_eq!(err, ApiError::new(ErrorCode::NotFound, "plain text"));
        let err = connect_error(
            StatusCode::BAD_REQUEST,
            None,
            br#"{"code":400,"message":"is a dir"}"#,
        );
        assert_eq!(err, ApiError::new(ErrorCode::InvalidRequest, "is a dir"));
        // The errno wins over Connect's coarser code and envd's status.
        let code = |status, errno, body: &[u8]| connect_error(status, errno, body).code;
        let denied = br#"{"code":"permission_denied","message":"x"}"#;
        assert_eq!(
            code(StatusCode::FORBIDDEN, Some("EROFS"), denied),
            ErrorCode::ReadOnly
        );
        assert_eq!(
            code(StatusCode::FORBIDDEN, Some("EACCES"), denied),
            ErrorCode::PermissionDenied
        );
        let full = br#"{"code":507,"message":"x"}"#;
        assert_eq!(
            code(StatusCode::INSUFFICIENT_STORAGE, Some("EDQUOT"), full),
            ErrorCode::InsufficientStorage
        );
        assert_eq!(
            code(StatusCode::INSUFFICIENT_STORAGE, None, full),
            ErrorCode::InsufficientStorage
        );
        assert_eq!(
            code(StatusCode::PAYLOAD_TOO_LARGE, Some("EFBIG"), b"{}"),
            ErrorCode::FileTooLarge
        );
        // An errno that is no caller's mistake leaves the agent's failure a 502.
        assert_eq!(
            code(StatusCode::INTERNAL_SERVER_ERROR, Some("EIO"), b"{}"),
            ErrorCode::AgentError
        );
    }

    #[test]
    fn test_envelope_layout() {
        let bytes = envelope(&serde_json::json!({}));
        assert_eq!(&bytes[..], &[0, 0, 0, 0, 2, b'{', b'}']);
    }
}
