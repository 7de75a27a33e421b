//! Backends: one small [`TierBackend`] implementation per tier, a closed [`Backend`] enum to
//! pick one, and a probe that says what this host supports and why not.
//!
//! The tiers share the jail: the plan decides what the helper builds (a read-only host view
//! or an image's overlay), so a backend's job is what lies around the plan on the host side:
//! what it needs from this host, what it checks before compiling, and what its scratch
//! volume holds.

use airlock_api::{SandboxConfig, Tier};
use airlock_jail::{HostSupport, JailError, Sandbox, SpawnOptions};
use airlock_policy::Plan;

use crate::RuntimeError;

/// What one tier does on the host's side of the jail.
pub trait TierBackend: Sync {
    fn tier(&self) -> Tier;

    /// Whether this host can run the tier, and what it would lack.
    fn probe(&self, host: &HostSupport) -> BackendSupport;

    /// Host-side checks of a configuration before it is compiled (paths that must exist).
    fn check(&self, config: &SandboxConfig) -> Result<(), RuntimeError>;

    /// Whether the tier's scratch volume holds an overlay's `upper/` and `work/` besides
    /// `tmp/` and `workspace/`.
    fn needs_upper(&self) -> bool;

    /// Starts a sandbox from a compiled plan.
    fn start(&self, plan: &Plan, options: &SpawnOptions) -> Result<Sandbox, JailError> {
        Sandbox::spawn(plan, options)
    }

    /// Starts a long-lived sandbox whose pid 1 is the agent; see [`crate::LiveSpec`].
    /// `config` is what `plan` was compiled from (the microvm tier takes the guest's root
    /// disk from it).
    fn start_live(
        &self,
        _config: &SandboxConfig,
        plan: &Plan,
        options: &SpawnOptions,
        id: &str,
        agent: airlock_jail::spec::AgentSpec,
    ) -> Result<airlock_jail::live::Starting, JailError> {
        airlock_jail::live::start(plan, options, id, agent)
    }
}

/// The backends of this build; [`Backend::implementation`] is `None` for a tier that does not
/// exist yet, and its probe says so instead of failing later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    Process,
    Container,
    Microvm,
}

/// What [`Backend::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSupport {
    pub tier: Tier,
    /// `None` when the backend can run here, else why not.
    pub unavailable: Option<String>,
    /// Layers that exist only partly on this host (best-effort mode runs without them).
    pub degraded: Vec<String>,
}

impl Backend {
    pub fn all() -> [Backend; 3] {
        [Backend::Process, Backend::Container, Backend::Microvm]
    }

    pub fn for_tier(tier: Tier) -> Backend {
        match tier {
            Tier::Container => Backend::Container,
            Tier::Microvm => Backend::Microvm,
            _ => Backend::Process,
        }
    }

    pub fn tier(self) -> Tier {
        match self {
            Backend::Process => Tier::Process,
            Backend::Container => Tier::Container,
            Backend::Microvm => Tier::Microvm,
        }
    }

    /// The tier's implementation, if this build has one.
    pub fn implementation(self) -> Option<&'static dyn TierBackend> {
        match self {
            Backend::Process => Some(&ProcessTier),
            Backend::Container => Some(&ContainerTier),
            Backend::Microvm => Some(&crate::microvm::MicrovmTier),
        }
    }

    /// Whether this host can run the backend, and what it would lack.
    pub fn probe(self, host: &HostSupport) -> BackendSupport {
        match self.implementation() {
            Some(backend) => backend.probe(host),
            None => BackendSupport {
                tier: self.tier(),
                unavailable: Some("not implemented in this build yet".to_owned()),
                degraded: Vec::new(),
            },
        }
    }

    /// The implementation, or why the tier cannot run here.
    pub(crate) fn available(
        self,
        host: &HostSupport,
    ) -> Result<&'static dyn TierBackend, RuntimeError> {
        let unavailable = |reason| RuntimeError::TierUnavailable {
            tier: self.tier().as_str(),
            reason,
        };
        let backend = self.implementation().ok_or_else(|| {
            unavailable(
                self.probe(host)
                    .unavailable
                    .unwrap_or_else(|| "not implemented in this build yet".to_owned()),
            )
        })?;
        match backend.probe(host).unavailable {
            Some(reason) => Err(unavailable(reason)),
            None => Ok(backend),
        }
    }
}

/// What both tiers need: user namespaces and seccomp, and (degraded without) Landlock and
/// the memory and pids controllers.
pub(crate) fn common_support(tier: Tier, host: &HostSupport) -> BackendSupport {
    let unavailable = (!host.user_namespaces)
        .then(|| "user namespaces are disabled (user.max_user_namespaces is 0)".to_owned())
        .or_else(|| {
            (!host.seccomp_filter).then(|| "the kernel lacks seccomp filtering".to_owned())
        });
    let mut degraded = Vec::new();
    if host.landlock_abi.is_none() {
        degraded.push("Landlock is not available in this kernel".to_owned());
    }
    if host.cgroups.memory.is_none() || host.cgroups.pids.is_none() {
        degraded.push("the memory or pids cgroup controller is not mounted".to_owned());
    }
    BackendSupport {
        tier,
        unavailable,
        degraded,
    }
}

/// The process tier: the host's root (or `--rootfs`) read-only, with masks.
#[derive(Debug)]
pub struct ProcessTier;

impl TierBackend for ProcessTier {
    fn tier(&self) -> Tier {
        Tier::Process
    }

    fn probe(&self, host: &HostSupport) -> BackendSupport {
        common_support(Tier::Process, host)
    }

    fn check(&self, config: &SandboxConfig) -> Result<(), RuntimeError> {
        crate::check_paths(config)
    }

    fn needs_upper(&self) -> bool {
        false
    }
}

/// The container tier: an image's layers under a per-sandbox overlay, nothing of the host.
#[derive(Debug)]
pub struct ContainerTier;

impl TierBackend for ContainerTier {
    fn tier(&self) -> Tier {
        Tier::Container
    }

    fn probe(&self, host: &HostSupport) -> BackendSupport {
        let mut support = common_support(Tier::Container, host);
        if support.unavailable.is_none() {
            support.unavailable = if !host.caller_is_root {
                Some(
                    "it needs a root caller (the image's layers are idmapped and the overlay is mounted from the host's side)"
                        .to_owned(),
                )
            } else {
                host.overlay_unavailable.as_ref().map(|why| {
                    format!("overlayfs cannot take image layers as descriptors here (Linux 6.15 or later is needed): {why}")
                })
            };
        }
        support
    }

    fn check(&self, config: &SandboxConfig) -> Result<(), RuntimeError> {
        crate::check_paths(config)?;
        if let Some(image) = &config.image {
            for layer in &image.layers {
                match std::fs::symlink_metadata(layer) {
                    Ok(meta) if meta.is_dir() => {}
                    _ => return Err(RuntimeError::LayerMissing(layer.clone())),
                }
            }
        }
        Ok(())
    }

    fn needs_upper(&self) -> bool {
        true
    }
}

/// A host with every layer and cgroup v1 controllers, for the backends' probe tests.
#[cfg(test)]
pub(crate) fn test_host() -> HostSupport {
    use airlock_jail::cgroup::{Home, Layout};
    let v1 = |dir: &str| {
        Some(Home::V1 {
            own_dir: dir.into(),
        })
    };
    HostSupport {
        landlock_abi: Some(7),
        user_namespaces: true,
        seccomp_filter: true,
        cgroups: Layout {
            memory: v1("/sys/fs/cgroup/memory"),
            pids: v1("/sys/fs/cgroup/pids"),
            cpu: v1("/sys/fs/cgroup/cpu"),
            freezer: v1("/sys/fs/cgroup/freezer"),
        },
        caller_is_root: true,
        caller_uid: 0,
        caller_gid: 0,
        overlay_unavailable: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_host as host;

    #[test]
    fn test_probe_process_tier_available_on_a_full_host() {
        let support = Backend::Process.probe(&host());
        assert_eq!(support.unavailable, None);
        assert!(support.degraded.is_empty());
    }

    #[test]
    fn test_probe_names_what_is_missing() {
        let mut host = host();
        host.landlock_abi = None;
        host.cgroups.pids = None;
        let support = Backend::Process.probe(&host);
        assert_eq!(support.unavailable, None);
        assert_eq!(support.degraded.len(), 2, "{:?}", support.degraded);
        host.user_namespaces = false;
        let support = Backend::Process.probe(&host);
        assert!(
            support
                .unavailable
                .unwrap_or_default()
                .contains("user namespaces")
        );
    }

    #[test]
    fn test_probe_container_tier_says_why_not() {
        assert_eq!(Backend::Container.probe(&host()).unavailable, None);
        let mut user = host();
        user.caller_is_root = false;
        let reason = Backend::Container.probe(&user).unavailable.unwrap();
        assert!(reason.contains("root caller"), "{reason}");
        let mut old = host();
        old.overlay_unavailable = Some("Invalid argument".into());
        let reason = Backend::Container.probe(&old).unavailable.unwrap();
        assert!(reason.contains("6.15"), "{reason}");
        assert!(Backend::Microvm.implementation().is_some());
        assert!(Backend::Container.implementation().unwrap().needs_upper());
        assert!(!Backend::Process.implementation().unwrap().needs_upper());
    }
}
