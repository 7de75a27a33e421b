//! Container-tier images as the runtime sees them: unpacked layers plus the image's config.
//!
//! The image store (`airlock-image`) produces these; the container tier consumes them. Layer
//! directories are shared between images and sandboxes and never written after unpacking.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A container-tier root filesystem: an image's unpacked layers plus its config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageRootfs {
    /// The image's digest (`sha256:<hex>` of its manifest), for reports.
    pub digest: String,
    /// Unpacked layer directories on the host, lowest first. Whiteouts are already in
    /// overlay form (char device 0/0, `trusted.overlay.opaque=y` xattr on opaque dirs).
    /// Files keep the image's uids/gids (0..65535) as host ids.
    pub layers: Vec<PathBuf>,
    pub config: ImageConfig,
}

/// The parts of an OCI image config that decide how the workload starts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// `K=V` entries, as in the OCI config's `Env`.
    pub env: Vec<String>,
    /// The OCI config's `WorkingDir`, if set.
    pub working_dir: Option<String>,
    /// `uid[:gid]` or `name[:group]`, resolved against the image's `/etc/passwd` at start.
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_image_rootfs_unknown_field_rejected() {
        let json = r#"{"digest":"sha256:00","layers":[],"config":{"env":[],"working_dir":null,
            "user":null,"entrypoint":[],"cmd":[]},"extra":1}"#;
        assert!(serde_json::from_str::<ImageRootfs>(json).is_err());
    }

    #[test]
    fn test_image_rootfs_round_trip_equal() {
        let rootfs = ImageRootfs {
            digest: "sha256:ab".into(),
            layers: vec![PathBuf::from("/var/lib/airlock/images/layers/sha256/cd")],
            config: ImageConfig {
                env: vec!["PATH=/bin".into()],
                working_dir: Some("/app".into()),
                user: Some("1000:1000".into()),
                entrypoint: vec!["/bin/sh".into()],
                cmd: vec!["-c".into(), "true".into()],
            },
        };
        let json = serde_json::to_string(&rootfs).unwrap();
        assert_eq!(serde_json::from_str::<ImageRootfs>(&json).unwrap(), rootfs);
    }
}
