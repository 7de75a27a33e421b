//! Airlock's wire and configuration types.
//!
//! Everything here is plain data: strict (`deny_unknown_fields`), with units in field names, and
//! free of I/O. Parsing of human-written values (`512MiB`, `30s`, `1.5`) lives in [`units`].

pub mod image;
pub mod policy;
pub mod sandbox;
pub mod units;
pub mod v1;
pub mod whole;

pub use image::{ImageConfig, ImageRootfs, MAX_IMAGE_LAYERS};
pub use sandbox::{
    Compat, ResourceLimits, SandboxConfig, Tier, UserSpec, ViewBind, WorkspaceSource,
};
pub use units::{parse_cpus_milli, parse_duration_ms, parse_size_bytes};
