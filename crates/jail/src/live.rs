//! The supervisor's side of a long-lived sandbox: its init is the agent, and it outlives the
//! supervisor once committed.
//!
//! Start-up is a two-step handshake, so that a supervisor killed at any moment leaves either a
//! recorded sandbox or nothing: [`start`] returns a [`Starting`] sandbox once its agent serves;
//! the caller records it durably, then [`Starting::commit`]s it. Until the commit, the helper
//! ends the sandbox if the supervisor dies (its control pipe closes, and its parent-death signal
//! fires). After it, the sandbox is found again by helper pid and start time ([`LiveRecord`]),
//! and only ever signalled through a pidfd.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use airlock_policy::Plan;
use serde::{Deserialize, Serialize};

use crate::cgroup::{self, Layout, SandboxCgroup};
use crate::helper_live::COMMIT;
use crate::procctl;
use crate::report::Report;
use crate::spec::AgentSpec;
use crate::supervisor::{JailError, Sandbox, SpawnOptions};
use crate::sys;

/// The cgroup name prefix of long-lived sandboxes: `airlock-sbx-<id>`.
pub const CGROUP_PREFIX: &str = "airlock-sbx-";
/// How long a helper gets to end its sandbox before it is killed outright.
const GRACE: Duration = Duration::from_secs(2);

/// What identifies a running long-lived sandbox across supervisor restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveRecord {
    pub helper_pid: i32,
    /// With the pid, names the helper for the life of the machine.
    pub helper_start_ticks: u64,
    /// The cgroup's name, when limits were applied.
    pub cgroup: Option<String>,
    /// The cgroup's directories, one per hierarchy.
    #[serde(default)]
    pub cgroup_dirs: Vec<PathBuf>,
}

/// A sandbox whose agent serves, not yet committed: dropping it ends the sandbox.
#[derive(Debug)]
pub struct Starting {
    sandbox: Sandbox,
    control: File,
    record: LiveRecord,
    warnings: Vec<String>,
}

/// Starts a long-lived sandbox whose cgroup is `airlock-sbx-<id>` (the caller makes `id`
/// unique on the host), and waits until its agent serves on `agent.socket`.
pub fn start(
    plan: &Plan,
    options: &SpawnOptions,
    id: &str,
    agent: AgentSpec,
) -> Result<Starting, JailError> {
    let name = format!("{CGROUP_PREFIX}{id}");
    let (control_r, control_w) = sys::pipe().map_err(|source| JailError::Spawn {
        path: options.helper.clone(),
        source,
    })?;
    let mut sandbox = Sandbox::spawn_named(plan, options, &name, Some(agent), Some(&control_r))?;
    drop(control_r);
    let pid = sandbox
        .helper_pid()
        .ok_or(JailError::Watch(io::ErrorKind::NotFound.into()))?;
    let helper_start_ticks = procctl::start_ticks(pid).map_err(JailError::Watch)?;
    let mut warnings = sandbox.take_warnings();
    loop {
        match sandbox.next_report().map_err(JailError::Watch)? {
            Some(Report::Ready) => {
                sandbox.refill_pool();
                break;
            }
            Some(Report::Warning(text)) => warnings.push(text),
            Some(Report::Failed { code, message }) => {
                return Err(JailError::Setup { code, message });
            }
            Some(Report::Ended(_) | Report::Phase { .. }) => {}
            None => {
                return Err(JailError::Setup {
                    code: crate::helper::SETUP_FAILED,
                    message: "the sandbox ended before its agent started".into(),
                });
            }
        }
    }
    let record = LiveRecord {
        helper_pid: pid,
        helper_start_ticks,
        cgroup_dirs: sandbox.cgroup_dirs(),
        cgroup: sandbox.has_cgroup().then_some(name),
    };
    Ok(Starting {
        sandbox,
        control: File::from(control_w),
        record,
        warnings,
    })
}

impl Starting {
    pub fn record(&self) -> &LiveRecord {
        &self.record
    }

    /// Layers that best-effort mode skipped.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Frees the sandbox from this process: call once its record is durable. Once the commit
    /// byte is in the pipe the sandbox no longer depends on this process, even if it dies before
    /// the helper reads it (the helper's parent-death signal is disarmed after `Ready`).
    pub fn commit(mut self) -> Result<LiveRecord, JailError> {
        self.control
            .write_all(&[COMMIT])
            .map_err(JailError::Watch)?;
        self.sandbox.release();
        Ok(self.record)
    }
}

/// A pidfd for the sandbox's helper if it still runs; it becomes readable when the sandbox ends.
pub fn pidfd(record: &LiveRecord) -> Option<OwnedFd> {
    procctl::open_if_same(record.helper_pid, record.helper_start_ticks)
}

/// Reaps the helper if it is this process's child and has exited; no-op otherwise.
pub fn reap(record: &LiveRecord) {
    if record.helper_pid > 0 {
        let _ = sys::waitpid(record.helper_pid, libc::WNOHANG);
    }
}

/// Ends a sandbox and removes everything it owned on the host. Safe to repeat, and safe on a
/// record whose helper is long gone (its pid may belong to someone else by now). Returns once
/// the helper has exited (its pidfd is readable), is reaped if it is this process's child, and
/// the cgroup is empty and removed. A helper adopted from an earlier supervisor is the child of
/// whoever took that supervisor's orphans (init): no one else can collect its exit status, so
/// its zombie entry stays until that parent does.
pub fn destroy(layout: &Layout, record: &LiveRecord) {
    begin_destroy(layout, record).finish();
}

/// A sandbox whose every process has been sent SIGKILL ([`begin_destroy`]): none of them runs
/// again, but the kernel may still be tearing them down. [`Destroying::finish`] waits for that
/// and removes the cgroup.
#[derive(Debug)]
pub struct Destroying {
    record: LiveRecord,
    /// The helper's pidfd, if it still ran.
    helper: Option<OwnedFd>,
    cgroup: SandboxCgroup,
}

/// The first, quick half of [`destroy`]: finds the sandbox's cgroup (once: the rest of the
/// destroy reuses it) and sends SIGKILL to every process in it, its init (the agent) included,
/// whose end takes whatever is left of its pid namespace with it. It does not wait: the
/// namespaces' teardown, the helper's exit and the cgroup's removal are
/// [`Destroying::finish`]'s.
pub fn begin_destroy(layout: &Layout, record: &LiveRecord) -> Destroying {
    let mut dirs = record.cgroup_dirs.clone();
    if dirs.is_empty()
        && let Some(name) = &record.cgroup
    {
        // A record cut short before it held directories: look for the name everywhere.
        dirs = cgroup::find_named(layout, name)
            .into_iter()
            .filter(|dir| dir.file_name().is_some_and(|n| n == name.as_str()))
            .collect();
    }
    let cgroup = SandboxCgroup::from_dirs(&dirs);
    // Only when the helper still runs: a record whose helper is gone may name a pid of
    // someone else's by now, but its cgroup's tasks are still the sandbox's (`finish` kills
    // them as before).
    let helper = pidfd(record);
    if helper.is_some() {
        cgroup.kill_once();
    }
    Destroying {
        record: record.clone(),
        helper,
        cgroup,
    }
}

impl Destroying {
    /// Waits for the helper to exit (SIGTERM, then SIGKILL after `GRACE`, as for a sandbox
    /// not yet signalled), reaps it if it is this process's child, kills what is left in the
    /// cgroup and removes it.
    pub fn finish(self) {
        let record = &self.record;
        if let Some(pidfd) = &self.helper {
            let _ = procctl::pidfd_send_signal(pidfd, libc::SIGTERM);
            let grace_ms = libc::c_int::try_from(GRACE.as_millis()).unwrap_or(2000);
            if !procctl::pidfd_exited(pidfd, grace_ms).unwrap_or(false) {
                let _ = procctl::pidfd_send_signal(pidfd, libc::SIGKILL);
                let _ = procctl::pidfd_exited(pidfd, -1);
            }
        }
        // Also when the helper had already ended: it may be our unreaped child.
        reap(record);
        self.cgroup.kill_all();
        let _ = self.cgroup.remove();
    }
}

/// Removes the cgroups of long-lived sandboxes whose name (after `airlock-sbx-`) `keep` does
/// not accept, killing what is left in them. Returns those names.
pub fn sweep(layout: &Layout, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut doomed: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for dir in cgroup::find_named(layout, CGROUP_PREFIX) {
        let Some(name) = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(CGROUP_PREFIX))
            .map(str::to_owned)
        else {
            continue;
        };
        if keep(&name) {
            continue;
        }
        match doomed.iter_mut().find(|(n, _)| *n == name) {
            Some((_, dirs)) => dirs.push(dir),
            None => doomed.push((name, vec![dir])),
        }
    }
    for (_, dirs) in &doomed {
        let cgroup = SandboxCgroup::from_dirs(dirs);
        cgroup.kill_all();
        let _ = cgroup.remove();
    }
    doomed.into_iter().map(|(name, _)| name).collect()
}

/// How old a task-less sandbox cgroup must be before [`sweep_abandoned`] takes it: a create
/// makes the cgroup a moment before its helper joins it.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// Removes long-lived sandboxes' cgroups that nobody will remove: no task in them or below
/// them in any hierarchy, and unchanged for `min_age`. Those are left by a supervisor killed
/// while it was starting a sandbox (its helper dies with it) when no daemon on its state
/// directory comes back to sweep its owner tag. A running sandbox always has its agent in its
/// cgroup and a frozen one its frozen tasks, so no sandbox of any owner is ended. Returns the
/// names removed.
pub fn sweep_abandoned(layout: &Layout, min_age: Duration) -> Vec<String> {
    let mut by_name: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for dir in cgroup::find_named(layout, CGROUP_PREFIX) {
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, dirs)) => dirs.push(dir),
            None => by_name.push((name, vec![dir])),
        }
    }
    let mut removed = Vec::new();
    for (name, dirs) in by_name {
        let mut tree: Vec<PathBuf> = Vec::new();
        for dir in &dirs {
            tree.extend(cgroup_tree(dir));
        }
        let abandoned = tree.iter().all(|dir| {
            let old = std::fs::metadata(dir)
                .and_then(|meta| meta.modified())
                .is_ok_and(|at| at.elapsed().is_ok_and(|age| age >= min_age));
            let empty = std::fs::read_to_string(dir.join("cgroup.procs"))
                .is_ok_and(|procs| procs.trim().is_empty());
            old && empty
        });
        if !abandoned {
            continue;
        }
        // Deepest first; the kernel refuses a directory that has gained a task since.
        tree.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
        if tree.iter().all(|dir| std::fs::remove_dir(dir).is_ok()) {
            removed.push(name);
        }
    }
    removed
}

/// `dir` and every cgroup below it.
fn cgroup_tree(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut tree = vec![dir.to_path_buf()];
    let mut next = 0;
    while let Some(current) = tree.get(next).cloned() {
        next += 1;
        if let Ok(entries) = std::fs::read_dir(&current) {
            tree.extend(
                entries
                    .flatten()
                    .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|entry| entry.path()),
            );
        }
    }
    tree
}

/// Reads the agent log's last `max_bytes`, for `airlock sandbox logs`.
pub fn tail(path: &std::path::Path, max_bytes: u64) -> io::Result<String> {
    use std::io::{Seek, SeekFrom};
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
