//! `SandboxConfig` + `HostFacts` → `Plan`.

use std::path::{Path, PathBuf};

use airlock_api::{SandboxConfig, Tier, WorkspaceSource};

use crate::document::Policy;
use crate::document_compile;
use crate::plan::{
    CgroupLimits, IdMap, IdentityPlan, LandlockPlan, Mask, MaskKind, Plan, ProcessPlan, Rlimit,
    RlimitResource, RootPlan, ScratchPlan, UserLookup, ViewPlan, WorkspacePlan,
};
use crate::seccomp::default_rules;

/// The first host id of a root caller's sandboxes: uid 0 inside is this unprivileged uid
/// outside. It sits far above ordinary users and the usual subordinate-id ranges.
pub const SANDBOX_ID_BASE: u32 = 0x7000_0000;
/// How many ids a root caller's sandbox maps.
pub const SANDBOX_ID_COUNT: u32 = 65_536;
const CPU_PERIOD_US: u64 = 100_000;
/// Airlock's own processes in a sandbox's cgroup: init. (The helper leaves it once init exists.)
pub const AIRLOCK_PROCESSES: u64 = 1;
/// The kernel's ceiling for `pids.max` (`PID_MAX_LIMIT` on 64-bit).
pub const PIDS_LIMIT: u64 = 4_194_304;
const NOFILE: u64 = 65_536;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the caller's side knows about the host. Gathered at the edge, passed in as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub caller_uid: u32,
    pub caller_gid: u32,
    /// Airlock's own state directories, hidden from every sandbox.
    pub state_dirs: Vec<PathBuf>,
}

/// Why a configuration cannot become a plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("the {0} tier is not available yet; use --tier process or container")]
    UnsupportedTier(&'static str),
    #[error("no command given")]
    EmptyCommand,
    #[error("the container tier needs an image (--image)")]
    MissingImage,
    #[error("an image belongs to the container tier, not the {0} tier")]
    ImageOnWrongTier(&'static str),
    #[error("--rootfs and an image are exclusive: the image is the container tier's root")]
    RootfsWithImage,
    #[error("--rootfs and root binds are exclusive: the binds are the whole root")]
    RootfsWithBinds,
    #[error("root binds belong to the process tier; the container tier's root is its image")]
    BindsWithImage,
    #[error("root bind {path}: {reason}")]
    BadBind { path: String, reason: &'static str },
    #[error("the image has {0} layers; an overlay stacks at most {max}", max = airlock_api::MAX_IMAGE_LAYERS)]
    TooManyLayers(usize),
    #[error("the image has no layers")]
    NoLayers,
    #[error("the image has no entrypoint and no cmd: give a command after --")]
    NoImageCommand,
    #[error(
        "the container tier needs a root caller (it idmaps the image's layers and mounts an overlay on the host's side)"
    )]
    ContainerNeedsRoot,
    #[error("{what} contains a NUL byte")]
    NulByte { what: String },
    #[error("`{0}` is not a valid environment variable name")]
    BadEnvName(String),
    #[error("{what} must be at most {max}, got {value}")]
    TooLarge {
        what: &'static str,
        max: u64,
        value: u64,
    },
    #[error("{what} must be an absolute path, got `{path}`")]
    RelativePath { what: &'static str, path: String },
    #[error("invalid policy")]
    InvalidPolicy(#[source] crate::document::PolicyError),
    #[error("the policy's `{rule}` cannot be enforced: {reason}")]
    PolicyUnsupported { rule: String, reason: String },
    #[error("the policy needs at least the {required} tier, not {requested}")]
    PolicyTier {
        required: &'static str,
        requested: &'static str,
    },
}

/// Dot-directories and files in a home directory that hold keys or credentials.
const HOME_SECRETS: &[&str] = &[
    ".ssh",
    ".aws",
    ".config/gh",
    ".docker",
    ".netrc",
    ".kube",
    ".gnupg",
    ".git-credentials",
    ".config/gcloud",
    ".azure",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
];
const HOST_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/sudoers.d",
];
/// Runtime directories: sockets of docker, containerd, D-Bus and every other host daemon.
const HOST_RUNTIME_DIRS: &[&str] = &["/run", "/var/run"];

/// Compiles `config` into the plan that `airlock-jail` applies.
pub fn compile(config: &SandboxConfig, host: &HostFacts) -> Result<Plan, CompileError> {
    let container = match config.tier {
        Tier::Process => false,
        Tier::Container => true,
        other => return Err(CompileError::UnsupportedTier(other.as_str())),
    };
    validate_process(config)?;
    let root = match (&config.image, container) {
        (Some(_), false) => return Err(CompileError::ImageOnWrongTier(config.tier.as_str())),
        (None, true) => return Err(CompileError::MissingImage),
        (Some(image), true) => {
            if config.rootfs.is_some() {
                return Err(CompileError::RootfsWithImage);
            }
            if host.caller_uid != 0 {
                return Err(CompileError::ContainerNeedsRoot);
            }
            if image.layers.is_empty() {
                return Err(CompileError::NoLayers);
            }
            if image.layers.len() > airlock_api::MAX_IMAGE_LAYERS {
                return Err(CompileError::TooManyLayers(image.layers.len()));
            }
            let layers = image
                .layers
                .iter()
                .map(|layer| absolute("an image layer", layer))
                .collect::<Result<Vec<_>, _>>()?;
            RootPlan::Overlay { layers }
        }
        (None, false) => match &config.root_binds {
            Some(binds) => {
                if config.rootfs.is_some() {
                    return Err(CompileError::RootfsWithBinds);
                }
                RootPlan::Binds {
                    binds: root_binds(binds)?,
                }
            }
            None => RootPlan::Host {
                path: match &config.rootfs {
                    Some(path) => absolute("--rootfs", path)?,
                    None => PathBuf::from("/"),
                },
            },
        },
    };
    if container && config.root_binds.is_some() {
        return Err(CompileError::BindsWithImage);
    }
    let privileged_caller = host.caller_uid == 0;
    let workspace = match &config.workspace {
        WorkspaceSource::Fresh => WorkspacePlan::Fresh,
        WorkspaceSource::Host { path } => WorkspacePlan::Host {
            path: absolute("--workspace", path)?,
            idmap: privileged_caller,
        },
    };
    let mut plan = Plan {
        identity: identity(config, host),
        view: ViewPlan {
            root,
            workspace,
            scratch: ScratchPlan::Memory {
                size_bytes: memory_scratch_bytes(config),
            },
            // The container tier shows nothing of the host: there is nothing to mask.
            masks: if container {
                Vec::new()
            } else {
                masks(&host.state_dirs)
            },
            read_only_paths: Vec::new(),
            hostname: "airlock".to_owned(),
        },
        landlock: if container {
            container_landlock()
        } else {
            process_landlock()
        },
        seccomp: if container && host.caller_uid == 0 {
            crate::seccomp::image_root_rules()
        } else {
            default_rules()
        },
        rlimits: vec![
            Rlimit {
                resource: RlimitResource::Core,
                soft: 0,
                hard: 0,
            },
            Rlimit {
                resource: RlimitResource::Nofile,
                soft: NOFILE,
                hard: NOFILE,
            },
            Rlimit {
                resource: RlimitResource::Fsize,
                soft: config.resources.disk_bytes,
                hard: config.resources.disk_bytes,
            },
        ],
        cgroup: CgroupLimits {
            memory_bytes: config.resources.memory_bytes,
            workload_memory_bytes: None,
            freezable: false,
            // Init lives in the sandbox's cgroup too; the limit is the workload's.
            pids_max: config
                .resources
                .pids_max
                .map(|max| max.saturating_add(AIRLOCK_PROCESSES)),
            cpu_quota_us: config
                .resources
                .cpu_milli
                .map(|milli| u64::from(milli) * CPU_PERIOD_US / 1_000),
            cpu_period_us: CPU_PERIOD_US,
        },
        process: ProcessPlan {
            argv: config.command.clone(),
            env: if container {
                container_environment(&config.env)
            } else {
                environment(&config.env)
            },
            cwd: config.cwd.clone(),
        },
        compat: config.compat,
        timeout_ms: config.timeout_ms,
        egress: None,
    };
    if let Some(document) = &config.policy {
        let policy = Policy::from_document(document).map_err(CompileError::InvalidPolicy)?;
        document_compile::apply(&policy, config, &mut plan)?;
    }
    Ok(plan)
}

/// Top-level directories of the view that Airlock fills itself: a bind cannot go there.
const PROVIDED_ROOTS: &[&str] = &["proc", "sys", "dev", "tmp", "workspace", "run"];

/// Checks a view of binds only: absolute host paths, normal guest paths that stay clear of the
/// mount points Airlock provides, no guest path twice.
fn root_binds(binds: &[airlock_api::ViewBind]) -> Result<Vec<airlock_api::ViewBind>, CompileError> {
    use std::path::Component;
    for bind in binds {
        absolute("a root bind's host path", &bind.host)?;
        absolute("a root bind's guest path", &bind.guest)?;
        let bad = |reason| CompileError::BadBind {
            path: bind.guest.display().to_string(),
            reason,
        };
        let mut parts = bind.guest.components().skip(1);
        let Some(Component::Normal(top)) = parts.next() else {
            return Err(bad("it would replace the root itself"));
        };
        if !parts.all(|part| matches!(part, Component::Normal(_)))
            || !bind
                .host
                .components()
                .skip(1)
                .all(|part| matches!(part, Component::Normal(_)))
        {
            return Err(bad("`.` and `..` are not allowed in a bind's paths"));
        }
        if top
            .to_str()
            .is_some_and(|top| PROVIDED_ROOTS.contains(&top))
        {
            return Err(bad("Airlock mounts that directory itself"));
        }
        // A mount point inside another bind would have to be made in the host's directory.
        if binds
            .iter()
            .any(|other| !std::ptr::eq(other, bind) && bind.guest.starts_with(&other.guest))
        {
            return Err(bad("it lies inside another bind (or is bound twice)"));
        }
    }
    Ok(binds.to_vec())
}

/// The size of a scratch space in memory: the disk limit, but at most half the memory limit.
/// Its pages are charged to the sandbox's memory cgroup, so a full scratch space must still
/// leave the workload room: it answers `ENOSPC` long before the OOM killer would act.
pub fn memory_scratch_bytes(config: &SandboxConfig) -> u64 {
    match config.resources.memory_bytes {
        Some(memory) => config.resources.disk_bytes.min(memory / 2),
        None => config.resources.disk_bytes,
    }
}

fn validate_process(config: &SandboxConfig) -> Result<(), CompileError> {
    if let Some(pids) = config.resources.pids_max
        && pids > PIDS_LIMIT - AIRLOCK_PROCESSES
    {
        return Err(CompileError::TooLarge {
            what: "--pids",
            max: PIDS_LIMIT - AIRLOCK_PROCESSES,
            value: pids,
        });
    }
    if config.command.first().is_none_or(String::is_empty) {
        return Err(if config.image.is_some() {
            CompileError::NoImageCommand
        } else {
            CompileError::EmptyCommand
        });
    }
    for arg in &config.command {
        no_nul("an argument", arg)?;
    }
    for (name, value) in &config.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(CompileError::BadEnvName(name.clone()));
        }
        no_nul(&format!("environment variable {name}"), value)?;
    }
    no_nul("--cwd", &config.cwd)?;
    absolute("--cwd", Path::new(&config.cwd))?;
    Ok(())
}

fn no_nul(what: &str, value: &str) -> Result<(), CompileError> {
    if value.contains('\0') {
        return Err(CompileError::NulByte {
            what: what.to_owned(),
        });
    }
    Ok(())
}

fn absolute(what: &'static str, path: &Path) -> Result<PathBuf, CompileError> {
    let text = path.to_string_lossy();
    if text.contains('\0') {
        return Err(CompileError::NulByte {
            what: what.to_owned(),
        });
    }
    if !path.is_absolute() {
        return Err(CompileError::RelativePath {
            what,
            path: text.into_owned(),
        });
    }
    Ok(path.to_path_buf())
}

/// The process tier's Landlock plan: reads everywhere but credential names, writes only in the
/// scratch space, the workspace and a few devices.
fn process_landlock() -> LandlockPlan {
    LandlockPlan {
        read: vec!["/".into()],
        read_except: home_secrets(),
        write_trees: ["/workspace", "/tmp", "/dev/shm", "/dev/pts"]
            .map(PathBuf::from)
            .to_vec(),
        write_files: ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"]
            .map(PathBuf::from)
            .to_vec(),
        scoped: true,
    }
}

/// The container tier's: the whole root is the sandbox's own overlay and may be written
/// (`apt-get install`), so the write rights cover `/`. `/proc`, `/sys` and `/dev` stay
/// unwritable through their read-only mounts instead (Landlock cannot carve a subtree out of
/// a grant); device nodes still cannot be created anywhere. The home directories inside
/// are the image's, not the host's: no read exception.
fn container_landlock() -> LandlockPlan {
    LandlockPlan {
        read: vec!["/".into()],
        read_except: Vec::new(),
        write_trees: vec!["/".into()],
        write_files: Vec::new(),
        scoped: true,
    }
}

fn identity(config: &SandboxConfig, host: &HostFacts) -> IdentityPlan {
    let user = config.user;
    let lookup = config.image.as_ref().map(|image| UserLookup {
        spec: image.config.user.clone().filter(|spec| !spec.is_empty()),
        set_home: !config.env.iter().any(|(name, _)| name == "HOME"),
    });
    if host.caller_uid == 0 {
        let map = vec![IdMap {
            inside: 0,
            outside: SANDBOX_ID_BASE,
            count: SANDBOX_ID_COUNT,
        }];
        return IdentityPlan {
            uid_map: map.clone(),
            gid_map: map,
            uid: user.uid,
            gid: user.gid,
            privileged_caller: true,
            root_file_caps: lookup.is_some(),
            lookup,
            groups: Vec::new(),
        };
    }
    // An unprivileged caller may map only its own ids; the workload's ids stand for them.
    IdentityPlan {
        uid_map: vec![IdMap {
            inside: user.uid,
            outside: host.caller_uid,
            count: 1,
        }],
        gid_map: vec![IdMap {
            inside: user.gid,
            outside: host.caller_gid,
            count: 1,
        }],
        uid: user.uid,
        gid: user.gid,
        privileged_caller: false,
        lookup,
        groups: Vec::new(),
        root_file_caps: false,
    }
}

/// The container tier's environment: a default `PATH`, then the image's and the caller's
/// variables (in `requested`, the caller's last), which win. `HOME` comes from the image's
/// `/etc/passwd` when neither sets it (see [`UserLookup::set_home`]).
fn container_environment(requested: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![("PATH".into(), DEFAULT_PATH.into())];
    for (name, value) in requested {
        match env.iter_mut().find(|(existing, _)| existing == name) {
            Some(slot) => slot.1.clone_from(value),
            None => env.push((name.clone(), value.clone())),
        }
    }
    env
}

/// Credential paths in every home directory, as patterns.
fn home_secrets() -> Vec<String> {
    ["/root", "/home/*"]
        .iter()
        .flat_map(|home| {
            HOME_SECRETS
                .iter()
                .map(move |name| format!("{home}/{name}"))
        })
        .collect()
}

fn masks(state_dirs: &[PathBuf]) -> Vec<Mask> {
    let secret = |path: String| Mask {
        path,
        kind: MaskKind::Secret,
    };
    let mut masks: Vec<Mask> = home_secrets().into_iter().map(secret).collect();
    masks.extend(HOST_SECRETS.iter().map(|path| secret((*path).to_owned())));
    masks.extend(
        state_dirs
            .iter()
            .map(|dir| secret(dir.to_string_lossy().into_owned())),
    );
    masks.extend(HOST_RUNTIME_DIRS.iter().map(|path| Mask {
        path: (*path).to_owned(),
        kind: MaskKind::Empty,
    }));
    masks
}

/// The workload's environment: a sane base, then the caller's variables, which win.
fn environment(requested: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    for (name, value) in requested {
        match env.iter_mut().find(|(existing, _)| existing == name) {
            Some(slot) => slot.1.clone_from(value),
            None => env.push((name.clone(), value.clone())),
        }
    }
    env
}

#[cfg(test)]
#[path = "compile_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "compile_container_tests.rs"]
mod container_tests;
