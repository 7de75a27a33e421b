//! The compiled plan, handed to the helper as its spec.

use std::path::PathBuf;

use airlock_api::Compat;
use serde::{Deserialize, Serialize};

use crate::seccomp::SeccompRule;

/// One line of `/proc/PID/uid_map` or `gid_map`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// Who the workload is, inside and outside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityPlan {
    pub uid_map: Vec<IdMap>,
    pub gid_map: Vec<IdMap>,
    /// The workload's ids inside the sandbox.
    pub uid: u32,
    pub gid: u32,
    /// Whether the caller can write a multi-id map (it is root); otherwise the map is the
    /// caller's own id only and `setgroups` must be denied first.
    pub privileged_caller: bool,
    /// Set on the container tier: init looks the user up in the image's own `/etc/passwd`
    /// and `/etc/group` before it drops its privileges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<UserLookup>,
    /// Supplementary groups inside (a root caller only; empty otherwise). Filled in by init
    /// from the image's `/etc/group` on the container tier.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
    /// Set on the container tier with a multi-id map: a workload that runs as uid 0 keeps
    /// [`ROOT_FILE_CAPABILITIES`] inside its user namespace, as a container's root does, so
    /// that package managers can own, chown and switch to the image's users. They reach only
    /// what the namespace's own ids own; every other capability is out of the bounding set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub root_file_caps: bool,
}

/// The capabilities a container-tier root keeps (see [`IdentityPlan::root_file_caps`]):
/// `CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_FSETID`, `CAP_KILL`, `CAP_SETGID`,
/// `CAP_SETUID` and `CAP_NET_BIND_SERVICE`. Docker's default set without `CAP_MKNOD`,
/// `CAP_SYS_CHROOT`, `CAP_SETFCAP`, `CAP_SETPCAP` and `CAP_AUDIT_WRITE`, whose syscalls or
/// effects the sandbox refuses anyway.
pub const ROOT_FILE_CAPABILITIES: &[u32] = &[0, 1, 3, 4, 5, 6, 7, 10];

/// A user to find in the image (the container tier), resolved by init inside the sandbox's
/// root, where the image's files are, and through which nothing of the host is reachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserLookup {
    /// `name[:group]`, `uid[:gid]` or a mix, as in an OCI config's `User`; `None` keeps
    /// [`IdentityPlan::uid`] and [`IdentityPlan::gid`].
    pub spec: Option<String>,
    /// Set `HOME` from the user's entry (or `/`) when the environment has none.
    pub set_home: bool,
}

/// The host ids one sandbox's user namespace maps, for a root caller: `uid 0` inside is
/// `base` outside. The runtime gives each live sandbox its own range (see
/// [`Plan::use_id_range`]).
pub const fn id_range(base: u32) -> IdMap {
    IdMap {
        inside: 0,
        outside: base,
        count: crate::compile::SANDBOX_ID_COUNT,
    }
}

/// What stands at `/workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspacePlan {
    /// An empty directory in the sandbox's scratch space, owned by the workload's user.
    Fresh,
    /// A host directory bound read-write; `idmap` maps its owners into the sandbox's id range.
    Host { path: PathBuf, idmap: bool },
}

/// Where the sandbox's scratch space lives: `/tmp` and a fresh `/workspace`, one budget of
/// `disk` bytes for both, kept apart from the memory budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScratchPlan {
    /// One tmpfs of this size. Its pages are charged to the sandbox's memory cgroup, so the
    /// compiler makes it at most half the memory limit (`memory_scratch_bytes`): a full
    /// tmpfs answers `ENOSPC` and leaves the workload room.
    Memory { size_bytes: u64 },
    /// A host directory on disk with a quota (a btrfs subvolume prepared by the runtime) that
    /// holds `tmp/` and `workspace/`; beyond the quota writes fail with `EDQUOT`.
    Disk { host_dir: PathBuf },
}

/// The scratch directories inside [`ScratchPlan::Disk`]'s `host_dir`.
pub const SCRATCH_TMP: &str = "tmp";
pub const SCRATCH_WORKSPACE: &str = "workspace";

/// How a masked path is hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// Replaced by something that cannot be read at all (mode 000).
    Secret,
    /// Replaced by an empty, readable, read-only directory (`/run`).
    Empty,
}

/// A path hidden in the view. `*` as a whole component matches every entry of that directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mask {
    pub path: String,
    pub kind: MaskKind,
}

/// What the view's `/` is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RootPlan {
    /// A host directory shown read-only (the process tier; the host's `/` by default), with
    /// the masks over it.
    Host { path: PathBuf },
    /// An overlayfs (the container tier): the image's layer directories, lowest first, as
    /// read-only lower layers, each idmapped into the sandbox's user namespace, over a fresh
    /// upper directory in the sandbox's scratch space. The host is not visible at all.
    Overlay { layers: Vec<PathBuf> },
    /// An empty tmpfs holding only these read-only binds of host paths (each at its `guest`
    /// path, made with the mounts beneath it), the mount points Airlock provides, and the masks
    /// over them: nothing else of the host is visible (the wasm tier's worker).
    Binds { binds: Vec<airlock_api::ViewBind> },
}

/// The upper and work directories of an [`RootPlan::Overlay`] in a
/// [`ScratchPlan::Disk`]'s `host_dir`. (In memory they sit in the scratch tmpfs.)
pub const SCRATCH_UPPER: &str = "upper";
pub const SCRATCH_WORK: &str = "work";

/// The filesystem view, built in a fresh mount namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewPlan {
    pub root: RootPlan,
    pub workspace: WorkspacePlan,
    pub scratch: ScratchPlan,
    pub masks: Vec<Mask>,
    /// Paths inside the writable filesystems (`/workspace`, `/tmp`) made read-only by a bind
    /// mount over themselves, if they exist when the sandbox starts; shallower paths first.
    /// Their parent directories below the top level are pinned (bound onto themselves) so
    /// that they cannot be renamed away and replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_paths: Vec<PathBuf>,
    pub hostname: String,
}

/// Landlock rules, in sandbox paths. Rights are added by the helper for the kernel's ABI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockPlan {
    /// Trees that may be read and executed.
    pub read: Vec<PathBuf>,
    /// Paths beneath `read` whose contents may not be read, even if they appear only after the
    /// sandbox started (when no mask can cover them). `*` matches one whole component. Names
    /// stay listable.
    pub read_except: Vec<String>,
    /// Trees that may also be written.
    pub write_trees: Vec<PathBuf>,
    /// Single files (device nodes) that may be written.
    pub write_files: Vec<PathBuf>,
    /// Signals and abstract Unix sockets stay inside the sandbox (ABI 6).
    pub scoped: bool,
}

/// A resource limit the kernel enforces per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitResource {
    Core,
    Nofile,
    Fsize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    pub resource: RlimitResource,
    pub soft: u64,
    pub hard: u64,
}

/// cgroup limits, independent of the cgroup version that will carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupLimits {
    /// The whole sandbox's memory: the workload's, the scratch tmpfs's when it is in memory,
    /// and the agent's reserve when the workload has its own cgroup.
    pub memory_bytes: Option<u64>,
    /// When set, the workload's processes run in a child cgroup (`workload`) with this memory
    /// limit, so that the OOM killer, acting inside it, can only ever pick one of them: the
    /// agent beside it, in the sandbox's own cgroup, is never a candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_memory_bytes: Option<u64>,
    /// The sandbox can be frozen (paused): its cgroup is also made in the freezer hierarchy
    /// (v1) or is a v2 cgroup (`cgroup.freeze`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub freezable: bool,
    pub pids_max: Option<u64>,
    /// CPU bandwidth: `cpu_quota_us` of every `cpu_period_us`.
    pub cpu_quota_us: Option<u64>,
    pub cpu_period_us: u64,
}

/// The workload itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessPlan {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// How a `proxy`-mode sandbox reaches the egress proxy (filled in by the runtime, which runs
/// the proxy: it is a fact of the host, not of the policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSetup {
    /// Host directory holding the proxy's Unix socket and the trust bundles; shown read-only at
    /// [`EGRESS_DIR`] inside.
    pub host_dir: PathBuf,
    /// The loopback port inside the sandbox that relays to the proxy (`HTTP_PROXY`).
    pub relay_port: u16,
}

/// Where the egress directory appears inside the sandbox.
pub const EGRESS_DIR: &str = "/run/airlock/egress";
/// The proxy's socket, the sandbox CA, and the host's trust bundle plus that CA, in
/// [`EgressSetup::host_dir`] (and so under [`EGRESS_DIR`] inside).
pub const EGRESS_SOCKET: &str = "proxy.sock";
pub const EGRESS_CA: &str = "ca.pem";
pub const EGRESS_TRUST_BUNDLE: &str = "ca-bundle.pem";
/// The system trust store that the view replaces with [`EGRESS_TRUST_BUNDLE`].
pub const SYSTEM_TRUST_STORE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Everything the helper needs, in the order it applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub identity: IdentityPlan,
    pub view: ViewPlan,
    pub landlock: LandlockPlan,
    pub seccomp: Vec<SeccompRule>,
    pub rlimits: Vec<Rlimit>,
    pub cgroup: CgroupLimits,
    pub process: ProcessPlan,
    pub compat: Compat,
    pub timeout_ms: Option<u64>,
    /// Set for `proxy` network mode.
    #[serde(default)]
    pub egress: Option<EgressSetup>,
}

impl Plan {
    /// Moves the scratch space onto disk at `host_dir` (see [`ScratchPlan::Disk`]): its bytes
    /// stop counting as memory, and its size is the volume's quota.
    pub fn use_disk_scratch(&mut self, host_dir: PathBuf) {
        self.view.scratch = ScratchPlan::Disk { host_dir };
    }

    /// Lets the sandbox be paused: its cgroup can be frozen.
    pub fn make_freezable(&mut self) {
        self.cgroup.freezable = true;
    }

    /// Maps the sandbox's ids to the host range that starts at `base` (a root caller's plan
    /// only; an unprivileged caller's map is its own ids, and stays).
    pub fn use_id_range(&mut self, base: u32) {
        if self.identity.privileged_caller {
            self.identity.uid_map = vec![id_range(base)];
            self.identity.gid_map = vec![id_range(base)];
        }
    }

    /// Whether the view's root is an image's overlay (the container tier).
    pub fn has_image_root(&self) -> bool {
        matches!(self.view.root, RootPlan::Overlay { .. })
    }

    /// Gives the workload a memory cgroup of its own with the sandbox's memory limit, and
    /// raises the sandbox's limit by `reserve_bytes` for Airlock's agent, which stays outside
    /// it (see [`CgroupLimits::workload_memory_bytes`]). Without a memory limit nothing changes.
    pub fn isolate_workload_memory(&mut self, reserve_bytes: u64) {
        if let Some(bytes) = self.cgroup.memory_bytes
            && self.cgroup.workload_memory_bytes.is_none()
        {
            self.cgroup.workload_memory_bytes = Some(bytes);
            self.cgroup.memory_bytes = Some(bytes.saturating_add(reserve_bytes));
        }
    }
}
