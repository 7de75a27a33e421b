//! E2B's control plane on top of the daemon's lifecycle: the same sandboxes as `/v1`, E2B's
//! shapes, statuses and units (seconds). See the module docs of [`super`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use airlock_api::v1::{self, CreateSandboxRequest, ErrorCode};
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};

use super::access::{self, SandboxRecord};
use super::wire::{self, ListedSandbox, NewSandbox, SandboxDetail, SandboxState};
use super::{CLIENT_ID, E2bError, ENVD_VERSION, discard, persistence, time};
use crate::error::ApiError;
use crate::http::{Body, form_decode, json_response, no_content};
use crate::lifecycle::Daemon;
use crate::routes::Ctx;
use crate::store::now_ms;

/// E2B's default lifetimes when a create names none.
const DEFAULT_TIMEOUT_V2_S: i64 = 300;
const DEFAULT_TIMEOUT_V1_S: i64 = 15;
/// Page size of `GET /v2/sandboxes`: E2B's default and maximum.
const MAX_PAGE: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    List { v2: bool },
    Create { v2: bool },
    Detail,
    Kill,
    Timeout,
    Connect,
    Pause,
    Resume,
    Refresh,
    CreateSnapshot,
    ListSnapshots,
    DeleteTemplate,
    Fork,
}

/// Serves one control-plane request.
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
    let response = route(&mut ctx).await.unwrap_or_else(|err| {
        ctx.daemon
            .metrics
            .error(crate::metrics::Surface::E2b, err.status.as_str());
        if err.status.is_server_error() {
            tracing::error!(
                method = %ctx.parts.method,
                path = ctx.parts.uri.path(),
                status = err.status.as_u16(),
                error = %err.message,
                "E2B request failed"
            );
        }
        err.response()
    });
    discard(ctx.body.take());
    response
}

/// The E2B endpoints Airlock serves: method, path (`{id}` is one segment), handler.
const ENDPOINTS: [(&str, &str, Endpoint); 16] = [
    ("GET", "/sandboxes", Endpoint::List { v2: false }),
    ("POST", "/sandboxes", Endpoint::Create { v2: false }),
    ("GET", "/v2/sandboxes", Endpoint::List { v2: true }),
    ("POST", "/v2/sandboxes", Endpoint::Create { v2: true }),
    ("GET", "/sandboxes/{id}", Endpoint::Detail),
    ("DELETE", "/sandboxes/{id}", Endpoint::Kill),
    ("POST", "/sandboxes/{id}/timeout", Endpoint::Timeout),
    ("POST", "/sandboxes/{id}/connect", Endpoint::Connect),
    ("POST", "/v2/sandboxes/{id}/connect", Endpoint::Connect),
    ("POST", "/sandboxes/{id}/pause", Endpoint::Pause),
    ("POST", "/sandboxes/{id}/resume", Endpoint::Resume),
    ("POST", "/sandboxes/{id}/refreshes", Endpoint::Refresh),
    (
        "POST",
        "/sandboxes/{id}/snapshots",
        Endpoint::CreateSnapshot,
    ),
    ("GET", "/snapshots", Endpoint::ListSnapshots),
    ("DELETE", "/templates/{id}", Endpoint::DeleteTemplate),
    ("POST", "/sandboxes/{id}/fork", Endpoint::Fork),
];

/// The `{id}` of `path` if it has the shape of `pattern` (empty when the pattern has none).
fn match_path(pattern: &str, path: &str) -> Option<String> {
    let (mut patterns, mut segments) = (pattern.split('/'), path.split('/'));
    let mut id = String::new();
    loop {
        match (patterns.next(), segments.next()) {
            (None, None) => return Some(id),
            (Some("{id}"), Some(segment)) if !segment.is_empty() => id = segment.to_owned(),
            (Some(expected), Some(segment)) if expected == segment => {}
            _ => return None,
        }
    }
}

/// The endpoint and its `{id}`; 405 for a wrong method, 501 for E2B endpoints Airlock does
/// not implement, 404 elsewhere.
fn endpoint(method: &Method, path: &str) -> Result<(Endpoint, String), E2bError> {
    let mut allowed = Vec::new();
    for (verb, pattern, endpoint) in &ENDPOINTS {
        if let Some(id) = match_path(pattern, path) {
            if method.as_str() == *verb {
                return Ok((*endpoint, id));
            }
            allowed.push(*verb);
        }
    }
    if !allowed.is_empty() {
        return Err(E2bError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} allows {}, not {method}", allowed.join(", ")),
        ));
    }
    if super::is_control_path(path) {
        return Err(E2bError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("Airlock does not implement {method} {path} of E2B's API yet"),
        ));
    }
    Err(E2bError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {path}"),
    ))
}

async fn route(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let path = ctx.parts.uri.path().to_owned();
    if !super::is_control_path(&path) {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("no route for {} {path}", ctx.parts.method),
        ));
    }
    let no_auth = ctx.daemon.config.no_auth;
    access::check_key(&ctx.daemon.store, &ctx.parts.headers, no_auth)?;
    if let Some(answer) = super::templates::route(ctx).await {
        return answer;
    }
    let (endpoint, id) = endpoint(&ctx.parts.method, &path)?;
    ctx.id = id;
    match endpoint {
        Endpoint::List { v2 } => {
            let listed = if v2 { list_v2(ctx) } else { list_v1(ctx) };
            // A sandbox the list missed had begun its teardown before it looked; it answers
            // once those are done.
            ctx.daemon.torn_down().await;
            listed
        }
        Endpoint::Create { v2 } => create(ctx, v2).await,
        Endpoint::Detail => detail(ctx),
        Endpoint::Kill => kill(ctx).await,
        Endpoint::Timeout => set_timeout(ctx).await,
        Endpoint::Connect => persistence::connect(ctx).await,
        Endpoint::Pause => persistence::pause(ctx).await,
        Endpoint::Resume => persistence::resume(ctx).await,
        Endpoint::CreateSnapshot => persistence::create_snapshot(ctx).await,
        Endpoint::ListSnapshots => persistence::list_snapshots(ctx),
        Endpoint::DeleteTemplate => persistence::delete_template(ctx),
        Endpoint::Fork => persistence::fork(ctx).await,
        Endpoint::Refresh => refresh(ctx).await,
    }
}

pub(super) async fn body<T: serde::de::DeserializeOwned>(ctx: &mut Ctx) -> Result<T, E2bError> {
    ctx.json::<T>().await.map_err(E2bError::from)
}

/// A lifetime in E2B's seconds as the daemon's milliseconds, within the daemon's bounds.
pub(super) fn timeout_ms(daemon: &Daemon, seconds: i64) -> Result<u64, E2bError> {
    let max_ms = daemon.config.max_timeout_ms;
    let ms = u64::try_from(seconds)
        .ok()
        .filter(|s| *s >= 1)
        .ok_or_else(|| {
            E2bError::bad_request(format!("timeout must be at least 1 second, got {seconds}"))
        })?
        .saturating_mul(1000);
    if ms > max_ms {
        let limit = if max_ms.is_multiple_of(3_600_000) {
            format!("{} hours", max_ms / 3_600_000)
        } else {
            format!("{} seconds", max_ms / 1000)
        };
        return Err(E2bError::bad_request(format!(
            "Timeout cannot be greater than {limit} (--max-timeout), got {seconds} seconds"
        )));
    }
    Ok(ms)
}

/// A running sandbox, or E2B's 404 (one still being created is not there yet).
fn running(daemon: &Daemon, id: &str) -> Result<v1::Sandbox, E2bError> {
    match daemon.get(id) {
        Ok(sandbox) if sandbox.state == v1::SandboxState::Running => Ok(sandbox),
        Ok(_) => Err(E2bError::sandbox_not_found(id)),
        Err(err) if err.code == ErrorCode::NotFound => Err(E2bError::sandbox_not_found(id)),
        Err(err) => Err(err.into()),
    }
}

/// Maps "no such sandbox" to E2B's message, anything else to E2B's statuses.
pub(super) fn not_found_or(id: &str) -> impl Fn(ApiError) -> E2bError + '_ {
    move |err| match err.code {
        ErrorCode::NotFound | ErrorCode::SandboxStopping => E2bError::sandbox_not_found(id),
        _ => err.into(),
    }
}

/// The access token an E2B client may see: that of a secure sandbox this surface created.
pub(super) fn visible_token(daemon: &Daemon, id: &str) -> Option<String> {
    access::read_record(daemon, id)
        .filter(|record| record.secure)
        .map(|record| record.access_token)
}

fn host_cpus() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

fn listed(sandbox: &v1::Sandbox) -> ListedSandbox {
    let r = &sandbox.resources;
    ListedSandbox {
        template_id: sandbox.template.clone(),
        alias: Some(sandbox.template.clone()),
        sandbox_id: sandbox.id.clone(),
        client_id: CLIENT_ID.to_owned(),
        started_at: time::format_ms(sandbox.created_at_ms),
        end_at: time::format_ms(sandbox.expires_at_ms),
        cpu_count: r
            .cpu_millis
            .map_or_else(host_cpus, |m| u64::from(m.div_ceil(1000)).max(1)),
        memory_mb: r.memory_bytes.unwrap_or(0) >> 20,
        disk_size_mb: r.disk_bytes.unwrap_or(0) >> 20,
        metadata: sandbox.metadata.clone(),
        state: match sandbox.state {
            v1::SandboxState::Paused => SandboxState::Paused,
            _ => SandboxState::Running,
        },
        envd_version: ENVD_VERSION.to_owned(),
    }
}

/// A running or paused sandbox, or E2B's 404.
fn existing(daemon: &Daemon, id: &str) -> Result<v1::Sandbox, E2bError> {
    match daemon.get(id) {
        Ok(sandbox) if sandbox.state != v1::SandboxState::Creating => Ok(sandbox),
        Ok(_) => Err(E2bError::sandbox_not_found(id)),
        Err(err) => Err(not_found_or(id)(err)),
    }
}

/// `domain` for `<port>-<id>.<domain>`: see the module docs of [`super`].
pub fn domain(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(HOST)?.to_str().ok()?.trim();
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (name, after) = rest.split_once(']')?;
        (name, after.strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() {
        return None;
    }
    let local = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
    Some(match (local, port) {
        (true, Some(port)) => format!("localhost:{port}"),
        (true, None) => "localhost".to_owned(),
        (false, _) => host.to_owned(),
    })
}

pub(super) fn answer(
    sandbox: &v1::Sandbox,
    token: Option<String>,
    headers: &HeaderMap,
) -> wire::Sandbox {
    wire::Sandbox {
        template_id: sandbox.template.clone(),
        sandbox_id: sandbox.id.clone(),
        alias: Some(sandbox.template.clone()),
        client_id: CLIENT_ID.to_owned(),
        envd_version: ENVD_VERSION.to_owned(),
        envd_access_token: token,
        domain: domain(headers),
    }
}

async fn create(ctx: &mut Ctx, v2: bool) -> Result<Response<Body>, E2bError> {
    let request: NewSandbox = body(ctx).await?;
    let daemon = ctx.daemon.clone();
    let template = request.template_id.trim();
    if template.is_empty() {
        return Err(E2bError::bad_request("templateID must not be empty"));
    }
    let snapshot = template.split_once(':').map_or(template, |(name, _)| name);
    let is_snapshot = daemon
        .store
        .get_snapshot(snapshot)
        .map_err(ApiError::from)?
        .is_some();
    let template = if is_snapshot { snapshot } else { template };
    if !is_snapshot && daemon.find_template(template)?.is_none() {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template '{template}' not found"),
        ));
    }
    if request
        .volume_mounts
        .as_ref()
        .is_some_and(|v| !v.is_empty())
    {
        return Err(E2bError::bad_request(
            "Volume mounts are not enabled: Airlock has no volumes yet",
        ));
    }
    let default_s = if v2 {
        DEFAULT_TIMEOUT_V2_S
    } else {
        DEFAULT_TIMEOUT_V1_S
    };
    let timeout_ms = timeout_ms(&daemon, request.timeout_s.unwrap_or(default_s))?;
    let secure = v2 || request.secure == Some(true);
    let lifecycle = lifecycle(&request)?;
    let mut metadata = request.metadata.unwrap_or_default();
    // Nor has it tools: `airlock.tools` (a JSON array of bindings) declares a wasm sandbox's.
    let tools =
        crate::lifecycle::tools_from_metadata(&mut metadata).map_err(E2bError::bad_request)?;
    // E2B's create has no workspace: `airlock.git.url` (and `.ref`, `.branch`) in the
    // metadata ask for a repository workspace.
    let workspace = crate::lifecycle::workspace_from_metadata(&metadata).unwrap_or_default();
    let created = daemon
        .create(CreateSandboxRequest {
            template: Some(template.to_owned()),
            timeout_ms: Some(timeout_ms),
            env: request.env_vars.unwrap_or_default(),
            metadata,
            workspace,
            lifecycle,
            tools,
            ..CreateSandboxRequest::default()
        })
        .await?;
    let id = created.sandbox.id.clone();
    let record = SandboxRecord {
        secure,
        access_token: created.access_token,
    };
    if let Err(err) = access::write_record(&daemon, &id, &record) {
        let _ = daemon.delete(&id).await;
        return Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot record the new sandbox's access token: {err}"),
        ));
    }
    let token = secure.then_some(record.access_token);
    Ok(json_response(
        StatusCode::CREATED,
        &answer(&created.sandbox, token, &ctx.parts.headers),
    ))
}

/// `autoPause`, `autoPauseMemory` and `autoResume` as the sandbox's lifecycle, checked as
/// the SDK checks them (older SDKs and raw clients do not).
fn lifecycle(request: &NewSandbox) -> Result<v1::Lifecycle, E2bError> {
    let auto_resume = match &request.auto_resume {
        None | Some(serde_json::Value::Null) => false,
        Some(value) => value
            .get("enabled")
            .and_then(serde_json::Value::as_bool)
            .ok_or_else(|| E2bError::bad_request("autoResume must be {\"enabled\": bool}"))?,
    };
    let lifecycle = v1::Lifecycle {
        on_timeout: if request.auto_pause == Some(true) {
            v1::OnTimeout::Pause
        } else {
            v1::OnTimeout::Kill
        },
        pause_mode: if request.auto_pause_memory == Some(false) {
            v1::PauseMode::Filesystem
        } else {
            v1::PauseMode::Frozen
        },
        auto_resume,
    };
    match lifecycle.problem() {
        Some(problem) => Err(E2bError::bad_request(problem)),
        None => Ok(lifecycle),
    }
}

fn detail(ctx: &Ctx) -> Result<Response<Body>, E2bError> {
    let sandbox = existing(&ctx.daemon, &ctx.id)?;
    let mut detail = SandboxDetail::new(
        listed(&sandbox),
        visible_token(&ctx.daemon, &ctx.id),
        domain(&ctx.parts.headers),
    );
    detail.pause_mode = sandbox.pause_mode.map(|mode| {
        match mode {
            v1::PauseMode::Frozen => "full",
            v1::PauseMode::Filesystem => "filesystem",
        }
        .to_owned()
    });
    detail.lifecycle = Some(wire::Lifecycle {
        on_timeout: match sandbox.lifecycle.on_timeout {
            v1::OnTimeout::Pause => "pause",
            v1::OnTimeout::Kill => "kill",
        }
        .to_owned(),
        auto_resume: sandbox.lifecycle.auto_resume,
    });
    Ok(json_response(StatusCode::OK, &detail))
}

async fn kill(ctx: &Ctx) -> Result<Response<Body>, E2bError> {
    ctx.daemon
        .delete(&ctx.id)
        .await
        .map_err(not_found_or(&ctx.id))?;
    Ok(no_content())
}

async fn set_timeout(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: wire::SetTimeout = body(ctx).await?;
    let ms = timeout_ms(&ctx.daemon, request.timeout_s)?;
    running(&ctx.daemon, &ctx.id)?;
    ctx.daemon
        .set_timeout(&ctx.id, ms)
        .map_err(not_found_or(&ctx.id))?;
    Ok(no_content())
}

/// Makes the sandbox live at least `seconds` from now; never shortens it.
fn extend(daemon: &Daemon, sandbox: &v1::Sandbox, seconds: i64) -> Result<(), E2bError> {
    let ms = timeout_ms(daemon, seconds)?;
    if now_ms().saturating_add(ms) > sandbox.expires_at_ms {
        daemon
            .set_timeout(&sandbox.id, ms)
            .map_err(not_found_or(&sandbox.id))?;
    }
    Ok(())
}

async fn refresh(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: wire::Refresh = body(ctx).await?;
    let sandbox = running(&ctx.daemon, &ctx.id)?;
    if let Some(seconds) = request.duration_s.filter(|s| *s != 0) {
        extend(&ctx.daemon, &sandbox, seconds)?;
    }
    Ok(no_content())
}

/// `metadata=` of the list calls: `k=v&k2=v2`, keys and values URL-encoded once more inside.
fn metadata_filter(value: &str) -> Result<BTreeMap<String, String>, E2bError> {
    let mut wanted = BTreeMap::new();
    for pair in value.split('&').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(E2bError::bad_request(format!(
                "metadata filter {pair:?} is not key=value"
            )));
        };
        wanted.insert(
            form_decode(&form_decode(key)),
            form_decode(&form_decode(value)),
        );
    }
    Ok(wanted)
}

fn list_in(
    daemon: &Daemon,
    states: &[v1::SandboxState],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<v1::Sandbox>, E2bError> {
    if states.is_empty() {
        return Ok(Vec::new());
    }
    Ok(daemon.list(states, metadata)?)
}

/// Legacy `GET /sandboxes`: every running sandbox, filtered by metadata.
fn list_v1(ctx: &Ctx) -> Result<Response<Body>, E2bError> {
    let mut metadata = BTreeMap::new();
    for (key, value) in ctx.query() {
        if key == "metadata" {
            metadata = metadata_filter(&value)?;
        }
    }
    let mut sandboxes = list_in(
        &ctx.daemon,
        &[v1::SandboxState::Running, v1::SandboxState::Paused],
        &metadata,
    )?;
    sandboxes.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    let listed: Vec<ListedSandbox> = sandboxes.iter().map(listed).collect();
    Ok(json_response(StatusCode::OK, &listed))
}

/// `GET /v2/sandboxes`: filters, newest first (or `order=asc`), pages of `limit` with the
/// position after the last entry in `x-next-token`.
fn list_v2(ctx: &Ctx) -> Result<Response<Body>, E2bError> {
    let mut metadata = BTreeMap::new();
    let mut states = vec![v1::SandboxState::Running, v1::SandboxState::Paused];
    let (mut limit, mut ascending) = (MAX_PAGE, false);
    let (mut after, mut started_after, mut template) = (None, None, None);
    for (key, value) in ctx.query() {
        match key.as_str() {
            "metadata" => metadata = metadata_filter(&value)?,
            "state" => {
                states.clear();
                for state in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match state {
                        "running" => states.push(v1::SandboxState::Running),
                        "paused" => states.push(v1::SandboxState::Paused),
                        other => {
                            return Err(E2bError::bad_request(format!(
                                "unknown state {other:?} (running, paused)"
                            )));
                        }
                    }
                }
            }
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        E2bError::bad_request(format!(
                            "limit must be 1 to {MAX_PAGE}, got {value:?}"
                        ))
                    })?;
            }
            "order" => {
                ascending = match value.as_str() {
                    "asc" => true,
                    "desc" => false,
                    other => {
                        return Err(E2bError::bad_request(format!(
                            "order must be asc or desc, got {other:?}"
                        )));
                    }
                }
            }
            "nextToken" if !value.is_empty() => {
                let cursor = value
                    .split_once('_')
                    .and_then(|(ms, id)| Some((ms.parse::<u64>().ok()?, id.to_owned())))
                    .ok_or_else(|| E2bError::bad_request(format!("bad nextToken {value:?}")))?;
                after = Some(cursor);
            }
            "startedAfter" => {
                let ms = time::parse_ms(&value).ok_or_else(|| {
                    E2bError::bad_request(format!("startedAfter is not RFC 3339: {value:?}"))
                })?;
                started_after = Some(ms);
            }
            "template" if !value.is_empty() => template = Some(value),
            _ => {}
        }
    }
    let mut sandboxes: Vec<v1::Sandbox> = list_in(&ctx.daemon, &states, &metadata)?;
    sandboxes.retain(|s| {
        template.as_ref().is_none_or(|t| *t == s.template)
            && started_after.is_none_or(|ms| i128::from(s.created_at_ms) > i128::from(ms))
    });
    sandboxes.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    if !ascending {
        sandboxes.reverse();
    }
    if let Some((ms, id)) = &after {
        let cursor = (*ms, id.as_str());
        sandboxes.retain(|s| {
            let key = (s.created_at_ms, s.id.as_str());
            if ascending {
                key > cursor
            } else {
                key < cursor
            }
        });
    }
    let more = sandboxes.len() > limit;
    sandboxes.truncate(limit);
    let page: Vec<ListedSandbox> = sandboxes.iter().map(listed).collect();
    let mut response = json_response(StatusCode::OK, &page);
    if more && let Some(last) = sandboxes.last() {
        let token = format!("{}_{}", last.created_at_ms, last.id);
        if let Ok(value) = HeaderValue::from_str(&token) {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_endpoints_and_their_refusals() {
        let found = |method: Method, path: &str| endpoint(&method, path);
        assert_eq!(
            found(Method::POST, "/v2/sandboxes"),
            Ok((Endpoint::Create { v2: true }, String::new()))
        );
        assert_eq!(
            found(Method::GET, "/sandboxes"),
            Ok((Endpoint::List { v2: false }, String::new()))
        );
        assert_eq!(
            found(Method::POST, "/v2/sandboxes/abc/connect"),
            Ok((Endpoint::Connect, "abc".into()))
        );
        assert_eq!(
            found(Method::POST, "/sandboxes/abc/refreshes"),
            Ok((Endpoint::Refresh, "abc".into()))
        );
        assert_eq!(
            found(Method::DELETE, "/sandboxes/abc"),
            Ok((Endpoint::Kill, "abc".into()))
        );
        let status = |method: Method, path: &str| endpoint(&method, path).unwrap_err().status;
        assert_eq!(
            status(Method::PUT, "/sandboxes"),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            status(Method::GET, "/sandboxes/abc/timeout"),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            status(Method::GET, "/v2/sandboxes/abc/connect"),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            status(Method::GET, "/sandboxes/abc/metrics"),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            status(Method::GET, "/v2/sandboxes/abc/logs"),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            status(Method::GET, "/v2/sandboxes/abc"),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            status(Method::GET, "/templates"),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(status(Method::GET, "/health"), StatusCode::NOT_FOUND);
    }

    #[test]
    fn test_metadata_filters_are_decoded_twice() {
        // What 2.63 sends for {"odd key &=": "odd value &=+ é"} once the query is decoded.
        let value = "odd%2520key%2520%2526%253D=odd%2520value%2520%2526%253D%252B%2520%25C3%25A9";
        let wanted = metadata_filter(value).unwrap();
        assert_eq!(
            wanted.get("odd key &="),
            Some(&"odd value &=+ é".to_owned())
        );
        assert_eq!(metadata_filter("a=1&b=2").unwrap().len(), 2);
        assert!(metadata_filter("novalue").is_err());
    }

    #[test]
    fn test_domain_follows_the_host_the_client_used() {
        let domain_of = |host: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(HOST, host.parse().unwrap());
            domain(&headers)
        };
        assert_eq!(
            domain_of("127.0.0.1:3000").as_deref(),
            Some("localhost:3000")
        );
        assert_eq!(domain_of("[::1]:3000").as_deref(), Some("localhost:3000"));
        assert_eq!(domain_of("localhost").as_deref(), Some("localhost"));
        assert_eq!(
            domain_of("sbx.example.com").as_deref(),
            Some("sbx.example.com")
        );
        assert_eq!(
            domain_of("sbx.example.com:8443").as_deref(),
            Some("sbx.example.com:8443")
        );
        assert_eq!(domain(&HeaderMap::new()), None);
    }
}
