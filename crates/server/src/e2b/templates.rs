//! E2B's template API, as the unmodified SDK's `Template.build` drives it (SDK 2.10 and later;
//! the wire protocol is in `shared/reference/images-and-templates.md` §1d), on the daemon's
//! one build engine (`crate::templates`):
//!
//! 1. `POST /v3/templates` `{name, tags, cpuCount, memoryMB}` → 202 with the template id (the
//!    name without its tag: `Sandbox.create(id)` works as `Sandbox.create(name)` does) and a
//!    build id (a UUID); the build waits for its steps.
//! 2. `GET /templates/{id}/files/{hash}` per `COPY` → 201 `{present: true}`, or `{present:
//!    false, url}` with a one-time URL of this daemon (`PUT /v1/uploads/{token}`, no API key:
//!    the token is the credential), built from the request's `Host`.
//! 3. `POST /v2/templates/{id}/builds/{buildID}` with the steps → 202; the build runs.
//! 4. `GET /templates/{id}/builds/{buildID}/status?logsOffset=N&limit=M` → 200 with the log
//!    from `N` and, on error, `reason` (`step`: `base`, `1`..`N` or `finalize`). A finished
//!    build's log runs out, so the SDK's last poll comes back empty and it stops.
//!
//! Also: `GET /templates/aliases/{alias}` (`Template.exists`), the tag calls (`assign_tags`,
//! `remove_tags`, `get_tags`) and `DELETE /templates/{id}` (every tag of a template, or a
//! snapshot). A bare name means its `latest` tag (else its newest), as on create.

use std::collections::BTreeMap;

use airlock_api::v1::{
    BuildState, BuildStep, BuildTemplateRequest, DEFAULT_TAG, Resources, StepKind, Template,
};
use hyper::header::HOST;
use hyper::{Method, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::control::body;
use super::{E2bError, time};
use crate::error::ApiError;
use crate::http::{Body, json_response, no_content, path_decode};
use crate::routes::Ctx;
use crate::templates::split_name;

/// `POST /v3/templates`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildRequestV3 {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    /// Deprecated spelling of `name`.
    #[serde(default)]
    alias: Option<String>,
    #[serde(rename = "teamID", default)]
    _team_id: Option<String>,
    #[serde(rename = "cpuCount", default)]
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB", default)]
    memory_mb: Option<u64>,
    #[serde(rename = "minFreeDiskMb", default)]
    min_free_disk_mb: Option<u64>,
}

#[derive(Debug, Serialize)]
struct BuildRequested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

/// A step as the SDK sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    force: Option<bool>,
    #[serde(rename = "filesHash", default)]
    files_hash: Option<String>,
    /// Client-side only (whether to upload again).
    #[serde(rename = "forceUpload", default)]
    _force_upload: Option<Value>,
    #[serde(rename = "resolveSymlinks", default)]
    _resolve_symlinks: Option<Value>,
    #[serde(rename = "gzip", default)]
    _gzip: Option<Value>,
}

/// `POST /v2/templates/{id}/builds/{buildID}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildStart {
    #[serde(rename = "fromImage", default)]
    from_image: Option<String>,
    #[serde(rename = "fromTemplate", default)]
    from_template: Option<String>,
    #[serde(rename = "fromImageRegistry", default)]
    from_image_registry: Option<Value>,
    #[serde(default)]
    force: Option<bool>,
    #[serde(default)]
    steps: Option<Vec<Step>>,
    #[serde(rename = "startCmd", default)]
    start_cmd: Option<String>,
    #[serde(rename = "readyCmd", default)]
    ready_cmd: Option<String>,
}

#[derive(Debug, Serialize)]
struct LogEntry {
    timestamp: String,
    level: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

#[derive(Debug, Serialize)]
struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
}

#[derive(Debug, Serialize)]
struct BuildStatus {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: &'static str,
    logs: Vec<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignTags {
    target: String,
    tags: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

fn not_found(what: &str) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("template '{what}' not found"),
    )
}

fn segments(path: &str) -> Vec<String> {
    path.trim_start_matches('/')
        .split('/')
        .map(path_decode)
        .collect()
}

/// Serves E2B's template calls; `None` for any other path.
pub async fn route(ctx: &mut Ctx) -> Option<Result<Response<Body>, E2bError>> {
    let path = ctx.parts.uri.path().to_owned();
    let method = ctx.parts.method.clone();
    let parts = segments(&path);
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    Some(match (method, parts.as_slice()) {
        (Method::POST, ["v3", "templates"]) => request_build(ctx).await,
        (Method::GET, ["templates", id, "files", hash]) => file_link(ctx, id, hash),
        (Method::POST, ["v2", "templates", id, "builds", build]) => trigger(ctx, id, build).await,
        (Method::GET, ["templates", id, "builds", build, "status"]) => status(ctx, id, build),
        (Method::GET, ["templates", "aliases", name]) => alias(ctx, name),
        (Method::POST, ["templates", "tags"]) => assign_tags(ctx).await,
        (Method::DELETE, ["templates", "tags"]) => remove_tags(ctx).await,
        (Method::GET, ["templates", id, "tags"]) => tags(ctx, id),
        _ => return None,
    })
}

async fn request_build(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: BuildRequestV3 = body(ctx).await?;
    let name = request
        .name
        .or(request.alias)
        .ok_or_else(|| E2bError::bad_request("name is required"))?;
    // E2B names may carry a team namespace (`team/name:tag`); Airlock has one team.
    let name = name.rsplit('/').next().unwrap_or(&name).to_owned();
    let (family, tag) = split_name(&name).ok_or_else(|| {
        E2bError::bad_request(format!(
            "template name {name:?} must be lower-case letters, digits, `.`, `_` and `-`, with an optional :tag"
        ))
    })?;
    let extra: Vec<String> = request.tags.unwrap_or_default();
    let resources = Resources {
        cpu_millis: request.cpu_count.map(|n| n.saturating_mul(1000)),
        memory_bytes: request.memory_mb.map(|mb| mb << 20),
        disk_bytes: request.min_free_disk_mb.map(|mb| mb << 20),
        ..Resources::default()
    };
    let build = ctx.daemon.create_build(BuildTemplateRequest {
        name: format!("{family}:{tag}"),
        tags: extra.clone(),
        resources,
        ..BuildTemplateRequest::default()
    })?;
    let mut tags = vec![tag];
    tags.extend(extra);
    tags.dedup();
    Ok(json_response(
        StatusCode::ACCEPTED,
        &BuildRequested {
            template_id: family.clone(),
            build_id: build.id,
            public: false,
            names: tags.iter().map(|t| format!("{family}:{t}")).collect(),
            tags,
            aliases: vec![family],
        },
    ))
}

fn file_link(ctx: &Ctx, _template: &str, hash: &str) -> Result<Response<Body>, E2bError> {
    if !crate::templates::files::is_hash(hash) {
        return Err(E2bError::bad_request(format!(
            "{hash:?} is not a files hash (64 lower-case hex digits)"
        )));
    }
    let answer = if ctx.daemon.files(hash).is_some() {
        serde_json::json!({ "present": true })
    } else {
        let host = ctx
            .parts
            .headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map_or_else(|| ctx.daemon.config.listen.to_string(), str::to_owned);
        let token = ctx.daemon.upload_token(hash)?;
        serde_json::json!({ "present": false, "url": format!("http://{host}/v1/uploads/{token}") })
    };
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// A build of `template`, or E2B's 404.
fn build_of(ctx: &Ctx, template: &str, build: &str) -> Result<crate::store::BuildRow, E2bError> {
    let row = ctx
        .daemon
        .get_build_row(build)
        .map_err(|_| E2bError::new(StatusCode::NOT_FOUND, format!("build '{build}' not found")))?;
    let family = row.build.template.split(':').next().unwrap_or_default();
    if family != template {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("build '{build}' is not a build of template '{template}'"),
        ));
    }
    Ok(row)
}

fn step(step: &Step, n: usize) -> Result<BuildStep, E2bError> {
    let kind = match step.kind.as_str() {
        "RUN" => StepKind::Run,
        "COPY" => StepKind::Copy,
        "ENV" => StepKind::Env,
        "WORKDIR" => StepKind::Workdir,
        "USER" => StepKind::User,
        other => {
            return Err(E2bError::bad_request(format!(
                "step {n}: Airlock builds RUN, COPY, ENV, WORKDIR and USER steps, not {other}"
            )));
        }
    };
    Ok(BuildStep {
        kind,
        args: step.args.clone(),
        force: step.force.unwrap_or(false),
        files_hash: step.files_hash.clone(),
    })
}

async fn trigger(ctx: &mut Ctx, template: &str, build: &str) -> Result<Response<Body>, E2bError> {
    let start: BuildStart = body(ctx).await?;
    let row = build_of(ctx, template, build)?;
    if start.from_image_registry.is_some() {
        return Err(E2bError::bad_request(
            "fromImageRegistry is not supported: pull the image into the daemon's store first (POST /v1/images/pull), or give a registry Airlock can pull from anonymously",
        ));
    }
    let steps = start
        .steps
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(n, s)| step(s, n + 1))
        .collect::<Result<Vec<_>, _>>()?;
    let request = BuildTemplateRequest {
        from_image: start.from_image,
        from_template: start.from_template,
        steps,
        start_cmd: start.start_cmd.filter(|c| !c.is_empty()),
        ready_cmd: start.ready_cmd.filter(|c| !c.is_empty()),
        force: start.force.unwrap_or(false),
        ..row.request
    };
    ctx.daemon.run_build(row.build, request)?;
    Ok(json_response(StatusCode::ACCEPTED, &serde_json::json!({})))
}

fn status(ctx: &Ctx, template: &str, build: &str) -> Result<Response<Body>, E2bError> {
    let (mut offset, mut limit) = (0u64, 100u64);
    for (key, value) in ctx.query() {
        let number = || {
            value.parse::<u64>().map_err(|_| {
                E2bError::bad_request(format!("{key} must be a whole number, got {value:?}"))
            })
        };
        match key.as_str() {
            "logsOffset" => offset = number()?,
            "limit" => limit = number()?.clamp(1, 100),
            _ => {}
        }
    }
    let row = build_of(ctx, template, build)?;
    let entry = |e: airlock_api::v1::BuildLogEntry| LogEntry {
        timestamp: time::format_ms(e.at_ms),
        level: e.level.as_str(),
        message: e.message,
        step: e.step,
    };
    let entries = ctx.daemon.build_logs(build, offset, limit)?;
    let state = row.build.state;
    let reason = row.build.reason.map(|r| {
        // The failed step's last lines, which the SDK shows with the error.
        let mut lines: Vec<airlock_api::v1::BuildLogEntry> = ctx
            .daemon
            .build_logs(build, 0, u64::MAX)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.step == r.step)
            .collect();
        let skip = lines.len().saturating_sub(20);
        lines.drain(..skip);
        Reason {
            message: r.message,
            step: r.step.clone(),
            log_entries: lines.into_iter().map(entry).collect(),
        }
    });
    Ok(json_response(
        StatusCode::OK,
        &BuildStatus {
            template_id: template.to_owned(),
            build_id: build.to_owned(),
            status: match state {
                BuildState::Waiting => "waiting",
                BuildState::Building => "building",
                BuildState::Ready => "ready",
                BuildState::Error => "error",
            },
            logs: Vec::new(),
            log_entries: entries.into_iter().map(entry).collect(),
            reason,
        },
    ))
}

fn alias(ctx: &Ctx, alias: &str) -> Result<Response<Body>, E2bError> {
    match ctx.daemon.find_template(alias)? {
        Some(template) if !template.builtin => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({
                "templateID": template.name.split(':').next().unwrap_or_default(),
                "public": false
            }),
        )),
        _ => Err(not_found(alias)),
    }
}

/// `POST /templates/tags`: `target` (`name:tag`)'s build under more tags.
async fn assign_tags(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: AssignTags = body(ctx).await?;
    let target = ctx
        .daemon
        .find_template(&request.target)?
        .filter(|t| !t.builtin)
        .ok_or_else(|| not_found(&request.target))?;
    let family = target.name.split(':').next().unwrap_or_default().to_owned();
    for tag in &request.tags {
        let name = format!("{family}:{tag}");
        if split_name(&name).is_none() {
            return Err(E2bError::bad_request(format!("tag {tag:?} is not a tag")));
        }
        let template = Template {
            name: name.clone(),
            updated_at_ms: crate::store::now_ms(),
            ..target.clone()
        };
        if let Some(image) = &template.image {
            let holder = format!("template:{name}");
            let _ = ctx.daemon.images.release(&holder);
            ctx.daemon
                .images
                .lease(image, &holder)
                .map_err(|e| ApiError::from_chain(airlock_api::v1::ErrorCode::Internal, &e))?;
        }
        ctx.daemon
            .store
            .put_template(&template, &family)
            .map_err(ApiError::from)?;
    }
    Ok(json_response(
        StatusCode::CREATED,
        &serde_json::json!({ "tags": request.tags, "buildID": target.build_id.unwrap_or_default() }),
    ))
}

/// `DELETE /templates/tags`: `name`'s tags go (its builds stay while another tag has them).
async fn remove_tags(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: RemoveTags = body(ctx).await?;
    let family = request
        .name
        .split(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    for tag in &request.tags {
        let name = format!("{family}:{tag}");
        if ctx
            .daemon
            .store
            .get_template(&name)
            .map_err(ApiError::from)?
            .is_none()
        {
            return Err(not_found(&name));
        }
        ctx.daemon.delete_template(&name)?;
    }
    Ok(no_content())
}

fn tags(ctx: &Ctx, id: &str) -> Result<Response<Body>, E2bError> {
    let family = id.split(':').next().unwrap_or_default();
    let templates = ctx
        .daemon
        .store
        .family_templates(family)
        .map_err(ApiError::from)?;
    if templates.is_empty() {
        return Err(not_found(id));
    }
    let mut by_tag = BTreeMap::new();
    for template in templates {
        let tag = template
            .name
            .split_once(':')
            .map_or(DEFAULT_TAG, |(_, t)| t)
            .to_owned();
        by_tag.insert(
            tag.clone(),
            serde_json::json!({
                "tag": tag,
                "buildID": template.build_id.unwrap_or_default(),
                "createdAt": time::format_ms(template.updated_at_ms),
            }),
        );
    }
    Ok(json_response(
        StatusCode::OK,
        &by_tag.into_values().collect::<Vec<_>>(),
    ))
}
