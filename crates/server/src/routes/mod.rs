//! The route table and the dispatcher.
//!
//! [`ROUTES`] is the single list of endpoints: the dispatcher matches requests against it and
//! `openapi` documents it, so the two cannot drift. Each route names its access level, and the
//! dispatcher authenticates before any handler runs. A body that a handler did not consume
//! (an early error) is read in the background while the answer goes out (`http::linger`).

mod egress;
pub(crate) mod exec;
mod files;
mod git;
mod lsp;
mod persistence;
mod sandboxes;

pub use persistence::valid_name as valid_snapshot_name;

use std::sync::Arc;

use airlock_api::v1::{self, ErrorCode};
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONNECTION, HeaderValue, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response};
use schemars::{JsonSchema, Schema, SchemaGenerator};

use crate::auth;
use crate::error::{ApiError, CAPACITY_RETRY_AFTER_SECONDS};
use crate::http::{Body, error_response, linger};
use crate::lifecycle::Daemon;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (health).
    Public,
    /// An API key.
    ApiKey,
    /// An API key or the access token of the sandbox named by `{id}`.
    Sandbox,
}

/// What travels in a request or response body, for the OpenAPI document.
#[derive(Debug, Clone, Copy)]
pub enum Payload {
    None,
    Json(fn(&mut SchemaGenerator) -> Schema),
    /// A JSON body that may be left out (an empty body reads as `{}`).
    OptionalJson(fn(&mut SchemaGenerator) -> Schema),
    /// Newline-delimited JSON, one value of this schema per line.
    Ndjson(fn(&mut SchemaGenerator) -> Schema),
    Octets,
    /// Prometheus's text format (or OpenMetrics, by `Accept`).
    Metrics,
    /// Whatever the agent speaks (the envd pass-through).
    Any,
}

/// What a query parameter's value must be, as the handler checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryValue {
    /// A path inside the sandbox: non-empty, no NUL.
    Path,
    /// Any string.
    Text,
    /// `true` or `false`.
    Bool,
    /// A non-negative integer of at most `max`.
    Integer { min: u64, max: u64 },
    /// Comma-separated sandbox states.
    States,
}

/// A query parameter: name, required, description, value.
pub type QueryDoc = (&'static str, bool, &'static str, QueryValue);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Health,
    Metrics,
    ListTemplates,
    GetPool,
    SetPool,
    CreateSandbox,
    ListSandboxes,
    GetSandbox,
    DeleteSandbox,
    SetTimeout,
    PauseSandbox,
    ResumeSandbox,
    CreateSnapshot,
    ForkSandbox,
    ListSnapshots,
    DeleteSnapshot,
    Logs,
    Events,
    PutPolicy,
    ListApprovals,
    DecideApproval,
    GitPush,
    PullRequest,
    StartLsp,
    LspSocket,
    Exec,
    FileGet,
    FilePut,
    FileRemove,
    FileList,
    FileStat,
    FileMkdir,
    FileMove,
    Envd,
}

#[derive(Debug)]
pub struct Route {
    /// `None` matches every method (the envd pass-through).
    pub method: Option<Method>,
    /// Segments in braces are parameters; `{rest}` at the end takes the remaining path.
    pub path: &'static str,
    pub handler: Handler,
    pub access: Access,
    pub summary: &'static str,
    pub query: &'static [QueryDoc],
    pub request: Payload,
    pub success: u16,
    pub response: Payload,
    /// Error statuses this route can answer besides 401 (and 500/502).
    pub errors: &'static [u16],
}

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

const PATH_Q: &[QueryDoc] = &[("path", true, "Path inside the sandbox.", QueryValue::Path)];

macro_rules! route {
    ($method:expr, $path:expr, $handler:ident, $access:ident, $summary:expr, $query:expr, $request:expr, $success:expr, $response:expr, $errors:expr) => {
        Route {
            method: $method,
            path: $path,
            handler: Handler::$handler,
            access: Access::$access,
            summary: $summary,
            query: $query,
            request: $request,
            success: $success,
            response: $response,
            errors: $errors,
        }
    };
}

/// Every endpoint of the daemon.
pub static ROUTES: [Route; 34] = [
    route!(
        Some(Method::GET),
        "/v1/health",
        Health,
        Public,
        "Liveness of the daemon.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::Health>),
        &[]
    ),
    route!(
        Some(Method::GET),
        "/metrics",
        Metrics,
        ApiKey,
        "The daemon's metrics in Prometheus's text format (OpenMetrics when Accept asks for application/openmetrics-text): sandboxes by state, creates and their latency, warm pools, execs, egress decisions, errors by code.",
        &[],
        Payload::None,
        200,
        Payload::Metrics,
        &[]
    ),
    route!(
        Some(Method::GET),
        "/v1/templates",
        ListTemplates,
        ApiKey,
        "List templates.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::TemplateList>),
        &[]
    ),
    route!(
        Some(Method::GET),
        "/v1/templates/{id}/pool",
        GetPool,
        ApiKey,
        "A template's warm pool: its size, members ready and starting, claims.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::PoolStatus>),
        &[404]
    ),
    route!(
        Some(Method::PUT),
        "/v1/templates/{id}/pool",
        SetPool,
        ApiKey,
        "Keep `size` sandboxes of the template started and ready (0 removes the pool); creates for it that ask for nothing else claim one. Kept across restarts.",
        &[],
        Payload::Json(schema::<v1::PoolRequest>),
        200,
        Payload::Json(schema::<v1::PoolStatus>),
        &[400, 404, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes",
        CreateSandbox,
        ApiKey,
        "Create a sandbox; returns once it is usable, with its access token.",
        &[],
        Payload::OptionalJson(schema::<v1::CreateSandboxRequest>),
        201,
        Payload::Json(schema::<v1::CreateSandboxResponse>),
        &[400, 403, 404, 413, 422, 503]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes",
        ListSandboxes,
        ApiKey,
        "List sandboxes.",
        &[
            (
                "state",
                false,
                "Comma-separated states to keep (creating, running, paused).",
                QueryValue::States
            ),
            (
                "metadata.{key}",
                false,
                "Keep sandboxes whose metadata has key = value; repeatable.",
                QueryValue::Text
            ),
            (
                "include",
                false,
                "`pool`: also list the unclaimed members of warm pools (`pool: true`).",
                QueryValue::Text
            )
        ],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SandboxList>),
        &[400]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}",
        GetSandbox,
        ApiKey,
        "Get a sandbox.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[404]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/sandboxes/{id}",
        DeleteSandbox,
        ApiKey,
        "Destroy a sandbox and everything it owned; 409 while it is still starting or already being removed.",
        &[],
        Payload::None,
        204,
        Payload::None,
        &[404, 409]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/timeout",
        SetTimeout,
        ApiKey,
        "Make the sandbox end timeout_ms from now.",
        &[],
        Payload::Json(schema::<v1::SetTimeoutRequest>),
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/pause",
        PauseSandbox,
        ApiKey,
        "Pause a running sandbox: frozen (its processes keep their memory; the default) or filesystem (they end, its files stay). Its timeout clock stops. 409 sandbox_paused if it already is; 422 for a filesystem pause of a sandbox whose files live in memory.",
        &[],
        Payload::OptionalJson(schema::<v1::PauseRequest>),
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/resume",
        ResumeSandbox,
        ApiKey,
        "Resume a paused sandbox (a running one only gets its deadline extended): it lives what it had left, or timeout_ms from now if that is later.",
        &[],
        Payload::OptionalJson(schema::<v1::ResumeRequest>),
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/snapshots",
        CreateSnapshot,
        ApiKey,
        "Snapshot a sandbox's files (/workspace and /tmp; processes are not captured), freezing it only for the copy. Create from it with template = its id or name. 409 if the name is taken; 422 without disk scratch.",
        &[],
        Payload::OptionalJson(schema::<v1::CreateSnapshotRequest>),
        201,
        Payload::Json(schema::<v1::Snapshot>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/fork",
        ForkSandbox,
        ApiKey,
        "count (1 to 20) new sandboxes from a consistent copy of the sandbox's files; each fork succeeds or fails on its own. Processes are not carried over.",
        &[],
        Payload::OptionalJson(schema::<v1::ForkRequest>),
        201,
        Payload::Json(schema::<v1::ForkResponse>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::GET),
        "/v1/snapshots",
        ListSnapshots,
        ApiKey,
        "List snapshots.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SnapshotList>),
        &[]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/snapshots/{id}",
        DeleteSnapshot,
        ApiKey,
        "Delete a snapshot by id or name; the sandboxes made from it keep their files.",
        &[],
        Payload::None,
        204,
        Payload::None,
        &[404]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/logs",
        Logs,
        ApiKey,
        "The sandbox's events and the tail of its agent's log.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SandboxLogs>),
        &[404]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/events",
        Events,
        ApiKey,
        "The sandbox's audit lines (egress, credentials, approvals, policy, files) and lifecycle events, oldest first; secrets and placeholders are redacted.",
        &[
            (
                "since_ms",
                false,
                "Only events at or after this Unix time in ms (the previous answer's next_since_ms).",
                QueryValue::Integer {
                    min: 0,
                    max: u64::MAX
                }
            ),
            (
                "limit",
                false,
                "At most this many events (default 1000, at most 10000).",
                QueryValue::Integer {
                    min: 1,
                    max: crate::audit::MAX_EVENTS_PER_PAGE as u64
                }
            )
        ],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SandboxEvents>),
        &[400, 404]
    ),
    route!(
        Some(Method::PUT),
        "/v1/sandboxes/{id}/policy",
        PutPolicy,
        ApiKey,
        "Replace a proxy-mode sandbox's network, credentials and approvals at once; 409 if the change widens access in a way that needs review and approve is not true, 422 if invalid (the old policy stays).",
        &[(
            "approve",
            false,
            "true: apply a change whose findings need review.",
            QueryValue::Bool
        )],
        Payload::Json(schema::<airlock_api::policy::PolicyDocument>),
        200,
        Payload::Json(schema::<v1::PolicyApplied>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::GET),
        "/v1/approvals",
        ListApprovals,
        ApiKey,
        "Requests held under approvals: ask, waiting for a decision, oldest first.",
        &[("sandbox", false, "Only this sandbox's.", QueryValue::Text)],
        Payload::None,
        200,
        Payload::Json(schema::<v1::ApprovalList>),
        &[400, 404]
    ),
    route!(
        Some(Method::POST),
        "/v1/approvals/{id}",
        DecideApproval,
        ApiKey,
        "Answer a held request: once, always (identical requests while the sandbox lives) or deny.",
        &[],
        Payload::Json(schema::<v1::DecideApprovalRequest>),
        204,
        Payload::None,
        &[400, 404, 413]
    ),
    git::PUSH,
    git::PULL_REQUEST,
    lsp::START,
    lsp::SOCKET,
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/exec",
        Exec,
        Sandbox,
        "Run a command; streams start, stdout, stderr and exit events as NDJSON.",
        &[],
        Payload::Json(schema::<v1::ExecRequest>),
        200,
        Payload::Ndjson(schema::<v1::ExecEvent>),
        &[400, 403, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/files",
        FileGet,
        Sandbox,
        "Download a file (streamed).",
        PATH_Q,
        Payload::None,
        200,
        Payload::Octets,
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::PUT),
        "/v1/sandboxes/{id}/files",
        FilePut,
        Sandbox,
        "Upload a file (streamed); creates parent directories, replaces the file. A refused upload (403 read-only or denied path, 413 file-size limit, 507 disk full) is answered as soon as it fails, with Connection: close.",
        PATH_Q,
        Payload::Octets,
        200,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409, 413, 507]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/sandboxes/{id}/files",
        FileRemove,
        Sandbox,
        "Remove a file or a directory tree.",
        PATH_Q,
        Payload::None,
        204,
        Payload::None,
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/files/list",
        FileList,
        Sandbox,
        "List a directory.",
        &[
            (
                "path",
                true,
                "Directory inside the sandbox.",
                QueryValue::Path
            ),
            (
                "depth",
                false,
                "Levels to descend (default 1; 0 means 1).",
                QueryValue::Integer {
                    min: 0,
                    max: u32::MAX as u64
                }
            )
        ],
        Payload::None,
        200,
        Payload::Json(schema::<v1::FileList>),
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/files/stat",
        FileStat,
        Sandbox,
        "Describe a file.",
        PATH_Q,
        Payload::None,
        200,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/files/mkdir",
        FileMkdir,
        Sandbox,
        "Create a directory and its parents; 409 if it exists.",
        &[],
        Payload::Json(schema::<v1::MkdirRequest>),
        201,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409, 413, 507]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/files/move",
        FileMove,
        Sandbox,
        "Rename or move a file.",
        &[],
        Payload::Json(schema::<v1::MoveRequest>),
        200,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409, 413, 507]
    ),
    route!(
        None,
        "/v1/sandboxes/{id}/envd/{rest}",
        Envd,
        Sandbox,
        "Pass-through to the sandbox's envd-compatible agent: its Connect RPCs (POST process.Process/* and filesystem.Filesystem/*, whose errors are Connect's), POST and GET files, GET health. Any other path is 404, another method 405; errors of files and of the daemon are ErrorBody.",
        &[],
        Payload::Any,
        200,
        Payload::Any,
        &[400, 403, 404, 405, 409, 413, 507]
    ),
];

/// A request being handled: the handler takes the body if it reads it.
#[derive(Debug)]
pub struct Ctx {
    pub daemon: Arc<Daemon>,
    pub parts: Parts,
    pub body: Option<Incoming>,
    /// The `{id}` parameter, validated as a possible sandbox id.
    pub id: String,
    /// The `{rest}` parameter.
    pub rest: String,
    /// The answer is the connection's last (`Connection: close`): an upload failed before its
    /// body was read.
    pub close: bool,
}

impl Ctx {
    pub fn take_body(&mut self) -> Result<Incoming, ApiError> {
        self.body
            .take()
            .ok_or_else(|| ApiError::internal("the request body was already read"))
    }

    pub async fn json<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, ApiError> {
        let body = self.take_body()?;
        crate::http::read_json(body, &self.parts.headers, self.daemon.config.max_body_bytes).await
    }

    pub fn query(&self) -> Vec<(String, String)> {
        crate::http::query_pairs(&self.parts.uri)
    }
}

struct Matched {
    route: &'static Route,
    id: String,
    rest: String,
}

fn match_path(pattern: &str, path: &str) -> Option<(String, String)> {
    let segments: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    let patterns: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    let mut id = String::new();
    for (i, pattern) in patterns.iter().enumerate() {
        if *pattern == "{rest}" {
            return (i < segments.len()).then(|| (id, segments[i..].join("/")));
        }
        let segment = segments.get(i)?;
        if *pattern == "{id}" {
            id = (*segment).to_owned();
        } else if pattern != segment {
            return None;
        }
    }
    (segments.len() == patterns.len()).then_some((id, String::new()))
}

/// The methods a path allows (for 405 and its `Allow` header); for the envd pass-through,
/// those of the agent's route.
fn allowed_methods(path: &str) -> Vec<&'static str> {
    ROUTES
        .iter()
        .filter_map(|route| Some((route, match_path(route.path, path)?)))
        .flat_map(|(route, (_, rest))| match &route.method {
            Some(method) => vec![method.as_str()],
            None => crate::proxy::agent_methods(&rest)
                .map(|(_, methods)| methods.iter().map(Method::as_str).collect())
                .unwrap_or_default(),
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn find(method: &Method, path: &str) -> Result<Matched, ApiError> {
    for route in &ROUTES {
        if let Some((id, rest)) = match_path(route.path, path)
            && route.method.as_ref().is_none_or(|m| m == method)
        {
            return Ok(Matched { route, id, rest });
        }
    }
    let allowed = allowed_methods(path);
    if allowed.is_empty() {
        Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no route for {path}"),
        ))
    } else {
        Err(ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{path} allows {}, not {method}", allowed.join(", ")),
        ))
    }
}

/// The route pattern that `method path` reaches, if any (for `crate::fuzzing`).
pub(crate) fn route_pattern(method: &Method, path: &str) -> Option<&'static str> {
    find(method, path).ok().map(|matched| matched.route.path)
}

/// Serves one request.
pub async fn dispatch(daemon: Arc<Daemon>, request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let mut ctx = Ctx {
        daemon,
        parts,
        body: Some(body),
        id: String::new(),
        rest: String::new(),
        close: false,
    };
    let result = route(&mut ctx).await;
    if let Err(err) = &result {
        ctx.daemon
            .metrics
            .error(crate::metrics::Surface::V1, err.code.as_str());
        if err.code.http_status() >= 500 {
            tracing::error!(
                method = %ctx.parts.method,
                path = ctx.parts.uri.path(),
                code = err.code.as_str(),
                error = %err.message,
                "request failed"
            );
        }
    }
    let mut response = match result {
        Ok(response) => response,
        Err(err) => {
            let mut response = error_response(&err);
            if err.code == ErrorCode::Capacity {
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(CAPACITY_RETRY_AFTER_SECONDS));
            }
            if err.code == ErrorCode::MethodNotAllowed
                && let Ok(allow) =
                    HeaderValue::from_str(&allowed_methods(ctx.parts.uri.path()).join(", "))
            {
                response.headers_mut().insert(ALLOW, allow);
            }
            response
        }
    };
    if let Some(body) = ctx.body.take() {
        linger(body);
    }
    response
        .headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-store"));
    if ctx.close {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn metrics(ctx: &Ctx) -> Response<Body> {
    let openmetrics = ctx
        .parts
        .headers
        .get(hyper::header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains(crate::metrics::OPENMETRICS));
    let (text, media_type) = ctx
        .daemon
        .metrics
        .render(&ctx.daemon.metrics_snapshot(), openmetrics);
    let mut response = Response::new(crate::http::full(text));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(media_type),
    );
    response
}

async fn route(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let Matched { route, id, rest } = find(&ctx.parts.method, ctx.parts.uri.path())?;
    let daemon = &ctx.daemon;
    let no_auth = daemon.config.no_auth;
    match route.access {
        Access::Public => {}
        Access::ApiKey if route.handler == Handler::Metrics => {
            auth::check_api_key_or_bearer(&daemon.store, &ctx.parts.headers, no_auth)?;
        }
        Access::ApiKey => {
            auth::check_api_key(&daemon.store, &ctx.parts.headers, no_auth)?;
        }
        Access::Sandbox => {
            let token_hash = daemon.token_hash(&id);
            auth::check_sandbox_access(
                &daemon.store,
                &ctx.parts.headers,
                no_auth,
                token_hash.as_deref(),
            )?;
        }
    }
    if route.path.starts_with("/v1/sandboxes/{id}") && !crate::auth::plausible_sandbox_id(&id) {
        return Err(ApiError::no_sandbox(&id));
    }
    ctx.id = id;
    ctx.rest = rest;
    match route.handler {
        Handler::Health => Ok(sandboxes::health()),
        Handler::Metrics => Ok(metrics(ctx)),
        Handler::ListTemplates => sandboxes::list_templates(ctx),
        Handler::GetPool => sandboxes::get_pool(ctx),
        Handler::SetPool => sandboxes::set_pool(ctx).await,
        Handler::CreateSandbox => sandboxes::create(ctx).await,
        Handler::ListSandboxes => sandboxes::list(ctx),
        Handler::GetSandbox => sandboxes::get(ctx),
        Handler::DeleteSandbox => sandboxes::delete(ctx).await,
        Handler::SetTimeout => sandboxes::set_timeout(ctx).await,
        Handler::PauseSandbox => persistence::pause(ctx).await,
        Handler::ResumeSandbox => persistence::resume(ctx).await,
        Handler::CreateSnapshot => persistence::snapshot(ctx).await,
        Handler::ForkSandbox => persistence::fork(ctx).await,
        Handler::ListSnapshots => persistence::list(ctx),
        Handler::DeleteSnapshot => persistence::delete(ctx),
        Handler::Logs => sandboxes::logs(ctx),
        Handler::Events => egress::events(ctx).await,
        Handler::PutPolicy => egress::put_policy(ctx).await,
        Handler::ListApprovals => egress::list_approvals(ctx),
        Handler::DecideApproval => egress::decide_approval(ctx).await,
        Handler::GitPush => git::push(ctx).await,
        Handler::PullRequest => git::pull_request(ctx).await,
        Handler::StartLsp => lsp::start(ctx).await,
        Handler::LspSocket => lsp::socket(ctx),
        Handler::Exec => exec::exec(ctx).await,
        Handler::FileGet
        | Handler::FilePut
        | Handler::FileRemove
        | Handler::FileList
        | Handler::FileStat
        | Handler::FileMkdir
        | Handler::FileMove => {
            let result = match route.handler {
                Handler::FileGet => files::get(ctx).await,
                Handler::FilePut => files::put(ctx).await,
                Handler::FileRemove => files::remove(ctx).await,
                Handler::FileList => files::list(ctx).await,
                Handler::FileStat => files::stat(ctx).await,
                Handler::FileMkdir => files::mkdir(ctx).await,
                _ => files::rename(ctx).await,
            };
            // A failed upload whose body went to the agent: the rest is not wanted.
            ctx.close = result.is_err() && route.handler == Handler::FilePut && ctx.body.is_none();
            if let Err(err) = &result
                && matches!(err.code, ErrorCode::PermissionDenied | ErrorCode::ReadOnly)
            {
                let path = ctx.query().into_iter().find(|(k, _)| k == "path");
                ctx.daemon.audit.file_denied(
                    &ctx.id,
                    ctx.parts.method.as_str(),
                    path.as_ref().map(|(_, v)| v.as_str()),
                    &err.message,
                );
            }
            result
        }
        Handler::Envd => {
            let agent = ctx.daemon.agent(&ctx.id).await?;
            crate::proxy::agent_route(&ctx.parts.method, &ctx.rest)?;
            let body = ctx.take_body()?;
            let answer = crate::proxy::forward_native(&agent, &ctx.parts, body, &ctx.rest).await;
            if let Ok(response) = &answer {
                ctx.close = response.headers().contains_key(CONNECTION);
            }
            answer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths_match_with_parameters() {
        assert_eq!(
            match_path("/v1/sandboxes", "/v1/sandboxes"),
            Some((String::new(), String::new()))
        );
        assert_eq!(match_path("/v1/sandboxes", "/v1/sandboxes/"), None);
        assert_eq!(
            match_path("/v1/sandboxes/{id}", "/v1/sandboxes/abc"),
            Some(("abc".into(), String::new()))
        );
        assert_eq!(
            match_path("/v1/sandboxes/{id}", "/v1/sandboxes/abc/files"),
            None
        );
        assert_eq!(
            match_path("/v1/sandboxes/{id}/files", "/v1/sandboxes/abc"),
            None
        );
        assert_eq!(
            match_path(
                "/v1/sandboxes/{id}/envd/{rest}",
                "/v1/sandboxes/abc/envd/process.Process/Start"
            ),
            Some(("abc".into(), "process.Process/Start".into()))
        );
        assert_eq!(
            match_path("/v1/sandboxes/{id}/envd/{rest}", "/v1/sandboxes/abc/envd"),
            None
        );
    }

    #[test]
    fn test_find_distinguishes_404_and_405() {
        assert_eq!(
            find(&Method::GET, "/v1/nope").err().map(|e| e.code),
            Some(ErrorCode::NotFound)
        );
        assert_eq!(
            find(&Method::PATCH, "/v1/sandboxes").err().map(|e| e.code),
            Some(ErrorCode::MethodNotAllowed)
        );
        let matched = find(&Method::DELETE, "/v1/sandboxes/x1/files")
            .ok()
            .map(|m| m.route.handler);
        assert_eq!(matched, Some(Handler::FileRemove));
    }
}
