//! The helper's part in a long-lived sandbox: it binds the agent's socket and prepares the
//! agent's binary and log while still on the host, init execs the agent as the sandbox's pid 1
//! once every layer is on, and the helper then stays beside it, until the supervisor commits
//! the sandbox (from then on it outlives the supervisor) or ends it.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;

use airlock_policy::Plan;

use crate::procctl;
use crate::report::CONTROL_FD;
use crate::spec::{
    AGENT_LISTEN_FD, AGENT_OOM_EVENTS_FD, AGENT_PATH, AGENT_WORKLOAD_CGROUP_FD, AgentSpec,
    VMM_KVM_FD, VmmSpec, WorkloadCgroupSpec,
};
use crate::sys;

/// What init needs to become the agent, opened by the helper on the host.
#[derive(Debug)]
pub struct AgentFds {
    pub listener: OwnedFd,
    pub log: OwnedFd,
    /// A detached mount of the agent binary, attached at [`AGENT_PATH`] in the view.
    pub binary: OwnedFd,
    /// The workload cgroup's `cgroup.procs` (write) and OOM counters (read).
    pub workload_cgroup: Option<(OwnedFd, OwnedFd)>,
    /// Set on the microvm tier: init execs the VMM (`binary`) instead of the agent.
    pub vmm: Option<VmmFds>,
}

/// The microvm tier's host descriptors (see [`VmmSpec`]).
#[derive(Debug)]
pub struct VmmFds {
    /// `/dev/kvm`, opened on the host; [`VMM_KVM_FD`] in the VMM.
    pub kvm: OwnedFd,
    /// Detached mounts of the spec's files, by name, for the view.
    pub files: Vec<(String, OwnedFd)>,
    /// Detached mounts of the spec's disks, by name: shown read-write.
    pub disks: Vec<(String, OwnedFd)>,
    pub mode: String,
    pub args: Vec<String>,
}

fn prepare_vmm(vmm: &VmmSpec) -> io::Result<VmmFds> {
    let kvm = File::options().read(true).write(true).open("/dev/kvm")?;
    // Above the descriptors init installs, as for the workload cgroup's.
    let kvm = sys::dup_above(&OwnedFd::from(kvm), AGENT_OOM_EVENTS_FD + 1)?;
    let detach = |entries: &[(String, std::path::PathBuf)]| -> io::Result<Vec<(String, OwnedFd)>> {
        let mut trees = Vec::new();
        for (name, path) in entries {
            if !crate::view_vmm::is_file_name(name) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("`{name}` cannot name a file of the VMM's view"),
                ));
            }
            let tree = sys::open_tree_clone(None, path, false).map_err(|e| {
                io::Error::new(e.kind(), format!("opening {}: {e}", path.display()))
            })?;
            trees.push((name.clone(), tree));
        }
        Ok(trees)
    };
    let files = detach(&vmm.files)?;
    let disks = detach(&vmm.disks)?;
    Ok(VmmFds {
        kvm,
        files,
        disks,
        mode: vmm.mode.clone(),
        args: vmm.args.clone(),
    })
}

/// What the helper opens on the host for init: a long-lived sandbox's agent, the egress
/// attachments of a `proxy`-mode sandbox, and on-disk scratch directories.
#[derive(Debug, Default)]
pub struct HostFds {
    pub agent: Option<AgentFds>,
    pub egress: Option<EgressFds>,
    pub scratch: Option<ScratchFds>,
    /// The container tier's upper directory (and, in memory, the tmpfs that holds it).
    pub image_upper: Option<crate::mountfs::ImageUpper>,
    /// The view's template, which init clones (see `view_template`).
    pub view_template: Option<OwnedFd>,
    /// A network namespace the host made, which init is cloned into (see `network_pool`).
    pub network: Option<crate::network_pool::Network>,
}

/// Detached clones of the on-disk scratch space's `tmp/` and `workspace/`.
#[derive(Debug)]
pub struct ScratchFds {
    pub tmp: OwnedFd,
    pub workspace: OwnedFd,
}

/// Opened on the host by the helper: the scratch directories sit in the caller's private
/// state, which the sandbox could not reach.
pub fn prepare_scratch(host_dir: &std::path::Path) -> io::Result<ScratchFds> {
    Ok(ScratchFds {
        tmp: sys::open_tree_clone(None, &host_dir.join(airlock_policy::SCRATCH_TMP), false)?,
        workspace: sys::open_tree_clone(
            None,
            &host_dir.join(airlock_policy::SCRATCH_WORKSPACE),
            false,
        )?,
    })
}

/// The egress directory and trust bundle, as detached mounts the view attaches.
#[derive(Debug)]
pub struct EgressFds {
    pub dir: OwnedFd,
    pub trust_bundle: OwnedFd,
}

/// Opened on the host by the helper: the directory sits in the caller's private state, which
/// the sandbox's root could not even traverse.
pub fn prepare_egress(egress: &airlock_policy::EgressSetup) -> io::Result<EgressFds> {
    let dir = sys::open_tree_clone(None, &egress.host_dir, false)?;
    let bundle = egress.host_dir.join(airlock_policy::EGRESS_TRUST_BUNDLE);
    let trust_bundle = sys::open_tree_clone(None, &bundle, false)?;
    Ok(EgressFds { dir, trust_bundle })
}

/// Leaves the supervisor's session (its terminal's signals are not the sandbox's) and its
/// standard streams (a pipe held open by a sandbox would outlive the supervisor's reader).
pub fn detach_from_caller() -> io::Result<()> {
    procctl::setsid()?;
    let null = File::options().read(true).write(true).open("/dev/null")?;
    for target in 0..3 {
        procctl::dup_inheritable(null.as_raw_fd(), target)?;
    }
    Ok(())
}

pub fn prepare(agent: &AgentSpec) -> io::Result<AgentFds> {
    match std::fs::symlink_metadata(&agent.socket) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(&agent.socket)?;
        }
        _ => {}
    }
    let listener = UnixListener::bind(&agent.socket)?;
    std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(0o600))?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&agent.log)?;
    let binary = sys::open_tree_clone(None, &agent.binary, false)?;
    let vmm = agent.vmm.as_ref().map(prepare_vmm).transpose()?;
    Ok(AgentFds {
        listener: OwnedFd::from(listener),
        log: OwnedFd::from(log),
        binary,
        workload_cgroup: None,
        vmm,
    })
}

impl AgentFds {
    /// Adds the workload cgroup's files, once the supervisor has made it.
    pub fn with_workload_cgroup(mut self, cgroup: &WorkloadCgroupSpec) -> io::Result<AgentFds> {
        if self.vmm.is_some() {
            // The workload runs in the guest; the VMM is the sandbox's one process.
            return Ok(self);
        }
        // Above the descriptors init installs for the agent, so that installing one cannot
        // clobber another.
        let high = |file: File| sys::dup_above(&OwnedFd::from(file), AGENT_OOM_EVENTS_FD + 1);
        let procs = high(File::options().write(true).open(&cgroup.procs)?)?;
        let oom = high(File::open(&cgroup.oom_events)?)?;
        self.workload_cgroup = Some((procs, oom));
        Ok(self)
    }
}

/// Init's last step in a long-lived sandbox: become the agent. Returns only on failure. The
/// report channel is close-on-exec, so the helper learns of the exec from its end of file.
pub fn exec_agent(plan: &Plan, fds: &AgentFds) -> io::Error {
    let run = || -> io::Result<io::Error> {
        let null = File::options().read(true).open("/dev/null")?;
        procctl::dup_inheritable(null.as_raw_fd(), 0)?;
        procctl::dup_inheritable(fds.log.as_raw_fd(), 1)?;
        procctl::dup_inheritable(fds.log.as_raw_fd(), 2)?;
        procctl::dup_inheritable(fds.listener.as_raw_fd(), AGENT_LISTEN_FD)?;
        let c =
            |s: String| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
        if let Some(vmm) = &fds.vmm {
            procctl::dup_inheritable(vmm.kvm.as_raw_fd(), VMM_KVM_FD)?;
            sys::close_from(AGENT_LISTEN_FD + 1, &[crate::report::REPORT_FD, VMM_KVM_FD])?;
            let argv = vmm_argv(vmm)
                .into_iter()
                .map(c)
                .collect::<io::Result<Vec<_>>>()?;
            sys::chdir(std::path::Path::new("/"))?;
            // No environment: the guest's comes from the runtime, over vsock.
            return Ok(sys::execve(&c(AGENT_PATH.to_owned())?, &argv, &[]));
        }
        let mut keep = vec![crate::report::REPORT_FD];
        if let Some((procs, oom)) = &fds.workload_cgroup {
            procctl::dup_inheritable(procs.as_raw_fd(), AGENT_WORKLOAD_CGROUP_FD)?;
            procctl::dup_inheritable(oom.as_raw_fd(), AGENT_OOM_EVENTS_FD)?;
            keep.extend([AGENT_WORKLOAD_CGROUP_FD, AGENT_OOM_EVENTS_FD]);
        }
        sys::close_from(AGENT_LISTEN_FD + 1, &keep)?;
        let program = c(AGENT_PATH.to_owned())?;
        let mut argv = vec![
            c("airlock-agent".to_owned())?,
            c("--listen-fd".to_owned())?,
            c(AGENT_LISTEN_FD.to_string())?,
        ];
        if fds.workload_cgroup.is_some() {
            for arg in [
                "--workload-cgroup-fd".to_owned(),
                AGENT_WORKLOAD_CGROUP_FD.to_string(),
                "--oom-events-fd".to_owned(),
                AGENT_OOM_EVENTS_FD.to_string(),
            ] {
                argv.push(c(arg)?);
            }
        }
        if let Some(egress) = &plan.egress {
            // The agent is the relay to the egress proxy (see `airlock_agent::relay`).
            argv.push(c("--egress-relay".to_owned())?);
            argv.push(c(format!(
                "{}:{}/{}",
                egress.relay_port,
                airlock_policy::EGRESS_DIR,
                airlock_policy::EGRESS_SOCKET
            ))?);
        }
        let env = plan
            .process
            .env
            .iter()
            .map(|(k, v)| c(format!("{k}={v}")))
            .collect::<io::Result<Vec<_>>>()?;
        sys::chdir(std::path::Path::new("/"))?;
        Ok(sys::execve(&program, &argv, &env))
    };
    run().unwrap_or_else(|e| e)
}

/// The VMM's argv (see [`VmmSpec`]).
fn vmm_argv(vmm: &VmmFds) -> Vec<String> {
    let mut argv = vec![
        "airlock-vmm".to_owned(),
        vmm.mode.clone(),
        "--kvm-fd".to_owned(),
        VMM_KVM_FD.to_string(),
        "--vsock-listen-fd".to_owned(),
        AGENT_LISTEN_FD.to_string(),
    ];
    argv.extend(vmm.args.iter().cloned());
    argv
}

/// After the agent is up: wait for the supervisor's commit on [`CONTROL_FD`]. A commit frees
/// the helper from its supervisor; end of file before it means the supervisor died before the
/// sandbox was recorded, and the sandbox ends. (The parent-death signal is already disarmed:
/// the pipe carries a commit written just before the supervisor died.) SIGTERM ends it at any time. Returns once init is
/// gone and reaped.
pub fn stay_beside(init_pid: libc::pid_t, terminate: Option<&OwnedFd>) {
    let Ok(init) = procctl::pidfd_open(init_pid) else {
        let _ = sys::kill(init_pid, libc::SIGKILL);
        let _ = sys::waitpid(init_pid, 0);
        return;
    };
    let mut control = Some(CONTROL_FD);
    loop {
        let mut fds = vec![init.as_raw_fd()];
        fds.extend(terminate.map(AsRawFd::as_raw_fd));
        fds.extend(control);
        let Ok(ready) = sys::poll_readable(&fds, -1) else {
            break;
        };
        if ready.first().copied().unwrap_or(false) {
            break;
        }
        if terminate.is_some() && ready.get(1).copied().unwrap_or(false) {
            if let Some(signals) = terminate {
                let _ = sys::read_signal(signals);
            }
            let _ = sys::kill(init_pid, libc::SIGKILL);
        }
        if control.is_some() && ready.last().copied().unwrap_or(false) {
            match read_commit() {
                Some(true) => {
                    // Committed: the sandbox is recorded and outlives the supervisor. Nothing
                    // more is reported: the supervisor may already be gone.
                    control = None;
                }
                Some(false) => {
                    let _ = sys::kill(init_pid, libc::SIGKILL);
                    control = None;
                }
                None => {}
            }
        }
    }
    let _ = sys::waitpid(init_pid, 0);
}

/// `Some(true)` for a commit, `Some(false)` for end of file, `None` for nothing yet.
fn read_commit() -> Option<bool> {
    let mut byte = [0u8; 1];
    let mut file = std::mem::ManuallyDrop::new(control_file());
    match file.read(&mut byte) {
        Ok(0) => Some(false),
        Ok(_) => Some(byte[0] == COMMIT),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
        Err(_) => Some(false),
    }
}

fn control_file() -> File {
    use std::os::fd::FromRawFd;
    // SAFETY: CONTROL_FD was installed by the supervisor for the helper alone; the caller wraps
    // the File in ManuallyDrop, so the descriptor is borrowed, never closed twice.
    unsafe { File::from_raw_fd(CONTROL_FD) }
}

/// The byte a supervisor writes on the control pipe to commit a sandbox.
pub const COMMIT: u8 = b'C';

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_vmm_argv_names_the_inherited_descriptors_then_the_runtime_s_arguments() {
        let kvm = OwnedFd::from(File::open("/dev/null").unwrap());
        let vmm = VmmFds {
            kvm,
            files: Vec::new(),
            disks: Vec::new(),
            mode: "restore".into(),
            args: vec!["--snapshot".into(), "/run/airlock/vm/snapshot".into()],
        };
        assert_eq!(
            vmm_argv(&vmm),
            [
                "airlock-vmm",
                "restore",
                "--kvm-fd",
                "5",
                "--vsock-listen-fd",
                "3",
                "--snapshot",
                "/run/airlock/vm/snapshot"
            ]
        );
    }
}
