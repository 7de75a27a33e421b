//! A typed async client for the `/v1` API (used by the CLI, the benchmark and the tests).
//!
//! One TCP connection per call keeps it simple and makes concurrent calls independent.
//! Exec output and file downloads stream; uploads stream from any `AsyncRead`.

use std::collections::BTreeMap;

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{
    Approval, ApprovalDecision, ApprovalList, CreateSandboxRequest, CreateSandboxResponse,
    CreateSnapshotRequest, DecideApprovalRequest, ErrorBody, ErrorCode, ExecEvent, ExecRequest,
    FileEntry, FileList, Fork, ForkRequest, ForkResponse, GitPushRequest, GitPushResult, Health,
    LspRequest, LspServer, MkdirRequest, MoveRequest, PauseMode, PauseRequest, PolicyApplied,
    PoolRequest, PoolStatus, PullRequest, PullRequestRequest, ResumeRequest, Sandbox,
    SandboxEvents, SandboxList, SandboxLogs, SandboxState, SetTimeoutRequest, Snapshot,
    SnapshotList, TemplateList,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::{Body, ChannelBody, empty, encode_query_value, full};

mod templates;
pub use templates::Lines;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("unsupported base URL {0:?}: expected http://HOST:PORT")]
    BadUrl(String),
    #[error("cannot connect to airlockd at {0}")]
    Connect(String, #[source] std::io::Error),
    #[error("HTTP exchange with airlockd failed")]
    Http(#[source] hyper::Error),
    #[error("airlockd answered {status} {}: {message}", code.as_str())]
    Api {
        status: u16,
        code: ErrorCode,
        message: String,
    },
    #[error("unexpected answer from airlockd: {0}")]
    Protocol(String),
    #[error("local I/O failed")]
    Io(#[source] std::io::Error),
}

impl ClientError {
    /// The API error code, if the daemon answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    /// `host:port`.
    authority: String,
    api_key: Option<String>,
    access_token: Option<String>,
}

/// The collected result of a command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub pid: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    /// The OOM killer ended a process of the sandbox while the command ran.
    pub oom_killed: bool,
}

impl Client {
    /// `base_url` is `http://HOST:PORT` (a trailing `/` is fine).
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Client, ClientError> {
        let authority = base_url
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .ok_or_else(|| ClientError::BadUrl(base_url.to_owned()))?;
        Ok(Client {
            authority: authority.to_owned(),
            api_key,
            access_token: None,
        })
    }

    /// The same client, also sending a sandbox's access token (data-plane calls).
    pub fn with_access_token(&self, token: Option<String>) -> Client {
        Client {
            access_token: token,
            ..self.clone()
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// Sends any request and returns the raw response (streaming body).
    pub async fn send(
        &self,
        mut request: Request<Body>,
    ) -> Result<Response<Incoming>, ClientError> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| ClientError::Connect(self.authority.clone(), e))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Http)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let headers = request.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&self.authority) {
            headers.insert(HOST, host);
        }
        for (name, value) in [
            ("x-api-key", &self.api_key),
            ("x-access-token", &self.access_token),
        ] {
            if let Some(value) = value
                && !headers.contains_key(name)
                && let Ok(value) = HeaderValue::from_str(value)
            {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        sender
            .send_request(request)
            .await
            .map_err(ClientError::Http)
    }

    /// Sends a request with a buffered body; returns status, headers and the whole answer.
    pub async fn raw(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), ClientError> {
        let mut builder = Request::builder().method(method).uri(path_and_query);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder
            .body(full(body.into()))
            .map_err(|e| ClientError::Protocol(format!("bad request: {e}")))?;
        let response = self.send(request).await?;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.map_err(ClientError::Http)?.to_bytes();
        Ok((parts.status, parts.headers, bytes))
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let response = self.call_raw(method, path, body).await?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(ClientError::Http)?
            .to_bytes();
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("cannot decode the answer to {path}: {e}")))
    }

    async fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut builder = Request::builder().method(method).uri(path);
        let body = match body {
            Some(value) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                full(serde_json::to_vec(value).map_err(|e| ClientError::Protocol(e.to_string()))?)
            }
            None => empty(),
        };
        let request = builder
            .body(body)
            .map_err(|e| ClientError::Protocol(format!("bad request: {e}")))?;
        checked(self.send(request).await?).await
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call(Method::GET, "/v1/health", None::<&()>).await
    }

    pub async fn templates(&self) -> Result<TemplateList, ClientError> {
        self.call(Method::GET, "/v1/templates", None::<&()>).await
    }

    pub async fn create(
        &self,
        request: &CreateSandboxRequest,
    ) -> Result<CreateSandboxResponse, ClientError> {
        self.call(Method::POST, "/v1/sandboxes", Some(request))
            .await
    }

    /// A template's warm pool.
    pub async fn pool(&self, template: &str) -> Result<PoolStatus, ClientError> {
        let path = format!("/v1/templates/{}/pool", encode_query_value(template));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Sets a template's warm-pool size (0 removes the pool).
    pub async fn set_pool(&self, template: &str, size: u32) -> Result<PoolStatus, ClientError> {
        let path = format!("/v1/templates/{}/pool", encode_query_value(template));
        self.call(Method::PUT, &path, Some(&PoolRequest { size }))
            .await
    }

    /// Sandboxes in `states` (all when empty) whose metadata contains every pair given.
    pub async fn list(
        &self,
        states: &[SandboxState],
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<Sandbox>, ClientError> {
        self.list_including(states, metadata, false).await
    }

    /// [`Client::list`], with the unclaimed members of warm pools when `pool`.
    pub async fn list_including(
        &self,
        states: &[SandboxState],
        metadata: &BTreeMap<String, String>,
        pool: bool,
    ) -> Result<Vec<Sandbox>, ClientError> {
        let mut query = Vec::new();
        if pool {
            query.push("include=pool".to_owned());
        }
        if !states.is_empty() {
            let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
            query.push(format!("state={}", names.join(",")));
        }
        for (key, value) in metadata {
            query.push(format!(
                "metadata.{}={}",
                encode_query_value(key),
                encode_query_value(value)
            ));
        }
        let path = if query.is_empty() {
            "/v1/sandboxes".to_owned()
        } else {
            format!("/v1/sandboxes?{}", query.join("&"))
        };
        let list: SandboxList = self.call(Method::GET, &path, None::<&()>).await?;
        Ok(list.sandboxes)
    }

    pub async fn get(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.call(Method::GET, &format!("/v1/sandboxes/{id}"), None::<&()>)
            .await
    }

    /// One computer-use action on the sandbox's display.
    pub async fn computer(
        &self,
        id: &str,
        action: &airlock_api::v1::ComputerAction,
    ) -> Result<airlock_api::v1::ComputerResult, ClientError> {
        let path = format!("/v1/sandboxes/{id}/computer");
        self.call(Method::POST, &path, Some(action)).await
    }

    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        self.call_raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None::<&()>)
            .await
            .map(drop)
    }

    pub async fn set_timeout(&self, id: &str, timeout_ms: u64) -> Result<Sandbox, ClientError> {
        let body = SetTimeoutRequest { timeout_ms };
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/timeout"),
            Some(&body),
        )
        .await
    }

    /// Evaluates a snippet in a wasm-tier sandbox (templates `wasm-js`, `wasm-python`).
    pub async fn eval(
        &self,
        id: &str,
        request: &airlock_api::v1::EvalRequest,
    ) -> Result<airlock_api::v1::EvalResponse, ClientError> {
        let path = format!("/v1/sandboxes/{id}/eval");
        self.call(Method::POST, &path, Some(request)).await
    }

    /// Pauses a running sandbox (409 `sandbox_paused` if it already is).
    pub async fn pause(&self, id: &str, mode: PauseMode) -> Result<Sandbox, ClientError> {
        let path = format!("/v1/sandboxes/{id}/pause");
        self.call(Method::POST, &path, Some(&PauseRequest { mode }))
            .await
    }

    /// Resumes a paused sandbox (a running one only gets its deadline extended).
    pub async fn resume(&self, id: &str, timeout_ms: Option<u64>) -> Result<Sandbox, ClientError> {
        let path = format!("/v1/sandboxes/{id}/resume");
        self.call(Method::POST, &path, Some(&ResumeRequest { timeout_ms }))
            .await
    }

    /// Pushes a repository sandbox's branch (from inside it, through its proxy).
    pub async fn git_push(&self, id: &str, force: bool) -> Result<GitPushResult, ClientError> {
        let path = format!("/v1/sandboxes/{id}/git/push");
        self.call(Method::POST, &path, Some(&GitPushRequest { force }))
            .await
    }

    /// Pushes a repository sandbox's branch and opens a pull request on the daemon's forge.
    pub async fn pull_request(
        &self,
        id: &str,
        request: &PullRequestRequest,
    ) -> Result<PullRequest, ClientError> {
        let path = format!("/v1/sandboxes/{id}/git/pull-request");
        self.call(Method::POST, &path, Some(request)).await
    }

    /// Starts a language server in the sandbox; speak to it at its `websocket_path`.
    pub async fn start_lsp(
        &self,
        id: &str,
        request: &LspRequest,
    ) -> Result<LspServer, ClientError> {
        let path = format!("/v1/sandboxes/{id}/lsp");
        self.call(Method::POST, &path, Some(request)).await
    }

    pub async fn snapshot(&self, id: &str, name: Option<String>) -> Result<Snapshot, ClientError> {
        let path = format!("/v1/sandboxes/{id}/snapshots");
        self.call(Method::POST, &path, Some(&CreateSnapshotRequest { name }))
            .await
    }

    pub async fn snapshots(&self) -> Result<Vec<Snapshot>, ClientError> {
        let list: SnapshotList = self.call(Method::GET, "/v1/snapshots", None::<&()>).await?;
        Ok(list.snapshots)
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/snapshots/{}", encode_query_value(id));
        self.call_raw(Method::DELETE, &path, None::<&()>)
            .await
            .map(drop)
    }

    pub async fn fork(&self, id: &str, request: &ForkRequest) -> Result<Vec<Fork>, ClientError> {
        let path = format!("/v1/sandboxes/{id}/fork");
        let answer: ForkResponse = self.call(Method::POST, &path, Some(request)).await?;
        Ok(answer.forks)
    }

    pub async fn logs(&self, id: &str) -> Result<SandboxLogs, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/logs"),
            None::<&()>,
        )
        .await
    }

    /// The sandbox's audit lines and lifecycle events at or after `since_ms`, oldest first.
    pub async fn events(
        &self,
        id: &str,
        since_ms: Option<u64>,
        limit: Option<usize>,
    ) -> Result<SandboxEvents, ClientError> {
        let mut query = Vec::new();
        if let Some(since_ms) = since_ms {
            query.push(format!("since_ms={since_ms}"));
        }
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        let mut path = format!("/v1/sandboxes/{id}/events");
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Replaces a `proxy`-mode sandbox's network, credentials and approvals. A change that
    /// needs review is refused (409 `conflict`, listing the findings) unless `approve`.
    pub async fn apply_policy(
        &self,
        id: &str,
        policy: &PolicyDocument,
        approve: bool,
    ) -> Result<PolicyApplied, ClientError> {
        let path = format!("/v1/sandboxes/{id}/policy?approve={approve}");
        self.call(Method::PUT, &path, Some(policy)).await
    }

    /// Requests held for approval, of every sandbox or of one.
    pub async fn approvals(&self, sandbox: Option<&str>) -> Result<Vec<Approval>, ClientError> {
        let path = match sandbox {
            Some(id) => format!("/v1/approvals?sandbox={}", encode_query_value(id)),
            None => "/v1/approvals".to_owned(),
        };
        let list: ApprovalList = self.call(Method::GET, &path, None::<&()>).await?;
        Ok(list.approvals)
    }

    /// Answers a held request.
    pub async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
    ) -> Result<(), ClientError> {
        let body = DecideApprovalRequest { decision };
        self.call_raw(
            Method::POST,
            &format!("/v1/approvals/{}", encode_query_value(approval_id)),
            Some(&body),
        )
        .await
        .map(drop)
    }

    /// Starts a command; read its events from the stream.
    pub async fn exec(&self, id: &str, request: &ExecRequest) -> Result<ExecStream, ClientError> {
        let response = self
            .call_raw(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(request),
            )
            .await?;
        Ok(ExecStream {
            body: response.into_body(),
            buffer: BytesMut::new(),
        })
    }

    /// Runs a command to its end and collects its output.
    pub async fn exec_collect(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> Result<ExecOutput, ClientError> {
        let mut stream = self.exec(id, request).await?;
        let mut output = ExecOutput::default();
        while let Some(event) = stream.next_event().await? {
            match event {
                ExecEvent::Start { pid } => output.pid = pid,
                ExecEvent::Stdout { data_base64 } => output.stdout.extend(decode(&data_base64)?),
                ExecEvent::Stderr { data_base64 } => output.stderr.extend(decode(&data_base64)?),
                ExecEvent::Exit {
                    exit_code,
                    exited,
                    status,
                    oom_killed,
                } => {
                    output.exit_code = exit_code;
                    output.exited = exited;
                    output.status = status;
                    output.oom_killed = oom_killed;
                    return Ok(output);
                }
                ExecEvent::Error { code, message } => {
                    return Err(ClientError::Api {
                        status: 200,
                        code,
                        message,
                    });
                }
            }
        }
        Err(ClientError::Protocol(
            "the exec stream ended without an exit event".into(),
        ))
    }

    fn file_path(id: &str, op: &str, path: &str) -> String {
        format!(
            "/v1/sandboxes/{id}/files{op}?path={}",
            encode_query_value(path)
        )
    }

    /// Starts a download; read it with [`Download::chunk`] or [`Download::copy_to`].
    pub async fn download(&self, id: &str, path: &str) -> Result<Download, ClientError> {
        let response = self
            .call_raw(Method::GET, &Self::file_path(id, "", path), None::<&()>)
            .await?;
        Ok(Download {
            body: response.into_body(),
        })
    }

    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut download = self.download(id, path).await?;
        let mut out = Vec::new();
        while let Some(chunk) = download.chunk().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// Streams `reader` into the file at `path` (created or replaced). `length`, when known,
    /// is sent as Content-Length so that an oversized upload is refused before it starts.
    pub async fn upload<R>(
        &self,
        id: &str,
        path: &str,
        reader: R,
        length: Option<u64>,
    ) -> Result<FileEntry, ClientError>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        self.put_stream(Method::PUT, &Self::file_path(id, "", path), reader, length)
            .await
    }

    /// Streams `reader` as the body of `method uri` (Content-Length when `length` is known);
    /// decodes the JSON answer.
    pub(crate) async fn put_stream<R, T>(
        &self,
        method: Method,
        uri: &str,
        mut reader: R,
        length: Option<u64>,
    ) -> Result<T, ClientError>
    where
        R: AsyncRead + Send + Unpin + 'static,
        T: DeserializeOwned,
    {
        let (tx, body) = ChannelBody::new(4);
        tokio::spawn(async move {
            loop {
                let mut chunk = BytesMut::with_capacity(256 << 10);
                match reader.read_buf(&mut chunk).await {
                    Ok(0) => return,
                    Ok(_) => {
                        if tx.send(Ok(chunk.freeze())).await.is_err() {
                            return;
                        }
                    }
                    Err(err) => {
                        let _ = tx.send(Err(err.into())).await;
                        return;
                    }
                }
            }
        });
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(CONTENT_TYPE, "application/octet-stream");
        if let Some(length) = length {
            builder = builder.header(CONTENT_LENGTH, length);
        }
        let request = builder
            .body(body.boxed_unsync())
            .map_err(|e| ClientError::Protocol(format!("bad request: {e}")))?;
        let response = checked(self.send(request).await?).await?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(ClientError::Http)?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: impl Into<Bytes>,
    ) -> Result<FileEntry, ClientError> {
        let data: Bytes = data.into();
        let length = data.len() as u64;
        self.upload(id, path, std::io::Cursor::new(data), Some(length))
            .await
    }

    pub async fn list_dir(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<FileList, ClientError> {
        let uri = format!("{}&depth={depth}", Self::file_path(id, "/list", path));
        self.call(Method::GET, &uri, None::<&()>).await
    }

    pub async fn stat(&self, id: &str, path: &str) -> Result<FileEntry, ClientError> {
        self.call(
            Method::GET,
            &Self::file_path(id, "/stat", path),
            None::<&()>,
        )
        .await
    }

    pub async fn mkdir(&self, id: &str, path: &str) -> Result<FileEntry, ClientError> {
        let body = MkdirRequest {
            path: path.to_owned(),
        };
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/files/mkdir"),
            Some(&body),
        )
        .await
    }

    pub async fn rename(
        &self,
        id: &str,
        source: &str,
        destination: &str,
    ) -> Result<FileEntry, ClientError> {
        let body = MoveRequest {
            source: source.to_owned(),
            destination: destination.to_owned(),
        };
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/files/move"),
            Some(&body),
        )
        .await
    }

    pub async fn remove(&self, id: &str, path: &str) -> Result<(), ClientError> {
        self.call_raw(Method::DELETE, &Self::file_path(id, "", path), None::<&()>)
            .await
            .map(drop)
    }
}

fn decode(data: &str) -> Result<Vec<u8>, ClientError> {
    BASE64
        .decode(data)
        .map_err(|e| ClientError::Protocol(format!("output is not base64: {e}")))
}

/// Turns a non-2xx answer into `ClientError::Api`.
async fn checked(response: Response<Incoming>) -> Result<Response<Incoming>, ClientError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let bytes = http_body_util::Limited::new(response.into_body(), 1 << 20)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(body) => Err(ClientError::Api {
            status: status.as_u16(),
            code: body.code,
            message: body.message,
        }),
        Err(_) => Err(ClientError::Protocol(format!(
            "status {status} with body {:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))),
    }
}

/// The NDJSON events of a running command.
#[derive(Debug)]
pub struct ExecStream {
    body: Incoming,
    buffer: BytesMut,
}

impl ExecStream {
    /// The next event; `None` when the stream ends.
    pub async fn next_event(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        loop {
            if let Some(newline) = self.buffer.iter().position(|&b| b == b'\n') {
                let line = self.buffer.split_to(newline + 1);
                let event = serde_json::from_slice(&line[..newline])
                    .map_err(|e| ClientError::Protocol(format!("bad exec event: {e}")))?;
                return Ok(Some(event));
            }
            match self.body.frame().await {
                None if self.buffer.is_empty() => return Ok(None),
                None => {
                    return Err(ClientError::Protocol(
                        "the exec stream ended mid-line".into(),
                    ));
                }
                Some(Err(err)) => return Err(ClientError::Http(err)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// A file being downloaded.
#[derive(Debug)]
pub struct Download {
    body: Incoming,
}

impl Download {
    /// The next chunk; `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(err)) => return Err(ClientError::Http(err)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// Copies the rest of the file into `writer`; returns the bytes copied.
    pub async fn copy_to<W: AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
    ) -> Result<u64, ClientError> {
        let mut total = 0u64;
        while let Some(chunk) = self.chunk().await? {
            writer.write_all(&chunk).await.map_err(ClientError::Io)?;
            total += chunk.len() as u64;
        }
        writer.flush().await.map_err(ClientError::Io)?;
        Ok(total)
    }
}
