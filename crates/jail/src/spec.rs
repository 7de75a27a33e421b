//! What the supervisor hands the helper, through descriptor 3 (never argv or the environment).

use airlock_policy::Plan;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperSpec {
    /// The plan, without its seccomp rules: they arrive compiled, in `seccomp`.
    pub plan: Plan,
    /// The seccomp program init installs, one [`crate::seccomp::Insn::to_word`] per
    /// instruction. The supervisor compiles it, so that neither the rules (most of a plan's
    /// bytes, with their reasons) cross the pipe nor each helper compiles them again.
    pub seccomp: Vec<u64>,
    /// The helper exits at once if its parent is not this process (it died before we started).
    pub supervisor_pid: libc::pid_t,
    /// Report the time of each setup phase (`airlock bench start --phases`).
    pub trace: bool,
    /// Set for a long-lived sandbox: init execs the agent instead of a workload.
    pub agent: Option<AgentSpec>,
    /// Layers switched off or marked for a security evaluation; the default changes nothing.
    #[serde(default, skip_serializing_if = "Evaluation::is_default")]
    pub evaluation: Evaluation,
    /// The view's root is a clone of the template at `TEMPLATE_FD` (`view_template`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub view_template: bool,
}

/// Where a sandbox's network namespace comes from (the [`LateSpec`] says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkSource {
    /// Init makes its own, owned by the sandbox's user namespace.
    #[default]
    Init,
    /// The zygote's pool, at `NETNS_FD` and `SYSFS_FD`.
    Pooled,
    /// The helper makes one as the pooler would: the pool was empty.
    Helper,
}

/// What the supervisor knows only once the helper exists, sent on the same descriptor after
/// the [`HelperSpec`]: the sandbox's cgroup, made while the helper opens its host descriptors
/// (it joins the cgroup before it creates any process; empty when limits are not enforced, in
/// best effort), and where the network namespace comes from (the zygote's answer says).
///
/// Wire: the spec's length (4 bytes, little-endian) and its JSON, then this JSON up to the end
/// of the pipe. A helper forked from the zygote finds its spec written before the fork when the
/// pipe holds it, so that it never waits for its supervisor to be scheduled again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LateSpec {
    /// Files the helper writes `0` to, before anything else that counts, to join the cgroup.
    pub join: Vec<std::path::PathBuf>,
    /// Files the helper writes `0` to once init exists, to leave the sandbox's cgroup.
    pub leave: Vec<std::path::PathBuf>,
    /// Set when the workload has a memory cgroup of its own (a long-lived sandbox with a
    /// memory limit): the helper opens its files for the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadCgroupSpec>,
    #[serde(default)]
    pub network: NetworkSource,
}

/// The longest spec a helper reads (about 8 KiB for the default policy).
const MAX_SPEC_BYTES: u32 = 16 << 20;

/// The spec as the supervisor writes it: its length, then its JSON.
pub fn encode_spec(spec: &HelperSpec) -> serde_json::Result<Vec<u8>> {
    let json = serde_json::to_vec(spec)?;
    let len = u32::try_from(json.len()).unwrap_or(u32::MAX);
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend(json);
    Ok(bytes)
}

/// Reads the spec [`encode_spec`] wrote; the [`LateSpec`] follows on the same reader.
pub fn read_spec(reader: &mut impl std::io::Read) -> std::io::Result<HelperSpec> {
    let mut len = [0u8; 4];
    reader.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_SPEC_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a spec of {len} bytes (at most {MAX_SPEC_BYTES})"),
        ));
    }
    let mut json = vec![0u8; len as usize];
    reader.read_exact(&mut json)?;
    serde_json::from_slice(&json).map_err(std::io::Error::other)
}

/// Reads the [`LateSpec`] that follows the spec, up to the end of the pipe.
pub fn read_late(reader: &mut impl std::io::Read) -> std::io::Result<LateSpec> {
    let mut json = Vec::new();
    reader.read_to_end(&mut json)?;
    serde_json::from_slice(&json).map_err(std::io::Error::other)
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
    /// answer can be traced to the filter. `ENOSYS` rules keep theirs: libc relies on it. The
    /// supervisor applies it when it compiles the program.
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
    /// Set on the microvm tier: `binary` is `airlock-vmm`, and init execs it instead of the
    /// agent; the agent is the guest's init, reached through the VMM's vsock device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmm: Option<VmmSpec>,
}

/// What the microvm tier's jail holds besides the VMM binary, and how the VMM is started: the
/// view has nothing of the host but these (`RootPlan::Host` on an empty directory).
///
/// The helper opens `/dev/kvm` on the host (the sandbox's user could not, and Landlock's
/// device-ioctl right follows the opener) and hands it over as [`VMM_KVM_FD`]; the agent's
/// socket, bound on the host as for the agent, is [`AGENT_LISTEN_FD`]. The VMM's argv is
/// `airlock-vmm MODE --kvm-fd 5 --vsock-listen-fd 3 ARGS...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmmSpec {
    /// `linux` (boot a kernel) or `restore` (resume a snapshot).
    pub mode: String,
    /// Host files or directories shown read-only at `VMM_FILES_DIR/<name>` (the kernel, the
    /// initramfs, a snapshot's directory). Names are single path components.
    pub files: Vec<(String, std::path::PathBuf)>,
    /// Host regular files shown read-write (never executable, no devices) at
    /// `VMM_FILES_DIR/<name>`: the sandbox's own disks (its overlay disk). The runtime makes
    /// them the VMM's user's and grants them in Landlock; names as for `files`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<(String, std::path::PathBuf)>,
    /// The rest of the VMM's arguments; they name the files by their paths in the view.
    pub args: Vec<String>,
}

/// Where [`VmmSpec::files`] and [`VmmSpec::disks`] appear inside the microvm tier's jail.
pub const VMM_FILES_DIR: &str = "/run/airlock/vm";
/// The descriptor the VMM finds `/dev/kvm` on.
pub const VMM_KVM_FD: i32 = 5;

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
            seccomp: vec![0x0000_0004_0000_0020, u64::MAX],
            supervisor_pid: 1,
            trace: false,
            agent: None,
            evaluation: Evaluation::default(),
            view_template: true,
        }
    }

    #[test]
    fn test_helper_spec_round_trips() {
        let spec = spec();
        let bytes = serde_json::to_vec(&spec).unwrap();
        assert_eq!(serde_json::from_slice::<HelperSpec>(&bytes).unwrap(), spec);
    }

    #[test]
    fn test_spec_then_cgroups_share_one_stream() {
        let cgroups = LateSpec {
            join: vec!["/sys/fs/cgroup/pids/airlock-1-0/tasks".into()],
            leave: vec!["/sys/fs/cgroup/pids/tasks".into()],
            workload: None,
            network: NetworkSource::Pooled,
        };
        let mut bytes = encode_spec(&spec()).unwrap();
        bytes.extend(serde_json::to_vec(&cgroups).unwrap());
        let mut reader = std::io::Cursor::new(bytes);
        assert_eq!(read_spec(&mut reader).unwrap(), spec());
        assert_eq!(read_late(&mut reader).unwrap(), cgroups);
    }

    #[test]
    fn test_a_cut_or_oversized_spec_is_refused() {
        let bytes = encode_spec(&spec()).unwrap();
        let cut = read_spec(&mut std::io::Cursor::new(&bytes[..bytes.len() - 1])).unwrap_err();
        assert_eq!(cut.kind(), std::io::ErrorKind::UnexpectedEof);
        let huge = read_spec(&mut std::io::Cursor::new(u32::MAX.to_le_bytes())).unwrap_err();
        assert!(huge.to_string().contains("at most"), "{huge}");
        // A supervisor that failed to make the cgroup closes the pipe without one.
        assert!(read_late(&mut std::io::Cursor::new(Vec::new())).is_err());
    }

    #[test]
    fn test_helper_spec_rejects_unknown_fields() {
        let mut value = serde_json::to_value(spec()).unwrap();
        value["extra"] = serde_json::json!(1);
        let err = serde_json::from_value::<HelperSpec>(value).unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
    }
}
