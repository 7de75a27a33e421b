//! `/v1` language servers (`crate::lsp`): start one, then speak to it over a WebSocket.

use airlock_api::v1::{self, ErrorCode, LspRequest};
use hyper::header::{CONNECTION, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Response, StatusCode};
use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::{Access, Ctx, Handler, Payload, Route};
use crate::error::ApiError;
use crate::http::{Body, empty, json_response};

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

pub const START: Route = Route {
    method: Some(Method::POST),
    path: "/v1/sandboxes/{id}/lsp",
    handler: Handler::StartLsp,
    access: Access::Sandbox,
    summary: "Start a language server the sandbox has (pylsp, rust-analyzer, typescript-language-server, gopls, or any argv) on the stdio of a process inside it; speak JSON-RPC to it over a WebSocket at websocket_path (one message per frame). 404 if the sandbox has no such program.",
    query: &[],
    request: Payload::Json(schema::<v1::LspRequest>),
    success: 201,
    response: Payload::Json(schema::<v1::LspServer>),
    errors: &[400, 404, 409, 413, 422],
};

pub const SOCKET: Route = Route {
    method: Some(Method::GET),
    path: "/v1/sandboxes/{id}/lsp/{rest}",
    handler: Handler::LspSocket,
    access: Access::Sandbox,
    summary: "The WebSocket of a started language server (Upgrade: websocket; 400 without it, 404 first for an unknown server): each text or binary message is one JSON-RPC message to the server, each message from it one text frame. One client per server; the server ends with its WebSocket. 404 for an unknown or already attached server.",
    query: &[],
    request: Payload::None,
    success: 101,
    response: Payload::None,
    errors: &[400, 404, 409],
};

pub async fn start(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: LspRequest = ctx.json().await?;
    let argv = crate::lsp::command(&request)?;
    let root = request
        .root
        .clone()
        .unwrap_or_else(|| airlock_runtime::git::WORKSPACE.to_owned());
    if !root.starts_with('/') || root.contains('\0') {
        return Err(ApiError::invalid(
            "root must be an absolute path without NUL",
        ));
    }
    let agent = ctx.daemon.agent(&ctx.id).await?;
    let env = ctx.daemon.sandbox_env(&ctx.id)?;
    let server = ctx
        .daemon
        .lsp
        .start(&ctx.id, agent, argv, root, env)
        .await?;
    Ok(json_response(StatusCode::CREATED, &server))
}

fn header_lists(ctx: &Ctx, name: hyper::header::HeaderName, token: &str) -> bool {
    ctx.parts
        .headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| item.trim().eq_ignore_ascii_case(token))
}

fn not_waiting(ctx: &Ctx) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "no language server {} waits in sandbox {} (it has a client, ended, or was never started)",
            ctx.rest, ctx.id
        ),
    )
}

pub fn socket(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    if !ctx.daemon.lsp.waits(&ctx.id, &ctx.rest) {
        return Err(not_waiting(ctx));
    }
    let upgrade =
        header_lists(ctx, CONNECTION, "upgrade") && header_lists(ctx, UPGRADE, "websocket");
    let key = ctx
        .parts
        .headers
        .get(SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (true, Some(key)) = (upgrade, key) else {
        return Err(ApiError::invalid(
            "this is a WebSocket: send Connection: Upgrade, Upgrade: websocket and Sec-WebSocket-Key",
        ));
    };
    let Some(waiting) = ctx.daemon.lsp.take(&ctx.id, &ctx.rest) else {
        return Err(not_waiting(ctx));
    };
    let Some(on_upgrade) = ctx.parts.extensions.remove::<OnUpgrade>() else {
        return Err(ApiError::internal("the connection cannot be upgraded"));
    };
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => crate::lsp::bridge(upgraded, waiting).await,
            Err(_) => crate::lsp::abandon(waiting).await,
        }
    });
    let mut response = Response::new(empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&crate::websocket::accept_key(&key)) {
        headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
    }
    Ok(response)
}
