//! The microvm tier: each sandbox is a Linux guest of Airlock's VMM (`airlock-vmm`), whose init
//! is the agent serving envd over vsock. The VMM itself runs inside the process tier's jail, as
//! Firecracker's jailer confines Firecracker: its own namespaces, a view holding only the VMM,
//! its kernel and initramfs (or snapshot) read-only and Airlock's `/dev`, `/proc` and scratch
//! (the root is an empty directory); the jail's seccomp deny-list under the VMM's own
//! allow-list, which it installs on every thread before the guest runs; and the sandbox's
//! cgroup, whose memory limit holds the guest's memory plus Airlock's reserve for the VMM, and
//! whose CPU quota bounds its vCPU.
//!
//! The jail binds the agent's socket on the host as on the process tier and hands it to the
//! VMM, which sends every connection on it to the guest's agent port (no `CONNECT` handshake),
//! so the daemon, the E2B data plane and the SDKs reach a guest exactly as a process sandbox.
//!
//! In `proxy` network mode the guest reaches the sandbox's egress proxy over vsock and only
//! that way: it has no network device ([`egress`]).
//!
//! The guest comes from the operator's settings ([`guest`]): a kernel and initramfs to boot,
//! or a snapshot of a booted guest to fork; with an image's root disk set, the guest's root
//! filesystem is that image under the sandbox's own overlay disk ([`disks`]). Before a
//! sandbox is handed over, its agent has answered and taken the sandbox's environment with
//! fresh host entropy ([`ready`]).
//!
//! Every VMM is started able to snapshot its guest on request, and a sandbox whose directory
//! holds a VM paused to disk is restored from it, not booted ([`persist`]): how the daemon
//! pauses to disk, resumes, snapshots and forks a microvm sandbox. Such a start can stop
//! short of the restore, in a pre-created VM shell that restores when asked ([`shell`]).

pub mod answer;
pub mod disks;
pub mod egress;
pub mod guest;
pub mod persist;
pub mod ready;
pub mod shell;

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_api::{SandboxConfig, Tier, WorkspaceSource};
use airlock_jail::spec::AgentSpec;
use airlock_jail::{HostSupport, JailError, Sandbox, SpawnOptions};
use airlock_policy::{Plan, RootPlan};
use airlock_vmm::host::KvmKind;

use crate::RuntimeError;
use crate::backend::{BackendSupport, TierBackend};
use guest::GuestSource;

/// A guard against a guest that never answers, not a performance bound: under nested
/// emulation a boot takes minutes.
const READY_LIMIT: Duration = Duration::from_secs(600);

/// The microvm tier's backend.
#[derive(Debug)]
pub struct MicrovmTier;

/// The tier's probe: hardware KVM, a configured guest and the jail's own needs.
pub fn support(
    kvm: &KvmKind,
    guest: Result<&GuestSource, &str>,
    host: &HostSupport,
) -> BackendSupport {
    let unavailable = match kvm {
        KvmKind::None { reason } => Some(format!("this host has no KVM ({reason})")),
        KvmKind::Pvm => Some(
            "this host's /dev/kvm is PVM, where a Linux guest needs a PVM-enabled guest kernel"
                .to_owned(),
        ),
        KvmKind::Hardware { .. } => guest.err().map(str::to_owned),
    };
    let mut support = crate::backend::common_support(Tier::Microvm, host);
    if unavailable.is_some() {
        support.unavailable = unavailable;
    }
    support
}

/// `airlock-vmm`: `$AIRLOCK_VMM_BIN`, else beside the helper.
pub fn find_vmm(helper: &Path) -> PathBuf {
    std::env::var_os(guest::ENV_VMM_BIN)
        .map_or_else(|| helper.with_file_name("airlock-vmm"), PathBuf::from)
}

/// An empty directory for the VMM's view's root (only what Airlock mounts is in it).
pub fn empty_root() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = std::env::temp_dir().join("airlock-vmm-root");
    match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Someone else's directory, or one with entries, would become the VMM's root.
    let meta = std::fs::symlink_metadata(&dir)?;
    let uid = std::fs::metadata("/proc/self")?.uid();
    let ours = meta.is_dir() && meta.uid() == uid && meta.mode() & 0o022 == 0;
    if !ours || std::fs::read_dir(&dir)?.next().is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} is not an empty directory of this user's", dir.display()),
        ));
    }
    Ok(dir)
}

/// The configuration the VMM's jail is compiled from: the process tier's (the policy crate
/// compiles jails, and the VMM's is a process tier's turned by [`vmm_plan`]).
pub(crate) fn jail_config(config: &SandboxConfig) -> std::borrow::Cow<'_, SandboxConfig> {
    if config.tier == Tier::Microvm {
        let mut jail = config.clone();
        jail.tier = Tier::Process;
        // The image is the guest's root disk, not the VMM's view; its env is in `env` already.
        jail.image = None;
        jail.root_disk = None;
        std::borrow::Cow::Owned(jail)
    } else {
        std::borrow::Cow::Borrowed(config)
    }
}

/// The process tier's plan, turned into the VMM's jail (`disks`: the sandbox's own disks,
/// which the VMM writes).
pub fn vmm_plan(plan: &Plan, root: PathBuf, disks: Option<&disks::DiskPlan>) -> Plan {
    let mut plan = plan.clone();
    if disks.is_some() {
        plan.landlock
            .write_files
            .push(disks::DiskPlan::overlay_in_view());
    }
    plan.view.root = RootPlan::Host { path: root };
    // Nothing of the host is in the view to mask.
    plan.view.masks.clear();
    // The guest's processes are inside the VM: the VMM is the sandbox's one process, and the
    // sandbox's limit (the guest's memory plus the reserve) is the whole of it.
    plan.cgroup.workload_memory_bytes = None;
    plan
}

/// Lets the VMM size its guest's memory file and write it whole at a pause: the largest file
/// it may write (`RLIMIT_FSIZE`, the sandbox's disk limit) becomes at least the guest's memory.
/// The guest's own writes stay bounded by its disks' sizes.
pub fn fit_file_limit_to_guest(plan: &mut Plan, guest_memory_bytes: u64) {
    for limit in &mut plan.rlimits {
        if limit.resource == airlock_policy::RlimitResource::Fsize {
            limit.soft = limit.soft.max(guest_memory_bytes);
            limit.hard = limit.hard.max(guest_memory_bytes);
        }
    }
}

/// The guest and root disk of a sandbox of `config` under the operator's settings.
fn chosen_guest(config: &SandboxConfig) -> Result<(GuestSource, Option<PathBuf>), String> {
    disks::choose_guest(
        config.root_disk.as_deref(),
        |name| std::env::var_os(name),
        disks::same_file,
    )
}

/// The guest and root disk of a sandbox starting in `sandbox_dir`, and whether the guest is
/// that directory's own: a VM paused to disk there (or a fork's copy of a snapshot) is
/// restored on `paused_disk` (the root disk it was made on), with its own overlay disk;
/// otherwise the guest `chosen` under the operator's settings.
pub fn guest_for(
    sandbox_dir: &Path,
    paused_disk: Option<PathBuf>,
    chosen: impl FnOnce() -> Result<(GuestSource, Option<PathBuf>), String>,
) -> Result<(GuestSource, Option<PathBuf>, bool), String> {
    if persist::is_paused(sandbox_dir) {
        let dir = persist::paused_dir(sandbox_dir);
        return Ok((GuestSource::Snapshot { dir }, paused_disk, true));
    }
    chosen().map(|(guest, disk)| (guest, disk, false))
}

fn setup_error(message: String) -> JailError {
    JailError::Setup {
        code: airlock_jail::helper::SETUP_FAILED,
        message,
    }
}

impl TierBackend for MicrovmTier {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }

    fn probe(&self, host: &HostSupport) -> BackendSupport {
        let guest = GuestSource::from_env();
        support(
            &airlock_vmm::host::detect(),
            guest.as_ref().map_err(String::as_str),
            host,
        )
    }

    fn check(&self, config: &SandboxConfig) -> Result<(), RuntimeError> {
        let unavailable = |reason: String| RuntimeError::TierUnavailable {
            tier: "microvm",
            reason,
        };
        if matches!(config.workspace, WorkspaceSource::Host { .. }) {
            return Err(unavailable(
                "a host workspace cannot be shown to a guest yet".to_owned(),
            ));
        }
        if config.rootfs.is_some() {
            return Err(unavailable(
                "a guest's root is an image's disk or its initramfs, never a host directory (rootfs)"
                    .to_owned(),
            ));
        }
        if config.image.is_some() && config.root_disk.is_none() {
            return Err(unavailable(
                "the image has no root disk: a guest boots an image from its ext4 disk (the daemon makes it; `airlock image disk REF`)".to_owned(),
            ));
        }
        if let Some(document) = &config.policy {
            let policy = airlock_policy::Policy::from_document(document).map_err(|e| {
                RuntimeError::Compile(airlock_policy::CompileError::InvalidPolicy(e))
            })?;
            let syscalls = &policy.document().process.syscalls;
            if let Some(name) = syscalls
                .deny_extra
                .iter()
                .chain(&syscalls.allow_extra)
                .next()
            {
                return Err(unavailable(format!(
                    "the policy's syscall rule `{name}` cannot be enforced: the guest has no seccomp filter yet (`airlock policy explain --tier microvm` lists what holds there)"
                )));
            }
            if airlock_policy::egress_plan(&policy).mode
                == airlock_policy::egress::NetworkMode::Full
            {
                return Err(unavailable(
                    "a guest has no network device: `network: full` cannot be given to it (use `proxy`, whose egress goes over vsock through the egress proxy)".to_owned(),
                ));
            }
        }
        let (guest, root_disk) = chosen_guest(config).map_err(unavailable)?;
        for path in guest.required_paths().into_iter().chain(root_disk) {
            if !path.exists() {
                return Err(unavailable(format!(
                    "the guest's {} does not exist",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    fn needs_upper(&self) -> bool {
        false
    }

    fn start(&self, _plan: &Plan, _options: &SpawnOptions) -> Result<Sandbox, JailError> {
        Err(setup_error(
            "the microvm tier runs long-lived sandboxes only (airlockd, `airlock sandbox create`)"
                .to_owned(),
        ))
    }

    fn start_live(
        &self,
        config: &SandboxConfig,
        plan: &Plan,
        options: &SpawnOptions,
        id: &str,
        agent: AgentSpec,
    ) -> Result<airlock_jail::live::Starting, JailError> {
        let (starting, guest) = self.start_vm(config, plan, options, id, agent, false)?;
        guest
            .finish()
            .map_err(|e| setup_error(crate::error_chain(&e)))?;
        Ok(starting)
    }
}

impl MicrovmTier {
    /// Starts the VMM in its jail and returns what is left to do for the guest to serve
    /// ([`shell::GuestStart`]). With `shell`, the sandbox's directory must hold a paused VM,
    /// and the VMM stops short of restoring it until asked.
    pub(crate) fn start_vm(
        &self,
        config: &SandboxConfig,
        plan: &Plan,
        options: &SpawnOptions,
        id: &str,
        agent: AgentSpec,
        shell: bool,
    ) -> Result<(airlock_jail::live::Starting, shell::GuestStart), JailError> {
        let sandbox_dir = agent.socket.parent().ok_or_else(|| {
            setup_error("the agent's socket names no sandbox directory".to_owned())
        })?;
        let paused_disk = config
            .root_disk
            .clone()
            .or_else(|| disks::root_disk_from_vars(&|name| std::env::var_os(name)));
        let (guest, root_disk, paused) =
            guest_for(sandbox_dir, paused_disk, || chosen_guest(config)).map_err(setup_error)?;
        if shell && !paused {
            let err = shell::ShellError::NotPaused(sandbox_dir.to_owned());
            return Err(setup_error(crate::error_chain(&err)));
        }
        let memory_mib = guest::guest_memory_mib(
            plan.cgroup
                .workload_memory_bytes
                .or(plan.cgroup.memory_bytes),
        );
        let root = empty_root()
            .map_err(|e| setup_error(format!("preparing the VMM's empty root: {e}")))?;
        let mut disks = disks::DiskPlan::new(&guest, root_disk, sandbox_dir);
        if let Some(disks) = disks.as_mut().filter(|_| paused) {
            disks.start = disks::OverlayStart::Keep;
        }
        let owner = disks::host_owner(&plan.identity);
        if let Some(disks) = &disks {
            disks
                .prepare(owner)
                .map_err(|e| setup_error(crate::error_chain(&e)))?;
        }
        let mut plan = vmm_plan(plan, root, disks.as_ref());
        fit_file_limit_to_guest(&mut plan, memory_mib << 20);
        let socket = agent.socket.clone();
        let mut vmm = guest::vmm_spec(&guest, memory_mib);
        if shell {
            vmm.args.push("--shell".to_owned());
        }
        if let Some(disks) = &disks {
            disks.add_to(&mut vmm);
        }
        let save = persist::prepare_save(sandbox_dir, owner, &mut vmm)
            .map_err(|e| setup_error(crate::error_chain(&e)))?;
        plan.landlock.write_files.extend(save);
        let egress = egress::EgressPlan::new(plan.egress.as_ref());
        let resume_egress = egress
            .as_ref()
            .map(|egress| {
                egress.add_to(&mut vmm);
                egress.resume_value()
            })
            .transpose()
            .map_err(|e| setup_error(crate::error_chain(&e)))?;
        let agent = AgentSpec {
            binary: find_vmm(&options.helper),
            vmm: Some(vmm),
            ..agent
        };
        let starting = airlock_jail::live::start(&plan, options, id, agent)?;
        let guest = shell::GuestStart {
            socket,
            helper_pid: starting.record().helper_pid,
            env: plan.process.env.clone(),
            egress: resume_egress,
            limit: READY_LIMIT,
        };
        Ok((starting, guest))
    }
}

#[cfg(test)]
mod tests;
