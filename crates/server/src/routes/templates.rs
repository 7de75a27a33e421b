//! `/v1/templates`, `/v1/builds` and the file contexts of `COPY` steps
//! (`/v1/template-files`, and E2B's one-time `/v1/uploads`).

use std::time::Duration;

use airlock_api::v1::{BuildTemplateRequest, ErrorCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Response, StatusCode};

use super::Ctx;
use crate::error::ApiError;
use crate::http::{Body, ChannelBody, NDJSON, json_response, no_content, path_decode, with_type};

/// Log lines read from the store at once.
const LOG_PAGE: u64 = 500;

pub async fn build(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: BuildTemplateRequest = ctx.json().await?;
    let build = ctx.daemon.build_template(request)?;
    Ok(json_response(StatusCode::ACCEPTED, &build))
}

pub fn get(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let template = ctx.daemon.template(&path_decode(&ctx.id))?;
    Ok(json_response(StatusCode::OK, &template))
}

pub fn delete(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    ctx.daemon.delete_template(&path_decode(&ctx.id))?;
    Ok(no_content())
}

pub fn get_build(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let build = ctx.daemon.get_build(&path_decode(&ctx.id))?;
    Ok(json_response(StatusCode::OK, &build))
}

pub fn logs(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let (mut offset, mut follow) = (0u64, false);
    for (key, value) in ctx.query() {
        match key.as_str() {
            "offset" => {
                offset = value.parse().map_err(|_| {
                    ApiError::invalid(format!("offset must be a whole number, got {value:?}"))
                })?;
            }
            "follow" => {
                follow = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::invalid(format!(
                            "follow must be true or false, got {other:?}"
                        )));
                    }
                }
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} (offset, follow)"
                )));
            }
        }
    }
    let id = path_decode(&ctx.id);
    ctx.daemon.get_build(&id)?;
    let daemon = ctx.daemon.clone();
    let (tx, body) = ChannelBody::new(32);
    tokio::spawn(async move {
        let mut changes = daemon.builds.subscribe();
        loop {
            // Whether it had finished before this read: then the read saw its last line.
            let finished = daemon.get_build(&id).map_or(true, |b| b.state.finished());
            loop {
                let Ok(entries) = daemon.build_logs(&id, offset, LOG_PAGE) else {
                    return;
                };
                let full = entries.len() as u64 == LOG_PAGE;
                for entry in entries {
                    offset = entry.offset + 1;
                    let mut line = serde_json::to_vec(&entry).unwrap_or_default();
                    line.push(b'\n');
                    if tx.send(Ok(Bytes::from(line))).await.is_err() {
                        return;
                    }
                }
                if !full {
                    break;
                }
            }
            if !follow || finished {
                return;
            }
            // A change wakes it; the timer only bounds a missed one.
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }
    });
    Ok(with_type(StatusCode::OK, NDJSON, body.boxed_unsync()))
}

fn files_hash(ctx: &Ctx) -> Result<String, ApiError> {
    let hash = path_decode(&ctx.id);
    if crate::templates::files::is_hash(&hash) {
        Ok(hash)
    } else {
        Err(ApiError::invalid(format!(
            "{hash:?} is not a files hash (64 lower-case hex digits)"
        )))
    }
}

pub fn get_files(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let hash = files_hash(ctx)?;
    let files = ctx
        .daemon
        .files(&hash)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no files {hash} uploaded")))?;
    Ok(json_response(StatusCode::OK, &files))
}

pub async fn put_files(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let hash = files_hash(ctx)?;
    let body = ctx.take_body()?;
    let files = ctx.daemon.store_files(&hash, body).await?;
    Ok(json_response(StatusCode::CREATED, &files))
}

/// E2B's upload: the token names the files hash it was issued for, once.
pub async fn upload(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let token = path_decode(&ctx.id);
    let hash = ctx.daemon.take_upload_token(&token).ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            "no such upload URL: it was used already, or it expired",
        )
    })?;
    let body = ctx.take_body()?;
    let files = ctx.daemon.store_files(&hash, body).await?;
    Ok(json_response(StatusCode::CREATED, &files))
}
