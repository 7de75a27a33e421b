//! `POST /v1/sandboxes/{id}/eval`: one snippet in a fresh isolate of a wasm-tier sandbox
//! (`lifecycle/wasm.rs`). The answer is 200 whenever the worker answered, an error of the code
//! included (`error.kind` says which); HTTP errors are the daemon's own.

use airlock_api::v1::{EvalRequest, MAX_EVAL_TIMEOUT_MS};
use hyper::{Response, StatusCode};

use super::Ctx;
use crate::error::ApiError;
use crate::http::{Body, json_response};

pub async fn eval(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: EvalRequest = ctx.json().await?;
    if let Some(timeout_ms) = request.timeout_ms
        && !(1..=MAX_EVAL_TIMEOUT_MS).contains(&timeout_ms)
    {
        return Err(ApiError::invalid(format!(
            "timeout_ms must be 1..={MAX_EVAL_TIMEOUT_MS}, not {timeout_ms}"
        )));
    }
    if let Some(context) = &request.context_id
        && !airlock_api::v1::valid_context_id(context)
    {
        return Err(ApiError::invalid(
            "context_id must be 1 to 64 of A-Z a-z 0-9 _ . -",
        ));
    }
    let answer = ctx.daemon.eval(&ctx.id, &request).await?;
    ctx.daemon.audit_eval(&ctx.id, &request, &answer);
    Ok(json_response(StatusCode::OK, &answer))
}
