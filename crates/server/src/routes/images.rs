//! `/v1/images`: the daemon's image store (`<state>/images`): list, pull (NDJSON progress),
//! import (an uploaded archive), inspect, remove a name, prune.

use std::sync::Arc;

use airlock_api::v1::{
    ErrorCode, ImageDetails, ImageLayer, ImageList, ImageSummary, ImportResponse, ImportedImage,
    LayerPhase, MAX_REFERENCE_CHARS, PruneResponse, PullEvent, PullImageRequest, RemovedImage,
};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Response, StatusCode};

use super::Ctx;
use crate::error::ApiError;
use crate::http::{Body, ChannelBody, NDJSON, json_response, path_decode, with_type};

fn store_error(err: airlock_image::StoreError) -> ApiError {
    let code = match &err {
        // A name that cannot be a reference names no image either.
        airlock_image::StoreError::NotFound(_) | airlock_image::StoreError::Reference(_) => {
            ErrorCode::NotFound
        }
        _ => ErrorCode::Internal,
    };
    ApiError::from_chain(code, &err)
}

/// The `{rest}` of the path: an image reference, slashes and all.
fn reference(ctx: &Ctx) -> Result<String, ApiError> {
    let text = path_decode(&ctx.rest);
    if text.is_empty() || text.len() > MAX_REFERENCE_CHARS || text.contains('\0') {
        return Err(ApiError::invalid(format!(
            "{text:?} is not an image reference"
        )));
    }
    Ok(text)
}

pub fn list(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let images = ctx
        .daemon
        .images
        .list()
        .map_err(store_error)?
        .into_iter()
        .map(|image| ImageSummary {
            digest: image.digest,
            names: image.names,
            layers: image.layers,
            size_bytes: image.size_bytes,
            created_at_ms: u64::try_from(image.created_ms).unwrap_or(0),
        })
        .collect();
    Ok(json_response(StatusCode::OK, &ImageList { images }))
}

pub fn inspect(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let details = ctx
        .daemon
        .images
        .inspect(&reference(ctx)?)
        .map_err(store_error)?;
    let layers = details
        .layers
        .into_iter()
        .map(|layer| ImageLayer {
            diff_id: layer.diff_id,
            blob: layer.blob,
            size_bytes: layer.blob_size_bytes,
            media_type: layer.media_type,
            warnings: layer.unpack_report.map(|r| r.warnings).unwrap_or_default(),
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &ImageDetails {
            digest: details.digest,
            names: details.names,
            config: details.config,
            refcount: details.refcount,
            layers,
        },
    ))
}

pub fn remove(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let names = ctx
        .daemon
        .images
        .remove(&reference(ctx)?)
        .map_err(store_error)?;
    Ok(json_response(StatusCode::OK, &RemovedImage { names }))
}

pub async fn prune(ctx: &Ctx) -> Result<Response<Body>, ApiError> {
    let images = ctx.daemon.images.clone();
    let report = tokio::task::spawn_blocking(move || images.prune())
        .await
        .map_err(|e| ApiError::internal(format!("the prune task failed: {e}")))?
        .map_err(store_error)?;
    Ok(json_response(
        StatusCode::OK,
        &PruneResponse {
            manifests: report.manifests,
            blobs: report.blobs,
            layers: report.layers,
            freed_bytes: report.freed_bytes,
        },
    ))
}

pub async fn import(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let mut tag = None;
    for (key, value) in ctx.query() {
        match key.as_str() {
            "tag" => tag = Some(value),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?} (tag)"
                )));
            }
        }
    }
    if let Some(tag) = &tag
        && airlock_image::Reference::parse(tag).is_err()
    {
        return Err(ApiError::invalid(format!("tag {tag:?} is not NAME[:TAG]")));
    }
    let dir = ctx.daemon.config.builds_dir().join("imports");
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
    let name = crate::auth::hex(
        &crate::auth::random_bytes::<8>()
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?,
    );
    let path = dir.join(format!("{name}.archive"));
    let body = ctx.take_body()?;
    let saved =
        crate::templates::files::save_body(body, &path, ctx.daemon.config.max_upload_bytes).await;
    if let Err(err) = saved {
        let _ = std::fs::remove_file(&path);
        return Err(err);
    }
    let images = ctx.daemon.images.clone();
    let archive = path.clone();
    let imported = tokio::task::spawn_blocking(move || {
        images.import(&archive, &airlock_image::ImportOptions { tag }, None)
    })
    .await;
    let _ = std::fs::remove_file(&path);
    let report = imported
        .map_err(|e| ApiError::internal(format!("the import task failed: {e}")))?
        .map_err(|e| {
            let code = match &e {
                airlock_image::ImportError::Store { .. } => ErrorCode::Internal,
                _ => ErrorCode::Unprocessable,
            };
            // The archive's temporary name means nothing to the client.
            let message = airlock_runtime::error_chain(&e)
                .replace(&format!("`{}`", path.display()), "the upload");
            ApiError::new(code, message)
        })?;
    let kind = match report.kind {
        airlock_image::ImportKind::OciLayout => "oci-layout",
        airlock_image::ImportKind::DockerSave => "docker-save",
        airlock_image::ImportKind::RootfsTarball => "rootfs-tarball",
    };
    Ok(json_response(
        StatusCode::CREATED,
        &ImportResponse {
            kind: kind.to_owned(),
            images: report
                .images
                .into_iter()
                .map(|i| ImportedImage {
                    digest: i.digest,
                    names: i.names,
                })
                .collect(),
        },
    ))
}

fn line(event: &PullEvent) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

pub async fn pull(ctx: &mut Ctx) -> Result<Response<Body>, ApiError> {
    let request: PullImageRequest = ctx.json().await?;
    if request.reference.is_empty()
        || request.reference.chars().count() > MAX_REFERENCE_CHARS
        || request.reference.contains('\0')
    {
        return Err(ApiError::unprocessable(format!(
            "reference must be 1 to {MAX_REFERENCE_CHARS} characters without NUL"
        )));
    }
    let reference = airlock_image::Reference::parse(&request.reference).map_err(|e| {
        ApiError::unprocessable(format!(
            "{:?} is not an image reference: {}",
            request.reference,
            airlock_runtime::error_chain(&e)
        ))
    })?;
    let (tx, body) = ChannelBody::new(64);
    let progress_tx = tx.clone();
    let progress: airlock_image::ProgressFn = Arc::new(move |p: &airlock_image::Progress| {
        let phase = match p.phase {
            airlock_image::Phase::Present => LayerPhase::Present,
            airlock_image::Phase::Transferring => LayerPhase::Transferring,
            airlock_image::Phase::Done => LayerPhase::Done,
        };
        // Progress is best effort: a slow reader misses some lines, never the last one.
        let _ = progress_tx.try_send(Ok(line(&PullEvent::Progress {
            blob: p.blob.to_string(),
            done_bytes: p.done_bytes,
            total_bytes: p.total_bytes,
            phase,
        })));
    });
    let images = ctx.daemon.images.clone();
    let options = airlock_image::PullOptions {
        insecure: request.insecure,
        credentials: None,
    };
    tokio::spawn(async move {
        let event = match images.pull(&reference, &options, Some(progress)).await {
            Ok(report) => PullEvent::Done {
                digest: report.digest,
                names: vec![report.name],
                downloaded_bytes: report.layers.iter().map(|l| l.downloaded_bytes).sum(),
            },
            Err(err) => PullEvent::Error {
                code: ErrorCode::Unprocessable,
                message: airlock_runtime::error_chain(&err),
            },
        };
        let _ = tx.send(Ok(line(&event))).await;
    });
    Ok(with_type(StatusCode::OK, NDJSON, body.boxed_unsync()))
}
