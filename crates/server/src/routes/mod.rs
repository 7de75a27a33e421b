//! The route table and the dispatcher.
//!
//! [`ROUTES`] is the single list of endpoints: the dispatcher matches requests against it and
//! `openapi` documents it, so the two cannot drift. Each route names its access level, and the
//! dispatcher authenticates before any handler runs. A body that a handler did not consume
//! (an early error) is read in the background while the answer goes out (`http::linger`).

mod computer;
mod egress;
mod eval;
pub(crate) mod exec;
mod files;
mod git;
mod images;
mod lsp;
mod persistence;
mod sandboxes;
mod table;
mod templates;

pub use persistence::valid_name as valid_snapshot_name;

use std::sync::Arc;

use airlock_api::v1::ErrorCode;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONNECTION, HeaderValue, RETRY_AFTER};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response};

use crate::auth;
use crate::error::{ApiError, CAPACITY_RETRY_AFTER_SECONDS};
use crate::http::{Body, error_response, linger};
use crate::lifecycle::Daemon;

pub use table::{Access, Handler, Payload, QueryDoc, QueryValue, ROUTES, Route};

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
    candidates(path)
        .into_iter()
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

/// The routes whose path matches: those of a literal path (`/v1/images/pull`) alone when
/// there are any, so that a parameter (`/v1/images/{rest}`) never takes them over.
fn candidates(path: &str) -> Vec<(&'static Route, (String, String))> {
    let matched: Vec<(&'static Route, (String, String))> = ROUTES
        .iter()
        .filter_map(|route| Some((route, match_path(route.path, path)?)))
        .collect();
    if matched.iter().any(|(route, _)| !route.path.contains('{')) {
        matched
            .into_iter()
            .filter(|(route, _)| !route.path.contains('{'))
            .collect()
    } else {
        matched
    }
}

fn find(method: &Method, path: &str) -> Result<Matched, ApiError> {
    for (route, (id, rest)) in candidates(path) {
        if route.method.as_ref().is_none_or(|m| m == method) {
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
    // An agent that vanished under a request was most often its sandbox ending: say so.
    let result = result.map_err(|err| {
        if err.code == ErrorCode::AgentError && !ctx.id.is_empty() {
            ctx.daemon.agent_failure(&ctx.id, err)
        } else {
            err
        }
    });
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
        Handler::ListSandboxes => {
            let listed = sandboxes::list(ctx);
            // A sandbox the list missed had begun its teardown before it looked; it answers
            // once those are done.
            ctx.daemon.torn_down().await;
            listed
        }
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
        Handler::Computer => computer::act(ctx).await,
        Handler::LspSocket => lsp::socket(ctx),
        Handler::Exec => exec::exec(ctx).await,
        Handler::Eval => eval::eval(ctx).await,
        Handler::ListImages => images::list(ctx),
        Handler::PullImage => images::pull(ctx).await,
        Handler::ImportImage => images::import(ctx).await,
        Handler::PruneImages => images::prune(ctx).await,
        Handler::InspectImage => images::inspect(ctx),
        Handler::DeleteImage => images::remove(ctx),
        Handler::BuildTemplate => templates::build(ctx).await,
        Handler::GetTemplate => templates::get(ctx),
        Handler::DeleteTemplate => templates::delete(ctx),
        Handler::GetBuild => templates::get_build(ctx),
        Handler::BuildLogs => templates::logs(ctx),
        Handler::GetTemplateFiles => templates::get_files(ctx),
        Handler::PutTemplateFiles => templates::put_files(ctx).await,
        Handler::UploadFiles => templates::upload(ctx).await,
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
