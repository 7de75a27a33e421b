//! Files of a sandbox, through its agent (`/files` and `filesystem.Filesystem`).
//!
//! Every path is resolved by the agent inside the sandbox's own mount view, with the
//! sandbox's Landlock rules: `../../etc/shadow` or `/etc/passwd` name files of the sandbox's
//! view (masked or read-only), never the host's. The edge only rejects what cannot be a path
//! (empty, NUL). Uploads and downloads stream in both directions; an upload larger than
//! `--max-upload-bytes` is cut off and answered with 413. An upload the agent refuses (a
//! read-only path, a full disk, the file-size limit) is answered as soon as the agent
//! answers, before the rest of the body arrives, with `Connection: close`; the rest is read
//! away in the background (`http::linger`, bounded) so that the client sees the answer.
//! Write errors are the caller's (`read_only`, `permission_denied`, `file_too_large`,
//! `insufficient_storage`) by the errno the agent names; `agent_error` is left for an agent
//! that failed.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use airlock_api::v1::{FileEntry, FileList, MkdirRequest, MoveRequest};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::Ctx;
use crate::agent::{Agent, connect_error, file_entry};
use crate::error::ApiError;
use crate::http::{
    Body, BoxError, OCTET_STREAM, content_length, empty, encode_query_value, json_response, linger,
    no_content, too_large,
};

/// Checks a path given by a client.
pub fn check_path(name: &str, path: &str) -> Result<(), ApiError> {
    if path.is_empty() {
        return Err(ApiError::invalid(format!("`{name}` must not be empty")));
    }
    if path.contains('\0') {
        return Err(ApiError::invalid(format!("`{name}` contains a NUL byte")));
    }
    Ok(())
}

fn query_param(ctx: &Ctx, name: &str) -> Option<String> {
    ctx.query()
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

fn path_param(ctx: &Ctx) -> Result<String, ApiError> {
    let path = query_param(ctx, "path")
        .ok_or_else(|| ApiError::invalid("the query parameter `path` is required"))?;
    check_path("path", &path)?;
    Ok(path)
}

fn files_uri(path: &str) -> String {
    format!("/files?path={}", encode_query_value(path))
}

pub async fn get(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let path = path_param(ctx)?;
    let agent = ctx.daemon.agent(&ctx.id).await?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(files_uri(&path))
        .body(empty())
        .map_err(|e| ApiError::invalid(format!("bad path: {e}")))?;
    let response = agent.send(request).await?;
    if response.status() != StatusCode::OK {
        return Err(agent_failure(response).await);
    }
    let length = response.headers().get(CONTENT_LENGTH).cloned();
    let mut answer = Response::new(crate::http::boxed(response.into_body()));
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(OCTET_STREAM));
    if let Some(length) = length {
        answer.headers_mut().insert(CONTENT_LENGTH, length);
    }
    Ok(answer)
}

pub async fn put(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let path = path_param(ctx)?;
    let limit = ctx.daemon.config.max_upload_bytes;
    let declared = content_length(&ctx.parts.headers);
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large(limit));
    }
    let agent = ctx.daemon.agent(&ctx.id).await?;
    let tripped = Arc::new(AtomicBool::new(false));
    let body = CappedBody {
        inner: Some(ctx.take_body()?),
        seen: 0,
        limit,
        tripped: tripped.clone(),
    };
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(files_uri(&path))
        .header(CONTENT_TYPE, OCTET_STREAM);
    if let Some(length) = declared {
        builder = builder.header(CONTENT_LENGTH, length);
    }
    let request = builder
        .body(body.boxed_unsync())
        .map_err(|e| ApiError::invalid(format!("bad path: {e}")))?;
    let sent = agent.send_attached(request).await;
    if tripped.load(Ordering::Relaxed) {
        return Err(too_large(limit));
    }
    let (response, connection) = sent?;
    if response.status() != StatusCode::OK {
        // The agent answered early: its answer, then the connection ends, and with it the
        // forwarding of the rest of the client's body (`CappedBody` lingers it, bounded).
        let err = agent_failure(response).await;
        drop(connection);
        return Err(err);
    }
    let _ = response.into_body().collect().await;
    drop(connection);
    Ok(json_response(
        StatusCode::OK,
        &stat_entry(&agent, &path).await?,
    ))
}

async fn agent_failure(response: Response<Incoming>) -> ApiError {
    let status = response.status();
    let errno = crate::proxy::errno_of(&response);
    let body = http_body_util::Limited::new(response.into_body(), 64 << 10)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    connect_error(status, errno.as_deref(), &body)
}

async fn stat_entry(agent: &Agent, path: &str) -> Result<FileEntry, ApiError> {
    let answer: Value = agent
        .unary("filesystem.Filesystem/Stat", &json!({ "path": path }))
        .await?;
    Ok(file_entry(answer.get("entry").unwrap_or(&Value::Null)))
}

pub async fn remove(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let path = path_param(ctx)?;
    let agent = ctx.daemon.agent(&ctx.id).await?;
    agent
        .unary::<Value>("filesystem.Filesystem/Remove", &json!({ "path": path }))
        .await?;
    Ok(no_content())
}

pub async fn list(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let path = path_param(ctx)?;
    let depth = match query_param(ctx, "depth") {
        Some(depth) => depth
            .parse::<u32>()
            .map_err(|_| ApiError::invalid(format!("depth {depth:?} is not a number")))?,
        None => 1,
    };
    let agent = ctx.daemon.agent(&ctx.id).await?;
    let answer: Value = agent
        .unary(
            "filesystem.Filesystem/ListDir",
            &json!({ "path": path, "depth": depth.max(1) }),
        )
        .await?;
    let entries = answer
        .get("entries")
        .and_then(Value::as_array)
        .map(|entries| entries.iter().map(file_entry).collect())
        .unwrap_or_default();
    Ok(json_response(StatusCode::OK, &FileList { entries }))
}

pub async fn stat(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let path = path_param(ctx)?;
    let agent = ctx.daemon.agent(&ctx.id).await?;
    Ok(json_response(
        StatusCode::OK,
        &stat_entry(&agent, &path).await?,
    ))
}

pub async fn mkdir(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: MkdirRequest = ctx.json().await?;
    check_path("path", &request.path)?;
    let agent = ctx.daemon.agent(&ctx.id).await?;
    let answer: Value = agent
        .unary(
            "filesystem.Filesystem/MakeDir",
            &json!({ "path": request.path }),
        )
        .await?;
    let entry = match answer.get("entry") {
        Some(entry) => file_entry(entry),
        None => stat_entry(&agent, &request.path).await?,
    };
    Ok(json_response(StatusCode::CREATED, &entry))
}

pub async fn rename(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: MoveRequest = ctx.json().await?;
    check_path("source", &request.source)?;
    check_path("destination", &request.destination)?;
    let agent = ctx.daemon.agent(&ctx.id).await?;
    let answer: Value = agent
        .unary(
            "filesystem.Filesystem/Move",
            &json!({ "source": request.source, "destination": request.destination }),
        )
        .await?;
    let entry = match answer.get("entry") {
        Some(entry) => file_entry(entry),
        None => stat_entry(&agent, &request.destination).await?,
    };
    Ok(json_response(StatusCode::OK, &entry))
}

/// An upload body that fails once more than `limit` bytes have passed, and says so. The rest
/// of the client's body is then read and dropped in the background (`linger`), so that the
/// client sees the 413 rather than a reset connection; the same happens when the agent stops
/// reading (it refused the upload) and hyper drops this body.
#[derive(Debug)]
struct CappedBody {
    inner: Option<Incoming>,
    seen: u64,
    limit: u64,
    tripped: Arc<AtomicBool>,
}

impl Drop for CappedBody {
    fn drop(&mut self) {
        if let Some(rest) = self.inner.take()
            && !hyper::body::Body::is_end_stream(&rest)
        {
            linger(rest);
        }
    }
}

impl hyper::body::Body for CappedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.seen = self.seen.saturating_add(data.len() as u64);
                    if self.seen > self.limit {
                        self.tripped.store(true, Ordering::Relaxed);
                        if let Some(rest) = self.inner.take() {
                            linger(rest);
                        }
                        return Poll::Ready(Some(Err("the upload exceeds the size limit".into())));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
            other => other.map(|frame| frame.map(|r| r.map_err(Into::into))),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(hyper::body::SizeHint::default, |inner| inner.size_hint())
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|inner| inner.is_end_stream())
    }
}
