//! `proxy`-mode sandboxes: policy hot reload, approvals and the events (audit) API.

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{ApprovalList, DecideApprovalRequest};
use hyper::{Response, StatusCode};

use super::Ctx;
use crate::error::ApiError;
use crate::http::{Body, json_response, no_content};

/// The default page of `GET .../events`.
const DEFAULT_EVENTS_LIMIT: usize = 1000;

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ApiError> {
    value.parse().map_err(|_| {
        ApiError::invalid(format!("query parameter {key:?} has a bad value {value:?}"))
    })
}

pub async fn events(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let mut since_ms = 0;
    let mut limit = DEFAULT_EVENTS_LIMIT;
    for (key, value) in ctx.query() {
        match key.as_str() {
            "since_ms" => since_ms = parse(&key, &value)?,
            "limit" => limit = parse(&key, &value)?,
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {key:?} (since_ms, limit)"
                )));
            }
        }
    }
    if limit == 0 || limit > crate::audit::MAX_EVENTS_PER_PAGE {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {}",
            crate::audit::MAX_EVENTS_PER_PAGE
        )));
    }
    // Reading the logs (up to twice --audit-max-bytes) is file I/O: off the async workers.
    let (daemon, id) = (ctx.daemon.clone(), ctx.id.clone());
    let events = tokio::task::spawn_blocking(move || daemon.events(&id, since_ms, limit))
        .await
        .map_err(|e| ApiError::internal(format!("the events task failed: {e}")))??;
    Ok(json_response(StatusCode::OK, &events))
}

pub async fn put_policy(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let mut approve = false;
    for (key, value) in ctx.query() {
        match (key.as_str(), value.as_str()) {
            ("approve", "true") => approve = true,
            ("approve", "false") => approve = false,
            ("approve", other) => {
                return Err(ApiError::invalid(format!(
                    "approve must be true or false, not {other:?}"
                )));
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {key:?} (approve)"
                )));
            }
        }
    }
    let value: serde_json::Value = ctx.json().await?;
    if !airlock_api::whole::policy_shape_ok(&value) {
        return Err(ApiError::invalid(
            "invalid JSON body: a policy document's sections, rules and credentials must be objects",
        ));
    }
    let document: PolicyDocument = serde_json::from_value(value)
        .map_err(|err| ApiError::invalid(format!("invalid JSON body: {err}")))?;
    let applied = ctx.daemon.apply_policy(&ctx.id, document, approve).await?;
    Ok(json_response(StatusCode::OK, &applied))
}

pub fn list_approvals(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let mut sandbox = None;
    for (key, value) in ctx.query() {
        if key == "sandbox" {
            sandbox = Some(value);
        } else {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {key:?} (sandbox)"
            )));
        }
    }
    let approvals = ctx.daemon.approvals(sandbox.as_deref())?;
    Ok(json_response(StatusCode::OK, &ApprovalList { approvals }))
}

pub async fn decide_approval(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let plausible = !ctx.id.is_empty()
        && ctx.id.len() <= 128
        && ctx
            .id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !plausible {
        return Err(ApiError::new(
            airlock_api::v1::ErrorCode::NotFound,
            format!("no pending approval {:?}", ctx.id),
        ));
    }
    let request: DecideApprovalRequest = ctx.json().await?;
    ctx.daemon.decide_approval(&ctx.id, request.decision)?;
    Ok(no_content())
}
