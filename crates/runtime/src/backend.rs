//! Backends: a closed enum over the tiers, each with a probe of what this host supports.

use airlock_api::Tier;
use airlock_jail::{HostSupport, JailError, Sandbox, SpawnOptions};
use airlock_policy::Plan;

/// The backends of this build. Only the process tier exists so far; the others report why
/// they are unavailable instead of failing later.
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

    /// Whether this host can run the backend, and what it would lack.
    pub fn probe(self, host: &HostSupport) -> BackendSupport {
        let tier = self.tier();
        match self {
            Backend::Process => {
                let unavailable = (!host.user_namespaces)
                    .then(|| {
                        "user namespaces are disabled (user.max_user_namespaces is 0)".to_owned()
                    })
                    .or_else(|| {
                        (!host.seccomp_filter)
                            .then(|| "the kernel lacks seccomp filtering".to_owned())
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
            Backend::Container | Backend::Microvm => BackendSupport {
                tier,
                unavailable: Some("not implemented in this build yet".to_owned()),
                degraded: Vec::new(),
            },
        }
    }

    /// Starts a sandbox of this backend from a compiled plan. Callers check [`Backend::probe`]
    /// first; the policy compiler refuses plans for tiers that do not exist yet.
    pub fn start(self, plan: &Plan, options: &SpawnOptions) -> Result<Sandbox, JailError> {
        Sandbox::spawn(plan, options)
    }

    /// Starts a long-lived sandbox whose pid 1 is the agent; see [`crate::LiveSpec`].
    pub fn start_live(
        self,
        plan: &Plan,
        options: &SpawnOptions,
        id: &str,
        agent: airlock_jail::spec::AgentSpec,
    ) -> Result<airlock_jail::live::Starting, JailError> {
        airlock_jail::live::start(plan, options, id, agent)
    }
}

#[cfg(test)]
mod tests {
    use airlock_jail::cgroup::{Home, Layout};

    use super::*;

    fn host() -> HostSupport {
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
        }
    }

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
    fn test_probe_unbuilt_tiers_say_so() {
        for backend in [Backend::Container, Backend::Microvm] {
            assert!(backend.probe(&host()).unavailable.is_some());
        }
    }
}
