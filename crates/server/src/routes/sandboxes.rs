//! The control plane of `/v1`: health, templates, and sandbox create, list, get, delete,
//! timeout and logs.

use std::collections::BTreeMap;

use airlock_api::v1::{
    CreateSandboxRequest, Health, PoolRequest, SandboxList, SandboxLogs, SandboxState,
    SetTimeoutRequest, TemplateList,
};
use hyper::{Response, StatusCode};

use super::Ctx;
use crate::error::ApiError;
use crate::http::{Body, json_response, no_content};

pub fn health() -> Response<Body> {
    json_response(
        StatusCode::OK,
        &Health {
            status: "ok".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        },
    )
}

pub fn list_templates(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let templates = ctx.daemon.store.list_templates()?;
    Ok(json_response(StatusCode::OK, &TemplateList { templates }))
}

pub fn get_pool(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    Ok(json_response(
        StatusCode::OK,
        &ctx.daemon.pool_status(&ctx.id)?,
    ))
}

pub async fn set_pool(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: PoolRequest = ctx.json().await?;
    let status = ctx.daemon.set_pool(&ctx.id, request.size).await?;
    Ok(json_response(StatusCode::OK, &status))
}

pub async fn create(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: CreateSandboxRequest = ctx.json().await?;
    let created = ctx.daemon.create(request).await?;
    Ok(json_response(StatusCode::CREATED, &created))
}

pub fn list(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let mut states = Vec::new();
    let mut metadata = BTreeMap::new();
    let mut pool = false;
    for (key, value) in ctx.query() {
        if key == "state" {
            for state in value.split(',') {
                states.push(match state {
                    "creating" => SandboxState::Creating,
                    "running" => SandboxState::Running,
                    "paused" => SandboxState::Paused,
                    other => {
                        return Err(ApiError::invalid(format!(
                            "unknown state {other:?} (creating, running, paused)"
                        )));
                    }
                });
            }
        } else if key == "include" {
            for part in value.split(',') {
                match part {
                    "pool" => pool = true,
                    other => {
                        return Err(ApiError::invalid(format!(
                            "unknown include {other:?} (pool: also the unclaimed members of warm pools)"
                        )));
                    }
                }
            }
        } else if let Some(meta_key) = key.strip_prefix("metadata.") {
            metadata.insert(meta_key.to_owned(), value);
        } else {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {key:?} (state, include, metadata.KEY)"
            )));
        }
    }
    let mut sandboxes = ctx.daemon.list(&states, &metadata)?;
    if pool {
        sandboxes.extend(ctx.daemon.pool_views().into_iter().filter(|s| {
            (states.is_empty() || states.contains(&s.state))
                && metadata.iter().all(|(k, v)| s.metadata.get(k) == Some(v))
        }));
    }
    Ok(json_response(StatusCode::OK, &SandboxList { sandboxes }))
}

pub fn get(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    Ok(json_response(StatusCode::OK, &ctx.daemon.get(&ctx.id)?))
}

pub async fn delete(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    ctx.daemon.delete(&ctx.id).await?;
    Ok(no_content())
}

pub async fn set_timeout(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: SetTimeoutRequest = ctx.json().await?;
    let sandbox = ctx.daemon.set_timeout(&ctx.id, request.timeout_ms)?;
    Ok(json_response(StatusCode::OK, &sandbox))
}

pub fn logs(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let (events, agent_log) = ctx.daemon.logs(&ctx.id)?;
    Ok(json_response(
        StatusCode::OK,
        &SandboxLogs { events, agent_log },
    ))
}
