//! What a caller asks for when it creates a sandbox.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The isolation tier of a sandbox. Every tier runs the same agent and obeys the same policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Tier {
    /// Namespaces, Landlock, seccomp and cgroups over a read-only host view.
    #[default]
    Process,
    /// An OCI image root on overlayfs with the same hardening.
    Container,
    /// A KVM micro virtual machine.
    Microvm,
}

impl Tier {
    /// The name used on the command line and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Container => "container",
            Tier::Microvm => "microvm",
        }
    }

    /// Isolation strength: process < container < microvm.
    pub fn strength(self) -> u8 {
        match self {
            Tier::Process => 0,
            Tier::Container => 1,
            Tier::Microvm => 2,
        }
    }
}

/// What to do when a confinement layer cannot be applied on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compat {
    /// Refuse to start, naming the missing kernel feature.
    #[default]
    Strict,
    /// Start anyway and report, on stderr, what is not enforced.
    BestEffort,
}

/// The identity the workload runs as, in the sandbox's user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    pub uid: u32,
    pub gid: u32,
}

/// Why a `UID[:GID]` string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserSpecError {
    #[error("`{0}` is not UID or UID:GID with numeric ids")]
    NotNumeric(String),
    #[error("id {0} is outside the sandbox's range 0..=65535")]
    OutOfRange(u32),
}

/// The largest id inside a sandbox; the user namespace maps 65536 ids.
pub const MAX_SANDBOX_ID: u32 = 65_535;

impl std::str::FromStr for UserSpec {
    type Err = UserSpecError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = || UserSpecError::NotNumeric(value.to_owned());
        let (uid, gid) = match value.split_once(':') {
            Some((uid, gid)) => (uid, Some(gid)),
            None => (value, None),
        };
        let uid: u32 = uid.parse().map_err(|_| bad())?;
        let gid: u32 = match gid {
            Some(gid) => gid.parse().map_err(|_| bad())?,
            None => uid,
        };
        for id in [uid, gid] {
            if id > MAX_SANDBOX_ID {
                return Err(UserSpecError::OutOfRange(id));
            }
        }
        Ok(UserSpec { uid, gid })
    }
}

/// Where the sandbox's `/workspace` comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceSource {
    /// A fresh, empty, private tmpfs that disappears with the sandbox.
    Fresh,
    /// A directory on the host, bound read-write.
    Host { path: PathBuf },
}

/// Resource limits. `None` means "no limit beyond the host's".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    /// Memory, in bytes; swap is never allowed on top.
    pub memory_bytes: Option<u64>,
    /// The most processes and threads alive at once.
    pub pids_max: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (1500 = 1.5 CPUs).
    pub cpu_milli: Option<u32>,
    /// The size of each writable scratch area (`/tmp`, a fresh workspace) and the largest file
    /// the workload may write (`RLIMIT_FSIZE`).
    pub disk_bytes: u64,
}

/// Default limits: generous enough for builds and package installs, finite so that a runaway
/// workload cannot take the host down.
impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            memory_bytes: Some(2 << 30),
            pids_max: Some(1024),
            cpu_milli: None,
            disk_bytes: 1 << 30,
        }
    }
}

/// A host path shown read-only at `guest` in a view that holds nothing else of the host (see
/// [`SandboxConfig::root_binds`]). A directory is bound with the mounts beneath it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewBind {
    pub host: PathBuf,
    pub guest: PathBuf,
}

/// One sandbox as a caller configures it. The policy crate compiles it into a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    pub tier: Tier,
    /// The root of the sandbox's read-only view; `None` is the host's `/`.
    pub rootfs: Option<PathBuf>,
    /// Set: the view's root is empty but for these read-only binds (and what Airlock mounts
    /// itself: `/workspace`, `/tmp`, `/dev`, `/proc`, the agent; `/sys` stays empty): nothing
    /// else of the host. For a workload that needs a few known files (the wasm tier's worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_binds: Option<Vec<ViewBind>>,
    pub workspace: WorkspaceSource,
    pub resources: ResourceLimits,
    /// Wall-clock limit for the whole sandbox.
    pub timeout_ms: Option<u64>,
    /// The workload's entire environment: nothing is inherited from the host.
    pub env: Vec<(String, String)>,
    /// The working directory, inside the sandbox.
    pub cwd: String,
    pub user: UserSpec,
    pub compat: Compat,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// A policy document whose filesystem, syscall and network sections the compiler applies.
    /// Its resources, user, tier and timeout are settings the caller merges into the fields
    /// above first (`airlock_policy::Policy::settings`), since explicit flags win over them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Box<crate::policy::PolicyDocument>>,
    /// The container tier's root filesystem; `tier: container` requires it. Its config's
    /// `user` is resolved inside the image and wins over [`SandboxConfig::user`]: a caller that
    /// overrides the image's user replaces `image.config.user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::image::ImageRootfs>,
    /// The microvm tier's root filesystem: the image's ext4 disk (the image store's
    /// `root_disk`), shown to the guest read-only under the sandbox's own overlay disk. `None`:
    /// the operator's default (`AIRLOCK_MICROVM_ROOT_DISK`) or the guest's initramfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_disk: Option<PathBuf>,
}

impl SandboxConfig {
    /// A configuration with Airlock's defaults that runs `command`.
    pub fn new(command: Vec<String>) -> Self {
        SandboxConfig {
            tier: Tier::Process,
            rootfs: None,
            root_binds: None,
            workspace: WorkspaceSource::Fresh,
            resources: ResourceLimits::default(),
            timeout_ms: None,
            env: Vec::new(),
            cwd: "/workspace".to_owned(),
            user: UserSpec::default(),
            compat: Compat::Strict,
            command,
            policy: None,
            image: None,
            root_disk: None,
        }
    }

    /// Runs the workload as `user`: on the container tier this replaces the image's own
    /// `User` too, which would otherwise win.
    pub fn set_user(&mut self, user: UserSpec) {
        self.user = user;
        if let Some(image) = &mut self.image {
            image.config.user = Some(format!("{}:{}", user.uid, user.gid));
        }
    }

    /// A container-tier configuration of `image` with Airlock's defaults. The image's config
    /// applies as Docker applies it: the command is the entrypoint followed by `command`, or
    /// by the image's `cmd` when `command` is empty; the working directory is the image's
    /// (`/` without one); the image's environment comes first, so that variables the caller
    /// adds later win; its `user` is resolved against the image's own `/etc/passwd` when the
    /// sandbox starts.
    pub fn for_image(image: crate::image::ImageRootfs, command: &[String]) -> Self {
        let mut config = SandboxConfig::new(image.config.argv(command));
        config.tier = Tier::Container;
        config.cwd = image
            .config
            .working_dir
            .clone()
            .filter(|dir| !dir.is_empty())
            .unwrap_or_else(|| "/".to_owned());
        config.env = image.config.env_pairs();
        config.image = Some(image);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_user_spec_parses_uid_and_optional_gid() {
        assert_eq!(
            "1000".parse(),
            Ok(UserSpec {
                uid: 1000,
                gid: 1000
            })
        );
        assert_eq!("1000:50".parse(), Ok(UserSpec { uid: 1000, gid: 50 }));
        assert_eq!(
            "alice".parse::<UserSpec>(),
            Err(UserSpecError::NotNumeric("alice".into()))
        );
        assert_eq!(
            "1000:".parse::<UserSpec>(),
            Err(UserSpecError::NotNumeric("1000:".into()))
        );
        assert_eq!(
            "70000".parse::<UserSpec>(),
            Err(UserSpecError::OutOfRange(70000))
        );
    }

    #[test]
    fn test_config_round_trips_and_rejects_unknown_fields() {
        let config = SandboxConfig::new(vec!["true".into()]);
        let json = serde_json::to_string(&config).unwrap_or_default();
        let back: SandboxConfig = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, config);

        let mut value: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
        value["surprise"] = serde_json::Value::Bool(true);
        let err = serde_json::from_value::<SandboxConfig>(value)
            .err()
            .map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("unknown field `surprise`"));
    }

    #[test]
    fn test_config_for_image_applies_the_image_config() {
        let image = crate::image::ImageRootfs {
            digest: "sha256:ab".into(),
            layers: vec!["/layers/a".into()],
            config: crate::image::ImageConfig {
                env: vec!["PATH=/opt/bin".into()],
                working_dir: Some("/srv".into()),
                user: Some("alice".into()),
                entrypoint: vec!["/entry".into()],
                cmd: vec!["default".into()],
            },
        };
        let config = SandboxConfig::for_image(image.clone(), &["given".into()]);
        assert_eq!(config.tier, Tier::Container);
        assert_eq!(
            config.command,
            vec!["/entry".to_owned(), "given".to_owned()]
        );
        assert_eq!(config.cwd, "/srv");
        assert_eq!(config.env, vec![("PATH".into(), "/opt/bin".into())]);
        let mut bare = image;
        bare.config.working_dir = None;
        assert_eq!(SandboxConfig::for_image(bare, &[]).cwd, "/");
    }

    #[test]
    fn test_workspace_source_is_tagged() {
        let host = WorkspaceSource::Host {
            path: "/src".into(),
        };
        let json = serde_json::to_string(&host).unwrap_or_default();
        assert_eq!(json, r#"{"type":"host","path":"/src"}"#);
    }
}
