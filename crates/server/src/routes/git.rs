//! `/v1` pushes and pull requests of repository sandboxes (`lifecycle::git`), and their
//! entries in the route table.

use airlock_api::v1::{self, GitPushRequest, PullRequestRequest};
use hyper::{Method, Response, StatusCode};
use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::{Access, Ctx, Handler, Payload, Route};
use crate::error::ApiError;
use crate::http::{Body, json_response};

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

pub const PUSH: Route = Route {
    method: Some(Method::POST),
    path: "/v1/sandboxes/{id}/git/push",
    handler: Handler::GitPush,
    access: Access::Sandbox,
    summary: "Push a repository sandbox's branch, from inside it and through its egress proxy (the proxy lets pushes change that branch alone). 409 if the sandbox has no repository or no such branch, or the remote refuses a non-fast-forward; 403 if the push is refused.",
    query: &[],
    request: Payload::OptionalJson(schema::<v1::GitPushRequest>),
    success: 200,
    response: Payload::Json(schema::<v1::GitPushResult>),
    errors: &[400, 403, 404, 409, 413, 422],
};

pub const PULL_REQUEST: Route = Route {
    method: Some(Method::POST),
    path: "/v1/sandboxes/{id}/git/pull-request",
    handler: Handler::PullRequest,
    access: Access::ApiKey,
    summary: "Push a repository sandbox's branch, then open a pull request from it on the daemon's forge (--forge-api), with the forge token held on the host. 422 without a forge or for a repository of another host; 409 if the forge refuses it (a pull request exists, no commits); 502 forge_error if the forge fails.",
    query: &[],
    request: Payload::Json(schema::<v1::PullRequestRequest>),
    success: 201,
    response: Payload::Json(schema::<v1::PullRequest>),
    errors: &[400, 403, 404, 409, 413, 422, 502],
};

pub async fn push(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: GitPushRequest = ctx.json().await?;
    let pushed = ctx.daemon.git_push(&ctx.id, &request).await?;
    Ok(json_response(StatusCode::OK, &pushed))
}

pub async fn pull_request(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: PullRequestRequest = ctx.json().await?;
    if request.title.is_empty() || request.title.chars().count() > 1024 {
        return Err(ApiError::invalid("title must be 1 to 1024 characters"));
    }
    if request
        .body
        .as_ref()
        .is_some_and(|b| b.chars().count() > 65536)
    {
        return Err(ApiError::invalid("body must be at most 65536 characters"));
    }
    let texts = [Some(&request.title), request.body.as_ref()];
    if texts.into_iter().flatten().any(|t| t.contains('\0')) {
        return Err(ApiError::invalid("title and body may not contain NUL"));
    }
    let opened = ctx.daemon.pull_request(&ctx.id, &request).await?;
    Ok(json_response(StatusCode::CREATED, &opened))
}
