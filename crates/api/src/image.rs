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

/// The most layers one overlay can stack on this kernel (overlayfs' own limit).
pub const MAX_IMAGE_LAYERS: usize = 500;

impl ImageConfig {
    /// The program and arguments a sandbox of this image runs, by Docker's rule: the
    /// entrypoint, followed by `command` when one is given, else by the image's `cmd`.
    pub fn argv(&self, command: &[String]) -> Vec<String> {
        let tail = if command.is_empty() {
            &self.cmd
        } else {
            command
        };
        self.entrypoint.iter().chain(tail).cloned().collect()
    }

    /// The image's environment as pairs; an entry without `=` is a variable with an empty
    /// value, as Docker reads it.
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .map(|entry| match entry.split_once('=') {
                Some((name, value)) => (name.to_owned(), value.to_owned()),
                None => (entry.clone(), String::new()),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn test_image_argv_follows_dockers_entrypoint_and_cmd_rule() {
        let config = ImageConfig {
            entrypoint: strings(&["/entry", "-x"]),
            cmd: strings(&["serve"]),
            ..ImageConfig::default()
        };
        assert_eq!(config.argv(&[]), strings(&["/entry", "-x", "serve"]));
        assert_eq!(
            config.argv(&strings(&["run", "1"])),
            strings(&["/entry", "-x", "run", "1"])
        );
        let plain = ImageConfig {
            cmd: strings(&["sh"]),
            ..ImageConfig::default()
        };
        assert_eq!(plain.argv(&strings(&["ls"])), strings(&["ls"]));
        assert!(ImageConfig::default().argv(&[]).is_empty());
    }

    #[test]
    fn test_image_env_pairs_split_at_the_first_equals_sign() {
        let config = ImageConfig {
            env: strings(&["PATH=/bin:/usr/bin", "A=b=c", "EMPTY"]),
            ..ImageConfig::default()
        };
        assert_eq!(
            config.env_pairs(),
            vec![
                ("PATH".into(), "/bin:/usr/bin".into()),
                ("A".into(), "b=c".into()),
                ("EMPTY".into(), String::new())
            ]
        );
    }

    #[test]
    fn test_image_rootfs_rejects_unknown_fields() {
        let json = r#"{"digest":"sha256:00","layers":["/l"],"config":{"env":[],"working_dir":null,"user":null,"entrypoint":[],"cmd":[],"extra":1}}"#;
        let err = serde_json::from_str::<ImageRootfs>(json).unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
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
