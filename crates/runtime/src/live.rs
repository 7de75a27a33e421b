//! Long-lived sandboxes: the agent runs as the sandbox's pid 1, and the sandbox outlives the
//! process that created it once committed. The daemon builds on this.

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use airlock_api::SandboxConfig;
use airlock_jail::live::{self, LiveRecord, Starting};
use airlock_jail::spec::{AGENT_LISTEN_FD, AGENT_PATH, AgentSpec};
use serde::{Deserialize, Serialize};

use crate::storage::{Storage, VolumeOwners, VolumeSource};
use crate::{Backend, IdRange, Runtime, RuntimeError};

/// What the caller asks for.
#[derive(Debug, Clone)]
pub struct LiveSpec {
    /// Lower-case letters and digits, at most 32: it names the cgroup.
    pub id: String,
    /// A private (0700) host directory the caller created; the agent's socket and log go here.
    pub dir: PathBuf,
    /// The sandbox's settings. The command is ignored (the agent runs), and so is the timeout:
    /// the caller owns a long-lived sandbox's lifetime.
    pub config: SandboxConfig,
    /// What its scratch volume starts with (disk scratch only; see [`VolumeSource`]).
    pub volume: VolumeSource,
    /// A microvm sandbox whose directory holds a paused VM (a fork's copy of a snapshot):
    /// started as a pre-created VM shell, which [`Pending::restore_in_shell`] restores
    /// ([`crate::microvm::shell`]). Its agent serves only then.
    pub vm_shell: bool,
}

/// Everything needed to find, reach and end a running long-lived sandbox: store it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSandbox {
    pub id: String,
    /// The agent's Unix socket on the host.
    pub socket: PathBuf,
    pub helper_pid: i32,
    pub helper_start_ticks: u64,
    pub cgroup: Option<String>,
    /// The cgroup's directories, so that a process elsewhere in the hierarchy finds them.
    #[serde(default)]
    pub cgroup_dirs: Vec<PathBuf>,
    pub dir: PathBuf,
    /// The first host id of the sandbox's own id range (a root caller's sandbox). Its
    /// helper holds the range's lock, so a restarted daemon that re-adopts the sandbox finds
    /// it still taken, and no new sandbox gets it while this one lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_range: Option<u32>,
}

impl LiveSandbox {
    fn jail_record(&self) -> LiveRecord {
        LiveRecord {
            helper_pid: self.helper_pid,
            helper_start_ticks: self.helper_start_ticks,
            cgroup: self.cgroup.clone(),
            cgroup_dirs: self.cgroup_dirs.clone(),
        }
    }

    /// A descriptor that becomes readable when the sandbox has ended.
    pub fn pidfd(&self) -> io::Result<OwnedFd> {
        live::pidfd(&self.jail_record()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the sandbox is no longer running")
        })
    }

    /// The sandbox's cgroup (its OOM count and watch among what it offers), found from the
    /// recorded directories: a few `stat`s of cgroup files per directory, so a caller that
    /// asks often keeps it.
    pub fn cgroup(&self) -> airlock_jail::cgroup::SandboxCgroup {
        airlock_jail::cgroup::SandboxCgroup::from_dirs(&self.cgroup_dirs)
    }

    /// The sandbox's freezer, when its cgroup has one.
    /// The processes in the sandbox's cgroup (its leaves included).
    pub fn pids(&self) -> Vec<u32> {
        airlock_jail::cgroup::SandboxCgroup::from_dirs(&self.cgroup_dirs)
            .pids()
            .into_iter()
            .filter_map(|pid| u32::try_from(pid).ok())
            .collect()
    }

    fn freezer(&self) -> Option<airlock_jail::freezer::Freezer> {
        airlock_jail::cgroup::SandboxCgroup::from_dirs(&self.cgroup_dirs).freezer()
    }

    /// Freezes every process of the sandbox (a pause that keeps memory, descriptors and
    /// sockets); returns once all are frozen.
    pub fn freeze(&self) -> io::Result<()> {
        self.freezer()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "the sandbox has no freezer")
            })?
            .freeze()
    }

    /// Thaws the sandbox's processes; a no-op when they are not frozen.
    pub fn thaw(&self) -> io::Result<()> {
        self.freezer()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "the sandbox has no freezer")
            })?
            .thaw()
    }

    /// Whether a freeze of the sandbox was asked for (and not undone).
    pub fn is_frozen(&self) -> bool {
        self.freezer()
            .is_some_and(|freezer| freezer.is_freezing().unwrap_or(false))
    }

    /// Reaps the sandbox's helper if it is this process's child and has ended.
    pub fn reap(&self) {
        live::reap(&self.jail_record());
    }

    /// The agent's log, its last `max_bytes`.
    pub fn agent_log(&self, max_bytes: u64) -> io::Result<String> {
        live::tail(&self.dir.join(AGENT_LOG), max_bytes)
    }
}

/// A sandbox being destroyed: its processes are killed, their teardown and the removal of what
/// it owned are still to come ([`Runtime::finish_destroy`]).
#[derive(Debug)]
pub struct Destroying {
    id: String,
    dir: PathBuf,
    jail: live::Destroying,
}

const AGENT_SOCKET: &str = "agent.sock";
/// A guard against a VMM that never ends after a snapshot request, not a performance bound:
/// under nested emulation writing a guest's memory takes a while.
const VM_SAVE_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);
const AGENT_LOG: &str = "agent.log";

/// What a long-lived sandbox's memory limit holds beyond the workload's own: the agent, which
/// stays outside the workload's cgroup (`Plan::isolate_workload_memory`).
pub const AGENT_RESERVE_BYTES: u64 = 64 << 20;

/// A sandbox whose agent serves, not yet committed: dropping it ends the sandbox (and then
/// removes its volume).
#[derive(Debug)]
pub struct Pending {
    starting: Starting,
    volume: Option<VolumeGuard>,
    record: LiveSandbox,
    /// A VM shell's guest, until it is restored.
    shell: Option<crate::microvm::shell::GuestStart>,
}

/// A scratch volume that is removed when dropped, until its sandbox is committed.
#[derive(Debug)]
struct VolumeGuard {
    storage: std::sync::Arc<Storage>,
    id: String,
    armed: bool,
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        if self.armed {
            self.storage.remove_volume(&self.id);
        }
    }
}

impl Pending {
    pub fn record(&self) -> &LiveSandbox {
        &self.record
    }

    /// Layers that best-effort mode skipped.
    pub fn warnings(&self) -> &[String] {
        self.starting.warnings()
    }

    /// Whether the sandbox is a VM shell still to restore.
    pub fn is_vm_shell(&self) -> bool {
        self.shell.is_some()
    }

    /// Restores a VM shell's guest (a [`LiveSpec::vm_shell`] start) and returns once its
    /// agent serves, with the time the VMM took to restore. Blocking.
    pub fn restore_in_shell(&mut self) -> Result<std::time::Duration, RuntimeError> {
        let guest = self
            .shell
            .as_ref()
            .ok_or(crate::microvm::shell::ShellError::NotRestored)?;
        let took = guest.restore_in_shell()?;
        self.shell = None;
        Ok(took)
    }

    /// Lets the sandbox outlive this process. Call once its record is durable (and a VM
    /// shell restored).
    pub fn commit(self) -> Result<LiveSandbox, RuntimeError> {
        if self.shell.is_some() {
            return Err(crate::microvm::shell::ShellError::NotRestored.into());
        }
        let Pending {
            starting,
            volume,
            record,
            ..
        } = self;
        let mut volume = volume;
        starting.commit()?;
        // Committed: the volume is the sandbox's now, and goes with `Runtime::destroy`.
        if let Some(volume) = volume.as_mut() {
            volume.armed = false;
        }
        Ok(record)
    }
}

/// 1 to `max` lower-case letters and digits: safe in a cgroup name, with `-` left as separator.
fn is_name(text: &str, max: usize) -> bool {
    !text.is_empty()
        && text.len() <= max
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Why an id cannot name a sandbox.
pub(crate) fn check_id(id: &str) -> Result<(), RuntimeError> {
    if is_name(id, 32) {
        Ok(())
    } else {
        Err(RuntimeError::BadSandboxId(id.to_owned()))
    }
}

/// The host ids that own a volume's `tmp/` (the sandbox's root) and `workspace/` (the
/// workload's user), through the sandbox's id maps.
pub(crate) fn volume_owners(identity: &airlock_policy::IdentityPlan, upper: bool) -> VolumeOwners {
    // A root caller's sandboxes see their volume through a mount idmapped with their user
    // namespace, so it keeps their own ids (0 is the sandbox's root) in whichever host range
    // they run: a resume, a snapshot or a fork in another range finds the files theirs. An
    // unprivileged caller's single id is its own on both sides.
    let (root, workload) = if identity.privileged_caller {
        ((0, 0), (identity.uid, identity.gid))
    } else {
        let outside = |maps: &[airlock_policy::IdMap], inside: u32| {
            maps.iter()
                .find(|m| inside >= m.inside && inside - m.inside < m.count)
                .map_or(inside, |m| m.outside + (inside - m.inside))
        };
        (
            (outside(&identity.uid_map, 0), outside(&identity.gid_map, 0)),
            (
                outside(&identity.uid_map, identity.uid),
                outside(&identity.gid_map, identity.gid),
            ),
        )
    };
    let host_root = |maps: &[airlock_policy::IdMap]| {
        maps.iter().find(|m| m.inside == 0).map_or(0, |m| m.outside)
    };
    VolumeOwners {
        root,
        workload,
        upper: upper.then(|| (host_root(&identity.uid_map), host_root(&identity.gid_map))),
    }
}

/// Locates `airlock-agent`: `$AIRLOCK_AGENT_BIN`, else beside the helper.
pub fn find_agent(helper: &Path) -> Result<PathBuf, RuntimeError> {
    if let Some(path) = std::env::var_os("AIRLOCK_AGENT_BIN") {
        return Ok(PathBuf::from(path));
    }
    let candidate = helper.with_file_name("airlock-agent");
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(RuntimeError::AgentNotFound(candidate))
    }
}

impl Runtime {
    /// Starts a long-lived sandbox and returns once its agent accepts connections. Blocking.
    pub fn create_live(&self, spec: &LiveSpec) -> Result<Pending, RuntimeError> {
        self.create_live_with(spec, None)
    }

    /// [`Runtime::create_live`] for a `proxy`-mode sandbox whose egress proxy the caller runs
    /// (see [`crate::EgressSession`]; its directory must be inside `spec.dir`'s parent-private
    /// tree). The agent relays to it.
    pub fn create_live_with(
        &self,
        spec: &LiveSpec,
        egress: Option<&crate::EgressSession>,
    ) -> Result<Pending, RuntimeError> {
        check_id(&spec.id)?;
        let backend = Backend::for_tier(spec.config.tier).available(&self.support)?;
        let mut config = spec.config.clone();
        config.command = vec![
            AGENT_PATH.to_owned(),
            "--listen-fd".to_owned(),
            AGENT_LISTEN_FD.to_string(),
        ];
        config.timeout_ms = None;
        if backend.tier() == airlock_api::Tier::Microvm {
            // Given to the guest's agent at every resume: a fork's processes see their own id
            // (unless the caller names it otherwise).
            let name = crate::microvm::ready::ENV_SANDBOX_ID;
            if !config.env.iter().any(|(key, _)| key == name) {
                config.env.push((name.to_owned(), spec.id.clone()));
            }
        }
        backend.check(&config)?;
        let mut plan =
            airlock_policy::compile(&crate::microvm::jail_config(&config), &self.facts())?;
        let mut options = self.spawn_options();
        let id_range = self.id_range(&plan)?;
        if let Some(range) = &id_range {
            plan.use_id_range(range.base());
            options.hold = Some(range.lock());
        }
        let volume = match &self.storage {
            Some(storage) => {
                let owners = volume_owners(&plan.identity, backend.needs_upper());
                let dir = storage.create_volume(
                    &spec.id,
                    config.resources.disk_bytes,
                    owners,
                    &spec.volume,
                )?;
                if let VolumeSource::Snapshot(snapshot) = &spec.volume {
                    storage.refill_spare(snapshot);
                }
                plan.use_disk_scratch(dir);
                Some(VolumeGuard {
                    storage: storage.clone(),
                    id: spec.id.clone(),
                    armed: true,
                })
            }
            None => None,
        };
        if self.storage.is_none() && spec.volume != VolumeSource::Empty {
            return Err(RuntimeError::NoVolume(spec.id.clone()));
        }
        // The OOM killer acts inside the cgroup whose limit was reached: the workload's own.
        plan.isolate_workload_memory(AGENT_RESERVE_BYTES);
        plan.make_freezable();
        match (self.egress_plan(&config)?, egress) {
            (Some(_), Some(session)) => session.attach(&mut plan),
            (None, None) => {}
            (Some(_), None) => return Err(RuntimeError::NetworkMode("proxy (without a proxy)")),
            (None, Some(_)) => {}
        }
        let binary = if backend.tier() == airlock_api::Tier::Microvm {
            // The agent is the guest's init; the backend puts the VMM here.
            PathBuf::new()
        } else {
            find_agent(&self.helper)?
        };
        let agent = AgentSpec {
            binary,
            socket: spec.dir.join(AGENT_SOCKET),
            log: spec.dir.join(AGENT_LOG),
            vmm: None,
        };
        let socket = agent.socket.clone();
        let name = format!("{}-{}", self.owner, spec.id);
        let (starting, shell) = if spec.vm_shell {
            if backend.tier() != airlock_api::Tier::Microvm {
                return Err(crate::microvm::shell::ShellError::NotMicrovm.into());
            }
            let (starting, guest) = crate::microvm::MicrovmTier
                .start_vm(&config, &plan, &options, &name, agent, true)?;
            (starting, Some(guest))
        } else {
            (
                backend.start_live(&config, &plan, &options, &name, agent)?,
                None,
            )
        };
        let jail = starting.record();
        let record = LiveSandbox {
            id: spec.id.clone(),
            socket,
            helper_pid: jail.helper_pid,
            helper_start_ticks: jail.helper_start_ticks,
            cgroup: jail.cgroup.clone(),
            cgroup_dirs: jail.cgroup_dirs.clone(),
            dir: spec.dir.clone(),
            id_range: id_range.as_ref().map(IdRange::base),
        };
        Ok(Pending {
            starting,
            volume,
            record,
            shell,
        })
    }

    /// Checks that a recorded sandbox still runs (same helper pid and start time) and still
    /// holds its host id range (its helper keeps the range's lock), so that no new sandbox
    /// can be given it.
    pub fn adopt(&self, record: &LiveSandbox) -> Result<(), RuntimeError> {
        record
            .pidfd()
            .map(drop)
            .map_err(|_| RuntimeError::Gone(record.id.clone()))?;
        if let Some(base) = record.id_range
            && !IdRange::is_held_in(std::path::Path::new(crate::id_range::ID_RANGE_DIR), base)
        {
            return Err(RuntimeError::Gone(record.id.clone()));
        }
        Ok(())
    }

    /// Ends a sandbox and removes what it owned: processes, cgroup and its directory. Safe to
    /// repeat.
    pub fn destroy(&self, record: &LiveSandbox) {
        let ending = self.begin_destroy(record);
        self.finish_destroy(ending);
    }

    /// The quick half of [`Runtime::destroy`]: every process of the sandbox is sent SIGKILL
    /// (a frozen one is thawed to die, never resumed), so none runs again; it does not wait
    /// for them to end. [`Runtime::finish_destroy`] does the rest.
    pub fn begin_destroy(&self, record: &LiveSandbox) -> Destroying {
        Destroying {
            id: record.id.clone(),
            dir: record.dir.clone(),
            jail: live::begin_destroy(&self.support.cgroups, &record.jail_record()),
        }
    }

    /// The rest of [`Runtime::destroy`] after [`Runtime::begin_destroy`]: waits for the
    /// sandbox's helper to end (the kernel's teardown of its namespaces), reaps it, removes its
    /// cgroup, its scratch volume and its directory.
    pub fn finish_destroy(&self, ending: Destroying) {
        ending.jail.finish();
        if let Some(storage) = &self.storage {
            storage.remove_volume(&ending.id);
        }
        let _ = std::fs::remove_dir_all(&ending.dir);
    }

    /// Ends a sandbox's processes and removes its cgroup, but keeps its directory and its
    /// scratch volume (a filesystem-only pause: [`VolumeSource::Keep`] starts it again). A
    /// frozen sandbox is killed first and thawed, never resumed. Safe to repeat.
    pub fn stop(&self, record: &LiveSandbox) {
        live::destroy(&self.support.cgroups, &record.jail_record());
    }

    /// Snapshots a sandbox's scratch volume (its `/workspace` and `/tmp`) as `snapshot`; with
    /// `freeze`, a running sandbox is frozen for the copy alone (btrfs: O(1)), so that no
    /// write is half-done in it. A sandbox that is already frozen stays so.
    pub fn snapshot(
        &self,
        record: &LiveSandbox,
        snapshot: &str,
        freeze: bool,
    ) -> Result<(), RuntimeError> {
        check_id(snapshot)?;
        let storage = self
            .storage
            .as_ref()
            .ok_or_else(|| RuntimeError::NoVolume(record.id.clone()))?;
        let was_frozen = !freeze || record.is_frozen();
        if !was_frozen {
            record.freeze().map_err(RuntimeError::Freeze)?;
        }
        let taken = storage.snapshot(&record.id, snapshot);
        if !was_frozen {
            record.thaw().map_err(RuntimeError::Freeze)?;
        }
        taken.map_err(RuntimeError::Storage)?;
        // Once the sandbox runs again, so that the first create from the snapshot finds its
        // clone made. Only a speed-up: without it a create clones the snapshot itself.
        let _ = storage.prepare_spare(snapshot);
        Ok(())
    }

    /// Pauses a running microvm sandbox to disk: its VMM snapshots the guest into the
    /// sandbox's directory and ends (see [`crate::microvm::persist`]); [`Runtime::stop`] then
    /// removes the rest, and the next [`Runtime::create_live`] in the same directory restores
    /// it. A frozen sandbox is thawed first (the VMM must run to write its snapshot).
    pub fn pause_vm(&self, record: &LiveSandbox) -> Result<(), RuntimeError> {
        if record.is_frozen() {
            record.thaw().map_err(RuntimeError::Freeze)?;
        }
        crate::microvm::persist::pause_to_disk(&record.dir, &record.pids(), VM_SAVE_LIMIT, || {
            record.agent_log(2048).unwrap_or_default()
        })?;
        Ok(())
    }

    /// The snapshots on this runtime's storage.
    pub fn snapshot_ids(&self) -> Vec<String> {
        self.storage
            .as_ref()
            .map(|storage| storage.snapshots())
            .unwrap_or_default()
    }

    /// Deletes a snapshot (its sandboxes keep their copies).
    pub fn remove_snapshot(&self, snapshot: &str) {
        if let Some(storage) = &self.storage {
            storage.remove_snapshot(snapshot);
        }
    }

    /// Whether sandboxes here keep their files through a filesystem-only pause, snapshots and
    /// forks (disk scratch).
    pub fn has_volumes(&self) -> bool {
        self.storage.is_some()
    }

    /// Ends and removes the cgroups of this owner's long-lived sandboxes (see
    /// [`Runtime::set_owner`]) whose ids are not in `live_ids`; returns their ids. Other owners'
    /// sandboxes are never touched.
    pub fn sweep_orphans(&self, live_ids: &HashSet<String>) -> Vec<String> {
        let prefix = format!("{}-", self.owner);
        let mut swept: Vec<String> = live::sweep(&self.support.cgroups, |name| {
            name.strip_prefix(&prefix)
                .is_none_or(|id| live_ids.contains(id))
        })
        .into_iter()
        .filter_map(|name| name.strip_prefix(&prefix).map(str::to_owned))
        .collect();
        if let Some(storage) = &self.storage {
            storage.sweep_spares();
            for id in storage.volumes() {
                if !live_ids.contains(&id) {
                    storage.remove_volume(&id);
                    if !swept.contains(&id) {
                        swept.push(id);
                    }
                }
            }
        }
        swept
    }

    /// The cgroup name of this owner's long-lived sandbox `id`: for ending a sandbox whose
    /// record was never stored.
    pub fn cgroup_name(&self, id: &str) -> String {
        format!("{}{}-{id}", live::CGROUP_PREFIX, self.owner)
    }

    /// Names whose long-lived sandboxes these are: one tag per daemon (state directory), so
    /// that one daemon's sweep never ends another's sandboxes. 1 to 16 lower-case letters and
    /// digits; `run` by default.
    pub fn set_owner(&mut self, tag: &str) -> Result<(), RuntimeError> {
        if !is_name(tag, 16) {
            return Err(RuntimeError::BadSandboxId(tag.to_owned()));
        }
        self.owner = tag.to_owned();
        Ok(())
    }
}
