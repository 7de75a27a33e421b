//! `api/openapi.json`, generated from the route table and the wire types' JSON Schemas.
//!
//! Regenerate with `airlockd openapi > api/openapi.json`, or run the drift test with
//! `AIRLOCK_UPDATE_OPENAPI=1`. The test fails whenever the committed file differs.

use airlock_api::v1::{self, ErrorBody};
use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::error::CAPACITY_RETRY_AFTER_SECONDS;
use crate::routes::{Access, Handler, Payload, QueryValue, ROUTES, Route};

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted: it goes on in the background",
        204 => "No content",
        400 => "Malformed request (`invalid_request`)",
        401 => "Missing or wrong credentials (`unauthenticated`)",
        403 => {
            "Refused: a read-only path (`read_only`), or one the sandbox or the daemon does not permit (`permission_denied`)"
        }
        404 => "No such sandbox, route, template or file (`not_found`)",
        405 => "Method not allowed (`method_not_allowed`)",
        409 => {
            "Conflicts with the current state (`conflict`), or the sandbox is being removed (`sandbox_stopping`)"
        }
        413 => {
            "Body larger than the configured cap (`payload_too_large`), or a file past the sandbox's file-size limit (`file_too_large`)"
        }
        422 => "Well-formed but impossible (`unprocessable`)",
        500 => "Daemon or host failure (`internal`)",
        502 => "The sandbox's agent failed (`agent_error`)",
        503 => "At the daemon's cap on sandboxes (`capacity`); retry after Retry-After seconds",
        504 => {
            "Timed out (`timeout`): for a create, the template's ready check did not pass in time"
        }
        507 => "The sandbox's disk is full (`insufficient_storage`)",
        _ => "Other",
    }
}

/// The Connect protocol's error body, which the envd pass-through's RPCs answer with.
fn connect_error_schema() -> Value {
    json!({
        "description": "A Connect RPC's error (the Connect protocol's JSON error body).",
        "type": "object",
        "required": ["code"],
        "properties": {
            "code": {
                "type": "string",
                "enum": [
                    "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found",
                    "already_exists", "permission_denied", "resource_exhausted",
                    "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal",
                    "unavailable", "data_loss", "unauthenticated"
                ]
            },
            "message": { "type": "string" },
            "details": { "type": "array" }
        }
    })
}

fn query_schema(value: QueryValue) -> Value {
    match value {
        QueryValue::Path => json!({ "type": "string", "pattern": v1::NON_EMPTY_NO_NUL }),
        QueryValue::Text => json!({ "type": "string" }),
        QueryValue::Bool => json!({ "type": "boolean" }),
        QueryValue::Integer { min, max } => {
            json!({ "type": "integer", "minimum": min, "maximum": max })
        }
        QueryValue::OneOf(words) => json!({ "type": "string", "enum": words }),
        QueryValue::States => json!({
            "type": "array",
            "minItems": 1,
            "items": { "$ref": "#/components/schemas/SandboxState" }
        }),
    }
}

fn operation_id(handler: Handler) -> String {
    let name = format!("{handler:?}");
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn content(payload: Payload, generator: &mut SchemaGenerator) -> Option<Value> {
    match payload {
        Payload::None => None,
        Payload::Json(schema) | Payload::OptionalJson(schema) => {
            Some(json!({ "application/json": { "schema": schema(generator) } }))
        }
        Payload::Ndjson(schema) => Some(json!({
            "application/x-ndjson": {
                "schema": schema(generator),
                "description": "One JSON value of this schema per line."
            }
        })),
        Payload::Octets => Some(json!({
            "application/octet-stream": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } }
        })),
        Payload::Metrics => Some(json!({
            "text/plain": { "schema": { "type": "string" } },
            "application/openmetrics-text": { "schema": { "type": "string" } }
        })),
        Payload::Any => Some(json!({ "*/*": {} })),
    }
}

fn operation(
    route: &Route,
    suffix: &str,
    generator: &mut SchemaGenerator,
    error_ref: &Value,
) -> Value {
    let mut op = Map::new();
    op.insert(
        "operationId".into(),
        json!(format!("{}{suffix}", operation_id(route.handler))),
    );
    op.insert("summary".into(), json!(route.summary));
    let mut parameters = Vec::new();
    if route.path.contains("{id}") {
        let description = match route.path.split('/').nth(2) {
            Some("approvals") => "The approval id, from `GET /v1/approvals`.",
            Some("templates") => {
                "The template: `NAME:TAG`, or `NAME` (its latest tag, else its newest)."
            }
            Some("builds") => "The build id (a UUID).",
            Some("template-files") => "The files hash: 64 lower-case hex digits.",
            Some("uploads") => "The one-time token of an upload URL.",
            Some("snapshots") => "The snapshot's id or name.",
            _ => "The sandbox id.",
        };
        let schema = if route.path.starts_with("/v1/template-files/") {
            json!({ "type": "string", "pattern": v1::FILES_HASH_PATTERN })
        } else {
            json!({ "type": "string" })
        };
        parameters.push(json!({
            "name": "id", "in": "path", "required": true,
            "description": description, "schema": schema
        }));
    }
    if route.path.contains("{rest}") {
        parameters.push(json!({
            "name": "rest", "in": "path", "required": true,
            "description": if route.path.starts_with("/v1/images/") {
                "The image: a name (`REGISTRY/REPO[:TAG|@DIGEST]`, slashes and all) or a digest (`sha256:<hex>`)."
            } else {
                "The agent's path, e.g. `process.Process/Start` or `files`."
            },
            "schema": { "type": "string" }
        }));
    }
    for (name, required, description, value) in route.query {
        let mut parameter = json!({
            "name": name, "in": "query", "required": required,
            "description": description, "schema": query_schema(*value)
        });
        if *value == QueryValue::States {
            parameter["style"] = json!("form");
            parameter["explode"] = json!(false);
        }
        parameters.push(parameter);
    }
    if !parameters.is_empty() {
        op.insert("parameters".into(), Value::Array(parameters));
    }
    let security = match route.access {
        Access::Public => json!([]),
        Access::ApiKey => json!([{ "apiKey": [] }]),
        Access::Sandbox => json!([{ "apiKey": [] }, { "accessToken": [] }]),
    };
    op.insert("security".into(), security);
    if let Some(body) = content(route.request, generator) {
        // An upload may be empty: it makes an empty file.
        let required = !matches!(route.request, Payload::OptionalJson(_) | Payload::Octets);
        op.insert(
            "requestBody".into(),
            json!({ "required": required, "content": body }),
        );
    }
    let mut responses = Map::new();
    let mut success = Map::new();
    success.insert("description".into(), json!(reason(route.success)));
    if let Some(body) = content(route.response, generator) {
        success.insert("content".into(), body);
    }
    responses.insert(route.success.to_string(), Value::Object(success));
    let mut errors: Vec<u16> = route.errors.to_vec();
    if route.access != Access::Public {
        errors.push(401);
    }
    if matches!(route.access, Access::Sandbox) {
        errors.push(502);
    }
    errors.push(500);
    errors.sort_unstable();
    errors.dedup();
    // The envd pass-through's RPC errors are Connect's; any other status is the agent's.
    let envd = route.handler == Handler::Envd;
    let error_schema = if envd {
        json!({ "anyOf": [error_ref, { "$ref": "#/components/schemas/ConnectError" }] })
    } else {
        error_ref.clone()
    };
    for status in errors {
        let mut response = json!({
            "description": reason(status),
            "content": { "application/json": { "schema": error_schema } }
        });
        if status == 503 && route.handler == Handler::CreateSandbox {
            response["headers"] = json!({
                "Retry-After": {
                    "description": format!("Seconds to wait before trying again ({CAPACITY_RETRY_AFTER_SECONDS})."),
                    "required": true,
                    "schema": { "type": "integer", "minimum": 1 }
                }
            });
        }
        responses.insert(status.to_string(), response);
    }
    if envd {
        responses.insert(
            "default".into(),
            json!({ "description": "The agent's own answer (204 for health; Connect's statuses for the RPCs).", "content": { "*/*": {} } }),
        );
    }
    op.insert("responses".into(), Value::Object(responses));
    Value::Object(op)
}

/// The whole OpenAPI 3.1 document.
pub fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut generator = settings.into_generator();
    let error_ref = generator.subschema_for::<ErrorBody>().to_value();
    let mut paths = Map::new();
    for route in &ROUTES {
        let item = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(item) = item else { continue };
        match &route.method {
            Some(method) => {
                let op = operation(route, "", &mut generator, &error_ref);
                item.insert(method.as_str().to_ascii_lowercase(), op);
            }
            None => {
                for method in ["get", "post", "put", "delete"] {
                    let op = operation(route, &format!("_{method}"), &mut generator, &error_ref);
                    item.insert(method.to_owned(), op);
                }
            }
        }
    }
    let mut schemas = generator.take_definitions(true);
    schemas.insert("ConnectError".into(), connect_error_schema());
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Airlock daemon API",
            "version": "1",
            "description": "The native API of airlockd. Every error is a JSON body {code, message} with a stable code."
        },
        "servers": [{ "url": "http://127.0.0.1:3000" }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "apiKey": { "type": "apiKey", "in": "header", "name": "X-API-Key" },
                "accessToken": {
                    "type": "apiKey", "in": "header", "name": "X-Access-Token",
                    "description": "A sandbox's own token, returned by its create; valid for its exec, files and envd routes."
                }
            }
        }
    })
}

/// The document as committed: pretty-printed with a final newline.
pub fn document_json() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}
