//! The `airlock-jail` helper: a freshly exec'd, single-threaded process that reads its spec from
//! descriptor 3, joins the sandbox's cgroup, clones the sandbox's init (pid 1 inside) into new
//! namespaces and writes its id maps. Init builds the view, drops every privilege, confines itself
//! and finally forks and execs the workload; the helper relays its reports.
//!
//! Order of layers: cgroup → user, mount, pid and cgroup namespaces (and the idmapped workspace,
//! made while the helper is still privileged on the host) → network, ipc and uts namespaces
//! (built by a thread of init from its birth, while init waits for its maps and builds the view)
//! → view and pivot_root → rlimits → identity and capabilities → no_new_privs → Landlock →
//! seccomp.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use airlock_api::Compat;
use airlock_policy::{IdMap, Plan, RlimitResource, RootPlan, ScratchPlan, WorkspacePlan};

use crate::helper_live::{self, HostFds};
use crate::network_pool::Network;
use crate::report::{
    self, CONTROL_FD, HOLD_FD, NETNS_FD, Phase, REPORT_FD, Report, SPEC_FD, SYSFS_FD, TEMPLATE_FD,
    mark,
};
use crate::spec::{self, Evaluation, HelperSpec, NetworkSource};
use crate::sys::{self, Forked};
use crate::{landlock, mountfs, relay, seccomp, view};

mod workload;
use workload::supervise;

/// Exit code for a sandbox that could not be set up.
pub const SETUP_FAILED: i32 = 125;

/// An error on the way to the workload, with the exit code it maps to.
struct Failure {
    code: i32,
    message: String,
}

impl Failure {
    fn setup(message: impl Into<String>) -> Failure {
        Failure {
            code: SETUP_FAILED,
            message: message.into(),
        }
    }
}

fn with_source(context: &str, err: &dyn std::error::Error) -> Failure {
    Failure::setup(format!("{context}: {}", crate::error_chain(err)))
}

/// Entry point of the exec'd helper binary; returns its exit code.
pub fn main() -> i32 {
    // Run by hand, or by anything but a supervisor: say so, instead of taking ownership of
    // descriptors that are not there.
    if !sys::is_open(SPEC_FD) || !sys::is_open(REPORT_FD) {
        eprintln!(
            "airlock-jail: no spec on descriptor {SPEC_FD} or no report channel on descriptor \
             {REPORT_FD}: the helper is started only by Airlock's supervisor"
        );
        return SETUP_FAILED;
    }
    main_with_descriptors()
}

/// The helper's work once its descriptors are in place: after [`main`]'s check, or in a fork
/// of the zygote, which installed them itself.
pub(crate) fn main_with_descriptors() -> i32 {
    // If the supervisor dies, so do we; init follows through its own death signal.
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // SIGPIPE as the Rust runtime would leave it (the binary has no Rust `main`): a write to a
    // closed pipe fails with EPIPE instead of killing the helper.
    for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGTSTP, libc::SIGPIPE] {
        sys::ignore_signal(signal);
    }
    // Only the spec and report channels may cross into the helper; anything else the caller
    // leaked without close-on-exec stops here.
    let _ = sys::close_from(
        REPORT_FD + 1,
        &[CONTROL_FD, HOLD_FD, TEMPLATE_FD, NETNS_FD, SYSFS_FD],
    );
    match start() {
        Ok(()) => 0,
        Err(failure) => report_failure(failure),
    }
}

/// Reports a failure to the supervisor and returns the exit code that goes with it.
fn report_failure(failure: Failure) -> i32 {
    report::send(&Report::Failed {
        code: failure.code,
        message: failure.message,
    });
    failure.code
}

fn start() -> Result<(), Failure> {
    let (spec, mut channel) = read_spec()?;
    report::set_tracing(spec.trace);
    if spec.agent.is_some() {
        helper_live::detach_from_caller()
            .map_err(|e| with_source("leaving the caller's session", &e))?;
    } else {
        // Only long-lived sandboxes have a control channel.
        let _ = sys::close_from(CONTROL_FD, &[HOLD_FD, TEMPLATE_FD, NETNS_FD, SYSFS_FD]);
    }
    let view_template = take_view_template(spec.view_template)?;
    let inherited_network = take_network_fds();
    mark(Phase::HelperRunning);
    if sys::getppid() != spec.supervisor_pid {
        // The supervisor died before our death signal was armed: nobody is listening.
        return Err(Failure::setup("the supervisor is gone"));
    }
    // Descriptors only, while the supervisor makes the cgroup: nothing here creates a process
    // or fills memory that the sandbox's limits should count.
    let agent = spec
        .agent
        .as_ref()
        .map(|agent| {
            helper_live::prepare(agent).map_err(|e| {
                with_source(
                    &format!("preparing the agent at {}", agent.socket.display()),
                    &e,
                )
            })
        })
        .transpose()?;
    let egress = spec
        .plan
        .egress
        .as_ref()
        .map(|egress| {
            helper_live::prepare_egress(egress).map_err(|e| {
                with_source(
                    &format!("preparing egress from {}", egress.host_dir.display()),
                    &e,
                )
            })
        })
        .transpose()?;
    let scratch = match &spec.plan.view.scratch {
        ScratchPlan::Disk { host_dir } => {
            Some(helper_live::prepare_scratch(host_dir).map_err(|e| {
                with_source(
                    &format!("preparing the scratch space at {}", host_dir.display()),
                    &e,
                )
            })?)
        }
        ScratchPlan::Memory { .. } => None,
    };
    let cgroups = spec::read_late(&mut channel)
        .map_err(|e| with_source("receiving the sandbox cgroup and network", &e))?;
    drop(channel);
    // When the pool had none, the helper makes one the same way. Should the host not let it,
    // init makes its own, as without a zygote.
    let network = match (cgroups.network, inherited_network) {
        (NetworkSource::Init, _) => None,
        (NetworkSource::Pooled, Some(pooled)) => Some(pooled),
        (NetworkSource::Pooled, None) => {
            return Err(Failure::setup(
                "the zygote's pooled network namespace is missing",
            ));
        }
        (NetworkSource::Helper, _) => crate::network_pool::make().ok(),
    };
    for file in &cgroups.join {
        std::fs::write(file, "0").map_err(|e| {
            with_source(
                &format!("joining the sandbox cgroup through {}", file.display()),
                &e,
            )
        })?;
    }
    let agent = match (agent, &cgroups.workload) {
        (Some(agent), Some(workload)) => {
            Some(agent.with_workload_cgroup(workload).map_err(|e| {
                with_source(
                    &format!("opening the workload cgroup {}", workload.procs.display()),
                    &e,
                )
            })?)
        }
        (agent, _) => agent,
    };
    let image_upper = mountfs::ImageUpper::prepare(&spec.plan)
        .map_err(|e| with_source("preparing the image's upper directory", &e))?;
    let host = HostFds {
        agent,
        egress,
        scratch,
        image_upper,
        view_template,
        network,
    };
    let seccomp: Vec<seccomp::Insn> = spec
        .seccomp
        .iter()
        .map(|&word| seccomp::Insn::from_word(word))
        .collect();
    run(&spec.plan, &seccomp, &cgroups.leave, host, spec.evaluation)
}

/// The view's template at [`TEMPLATE_FD`] when the spec says one is there, moved to a
/// close-on-exec descriptor so that no exec'd process (the agent, a workload) inherits it.
/// Otherwise whatever a caller leaked at that number is closed: since `main`'s sweep, nothing
/// of ours has been left open there.
fn take_view_template(passed: bool) -> Result<Option<OwnedFd>, Failure> {
    let moved = sys::move_above(TEMPLATE_FD, SPEC_FD + 8);
    if !passed {
        return Ok(None);
    }
    moved
        .map(Some)
        .map_err(|e| with_source("taking the view's template", &e))
}

/// Whatever is at [`NETNS_FD`] and [`SYSFS_FD`] (a zygote's pooled network namespace and its
/// sysfs, or nothing), moved to close-on-exec descriptors, with both numbers freed before the
/// helper opens anything that could land there. Only the late spec says whether to use them.
fn take_network_fds() -> Option<Network> {
    let netns = sys::move_above(NETNS_FD, SPEC_FD + 8).ok();
    let sysfs = sys::move_above(SYSFS_FD, SPEC_FD + 8).ok();
    Some(Network {
        netns: netns?,
        sysfs: sysfs?,
    })
}

/// The spec from [`SPEC_FD`], and the channel, on which the cgroup follows.
fn read_spec() -> Result<(HelperSpec, File), Failure> {
    // SAFETY: the supervisor placed the spec pipe at SPEC_FD for us alone; we take ownership.
    let mut file = unsafe { File::from_raw_fd(SPEC_FD) };
    let spec =
        spec::read_spec(&mut file).map_err(|e| with_source("reading the sandbox spec", &e))?;
    Ok((spec, file))
}

fn warn_or_fail(compat: Compat, message: String) -> Result<(), Failure> {
    match compat {
        Compat::Strict => Err(Failure::setup(format!(
            "{message} (--compat best-effort runs without it)"
        ))),
        Compat::BestEffort => {
            report::send(&Report::Warning(format!("not enforced: {message}")));
            Ok(())
        }
    }
}

fn run(
    plan: &Plan,
    seccomp: &[seccomp::Insn],
    cgroup_leave: &[std::path::PathBuf],
    host: HostFds,
    evaluation: Evaluation,
) -> Result<(), Failure> {
    // The supervisor ends a sandbox with SIGTERM to the helper; it waits here until the relay.
    let terminate = sys::block_signals(&[libc::SIGTERM])
        .and_then(|_| sys::signalfd(&[libc::SIGTERM]))
        .ok();
    // Init waits on this socket for its id maps (and the idmapped workspace). EOF instead means
    // the helper died, and init gives up: it cannot see its parent from its own pid namespace.
    let (helper_end, init_end) = sys::socketpair().map_err(|e| with_source("socketpair", &e))?;
    let flags =
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWCGROUP;
    match clone_init(flags, host.network.as_ref())? {
        Forked::Child => {
            drop(helper_end);
            drop(terminate);
            let code =
                init(plan, seccomp, init_end, &host, evaluation).unwrap_or_else(report_failure);
            sys::exit_now(code)
        }
        Forked::Parent(init_pid) => {
            drop(init_end);
            let long_lived = host.agent.is_some();
            mark(Phase::InitCloned);
            // Init is in the sandbox's cgroup now; the helper, a host process, leaves it, so that
            // the sandbox's OOM killer can never pick it, nor its limits count it.
            let left = cgroup_leave.iter().try_for_each(|file| {
                std::fs::write(file, "0").map_err(|e| {
                    with_source(
                        &format!("leaving the sandbox cgroup through {}", file.display()),
                        &e,
                    )
                })
            });
            let released = left.and_then(|()| release_init(plan, init_pid, &helper_end, &host));
            drop(host);
            if let Err(failure) = released {
                let _ = sys::kill(init_pid, libc::SIGKILL);
                let _ = sys::waitpid(init_pid, 0);
                return Err(failure);
            }
            mark(Phase::InitReleased);
            let finished = relay_reports(&helper_end, init_pid, terminate.as_ref());
            if long_lived
                && !finished
                && matches!(sys::waitpid(init_pid, libc::WNOHANG), Ok((0, _)))
            {
                // Init closed its report channel by exec'ing the agent. From here the control
                // pipe, not the parent-death signal, ties the sandbox to its supervisor until the
                // commit: a commit byte already in the pipe survives the supervisor's death.
                let _ = sys::prctl(libc::PR_SET_PDEATHSIG, 0);
                report::send(&Report::Ready);
                helper_live::stay_beside(init_pid, terminate.as_ref());
                return Ok(());
            }
            let _ = sys::waitpid(init_pid, 0);
            Ok(())
        }
    }
}

/// Clones init with `flags`, into `network` when the host made its network namespace: a
/// process can only enter a namespace it holds capabilities over, so the helper enters it just
/// for the clone and returns to its own.
fn clone_init(flags: libc::c_int, network: Option<&Network>) -> Result<Forked, Failure> {
    let Some(network) = network else {
        return sys::fork_into(flags).map_err(|e| with_source("creating namespaces", &e));
    };
    let home = File::open("/proc/thread-self/ns/net")
        .map(OwnedFd::from)
        .map_err(|e| with_source("opening the helper's network namespace", &e))?;
    sys::setns(&network.netns, libc::CLONE_NEWNET)
        .map_err(|e| with_source("entering the sandbox's network namespace", &e))?;
    let forked = sys::fork_into(flags);
    if !matches!(forked, Ok(Forked::Child)) {
        // Staying would cost nothing but tidiness: the helper opens no socket from here on.
        let _ = sys::setns(&home, libc::CLONE_NEWNET);
    }
    forked.map_err(|e| with_source("creating namespaces", &e))
}

/// Forwards init's reports to the supervisor until init is gone. Init runs inside the sandbox,
/// so the helper passes on only well-formed messages, one per datagram.
///
/// SIGTERM (from the supervisor) ends the sandbox: init is killed, and the loop goes on until
/// init is gone, so that the helper can reap it and no zombie outlives the sandbox.
/// Returns whether a final message (an exit status or a failure) was relayed.
fn relay_reports(socket: &OwnedFd, init_pid: libc::pid_t, terminate: Option<&OwnedFd>) -> bool {
    let mut buf = vec![0u8; report::MAX_MESSAGE];
    let mut filter = RelayFilter::default();
    let mut fds = vec![socket.as_raw_fd()];
    fds.extend(terminate.map(AsRawFd::as_raw_fd));
    while let Ok(ready) = sys::poll_readable(&fds, -1) {
        if let Some(terminate) = terminate
            && ready.get(1).copied().unwrap_or(false)
        {
            let _ = sys::read_signal(terminate);
            let _ = sys::kill(init_pid, libc::SIGKILL);
        }
        if !ready.first().copied().unwrap_or(false) {
            continue;
        }
        let Ok(n) = sys::recv(socket, &mut buf) else {
            break;
        };
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        if let Some(message) =
            Report::decode(text.trim_end_matches('\n')).and_then(|message| filter.admit(message))
        {
            report::send(&message);
        }
    }
    filter.finished
}

/// What the helper lets through from init, which runs inside the sandbox: setup failures only
/// with the setup exit codes, one final message, a bounded number of the others, and no
/// terminal control characters.
#[derive(Debug, Default)]
struct RelayFilter {
    finished: bool,
    warnings: usize,
    phases: usize,
}

impl RelayFilter {
    const MAX_WARNINGS: usize = 32;

    fn admit(&mut self, message: Report) -> Option<Report> {
        let printable = |text: String| text.chars().filter(|c| !c.is_control()).collect();
        match message {
            Report::Warning(text) if self.warnings < Self::MAX_WARNINGS => {
                self.warnings += 1;
                Some(Report::Warning(printable(text)))
            }
            Report::Phase { .. } if self.phases < Phase::ALL.len() => {
                self.phases += 1;
                Some(message)
            }
            Report::Failed { code, message } if !self.finished => {
                self.finished = true;
                let code = if (SETUP_FAILED..=127).contains(&code) {
                    code
                } else {
                    SETUP_FAILED
                };
                Some(Report::Failed {
                    code,
                    message: printable(message),
                })
            }
            Report::Ended(_) if !self.finished => {
                self.finished = true;
                Some(message)
            }
            _ => None,
        }
    }
}

fn map_text(maps: &[IdMap]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count))
        .collect()
}

/// Writes init's id maps from outside its user namespace, builds the idmapped workspace while
/// still privileged on the host, and lets init go.
fn release_init(
    plan: &Plan,
    init_pid: libc::pid_t,
    socket: &OwnedFd,
    host: &HostFds,
) -> Result<(), Failure> {
    let proc_dir = format!("/proc/{init_pid}");
    let write = |file: &str, text: &str| {
        std::fs::write(format!("{proc_dir}/{file}"), text)
            .map_err(|e| with_source(&format!("writing {file}"), &e))
    };
    if !plan.identity.privileged_caller {
        // Required before an unprivileged gid_map.
        write("setgroups", "deny")?;
    }
    write("uid_map", &map_text(&plan.identity.uid_map))?;
    write("gid_map", &map_text(&plan.identity.gid_map))?;
    let userns = || {
        File::open(format!("{proc_dir}/ns/user"))
            .map(OwnedFd::from)
            .map_err(|e| with_source("opening the user namespace", &e))
    };
    if let (RootPlan::Overlay { layers }, Some(upper)) = (&plan.view.root, &host.image_upper) {
        let userns = userns()?;
        let (upper, work) = upper
            .dirs()
            .map_err(|e| with_source("opening the image's upper directory", &e))?;
        let root = mountfs::image_root(layers, &userns, &upper, &work)
            .map_err(|e| with_source("mounting the image's root", &e))?;
        sys::send_with_fd(socket, ROOT_MESSAGE, Some(&root))
            .map_err(|e| with_source("handing over the image's root", &e))?;
    }
    // The on-disk scratch volume keeps the sandbox's files with its own ids (0 is its root),
    // whatever host range the sandbox runs in: they are shown through idmapped mounts, so
    // that a resume, a snapshot or a fork in another range sees them as theirs.
    if let Some(scratch) = &host.scratch
        && plan.identity.privileged_caller
    {
        let userns = userns()?;
        for (name, tree) in [("/tmp", &scratch.tmp), ("/workspace", &scratch.workspace)] {
            sys::mount_setattr(tree, false, sys::MOUNT_ATTR_IDMAP, Some(&userns))
                .map_err(|e| with_source(&format!("idmapping the scratch {name}"), &e))?;
        }
    }
    let idmapped = match &plan.view.workspace {
        WorkspacePlan::Host { path, idmap: true } => {
            idmap_workspace(path, &userns()?, plan.compat)?
        }
        _ => None,
    };
    sys::send_with_fd(socket, b"go", idmapped.as_ref())
        .map_err(|e| with_source("releasing the sandbox init", &e))
}

fn idmap_workspace(
    path: &Path,
    userns: &OwnedFd,
    compat: Compat,
) -> Result<Option<OwnedFd>, Failure> {
    let tree = sys::open_tree_clone(None, path, false)
        .map_err(|e| with_source(&format!("opening workspace {}", path.display()), &e))?;
    match sys::mount_setattr(&tree, false, sys::MOUNT_ATTR_IDMAP, Some(userns)) {
        Ok(()) => Ok(Some(tree)),
        Err(e) => {
            warn_or_fail(
                compat,
                format!(
                    "idmapped workspace ({} does not support idmapped mounts: {e}); files written there would belong to an unmapped user",
                    path.display()
                ),
            )?;
            Ok(None)
        }
    }
}

/// The message that carries the container tier's root to init, before `go`.
const ROOT_MESSAGE: &[u8] = b"root";

/// The sandbox's init: pid 1 in the new pid namespace.
fn init(
    plan: &Plan,
    seccomp: &[seccomp::Insn],
    socket: OwnedFd,
    host: &HostFds,
    evaluation: Evaluation,
) -> Result<i32, Failure> {
    let agent = host.agent.as_ref();
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Init inherits HOLD_FD (the id range's lock) and keeps it out of reach like its other
    // descriptors: the workload's child closes every descriptor from 3 up before its exec, and
    // the agent's exec closes it too (`helper_live::exec_agent`).
    let join_network = network_namespaces(plan, host.network.is_some())?;
    let (mut message, mut idmapped) = sys::recv_with_fd(&socket).unwrap_or_default();
    let mut image_root = None;
    if message == ROOT_MESSAGE {
        image_root = idmapped.take();
        (message, idmapped) = sys::recv_with_fd(&socket).unwrap_or_default();
    }
    if message != b"go" {
        // The helper is gone, and with it whoever would read a report.
        return Ok(SETUP_FAILED);
    }
    // Not dumpable: the workload shares init's uid, and must not reach init's descriptors or
    // memory through /proc/1. (Only now: the helper needed init's /proc files to write its maps.)
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(|e| with_source("PR_SET_DUMPABLE", &e))?;
    // From here on init reports through the helper, which validates what it relays: the
    // supervisor's own report pipe never enters the sandbox.
    sys::dup_onto(&socket, REPORT_FD).map_err(|e| with_source("report channel", &e))?;
    drop(socket);
    if plan.identity.privileged_caller {
        // Host root is unmapped here: become the namespace's root before creating any file.
        sys::clear_groups().map_err(|e| with_source("dropping supplementary groups", &e))?;
        sys::setresgid(0).map_err(|e| with_source("setresgid", &e))?;
        sys::setresuid(0).map_err(|e| with_source("setresuid", &e))?;
    }
    sys::reset_signals();
    let workspace = view::prepare_workspace(&plan.view.workspace, idmapped)
        .map_err(|e| with_source("filesystem view", &e))?;
    let memory_mount = match &host.image_upper {
        Some(mountfs::ImageUpper::Memory(scratch)) => Some(&scratch.mount),
        _ => None,
    };
    let resolved = view::build(
        &plan.view,
        workspace,
        view::Attachments {
            scratch: host
                .scratch
                .as_ref()
                .map(|scratch| view::PreparedScratch::Disk {
                    tmp: &scratch.tmp,
                    workspace: &scratch.workspace,
                })
                .or(memory_mount.map(view::PreparedScratch::MemoryMount)),
            agent_binary: agent.map(|agent| &agent.binary),
            egress_dir: host.egress.as_ref().map(|egress| &egress.dir),
            trust_bundle: host.egress.as_ref().map(|egress| &egress.trust_bundle),
            image_root: image_root.as_ref(),
            vmm_files: agent
                .and_then(|agent| agent.vmm.as_ref())
                .map(|vmm| vmm.files.as_slice())
                .unwrap_or_default(),
            vmm_disks: agent
                .and_then(|agent| agent.vmm.as_ref())
                .map(|vmm| vmm.disks.as_slice())
                .unwrap_or_default(),
            template: host.view_template.as_ref(),
            sysfs: host.network.as_ref().map(|network| &network.sysfs),
        },
        &plan.identity,
        join_network,
    )
    .map_err(|e| with_source("filesystem view", &e))?;
    drop(image_root);
    // The container tier's user, found in the image: the rest of setup uses its ids, and its
    // home when the environment names none.
    let resolved_plan = resolved.map(|user| with_user(plan, user));
    let plan = resolved_plan.as_ref().unwrap_or(plan);
    mark(Phase::ViewBuilt);
    apply_rlimits(plan)?;
    drop_privileges(plan)?;
    // A change of credentials clears the parent-death signal: arm it again, then make sure the
    // helper did not die in between. Dumpability is reasserted for the same reason.
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| with_source("PR_SET_PDEATHSIG", &e))?;
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(|e| with_source("PR_SET_DUMPABLE", &e))?;
    if sys::poll_readable(&[REPORT_FD], 0).map_or(true, |ready| ready[0]) {
        return Ok(SETUP_FAILED);
    }
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map_err(|e| with_source("no_new_privs", &e))?;
    mark(Phase::PrivilegesDropped);
    if !evaluation.skip_landlock
        && let Err(e) = landlock::apply(&plan.landlock)
    {
        warn_or_fail(plan.compat, format!("Landlock: {}", crate::error_chain(&e)))?;
    }
    mark(Phase::LandlockApplied);
    seccomp::install(seccomp).map_err(|e| with_source("seccomp", &e))?;
    mark(Phase::SeccompInstalled);
    match agent {
        Some(agent) => {
            let err = helper_live::exec_agent(plan, agent);
            Err(with_source("starting the agent", &err))
        }
        None => {
            // The workload's first connection must find the relay's port open.
            let relay = plan
                .egress
                .as_ref()
                .map(|egress| relay::bind(egress.relay_port))
                .transpose()
                .map_err(|e| with_source("binding the egress relay", &e))?;
            supervise(plan, relay)
        }
    }
}

/// Init's ipc and uts namespaces, and its network namespace unless the host made it (init was
/// cloned into it): returns what joins them, which the view calls just before sysfs.
fn network_namespaces(
    plan: &Plan,
    host_made: bool,
) -> Result<Box<dyn FnOnce() -> io::Result<()>>, Failure> {
    let hostname = plan.view.hostname.clone();
    if host_made {
        return Ok(Box::new(move || {
            sys::unshare(libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)?;
            sys::sethostname(&hostname)
        }));
    }
    // The network namespace costs more to create than anything else: a thread builds it, with
    // the ipc and uts namespaces, while this one waits for its id maps and builds the filesystem
    // view. It needs no maps: init holds every capability in its new user namespace from birth.
    // Namespaces belong to a thread, so this thread joins them afterwards.
    let namespaces = std::thread::Builder::new().spawn(move || -> io::Result<[OwnedFd; 3]> {
        sys::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)?;
        sys::loopback_up()?;
        sys::sethostname(&hostname)?;
        let open =
            |kind: &str| File::open(format!("/proc/thread-self/ns/{kind}")).map(OwnedFd::from);
        Ok([open("net")?, open("ipc")?, open("uts")?])
    });
    let namespaces = namespaces.map_err(|e| with_source("starting the namespace thread", &e))?;
    Ok(Box::new(move || {
        let [net, ipc, uts] = namespaces
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))??;
        sys::setns(&net, libc::CLONE_NEWNET)?;
        sys::setns(&ipc, libc::CLONE_NEWIPC)?;
        sys::setns(&uts, libc::CLONE_NEWUTS)
    }))
}

fn apply_rlimits(plan: &Plan) -> Result<(), Failure> {
    for limit in &plan.rlimits {
        let resource = match limit.resource {
            RlimitResource::Core => libc::RLIMIT_CORE,
            RlimitResource::Nofile => libc::RLIMIT_NOFILE,
            RlimitResource::Fsize => libc::RLIMIT_FSIZE,
        };
        // Never raise a hard limit above what the host already allows.
        let (_, current_hard) =
            sys::getrlimit(resource).map_err(|e| with_source("getrlimit", &e))?;
        let hard = limit.hard.min(current_hard);
        let soft = limit.soft.min(hard);
        sys::setrlimit(resource, soft, hard)
            .map_err(|e| with_source(&format!("setrlimit {:?}", limit.resource), &e))?;
    }
    Ok(())
}

/// `plan` with the workload's identity replaced by `user` (see `IdentityPlan::lookup`).
fn with_user(plan: &Plan, user: airlock_policy::image_user::ResolvedUser) -> Plan {
    let mut plan = plan.clone();
    let set_home = plan.identity.lookup.as_ref().is_some_and(|l| l.set_home);
    if set_home && !plan.process.env.iter().any(|(name, _)| name == "HOME") {
        let home = user.home.clone().unwrap_or_else(|| "/".to_owned());
        plan.process.env.push(("HOME".to_owned(), home));
    }
    plan.identity.uid = user.uid;
    plan.identity.gid = user.gid;
    plan.identity.groups = user.groups;
    plan
}

fn drop_privileges(plan: &Plan) -> Result<(), Failure> {
    let keep = kept_capabilities(&plan.identity);
    // Shrink the bounding set while CAP_SETPCAP is still held, so exec can never regain
    // anything else. PR_CAPBSET_DROP fails with EINVAL past the kernel's last capability (and
    // succeeds for one already dropped), so no PR_CAPBSET_READ is needed.
    for cap in 0..64 {
        if keep & (1 << cap) != 0 {
            continue;
        }
        match sys::prctl(libc::PR_CAPBSET_DROP, cap) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(with_source("emptying the bounding set", &e)),
        }
    }
    if plan.identity.privileged_caller {
        sys::set_groups(&plan.identity.groups)
            .map_err(|e| with_source("setting the supplementary groups", &e))?;
    }
    sys::setresgid(plan.identity.gid)
        .map_err(|e| with_source(&format!("switching to gid {}", plan.identity.gid), &e))?;
    sys::setresuid(plan.identity.uid)
        .map_err(|e| with_source(&format!("switching to uid {}", plan.identity.uid), &e))?;
    sys::prctl_cap_ambient_clear_all()
        .map_err(|e| with_source("clearing ambient capabilities", &e))?;
    sys::set_capabilities(keep).map_err(|e| with_source("clearing capabilities", &e))
}

/// The capabilities the workload keeps, as a bit mask: none, except a container-tier root's
/// file capabilities inside its own user namespace (see `IdentityPlan::root_file_caps`).
fn kept_capabilities(identity: &airlock_policy::IdentityPlan) -> u64 {
    if !(identity.root_file_caps && identity.uid == 0) {
        return 0;
    }
    airlock_policy::ROOT_FILE_CAPABILITIES
        .iter()
        .fold(0, |mask, cap| mask | (1 << cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_relay_admits_one_final_message_with_a_setup_code() {
        let mut filter = RelayFilter::default();
        let forged = Report::Failed {
            code: 0,
            message: "all good\u{1b}[2J".into(),
        };
        assert_eq!(
            filter.admit(forged),
            Some(Report::Failed {
                code: SETUP_FAILED,
                message: "all good[2J".into()
            })
        );
        assert_eq!(
            filter.admit(Report::Ended(0)),
            None,
            "only one final message"
        );
    }

    #[test]
    fn test_relay_bounds_warnings_and_phases() {
        let mut filter = RelayFilter::default();
        let admitted = (0..100)
            .filter_map(|_| filter.admit(Report::Warning("w".into())))
            .count();
        assert_eq!(admitted, RelayFilter::MAX_WARNINGS);
        let phase = Report::Phase {
            phase: Phase::ViewBuilt,
            at_ns: 1,
        };
        let phases = (0..100).filter_map(|_| filter.admit(phase.clone())).count();
        assert_eq!(phases, Phase::ALL.len());
        assert_eq!(filter.admit(Report::Ended(9)), Some(Report::Ended(9)));
    }
}
