//! What the supervisor hands the helper, through descriptor 3 (never argv or the environment).

use airlock_policy::Plan;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperSpec {
    pub plan: Plan,
    /// The helper exits at once if its parent is not this process (it died before we started).
    pub supervisor_pid: libc::pid_t,
    /// Files the helper writes `0` to, first thing, to join the sandbox's cgroup.
    pub cgroup_join: Vec<std::path::PathBuf>,
    /// Files the helper writes `0` to once init exists, to leave the sandbox's cgroup.
    pub cgroup_leave: Vec<std::path::PathBuf>,
    /// Report the time of each setup phase (`airlock bench start --phases`).
    pub trace: bool,
    /// Set for a long-lived sandbox: init execs the agent instead of a workload.
    pub agent: Option<AgentSpec>,
    /// Set when the workload has a memory cgroup of its own (a long-lived sandbox with a
    /// memory limit): the helper opens its files for the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_cgroup: Option<WorkloadCgroupSpec>,
    /// Layers switched off or marked for a security evaluation; the default changes nothing.
    #[serde(default, skip_serializing_if = "Evaluation::is_default")]
    pub evaluation: Evaluation,
}

/// Changes to the confinement that only `airlock seceval` makes, one run at a time, to prove
/// which layer stops an attack (docs/seceval.md). Reached only through
/// `Runtime::run_for_evaluation`; `airlock run` and airlockd always send the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evaluation {
    /// Apply no Landlock ruleset at all.
    pub skip_landlock: bool,
    /// Answer every `EPERM` rule of the seccomp filter with this errno instead, so that an
    /// answer can be traced to the filter. `ENOSYS` rules keep theirs: libc relies on it.
    pub seccomp_tag: Option<u16>,
}

impl Evaluation {
    pub fn is_default(&self) -> bool {
        *self == Evaluation::default()
    }
}

/// Where a long-lived sandbox's agent comes from and how it is reached, in host paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The `airlock-agent` binary, bound read-only at [`AGENT_PATH`] in the view.
    pub binary: std::path::PathBuf,
    /// The Unix socket the helper binds; the agent serves on it as descriptor 3.
    pub socket: std::path::PathBuf,
    /// The agent's stdout and stderr.
    pub log: std::path::PathBuf,
}

/// The workload's own cgroup, in host paths (see `CgroupLimits::workload_memory_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadCgroupSpec {
    /// Its `cgroup.procs`: each workload process writes `0` to it, first thing after its fork,
    /// through a descriptor the helper opened (the sandbox cannot open cgroup files itself).
    pub procs: std::path::PathBuf,
    /// Its OOM counters: `memory.events` on v2, `memory.oom_control` on v1 (`oom_kill N`).
    pub oom_events: std::path::PathBuf,
}

/// Where the agent appears inside the sandbox.
pub const AGENT_PATH: &str = "/run/airlock/agent";
/// The descriptor the agent finds its listening socket on.
pub const AGENT_LISTEN_FD: i32 = 3;
/// The descriptors the agent finds the workload cgroup's `cgroup.procs` (write-only) and OOM
/// counters (read-only) on, when the workload has its own cgroup.
pub const AGENT_WORKLOAD_CGROUP_FD: i32 = 5;
pub const AGENT_OOM_EVENTS_FD: i32 = 6;

#[cfg(test)]
mod tests {
    use airlock_api::SandboxConfig;
    use airlock_policy::{HostFacts, compile};

    use super::*;

    fn spec() -> HelperSpec {
        let host = HostFacts {
            caller_uid: 0,
            caller_gid: 0,
            state_dirs: vec![],
        };
        let plan = compile(&SandboxConfig::new(vec!["true".into()]), &host).unwrap();
        HelperSpec {
            plan,
            supervisor_pid: 1,
            cgroup_join: vec!["/sys/fs/cgroup/pids/airlock-1-0/tasks".into()],
            cgroup_leave: vec!["/sys/fs/cgroup/pids/tasks".into()],
            trace: false,
            agent: None,
            workload_cgroup: None,
            evaluation: Evaluation::default(),
        }
    }

    #[test]
    fn test_helper_spec_round_trips() {
        let spec = spec();
        let bytes = serde_json::to_vec(&spec).unwrap();
        assert_eq!(serde_json::from_slice::<HelperSpec>(&bytes).unwrap(), spec);
    }

    #[test]
    fn test_helper_spec_rejects_unknown_fields() {
        let mut value = serde_json::to_value(spec()).unwrap();
        value["extra"] = serde_json::json!(1);
        let err = serde_json::from_value::<HelperSpec>(value).unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
    }
}
