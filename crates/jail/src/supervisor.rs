//! The caller's side of a sandbox: spawn the helper, watch it, enforce the deadline, clean up.
//!
//! Cleanup is layered so that nothing outlives the sandbox however it ends: killing the helper
//! kills init (parent-death signal), and init's end makes the kernel kill every process in the
//! sandbox's pid namespace; a dead supervisor takes the helper along the same way; the cgroup is
//! emptied and removed; and the sandbox's namespaces, mounts and tmpfs disappear with its last
//! process. No file is created on the host.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use airlock_api::Compat;
use airlock_policy::Plan;

use crate::cgroup::{self, CgroupError, Layout, SandboxCgroup};
use crate::report::{CONTROL_FD, HOLD_FD, Phase, REPORT_FD, Report, SPEC_FD, TEMPLATE_FD};
use crate::seccomp;
use crate::spec::{self, AgentSpec, HelperSpec, LateSpec, NetworkSource};
use crate::sys;

/// What can go wrong on the supervisor's side.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error(
        "cannot find the airlock-jail helper next to {0} (build it with scripts/sandbox-binaries.sh, or set AIRLOCK_JAIL_BIN)"
    )]
    HelperNotFound(PathBuf),
    #[error("cgroup limits cannot be applied (--compat best-effort runs without them)")]
    Cgroup(#[source] CgroupError),
    #[error("cannot start the helper {path}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the seccomp rules cannot be compiled")]
    Seccomp(#[source] seccomp::SeccompError),
    #[error("sending the spec to the helper failed")]
    SendSpec(#[source] io::Error),
    #[error("the sandbox's cgroup could not be removed")]
    Cleanup(#[source] CgroupError),
    #[error("watching the sandbox failed")]
    Watch(#[source] io::Error),
    #[error("{message}")]
    Setup { code: i32, message: String },
}

/// Locates `airlock-jail`: `$AIRLOCK_JAIL_BIN`, else next to the running executable or one
/// directory up (where cargo puts binaries relative to test executables).
pub fn find_helper() -> Result<PathBuf, JailError> {
    if let Some(path) = std::env::var_os("AIRLOCK_JAIL_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(current) = dir else { break };
        let candidate = current.join("airlock-jail");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = current.parent();
    }
    Err(JailError::HelperNotFound(exe))
}

/// SIGINT, SIGTERM and SIGHUP, blocked in the calling thread and delivered through a
/// descriptor so that the wait loop can tear the sandbox down before exiting.
#[derive(Debug)]
pub struct TerminationSignals {
    fd: OwnedFd,
}

impl TerminationSignals {
    const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    /// Call before spawning any sandbox, from a single-threaded program (the CLI).
    pub fn install() -> io::Result<TerminationSignals> {
        sys::block_signals(&Self::SIGNALS)?;
        Ok(TerminationSignals {
            fd: sys::signalfd(&Self::SIGNALS)?,
        })
    }
}

/// How a sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The workload exited with this code.
    Exited(i32),
    /// A signal killed the workload.
    Signaled(i32),
    /// The sandbox could not be set up; `code` is 125, 126 or 127.
    SetupFailed { code: i32, message: String },
    /// The wall-clock limit passed and the sandbox was killed.
    TimedOut,
    /// The supervisor received this signal and tore the sandbox down.
    Interrupted(i32),
}

/// How a sandbox ended, and whether its memory limit was hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub ending: Ending,
    pub oom_killed: bool,
    /// When each phase finished (`CLOCK_MONOTONIC` ns), if [`SpawnOptions::trace`] was set.
    pub phases: Vec<(Phase, u64)>,
}

impl Outcome {
    /// The exit code a shell-like caller reports: the workload's, 128+N for signal N, 124 for a
    /// timeout, and the setup code for a sandbox that never started.
    pub fn exit_code(&self) -> i32 {
        match &self.ending {
            Ending::Exited(code) => *code,
            Ending::Signaled(signal) | Ending::Interrupted(signal) => 128 + signal,
            Ending::SetupFailed { code, .. } => *code,
            Ending::TimedOut => 124,
        }
    }
}

/// Everything the supervisor needs besides the plan.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    pub helper: PathBuf,
    pub cgroups: Layout,
    /// Time each phase of the sandbox's life ([`Outcome::phases`]).
    pub trace: bool,
    /// Security evaluation only (`airlock seceval`); the default changes nothing.
    pub evaluation: crate::spec::Evaluation,
    /// A descriptor the helper holds as [`HOLD_FD`] for the sandbox's whole life (the lock
    /// of its host id range), so that what it locks outlives this process if the sandbox
    /// does.
    pub hold: Option<std::sync::Arc<OwnedFd>>,
    /// The workload's standard input, output and error instead of this process's own (a
    /// caller that collects a command's output, such as a template build's `RUN`).
    pub stdio: Option<std::sync::Arc<Stdio>>,
    /// Fork helpers from this zygote instead of exec'ing `helper` (long-lived runtimes).
    pub zygote: Option<std::sync::Arc<crate::zygote::Zygote>>,
}

/// Descriptors that become a sandbox's fds 0, 1 and 2 (the helper and init pass them on to
/// the workload).
#[derive(Debug)]
pub struct Stdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// A running sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// The helper's pid until it has been reaped.
    helper: Option<libc::pid_t>,
    /// When [`Sandbox::kill`] asked the helper to end the sandbox.
    killed_at: Option<Instant>,
    /// Phase times, when tracing.
    trace: Option<Vec<(Phase, u64)>>,
    report: Option<ReportReader>,
    cgroup: Option<SandboxCgroup>,
    warnings: Vec<String>,
    /// The zygote whose pool gave this sandbox its network namespace, until it is asked for a
    /// replacement ([`Sandbox::refill_pool`]).
    owed_refill: Option<std::sync::Arc<crate::zygote::Zygote>>,
}

static SANDBOX_COUNTER: AtomicU64 = AtomicU64::new(0);

/// How long the helper gets to end a sandbox cleanly before it is killed outright.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl Sandbox {
    /// Starts the helper and hands it its spec, then creates the cgroup while the helper execs
    /// and opens its host descriptors, then hands it the cgroup. The helper joins the cgroup
    /// before it creates any other process, so no process of the sandbox ever runs outside it.
    pub fn spawn(plan: &Plan, options: &SpawnOptions) -> Result<Sandbox, JailError> {
        let name = format!(
            "{}{}-{}",
            cgroup::NAME_PREFIX,
            std::process::id(),
            SANDBOX_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        Sandbox::spawn_named(plan, options, &name, None, None)
    }

    /// [`Sandbox::spawn`] with a chosen cgroup name, and for a long-lived sandbox its agent and
    /// the control pipe the helper receives as [`CONTROL_FD`].
    pub(crate) fn spawn_named(
        plan: &Plan,
        options: &SpawnOptions,
        name: &str,
        agent: Option<AgentSpec>,
        control: Option<&OwnedFd>,
    ) -> Result<Sandbox, JailError> {
        let started = sys::monotonic_ns();
        // Compiled before anything is started: rules the jail cannot compile fail the spawn
        // with nothing to clean up.
        let seccomp = seccomp::compile_tagged(&plan.seccomp, options.evaluation.seccomp_tag)
            .map_err(JailError::Seccomp)?;
        let spawn_err = |source| JailError::Spawn {
            path: options.helper.clone(),
            source,
        };
        let (spec_r, spec_w) = sys::pipe().map_err(spawn_err)?;
        let (report_r, report_w) = sys::pipe().map_err(spawn_err)?;
        // Above the target numbers, so that installing one cannot clobber the other.
        let spec_r = sys::dup_above(&spec_r, SPEC_FD + 8).map_err(spawn_err)?;
        let report_w = sys::dup_above(&report_w, SPEC_FD + 8).map_err(spawn_err)?;
        let control = control
            .map(|fd| sys::dup_above(fd, SPEC_FD + 8))
            .transpose()
            .map_err(spawn_err)?;
        let mut fds = vec![
            (spec_r.as_raw_fd(), SPEC_FD),
            (report_w.as_raw_fd(), REPORT_FD),
        ];
        fds.extend(control.as_ref().map(|fd| (fd.as_raw_fd(), CONTROL_FD)));
        let hold = options
            .hold
            .as_deref()
            .map(|fd| sys::dup_above(fd, SPEC_FD + 8))
            .transpose()
            .map_err(spawn_err)?;
        fds.extend(hold.as_ref().map(|fd| (fd.as_raw_fd(), HOLD_FD)));
        let stdio = options
            .stdio
            .as_deref()
            .map(|stdio| {
                [&stdio.stdin, &stdio.stdout, &stdio.stderr]
                    .map(|fd| sys::dup_above(fd, SPEC_FD + 8))
            })
            .map(|fds| fds.into_iter().collect::<io::Result<Vec<_>>>())
            .transpose()
            .map_err(spawn_err)?;
        if let Some(stdio) = &stdio {
            fds.extend(
                stdio
                    .iter()
                    .zip(0..)
                    .map(|(fd, target)| (fd.as_raw_fd(), target)),
            );
        }
        // The zygote installs only the helper's own descriptors: a caller's stdio is exec'd.
        let zygote = options.zygote.as_ref().filter(|_| stdio.is_none());
        let template = zygote
            .and_then(|zygote| zygote.view_templates().for_plan(plan, agent.as_ref()))
            .map(|template| sys::dup_above(template.root(), SPEC_FD + 8))
            .transpose()
            .map_err(spawn_err)?;
        fds.extend(template.as_ref().map(|fd| (fd.as_raw_fd(), TEMPLATE_FD)));
        // A zygote's sandboxes that keep no capability get a network namespace the host owns:
        // from its pool, else made by the helper (`network_pool`).
        let host_network = zygote.is_some() && crate::network_pool::eligible(plan, agent.as_ref());
        // A forked helper runs at once: the spec goes first, when the pipe holds it, so that the
        // helper need not wait for this thread to be scheduled again. An exec'd one takes longer
        // to start than the spec takes to write, so it is written after the spawn. Then the
        // helper opens its host descriptors while the cgroup is made, and waits for the cgroup
        // before it creates any process.
        let view_template = template.is_some();
        let encode_spec = || {
            spec::encode_spec(&HelperSpec {
                plan: Plan {
                    seccomp: Vec::new(),
                    ..plan.clone()
                },
                seccomp: seccomp.iter().map(|insn| insn.to_word()).collect(),
                supervisor_pid: sys::getpid(),
                trace: options.trace,
                agent: agent.clone(),
                evaluation: options.evaluation,
                view_template,
            })
            .map_err(|e| JailError::SendSpec(e.into()))
        };
        let mut spec_w = File::from(spec_w);
        let mut unwritten = None;
        if zygote.is_some() {
            let bytes = encode_spec()?;
            if sys::pipe_capacity(&spec_w).is_ok_and(|room| bytes.len() <= room) {
                spec_w.write_all(&bytes).map_err(JailError::SendSpec)?;
            } else {
                unwritten = Some(bytes);
            }
        }
        let written_ahead = zygote.is_some() && unwritten.is_none();
        // The cgroup is made after the fork, not while the zygote forks: measured, making it
        // meanwhile kept the CPU from the new helper and slowed creates by about 0.2 ms here.
        let (pid, pooled) = match zygote {
            Some(zygote) => match zygote.spawn(&fds, host_network) {
                Ok(spawned) => spawned,
                // A zygote that died (killed from outside) costs speed, not sandboxes.
                Err(err)
                    if err.raw_os_error() == Some(libc::EPIPE)
                        || err.kind() == io::ErrorKind::BrokenPipe
                        || err.kind() == io::ErrorKind::ConnectionReset =>
                {
                    (sys::spawn(&options.helper, &fds).map_err(spawn_err)?, false)
                }
                Err(err) => return Err(spawn_err(err)),
            },
            None => (sys::spawn(&options.helper, &fds).map_err(spawn_err)?, false),
        };
        let network = match (host_network, pooled) {
            (true, true) => NetworkSource::Pooled,
            (true, false) => NetworkSource::Helper,
            (false, _) => NetworkSource::Init,
        };
        drop(control);
        drop(hold);
        drop(stdio);
        drop(template);
        drop((spec_r, report_w));
        let mut sandbox = Sandbox {
            helper: Some(pid),
            killed_at: None,
            trace: options.trace.then(|| vec![(Phase::Start, started)]),
            report: Some(ReportReader {
                file: File::from(report_r),
                pending: Vec::new(),
                messages: std::collections::VecDeque::new(),
            }),
            cgroup: None,
            warnings: Vec::new(),
            owed_refill: zygote.filter(|_| pooled).cloned(),
        };
        sandbox.mark(Phase::HelperSpawned);
        if !written_ahead {
            let bytes = match unwritten.take() {
                Some(bytes) => bytes,
                None => encode_spec()?,
            };
            spec_w.write_all(&bytes).map_err(JailError::SendSpec)?;
        }
        match SandboxCgroup::create(&options.cgroups, name, &plan.cgroup) {
            Ok(cgroup) => sandbox.cgroup = Some(cgroup),
            Err(err) if plan.compat == Compat::BestEffort => sandbox.warnings.push(format!(
                "not enforced: cgroup limits (memory, pids, cpu): {}",
                crate::error_chain(&err)
            )),
            // Dropping the sandbox kills and reaps the helper.
            Err(err) => return Err(JailError::Cgroup(err)),
        }
        sandbox.mark(Phase::CgroupCreated);
        let late = sandbox
            .cgroup
            .as_ref()
            .map(|cgroup| LateSpec {
                join: cgroup.join_files(),
                leave: cgroup.leave_files().to_vec(),
                workload: cgroup.workload_files(),
                network,
            })
            .unwrap_or(LateSpec {
                network,
                ..LateSpec::default()
            });
        let bytes = serde_json::to_vec(&late).map_err(|e| JailError::SendSpec(e.into()))?;
        spec_w.write_all(&bytes).map_err(JailError::SendSpec)?;
        drop(spec_w);
        // Cgroups of Airlock processes killed with -9 are collected once per process, while the
        // helper is still busy starting.
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            cgroup::sweep_stale(&options.cgroups);
            crate::live::sweep_abandoned(&options.cgroups, crate::live::ABANDONED_AFTER);
        });
        Ok(sandbox)
    }

    /// Ends the sandbox: SIGTERM asks the helper to kill init (whose end takes the whole pid
    /// namespace along) and to reap it, so that not even a zombie remains. Only the helper is
    /// signalled by pid: it is our unreaped child, so its pid cannot have been reused. If the
    /// helper has not finished within `GRACE`, `Sandbox::kill_hard` follows.
    pub fn kill(&mut self) {
        if let Some(pid) = self.helper {
            let _ = sys::kill(pid, libc::SIGTERM);
            self.killed_at.get_or_insert_with(Instant::now);
        }
    }

    pub(crate) fn helper_pid(&self) -> Option<libc::pid_t> {
        self.helper
    }

    pub(crate) fn has_cgroup(&self) -> bool {
        self.cgroup.is_some()
    }

    pub(crate) fn cgroup_dirs(&self) -> Vec<PathBuf> {
        self.cgroup
            .as_ref()
            .map(SandboxCgroup::dirs)
            .unwrap_or_default()
    }

    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// The next report from the helper, blocking; `None` once it closed the channel.
    pub(crate) fn next_report(&mut self) -> io::Result<Option<Report>> {
        match &mut self.report {
            Some(reader) => reader.next(),
            None => Ok(None),
        }
    }

    /// Asks the pool that gave this sandbox its network namespace for another one: once the
    /// sandbox has started (a long-lived one's agent serves), or when it ends.
    pub(crate) fn refill_pool(&mut self) {
        if let Some(zygote) = self.owed_refill.take() {
            zygote.refill();
        }
    }

    /// Lets the sandbox go on without this handle: nothing is ended, killed or removed.
    pub(crate) fn release(&mut self) {
        self.refill_pool();
        self.helper = None;
        self.cgroup = None;
        self.report = None;
    }

    fn mark(&mut self, phase: Phase) {
        if let Some(trace) = &mut self.trace {
            trace.push((phase, sys::monotonic_ns()));
        }
    }

    /// SIGKILLs the helper (init follows by its parent-death signal) and everything left in the
    /// cgroup.
    fn kill_hard(&mut self) {
        if let Some(pid) = self.helper {
            let _ = sys::kill(pid, libc::SIGKILL);
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
    }

    /// Waits for the sandbox to end, killing it at `deadline` or when a termination signal
    /// arrives. `on_warning` receives every layer that best-effort mode skipped, as it happens.
    pub fn wait(
        mut self,
        deadline: Option<Instant>,
        signals: Option<&TerminationSignals>,
        mut on_warning: impl FnMut(&str),
    ) -> Result<Outcome, JailError> {
        for warning in self.warnings.drain(..) {
            on_warning(&warning);
        }
        let mut reader = self
            .report
            .take()
            .ok_or_else(|| JailError::Watch(io::ErrorKind::NotConnected.into()))?;
        let mut fds = vec![reader.file.as_raw_fd()];
        if let Some(signals) = signals {
            fds.push(signals.fd.as_raw_fd());
        }
        let (mut status, mut failure, mut forced): (
            Option<libc::c_int>,
            Option<(i32, String)>,
            Option<Ending>,
        ) = (None, None, None);
        let mut deadline = deadline;
        loop {
            let grace_end = self.killed_at.map(|at| at + GRACE);
            let wake = [deadline, grace_end].into_iter().flatten().min();
            let timeout_ms = match wake {
                Some(at) => libc::c_int::try_from(
                    at.saturating_duration_since(Instant::now())
                        .as_millis()
                        .saturating_add(1),
                )
                .unwrap_or(libc::c_int::MAX),
                None => -1,
            };
            if grace_end.is_some_and(|end| Instant::now() >= end) {
                // The helper did not end the sandbox in time; SIGKILL makes its pipe close.
                self.kill_hard();
                self.killed_at = None;
            }
            let ready = sys::poll_readable(&fds, timeout_ms).map_err(JailError::Watch)?;
            if ready.get(1).copied().unwrap_or(false)
                && let Some(signals) = signals
            {
                let signal = sys::read_signal(&signals.fd).map_err(JailError::Watch)?;
                forced.get_or_insert(Ending::Interrupted(signal));
                self.kill();
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                forced.get_or_insert(Ending::TimedOut);
                deadline = None;
                self.kill();
            }
            if !ready.first().copied().unwrap_or(false) {
                continue;
            }
            let (messages, open) = reader.read().map_err(JailError::Watch)?;
            for message in messages {
                match message {
                    Report::Warning(text) => on_warning(&text),
                    Report::Failed { code, message } => failure = Some((code, message)),
                    Report::Ended(raw) => status = Some(raw),
                    // Only long-lived sandboxes report readiness; `live` consumes it.
                    Report::Ready => {}
                    Report::Phase { phase, at_ns } => {
                        if let Some(trace) = &mut self.trace {
                            trace.push((phase, at_ns));
                        }
                    }
                }
            }
            if !open {
                break;
            }
        }
        self.mark(Phase::SandboxGone);
        let helper_status = self.helper.take().map(|pid| sys::waitpid(pid, 0));
        // Only a SIGKILL, or no status at all, can be the OOM killer's work.
        let maybe_oom =
            status.is_none_or(|raw| libc::WIFSIGNALED(raw) && libc::WTERMSIG(raw) == libc::SIGKILL);
        let oom_killed = maybe_oom && self.cgroup.as_ref().is_some_and(SandboxCgroup::oom_killed);
        self.cleanup().map_err(JailError::Cleanup)?;
        let reported = Reported {
            forced,
            failure,
            status,
        };
        let ending = reported.ending(helper_status, oom_killed);
        self.mark(Phase::CleanedUp);
        let mut phases = self.trace.take().unwrap_or_default();
        phases.sort_by_key(|&(phase, _)| phase);
        Ok(Outcome {
            ending,
            oom_killed,
            phases,
        })
    }

    /// Reaps the helper (ending the sandbox first if it still runs) and removes the cgroup.
    fn cleanup(&mut self) -> Result<(), CgroupError> {
        self.refill_pool();
        if let Some(pid) = self.helper.take() {
            let give_up = Instant::now() + GRACE;
            let _ = sys::kill(pid, libc::SIGTERM);
            while matches!(sys::waitpid(pid, libc::WNOHANG), Ok((0, _))) {
                if Instant::now() >= give_up {
                    let _ = sys::kill(pid, libc::SIGKILL);
                    let _ = sys::waitpid(pid, 0);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let Some(cgroup) = self.cgroup.take() else {
            return Ok(());
        };
        cgroup.remove()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.cleanup();
    }
}

/// What the wait loop learned about how the sandbox ended.
struct Reported {
    /// Set when the supervisor ended the sandbox itself (deadline or signal).
    forced: Option<Ending>,
    failure: Option<(i32, String)>,
    /// The workload's raw wait status.
    status: Option<libc::c_int>,
}

impl Reported {
    fn ending(
        self,
        helper: Option<io::Result<(libc::pid_t, libc::c_int)>>,
        oom_killed: bool,
    ) -> Ending {
        match (self.forced, self.failure, self.status) {
            (Some(forced), _, _) => forced,
            (None, Some((code, message)), _) => Ending::SetupFailed { code, message },
            (None, None, Some(raw)) if libc::WIFSIGNALED(raw) => {
                Ending::Signaled(libc::WTERMSIG(raw))
            }
            (None, None, Some(raw)) => Ending::Exited(libc::WEXITSTATUS(raw)),
            // The OOM killer may pick init instead of the workload: the sandbox died of its
            // memory limit all the same.
            (None, None, None) if oom_killed => Ending::Signaled(libc::SIGKILL),
            (None, None, None) => {
                let message = {
                    let detail = match helper {
                        Some(Ok((_, raw))) if libc::WIFSIGNALED(raw) => {
                            format!("killed by signal {}", libc::WTERMSIG(raw))
                        }
                        Some(Ok((_, raw))) => format!("exit status {}", libc::WEXITSTATUS(raw)),
                        Some(Err(err)) => err.to_string(),
                        None => "unknown".into(),
                    };
                    format!(
                        "the sandbox ended without reporting its workload's status (helper: {detail})"
                    )
                };
                Ending::SetupFailed {
                    code: crate::helper::SETUP_FAILED,
                    message,
                }
            }
        }
    }
}

/// Splits the report stream into messages.
#[derive(Debug)]
struct ReportReader {
    file: File,
    pending: Vec<u8>,
    /// Messages read ahead by [`ReportReader::next`].
    messages: std::collections::VecDeque<Report>,
}

impl ReportReader {
    /// Reads what is available; returns the complete messages and whether the channel is open.
    fn read(&mut self) -> io::Result<(Vec<Report>, bool)> {
        if !self.messages.is_empty() {
            return Ok((self.messages.drain(..).collect(), true));
        }
        let mut buf = [0u8; 4096];
        let n = match self.file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok((Vec::new(), true)),
            Err(e) => return Err(e),
        };
        self.pending.extend_from_slice(&buf[..n]);
        let mut messages = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            if let Some(report) = Report::decode(String::from_utf8_lossy(&line[..end]).as_ref()) {
                messages.push(report);
            }
        }
        Ok((messages, n > 0))
    }

    /// The next message, blocking; `None` once the channel is closed.
    fn next(&mut self) -> io::Result<Option<Report>> {
        loop {
            if let Some(message) = self.messages.pop_front() {
                return Ok(Some(message));
            }
            let (messages, open) = self.read()?;
            self.messages.extend(messages);
            if !open && self.messages.is_empty() {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(
        forced: Option<Ending>,
        failure: Option<(i32, String)>,
        status: Option<i32>,
    ) -> Reported {
        Reported {
            forced,
            failure,
            status,
        }
    }

    #[test]
    fn test_ending_prefers_what_the_supervisor_forced() {
        let ending = reported(Some(Ending::TimedOut), None, Some(0)).ending(None, false);
        assert_eq!(ending, Ending::TimedOut);
    }

    #[test]
    fn test_ending_decodes_wait_status() {
        assert_eq!(
            reported(None, None, Some(42 << 8)).ending(None, false),
            Ending::Exited(42)
        );
        assert_eq!(
            reported(None, None, Some(libc::SIGSEGV)).ending(None, false),
            Ending::Signaled(11)
        );
        let failed =
            reported(None, Some((127, "x: command not found".into())), None).ending(None, false);
        assert_eq!(
            failed,
            Ending::SetupFailed {
                code: 127,
                message: "x: command not found".into()
            }
        );
    }

    #[test]
    fn test_ending_without_a_report_is_a_setup_failure() {
        let ending = reported(None, None, None).ending(Some(Ok((1, libc::SIGKILL))), false);
        let Ending::SetupFailed { code, message } = ending else {
            panic!("{ending:?}")
        };
        assert_eq!(code, 125);
        assert!(message.contains("killed by signal 9"), "{message}");
        let oom = reported(None, None, None).ending(None, true);
        assert_eq!(
            oom,
            Ending::Signaled(libc::SIGKILL),
            "init, not the workload, was the victim"
        );
    }

    #[test]
    fn test_rules_the_jail_cannot_compile_fail_the_spawn_before_any_helper_starts() {
        let host = airlock_policy::HostFacts {
            caller_uid: 0,
            caller_gid: 0,
            state_dirs: vec![],
        };
        let mut plan =
            airlock_policy::compile(&airlock_api::SandboxConfig::new(vec!["true".into()]), &host)
                .unwrap();
        plan.seccomp.push(airlock_policy::SeccompRule {
            syscall: "frobnicate".into(),
            checks: vec![],
            action: airlock_policy::SyscallAction::Eperm,
            why: "test".into(),
        });
        let options = SpawnOptions {
            // Starting this would fail with `JailError::Spawn`.
            helper: PathBuf::from("/nonexistent/airlock-jail"),
            cgroups: Layout::default(),
            trace: false,
            evaluation: crate::spec::Evaluation::default(),
            hold: None,
            stdio: None,
            zygote: None,
        };
        let err = Sandbox::spawn(&plan, &options).unwrap_err();
        assert!(
            matches!(&err, JailError::Seccomp(seccomp::SeccompError::UnknownSyscall(name)) if name == "frobnicate"),
            "{err:?}"
        );
    }

    #[test]
    fn test_exit_codes_follow_shell_conventions() {
        let code = |ending| {
            Outcome {
                ending,
                oom_killed: false,
                phases: Vec::new(),
            }
            .exit_code()
        };
        assert_eq!(code(Ending::Exited(3)), 3);
        assert_eq!(code(Ending::Signaled(9)), 137);
        assert_eq!(code(Ending::Interrupted(2)), 130);
        assert_eq!(code(Ending::Interrupted(15)), 143);
        assert_eq!(code(Ending::TimedOut), 124);
        assert_eq!(
            code(Ending::SetupFailed {
                code: 127,
                message: String::new()
            }),
            127
        );
    }
}
