//! Per-sandbox cgroups on v1, v2, or a hybrid of both: each controller is used wherever this
//! host mounts it. Only the controllers a sandbox needs are touched, since every v1 hierarchy
//! costs a mkdir, an attach and an rmdir.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use airlock_policy::CgroupLimits;

/// The controllers Airlock limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
    /// v1's freezer hierarchy; on v2 freezing is core cgroup code (`cgroup.freeze`).
    Freezer,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Freezer => "freezer",
        }
    }
}

/// Where a controller lives on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Home {
    /// A v1 hierarchy: the directory of this process's own cgroup in it.
    V1 { own_dir: PathBuf },
    /// The v2 hierarchy, mounted at `mount`, and this process's own cgroup in it.
    V2 { mount: PathBuf, own_dir: PathBuf },
}

/// The cgroup layout of this host, as seen by this process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    pub memory: Option<Home>,
    pub pids: Option<Home>,
    pub cpu: Option<Home>,
    pub freezer: Option<Home>,
}

impl Layout {
    pub fn home(&self, controller: Controller) -> Option<&Home> {
        match controller {
            Controller::Memory => self.memory.as_ref(),
            Controller::Pids => self.pids.as_ref(),
            Controller::Cpu => self.cpu.as_ref(),
            Controller::Freezer => self.freezer.as_ref(),
        }
    }

    /// A one-word summary for reports: `v1`, `v2`, `hybrid` or `none`.
    pub fn describe(&self) -> &'static str {
        let homes = [&self.memory, &self.pids, &self.cpu, &self.freezer];
        let v1 = homes.iter().any(|h| matches!(h, Some(Home::V1 { .. })));
        let v2 = homes.iter().any(|h| matches!(h, Some(Home::V2 { .. })));
        match (v1, v2) {
            (true, true) => "hybrid",
            (true, false) => "v1",
            (false, true) => "v2",
            (false, false) => "none",
        }
    }

    /// Reads the layout from `/proc/self/mountinfo`, `/proc/self/cgroup` and the v2 root.
    pub fn detect() -> io::Result<Layout> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let v2_controllers =
            |mount: &Path| fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
        Ok(parse_layout(&mountinfo, &own, v2_controllers))
    }
}

/// Pure part of [`Layout::detect`]: a controller is v1 if a v1 hierarchy carries it, otherwise
/// v2 if the v2 root lists it.
pub fn parse_layout(
    mountinfo: &str,
    own_cgroups: &str,
    v2_controllers: impl Fn(&Path) -> String,
) -> Layout {
    let mut v1: Vec<(Vec<String>, PathBuf)> = Vec::new();
    let mut v2: Option<PathBuf> = None;
    for line in mountinfo.lines() {
        // Fields: id parent major:minor root mountpoint options [optional...] - fstype source super
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split_whitespace();
        let (Some(fstype), Some(_source), Some(super_options)) =
            (right.next(), right.next(), right.next())
        else {
            continue;
        };
        let Some(mount_point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape_mountinfo(mount_point));
        match fstype {
            "cgroup" => v1.push((
                super_options.split(',').map(str::to_owned).collect(),
                mount_point,
            )),
            "cgroup2" if v2.is_none() => v2 = Some(mount_point),
            _ => {}
        }
    }
    let own_v1_path = |controller: &str| -> Option<String> {
        own_cgroups.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
            list.split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })
    };
    let v2_list = v2
        .as_ref()
        .map(|mount| v2_controllers(mount))
        .unwrap_or_default();
    let home = |controller: Controller| -> Option<Home> {
        let name = controller.name();
        if let Some((_, mount)) = v1
            .iter()
            .find(|(options, _)| options.iter().any(|o| o == name))
        {
            let own = own_v1_path(name).unwrap_or_else(|| "/".to_owned());
            return Some(Home::V1 {
                own_dir: mount.join(own.trim_start_matches('/')),
            });
        }
        let mount = v2.as_ref()?;
        let own = own_cgroups
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .unwrap_or("/");
        // The v2 freezer is core code: it is never listed among the controllers.
        (controller == Controller::Freezer || v2_list.split_whitespace().any(|c| c == name)).then(
            || Home::V2 {
                mount: mount.clone(),
                own_dir: mount.join(own.trim_start_matches('/')),
            },
        )
    };
    Layout {
        memory: home(Controller::Memory),
        pids: home(Controller::Pids),
        cpu: home(Controller::Cpu),
        freezer: home(Controller::Freezer),
    }
}

/// mountinfo escapes spaces and the like as `\040`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What went wrong with a sandbox cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup hierarchy on this host carries the {0} controller")]
    MissingController(&'static str),
    #[error("cannot create cgroup {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove cgroup {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
}

/// The cgroup directory name prefix of Airlock's sandboxes.
pub const NAME_PREFIX: &str = "airlock-";

/// The child cgroups of a sandbox whose workload has a memory cgroup of its own
/// ([`CgroupLimits::workload_memory_bytes`]): the workload's, and on v2, where a cgroup with
/// children holds no processes, a leaf for the agent.
pub const WORKLOAD_CHILD: &str = "workload";
pub const AGENT_CHILD: &str = "agent";

/// One sandbox's cgroup, possibly spread over several v1 hierarchies.
#[derive(Debug)]
pub struct SandboxCgroup {
    dirs: Vec<(Controller, PathBuf)>,
    /// The v2 directory, when any controller lives on v2.
    v2_dir: Option<PathBuf>,
    /// The files through which the helper returns to the supervisor's cgroups.
    leave: Vec<PathBuf>,
    /// The workload's own memory cgroup, when it has one.
    workload: Option<PathBuf>,
}

fn write(path: PathBuf, value: &str) -> Result<(), CgroupError> {
    fs::write(&path, value).map_err(|source| CgroupError::Write {
        path,
        value: value.to_owned(),
        source,
    })
}

impl SandboxCgroup {
    /// Creates the cgroup `name` with `limits` in every hierarchy that carries a limited
    /// controller. Memory and pids are always used: they also let Airlock find every process.
    pub fn create(
        layout: &Layout,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<SandboxCgroup, CgroupError> {
        let mut wanted = vec![Controller::Memory, Controller::Pids];
        if limits.cpu_quota_us.is_some() {
            wanted.push(Controller::Cpu);
        }
        if limits.freezable {
            wanted.push(Controller::Freezer);
        }
        let mut cgroup = SandboxCgroup {
            dirs: Vec::new(),
            v2_dir: None,
            leave: Vec::new(),
            workload: None,
        };
        for &controller in &wanted {
            let home = layout
                .home(controller)
                .ok_or(CgroupError::MissingController(controller.name()))?;
            match home {
                Home::V1 { own_dir } => {
                    let dir = own_dir.join(name);
                    if let Err(err) = create_dir(&dir) {
                        let _ = cgroup.remove();
                        return Err(err);
                    }
                    cgroup.dirs.push((controller, dir));
                    cgroup.leave.push(own_dir.join("tasks"));
                }
                Home::V2 { mount, own_dir } => {
                    let dir = match &cgroup.v2_dir {
                        Some(dir) => dir.clone(),
                        None => {
                            let parent = mount.join("airlock");
                            // Enable only what lives on v2: on a hybrid host the rest is v1's.
                            let enable: Vec<String> = wanted
                                .iter()
                                .filter(|c| **c != Controller::Freezer)
                                .filter(|c| matches!(layout.home(**c), Some(Home::V2 { .. })))
                                .map(|c| format!("+{}", c.name()))
                                .collect();
                            let created = prepare_v2_parent(mount, &parent, &enable.join(" "))
                                .and_then(|()| create_dir(&parent.join(name)));
                            if let Err(err) = created {
                                let _ = cgroup.remove();
                                return Err(err);
                            }
                            let dir = parent.join(name);
                            cgroup.v2_dir = Some(dir.clone());
                            cgroup.leave.push(own_dir.join("cgroup.procs"));
                            dir
                        }
                    };
                    cgroup.dirs.push((controller, dir));
                }
            }
        }
        let limited = cgroup
            .set_limits(limits)
            .and_then(|()| match limits.workload_memory_bytes {
                Some(bytes) => cgroup.create_workload(bytes),
                None => Ok(()),
            });
        if let Err(err) = limited {
            let _ = cgroup.remove();
            return Err(err);
        }
        Ok(cgroup)
    }

    /// Creates the workload's memory cgroup below the memory controller's directory (and, on
    /// v2, the agent's leaf beside it).
    fn create_workload(&mut self, bytes: u64) -> Result<(), CgroupError> {
        let Some(memory) = self.dir(Controller::Memory).cloned() else {
            return Ok(());
        };
        let v2 = self.v2_dir.as_ref() == Some(&memory);
        let workload = memory.join(WORKLOAD_CHILD);
        if v2 {
            write(memory.join("cgroup.subtree_control"), "+memory")?;
            create_dir(&memory.join(AGENT_CHILD))?;
        }
        create_dir(&workload)?;
        self.workload = Some(workload.clone());
        if v2 {
            write(workload.join("memory.max"), &bytes.to_string())?;
            write(workload.join("memory.swap.max"), "0")
        } else {
            write(workload.join("memory.limit_in_bytes"), &bytes.to_string())?;
            let memsw = workload.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(memsw, &bytes.to_string())?;
            }
            Ok(())
        }
    }

    /// The workload cgroup's files for the helper, when the workload has one.
    pub fn workload_files(&self) -> Option<crate::spec::WorkloadCgroupSpec> {
        let dir = self.workload.as_ref()?;
        Some(crate::spec::WorkloadCgroupSpec {
            procs: dir.join("cgroup.procs"),
            oom_events: oom_file(dir),
        })
    }

    /// The memory cgroup the workload's OOM kills are counted in: its own, or the sandbox's.
    fn workload_memory_dir(&self) -> Option<&PathBuf> {
        self.workload
            .as_ref()
            .or_else(|| self.dir(Controller::Memory))
    }

    /// How many processes the OOM killer has ended in the workload's cgroup.
    pub fn workload_oom_kills(&self) -> u64 {
        self.workload_memory_dir().map_or(0, |dir| oom_kills(dir))
    }

    /// Notifications of the OOM killer's work in the workload's cgroup.
    pub fn workload_oom_watch(&self) -> io::Result<crate::oom::OomWatch> {
        let dir = self
            .workload_memory_dir()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        crate::oom::OomWatch::open(dir)
    }

    /// Every directory of this cgroup, each once: what a record must keep to find it again
    /// from another cgroup (a restarted daemon may run elsewhere in the hierarchy).
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for (_, dir) in &self.dirs {
            if !dirs.contains(dir) {
                dirs.push(dir.clone());
            }
        }
        dirs
    }

    /// A cgroup from directories a record kept. Each must be an Airlock sandbox cgroup inside
    /// a cgroup filesystem; anything else is ignored rather than killed or removed.
    pub fn from_dirs(dirs: &[PathBuf]) -> SandboxCgroup {
        let mut cgroup = SandboxCgroup {
            dirs: Vec::new(),
            v2_dir: None,
            leave: Vec::new(),
            workload: None,
        };
        for dir in dirs {
            let named = dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(NAME_PREFIX));
            if !named || !dir.is_absolute() || !dir.join("cgroup.procs").is_file() {
                continue;
            }
            let kind = crate::cgroup_kind::of(dir);
            if kind.v2 {
                cgroup.v2_dir = Some(dir.clone());
            }
            if kind.memory && dir.join(WORKLOAD_CHILD).is_dir() {
                cgroup.workload = Some(dir.join(WORKLOAD_CHILD));
            }
            cgroup.dirs.push((kind.controller, dir.clone()));
        }
        cgroup
    }

    fn dir(&self, controller: Controller) -> Option<&PathBuf> {
        self.dirs
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, d)| d)
    }

    fn set_limits(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        for (controller, dir) in &self.dirs {
            let v2 = self.v2_dir.as_ref() == Some(dir);
            match (controller, v2) {
                (Controller::Memory, false) => {
                    if let Some(bytes) = limits.memory_bytes {
                        write(dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                        // Memory plus swap equal to memory: no swap. Absent without swap accounting.
                        let memsw = dir.join("memory.memsw.limit_in_bytes");
                        if memsw.exists() {
                            write(memsw, &bytes.to_string())?;
                        }
                    }
                }
                (Controller::Memory, true) => {
                    if let Some(bytes) = limits.memory_bytes {
                        write(dir.join("memory.max"), &bytes.to_string())?;
                        write(dir.join("memory.swap.max"), "0")?;
                    }
                }
                (Controller::Pids, _) => {
                    if let Some(max) = limits.pids_max {
                        write(dir.join("pids.max"), &max.to_string())?;
                    }
                }
                (Controller::Cpu, false) => {
                    if let Some(quota) = limits.cpu_quota_us {
                        write(
                            dir.join("cpu.cfs_period_us"),
                            &limits.cpu_period_us.to_string(),
                        )?;
                        write(dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                    }
                }
                (Controller::Cpu, true) => {
                    if let Some(quota) = limits.cpu_quota_us {
                        write(
                            dir.join("cpu.max"),
                            &format!("{quota} {}", limits.cpu_period_us),
                        )?;
                    }
                }
                (Controller::Freezer, _) => {}
            }
        }
        Ok(())
    }

    /// The files a process writes `0` to in order to move itself into the sandbox's cgroup.
    ///
    /// On v1 this is `tasks`: a thread moving itself skips the global threadgroup lock, whose
    /// RCU synchronisation otherwise costs milliseconds per sandbox. On v2 it is `cgroup.procs`.
    pub fn join_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = Vec::new();
        for (_, dir) in &self.dirs {
            let file = if self.v2_dir.as_ref() == Some(dir) {
                if self.workload.is_some() && dir.join(AGENT_CHILD).is_dir() {
                    dir.join(AGENT_CHILD).join("cgroup.procs")
                } else {
                    dir.join("cgroup.procs")
                }
            } else {
                dir.join("tasks")
            };
            if !files.contains(&file) {
                files.push(file);
            }
        }
        files
    }

    /// The files a process writes `0` to in order to move itself back to the cgroups it came
    /// from. The helper does so once init exists: charged to the sandbox, a host process could
    /// be picked by the sandbox's OOM killer.
    pub fn leave_files(&self) -> &[PathBuf] {
        &self.leave
    }

    /// The processes in the sandbox's cgroup.
    pub fn pids(&self) -> Vec<libc::pid_t> {
        let Some(dir) = self
            .dir(Controller::Pids)
            .or_else(|| self.dirs.first().map(|(_, d)| d))
        else {
            return Vec::new();
        };
        // Processes sit in the children when there are any (v2's leaves, or v1's workload).
        [dir.clone(), dir.join(AGENT_CHILD), dir.join(WORKLOAD_CHILD)]
            .iter()
            .flat_map(|dir| {
                fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<libc::pid_t>>()
            })
            .collect()
    }

    /// Where this cgroup is frozen: the v1 freezer's directory, or the v2 directory.
    pub fn freezer(&self) -> Option<crate::freezer::Freezer> {
        match self.dir(Controller::Freezer) {
            Some(dir) if self.v2_dir.as_ref() != Some(dir) => {
                Some(crate::freezer::Freezer::V1(dir.clone()))
            }
            _ => self.v2_dir.clone().map(crate::freezer::Freezer::V2),
        }
    }

    /// Sends SIGKILL to every process in the cgroup once, without waiting for any to end: one
    /// write of `cgroup.kill` on v2; on v1 a signal to each listed process (a fork racing it
    /// is in the same pid namespace, which dies with its init) and a thaw, so that a frozen
    /// task dies without running again. [`SandboxCgroup::kill_all`] makes sure.
    pub fn kill_once(&self) {
        if let Some(dir) = &self.v2_dir
            && fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        for pid in self.pids() {
            let _ = crate::sys::kill(pid, libc::SIGKILL);
        }
        if let Some(freezer) = self.freezer() {
            let _ = freezer.thaw();
        }
    }

    /// Kills every process in the cgroup. On v2 with `cgroup.kill` this is one write; on v1,
    /// processes are killed until none is left (a fork racing the kill is caught next round).
    /// A frozen v1 task takes no signal until thawed: the cgroup is thawed after the first
    /// round of kills, so that it dies without running again.
    pub fn kill_all(&self) {
        if let Some(dir) = &self.v2_dir
            && fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        let freezer = self.freezer();
        for _ in 0..1000 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
            if let Some(freezer) = &freezer {
                let _ = freezer.thaw();
            }
            std::thread::yield_now();
        }
    }

    /// Whether the kernel's OOM killer acted inside this cgroup (v1 counts a kill only in
    /// the victim's own cgroup, so the workload's is read too).
    pub fn oom_killed(&self) -> bool {
        self.dir(Controller::Memory)
            .is_some_and(|dir| oom_kills(dir) > 0)
            || self.workload.as_ref().is_some_and(|dir| oom_kills(dir) > 0)
    }

    /// Kills what is left and removes the directories. Exiting tasks can keep a cgroup busy for
    /// a while on a loaded host, so each directory is retried for up to five seconds, and one
    /// that stays busy never keeps the others from being removed. Returns the first failure.
    pub fn remove(&self) -> Result<(), CgroupError> {
        let children = self
            .dirs
            .iter()
            .flat_map(|(_, dir)| [dir.join(WORKLOAD_CHILD), dir.join(AGENT_CHILD)])
            .filter(|dir| dir.is_dir())
            .collect::<Vec<_>>();
        let parents = self.dirs.iter().map(|(_, dir)| dir.clone());
        let mut order: Vec<PathBuf> = Vec::new();
        for dir in children.into_iter().chain(parents) {
            if !order.contains(&dir) {
                order.push(dir);
            }
        }
        let mut first_failure = None;
        for dir in order {
            let deadline = Instant::now() + REMOVE_PATIENCE;
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        self.kill_all();
                        sleep(Duration::from_millis(1));
                    }
                    Err(source) => {
                        first_failure.get_or_insert(CgroupError::Remove { path: dir, source });
                        break;
                    }
                }
            }
        }
        first_failure.map_or(Ok(()), Err)
    }
}

/// How long one cgroup directory's removal is retried while exiting tasks keep it busy.
const REMOVE_PATIENCE: Duration = Duration::from_secs(5);

/// A memory cgroup's OOM counters file: `memory.events` on v2, `memory.oom_control` on v1.
fn oom_file(dir: &Path) -> PathBuf {
    if dir.join("memory.events").exists() {
        dir.join("memory.events")
    } else {
        dir.join("memory.oom_control")
    }
}

/// The `oom_kill` count of a memory cgroup; 0 when it cannot be read.
fn oom_kills(dir: &Path) -> u64 {
    parse_oom_kills(&fs::read_to_string(oom_file(dir)).unwrap_or_default())
}

/// The `oom_kill N` line of `memory.events` or `memory.oom_control`.
pub fn parse_oom_kills(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == "oom_kill")
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

fn create_dir(dir: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(source) => Err(CgroupError::Create {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// On v2, controllers must be enabled in every ancestor's `cgroup.subtree_control`. Airlock's
/// sandboxes live under `<root>/airlock`, which holds no processes itself.
fn prepare_v2_parent(mount: &Path, parent: &Path, enable: &str) -> Result<(), CgroupError> {
    write(mount.join("cgroup.subtree_control"), enable)?;
    match fs::create_dir(parent) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(CgroupError::Create {
                path: parent.to_path_buf(),
                source,
            });
        }
    }
    write(parent.join("cgroup.subtree_control"), enable)
}

/// Removes cgroups left by Airlock processes that died without cleaning up (`kill -9`): those
/// whose owner pid, encoded in the name, is gone. Empty ones only; the kernel refuses others.
pub fn sweep_stale(layout: &Layout) {
    for parent in parents(layout) {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name.to_str().and_then(owner_pid) else {
                continue;
            };
            if crate::sys::kill(owner, 0).is_err_and(|e| e.raw_os_error() == Some(libc::ESRCH)) {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
}

/// The directories that hold Airlock's sandbox cgroups, each once.
pub fn parents(layout: &Layout) -> Vec<PathBuf> {
    let mut parents: Vec<PathBuf> = Vec::new();
    for home in [&layout.memory, &layout.pids, &layout.cpu, &layout.freezer]
        .into_iter()
        .flatten()
    {
        let parent = match home {
            Home::V1 { own_dir } => own_dir.clone(),
            Home::V2 { mount, .. } => mount.join("airlock"),
        };
        if !parents.contains(&parent) {
            parents.push(parent);
        }
    }
    parents
}

/// The roots of the hierarchies that carry Airlock's controllers: a v1 hierarchy's root is the
/// highest ancestor of our own cgroup that is still a cgroup.
fn hierarchy_roots(layout: &Layout) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for home in [&layout.memory, &layout.pids, &layout.cpu, &layout.freezer]
        .into_iter()
        .flatten()
    {
        let root = match home {
            Home::V1 { own_dir } => {
                let mut root = own_dir.clone();
                while let Some(parent) = root.parent() {
                    if !parent.join("cgroup.procs").is_file() {
                        break;
                    }
                    root = parent.to_path_buf();
                }
                root
            }
            Home::V2 { mount, .. } => mount.join("airlock"),
        };
        if !roots.contains(&root) {
            roots.push(root);
        }
    }
    roots
}

/// Every cgroup directory whose name starts with `prefix`, in every hierarchy Airlock uses,
/// down to a few levels (daemons may run in nested cgroups). Sandbox cgroups themselves are
/// not descended into.
pub fn find_named(layout: &Layout, prefix: &str) -> Vec<PathBuf> {
    const MAX_DEPTH: usize = 6;
    let mut found = Vec::new();
    let mut pending: Vec<(PathBuf, usize)> = hierarchy_roots(layout)
        .into_iter()
        .map(|r| (r, 0))
        .collect();
    while let Some((dir, depth)) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(prefix) {
                found.push(entry.path());
            } else if depth < MAX_DEPTH && !name.starts_with(NAME_PREFIX) {
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

/// `airlock-<pid>-<n>` → `pid`.
pub fn owner_pid(name: &str) -> Option<libc::pid_t> {
    name.strip_prefix(NAME_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

#[path = "cgroup_workload.rs"]
mod workload;
pub use workload::WorkloadClock;

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
