//! `POST /v1/sandboxes/{id}/computer`: one screen, mouse, keyboard or clipboard action
//! (`lifecycle::computer` runs it).

use airlock_api::v1;
use hyper::{Method, Response, StatusCode};

use super::Ctx;
use super::{Access, Handler, Payload, Route};
use crate::error::ApiError;
use crate::http::{Body, json_response};

fn schema<T: schemars::JsonSchema>(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    generator.subschema_for::<T>()
}

pub const ACT: Route = Route {
    method: Some(Method::POST),
    path: "/v1/sandboxes/{id}/computer",
    handler: Handler::Computer,
    access: Access::Sandbox,
    summary: "One computer-use action on the sandbox's X display (the desktop template's): screenshot (a PNG), click, double_click, move, drag, scroll, type, key, cursor_position, screen_size, clipboard_get, clipboard_set. The first action starts Xvfb at metadata.resolution when no X server runs.",
    query: &[],
    request: Payload::Json(schema::<v1::ComputerAction>),
    success: 200,
    response: Payload::Json(schema::<v1::ComputerResult>),
    errors: &[400, 404, 409, 413, 422],
};

pub async fn act(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let action: v1::ComputerAction = ctx.json().await?;
    let result = ctx.daemon.computer(&ctx.id, &action).await?;
    Ok(json_response(StatusCode::OK, &result))
}
