//! `/v1` pause, resume, snapshots and forks (the semantics are in `lifecycle::pause`).

use airlock_api::v1::{
    CreateSnapshotRequest, ErrorCode, ForkRequest, ForkResponse, PauseRequest, ResumeRequest,
    SnapshotList,
};
use hyper::{Response, StatusCode};

use super::Ctx;
use crate::error::ApiError;
use crate::http::{Body, json_response, no_content};

pub async fn pause(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: PauseRequest = ctx.json().await?;
    let sandbox = ctx.daemon.pause(&ctx.id, request.mode).await?;
    Ok(json_response(StatusCode::OK, &sandbox))
}

pub async fn resume(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: ResumeRequest = ctx.json().await?;
    if let Some(timeout_ms) = request.timeout_ms {
        ctx.daemon.check_timeout(timeout_ms)?;
    }
    let (sandbox, _) = ctx.daemon.resume(&ctx.id, request.timeout_ms).await?;
    Ok(json_response(StatusCode::OK, &sandbox))
}

pub async fn snapshot(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: CreateSnapshotRequest = ctx.json().await?;
    if let Some(name) = &request.name
        && !valid_name(name)
    {
        return Err(ApiError::invalid(format!(
            "snapshot name {name:?}: 1 to 64 lower-case letters, digits, - and _, starting with a letter or digit"
        )));
    }
    let snapshot = ctx.daemon.snapshot(&ctx.id, request.name).await?;
    Ok(json_response(StatusCode::CREATED, &snapshot))
}

pub async fn fork(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: ForkRequest = ctx.json().await?;
    if let Some(timeout_ms) = request.timeout_ms {
        ctx.daemon.check_timeout(timeout_ms)?;
    }
    let forks = ctx
        .daemon
        .fork(&ctx.id, request.count, request.timeout_ms)
        .await?;
    Ok(json_response(StatusCode::CREATED, &ForkResponse { forks }))
}

pub fn list(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let snapshots = ctx.daemon.list_snapshots()?;
    Ok(json_response(StatusCode::OK, &SnapshotList { snapshots }))
}

pub fn delete(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    if ctx.daemon.delete_snapshot(&ctx.id)? {
        Ok(no_content())
    } else {
        Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no snapshot {:?}", ctx.id),
        ))
    }
}

/// A snapshot name: it names a template too, so it follows template names' rules.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}
