//! The daemon's image store on the native API (`/v1/images`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ErrorCode, NON_EMPTY_NO_NUL};
use crate::image::ImageConfig;

/// The longest image reference the daemon takes.
pub const MAX_REFERENCE_CHARS: usize = 1024;

/// One image of `GET /v1/images`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageSummary {
    /// `sha256:<hex>` of its manifest.
    pub digest: String,
    /// `registry/repo:tag` names (and `name@digest` for pulls by digest). A template's
    /// images have none: a lease keeps them.
    pub names: Vec<String>,
    pub layers: u64,
    /// The compressed layer blobs together.
    pub size_bytes: u64,
    /// Unix time in milliseconds.
    pub created_at_ms: u64,
}

/// `GET /v1/images`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageList {
    pub images: Vec<ImageSummary>,
}

/// One layer of [`ImageDetails`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageLayer {
    /// `sha256:<hex>` of the uncompressed tar, which names its unpacked directory.
    pub diff_id: String,
    pub blob: String,
    pub size_bytes: u64,
    pub media_type: String,
    /// What unpacking it skipped (device nodes, FIFOs, unsupported attributes).
    pub warnings: Vec<String>,
}

/// `GET /v1/images/{rest}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageDetails {
    pub digest: String,
    pub names: Vec<String>,
    pub config: ImageConfig,
    /// Names plus leases (sandboxes, templates, the build cache) that keep it from prune.
    pub refcount: u64,
    pub layers: Vec<ImageLayer>,
}

/// `POST /v1/images/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImageRequest {
    /// `REGISTRY/REPO[:TAG|@DIGEST]`; Docker Hub's short names work (`debian` is
    /// `docker.io/library/debian:latest`).
    #[schemars(length(min = 1, max = MAX_REFERENCE_CHARS), regex(pattern = NON_EMPTY_NO_NUL))]
    pub reference: String,
    /// Allow plain HTTP to a registry that is not on loopback.
    #[serde(default)]
    pub insecure: bool,
}

/// Where a layer of a pull stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LayerPhase {
    /// Already in the store.
    Present,
    Transferring,
    /// Verified and unpacked.
    Done,
}

/// One line of the pull's answer (`application/x-ndjson`): progress per layer, then exactly
/// one `done` or `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PullEvent {
    Progress {
        /// The layer's blob digest.
        blob: String,
        done_bytes: u64,
        total_bytes: u64,
        phase: LayerPhase,
    },
    Done {
        digest: String,
        names: Vec<String>,
        /// Bytes downloaded by this pull (layers already stored cost nothing).
        downloaded_bytes: u64,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// One image an import recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportedImage {
    pub digest: String,
    pub names: Vec<String>,
}

/// `POST /v1/images/import`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportResponse {
    /// `oci-layout`, `docker-save` or `rootfs-tarball`.
    pub kind: String,
    pub images: Vec<ImportedImage>,
}

/// `DELETE /v1/images/{rest}`: the names removed (the files stay until prune).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RemovedImage {
    pub names: Vec<String>,
}

/// `POST /v1/images/prune`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneResponse {
    /// The manifests removed: no name and no lease referred to them.
    pub manifests: Vec<String>,
    pub blobs: u64,
    pub layers: u64,
    pub freed_bytes: u64,
}
