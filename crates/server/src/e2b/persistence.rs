//! E2B's pause, resume (connect), snapshots and fork, on the daemon's `lifecycle::pause`.
//! Statuses follow the SDK's parsers exactly (`pause-and-snapshots.md` §1): pause 204 or 409
//! when already paused; connect 201 when it resumed, 200 when it was running; snapshots 201
//! `{snapshotID, names}`; fork 201 with one entry per fork.

use airlock_api::v1::{self, ErrorCode, PauseMode};
use hyper::{Response, StatusCode};

use super::control::{answer, body, not_found_or, timeout_ms, visible_token};
use super::wire::{self, CreateSnapshot, ForkEntry, SnapshotInfo};
use super::{E2bError, wire::ErrorBody};
use crate::http::{Body, json_response, no_content};
use crate::routes::Ctx;

/// What connect extends a sandbox to when it names no timeout (E2B's default).
const DEFAULT_CONNECT_TIMEOUT_S: i64 = 300;
/// E2B's default lifetime of a fork.
const DEFAULT_FORK_TIMEOUT_S: i64 = 15;

fn mode(memory: Option<bool>) -> PauseMode {
    if memory == Some(false) {
        PauseMode::Filesystem
    } else {
        PauseMode::Frozen
    }
}

/// `POST /sandboxes/{id}/pause`.
pub async fn pause(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: wire::Pause = body(ctx).await?;
    let daemon = ctx.daemon.clone();
    match daemon.pause(&ctx.id, mode(request.memory)).await {
        Ok(_) => Ok(no_content()),
        Err(err) if err.code == ErrorCode::SandboxPaused => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("Sandbox '{}' is already paused", ctx.id),
        )),
        Err(err) if err.code == ErrorCode::Conflict => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("Sandbox '{}' is busy: {}", ctx.id, err.message),
        )),
        Err(err) => Err(not_found_or(&ctx.id)(err)),
    }
}

/// `POST /v2/sandboxes/{id}/connect`: resumes a paused sandbox (201) or extends a running one
/// (200); `memory: false` reboots a frozen one on its files.
pub async fn connect(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: wire::ConnectSandbox = body(ctx).await?;
    let seconds = request.timeout_s.unwrap_or(DEFAULT_CONNECT_TIMEOUT_S);
    resume_as(ctx, seconds, request.memory, false).await
}

/// Legacy `POST /sandboxes/{id}/resume`: 201, or 409 for a running sandbox.
pub async fn resume(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: wire::Resume = body(ctx).await?;
    let seconds = request.timeout_s.unwrap_or(DEFAULT_CONNECT_TIMEOUT_S);
    resume_as(ctx, seconds, None, true).await
}

async fn resume_as(
    ctx: &mut Ctx,
    seconds: i64,
    memory: Option<bool>,
    legacy: bool,
) -> Result<Response<Body>, E2bError> {
    let daemon = ctx.daemon.clone();
    let ms = timeout_ms(&daemon, seconds)?;
    let sandbox = daemon.get(&ctx.id).map_err(not_found_or(&ctx.id))?;
    if sandbox.state == v1::SandboxState::Creating {
        return Err(E2bError::sandbox_not_found(&ctx.id));
    }
    if legacy && sandbox.state == v1::SandboxState::Running {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("Sandbox '{}' is already running", ctx.id),
        ));
    }
    if memory == Some(false) && sandbox.pause_mode == Some(PauseMode::Frozen) {
        daemon
            .pause_to_disk(&ctx.id)
            .await
            .map_err(not_found_or(&ctx.id))?;
    }
    let (sandbox, resumed) =
        daemon
            .resume(&ctx.id, Some(ms))
            .await
            .map_err(|err| match err.code {
                ErrorCode::NotFound | ErrorCode::SandboxStopping => E2bError::new(
                    StatusCode::NOT_FOUND,
                    format!("Paused sandbox {} not found", ctx.id),
                ),
                _ => err.into(),
            })?;
    let token = visible_token(&daemon, &ctx.id);
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(
        status,
        &answer(&sandbox, token, &ctx.parts.headers),
    ))
}

fn info(snapshot: &v1::Snapshot) -> SnapshotInfo {
    let mut names = vec![format!("{}:default", snapshot.id)];
    if let Some(name) = &snapshot.name {
        names.insert(0, format!("{name}:default"));
    }
    SnapshotInfo {
        snapshot_id: snapshot.name.clone().unwrap_or_else(|| snapshot.id.clone()),
        names,
    }
}

/// `POST /sandboxes/{id}/snapshots` (the filesystem: memory snapshots are refused as E2B
/// refuses a mode a node cannot do, except on the microvm tier, whose snapshots are the VM's).
pub async fn create_snapshot(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: CreateSnapshot = body(ctx).await?;
    let microvm =
        ctx.daemon.get(&ctx.id).map_err(not_found_or(&ctx.id))?.tier == airlock_api::Tier::Microvm;
    if request.memory == Some(true) && !microvm {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "Airlock snapshots hold the filesystem only outside the microvm tier; processes are not captured (leave memory out)",
        ));
    }
    let name = request.name.map(|name| {
        name.split_once(':')
            .map_or(name.clone(), |(n, _)| n.to_owned())
    });
    if let Some(name) = &name
        && !crate::routes::valid_snapshot_name(name)
    {
        return Err(E2bError::bad_request(format!(
            "snapshot name {name:?}: lower-case letters, digits, - and _"
        )));
    }
    let daemon = ctx.daemon.clone();
    let snapshot = daemon
        .snapshot(&ctx.id, name)
        .await
        .map_err(not_found_or(&ctx.id))?;
    Ok(json_response(StatusCode::CREATED, &info(&snapshot)))
}

/// `GET /snapshots?sandboxID=&name=`.
pub fn list_snapshots(ctx: &Ctx) -> Result<Response<Body>, E2bError> {
    let (mut source, mut name) = (None, None);
    for (key, value) in ctx.query() {
        match key.as_str() {
            "sandboxID" if !value.is_empty() => source = Some(value),
            "name" if !value.is_empty() => {
                let bare = value.rsplit('/').next().unwrap_or(&value);
                name = Some(bare.split_once(':').map_or(bare, |(n, _)| n).to_owned());
            }
            _ => {}
        }
    }
    let list: Vec<SnapshotInfo> = ctx
        .daemon
        .list_snapshots()?
        .iter()
        .filter(|s| source.as_ref().is_none_or(|id| *id == s.source_id))
        .filter(|s| {
            name.as_ref()
                .is_none_or(|n| s.name.as_ref() == Some(n) || s.id == *n)
        })
        .map(info)
        .collect();
    Ok(json_response(StatusCode::OK, &list))
}

/// `DELETE /templates/{id}`: a snapshot (`name:tag` names it too), or a built template
/// (every tag of its name, or the one `name:tag` names); 404 when unknown.
pub fn delete_template(ctx: &Ctx) -> Result<Response<Body>, E2bError> {
    let id = crate::http::path_decode(&ctx.id);
    let bare = id.split_once(':').map_or(id.as_str(), |(n, _)| n);
    if ctx.daemon.delete_snapshot(bare)? {
        return Ok(no_content());
    }
    let built = ctx.daemon.find_template(&id)?.is_some_and(|t| !t.builtin);
    if built {
        ctx.daemon.delete_template(&id)?;
        Ok(no_content())
    } else {
        Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template '{}' not found", ctx.id),
        ))
    }
}

/// `POST /sandboxes/{id}/fork`.
pub async fn fork(ctx: &mut Ctx) -> Result<Response<Body>, E2bError> {
    let request: wire::Fork = body(ctx).await?;
    let count = request.count.unwrap_or(1);
    let count = u32::try_from(count)
        .ok()
        .filter(|n| (1..=v1::MAX_FORKS).contains(n))
        .ok_or_else(|| E2bError::bad_request(format!("count must be 1 to 20, got {count}")))?;
    let daemon = ctx.daemon.clone();
    let ms = timeout_ms(&daemon, request.timeout_s.unwrap_or(DEFAULT_FORK_TIMEOUT_S))?;
    let forks = daemon
        .fork(&ctx.id, count, Some(ms))
        .await
        .map_err(not_found_or(&ctx.id))?;
    let mut entries = Vec::new();
    for fork in forks {
        entries.push(match (fork.sandbox, fork.access_token, fork.error) {
            (Some(sandbox), Some(token), _) => {
                let record = super::access::SandboxRecord {
                    secure: true,
                    access_token: token.clone(),
                };
                let _ = super::access::write_record(&daemon, &sandbox.id, &record);
                ForkEntry {
                    sandbox: Some(answer(&sandbox, Some(token), &ctx.parts.headers)),
                    error: None,
                }
            }
            (_, _, error) => {
                let error = error.unwrap_or(v1::ErrorBody {
                    code: ErrorCode::Internal,
                    message: "the fork failed".to_owned(),
                });
                ForkEntry {
                    sandbox: None,
                    error: Some(ErrorBody {
                        code: error.code.http_status(),
                        message: error.message,
                    }),
                }
            }
        });
    }
    Ok(json_response(StatusCode::CREATED, &entries))
}
