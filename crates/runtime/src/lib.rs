//! Airlock's embeddable runtime: pick a backend for a tier, compile the configuration into a
//! plan, and run the sandbox.
//!
//! ```no_run
//! use airlock_runtime::Runtime;
//! use airlock_api::SandboxConfig;
//!
//! let runtime = Runtime::new()?;
//! let outcome = runtime.run(&SandboxConfig::new(vec!["echo".into(), "hi".into()]), None, |w| eprintln!("{w}"))?;
//! assert_eq!(outcome.exit_code(), 0);
//! # Ok::<(), airlock_runtime::RuntimeError>(())
//! ```

mod backend;
pub mod egress;
mod evaluation;
pub mod git;
pub mod id_range;
mod live;
pub mod microvm;
mod step;
pub mod storage;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_api::{SandboxConfig, WorkspaceSource};
pub use airlock_jail::Outcome;
use airlock_jail::zygote::Zygote;
use airlock_jail::{HostSupport, JailError, Sandbox, SpawnOptions, TerminationSignals};
use airlock_policy::egress::{EgressPlan, NetworkMode};
use airlock_policy::{CompileError, HostFacts};
pub use egress::{EgressOptions, EgressSession};

pub use airlock_jail::oom::OomWatch;
pub use airlock_jail::report::Phase;
pub use airlock_jail::{Ending, Stdio, TerminationSignals as Signals, error_chain};
pub use backend::{Backend, BackendSupport, ContainerTier, ProcessTier, TierBackend};
pub use evaluation::{Ablation, SECCOMP_TAG_ERRNO};
pub use id_range::{IdRange, IdRangeError};
pub use live::{AGENT_RESERVE_BYTES, Destroying, LiveSandbox, LiveSpec, Pending, find_agent};
pub use microvm::MicrovmTier;
pub use step::{KeptScratch, StepOptions};
pub use storage::{Storage, StorageError, VolumeSource};
pub use workload::Workload;

/// Why a sandbox could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid sandbox configuration")]
    Compile(#[from] CompileError),
    #[error("workspace {0} does not exist or is not a directory")]
    WorkspaceMissing(PathBuf),
    #[error("rootfs {0} does not exist or is not a directory")]
    RootfsMissing(PathBuf),
    #[error("root bind {0} does not exist")]
    BindMissing(PathBuf),
    #[error("the {tier} tier cannot run on this host: {reason}")]
    TierUnavailable { tier: &'static str, reason: String },
    #[error(transparent)]
    Jail(#[from] JailError),
    #[error("`{0}` is not a sandbox id (1 to 32 lower-case letters and digits)")]
    BadSandboxId(String),
    #[error(
        "cannot find the airlock-agent binary at {0} (build it with scripts/sandbox-binaries.sh, or set AIRLOCK_AGENT_BIN)"
    )]
    AgentNotFound(PathBuf),
    #[error("sandbox {0} is no longer running")]
    Gone(String),
    #[error("the egress proxy could not be set up")]
    Egress(#[from] egress::EgressSetupError),
    #[error("the {0} network mode is not supported yet")]
    NetworkMode(&'static str),
    #[error("the sandbox's scratch space could not be made")]
    Storage(#[from] StorageError),
    #[error("sandbox {0} has no volume: pause to disk, snapshots and forks need disk scratch")]
    NoVolume(String),
    #[error("freezing or thawing the sandbox failed")]
    Freeze(#[source] std::io::Error),
    #[error("image layer {0} does not exist or is not a directory")]
    LayerMissing(PathBuf),
    #[error("no host id range for the sandbox")]
    IdRange(#[from] IdRangeError),
    #[error("the microVM could not be paused to disk or copied")]
    VmPersist(#[from] microvm::persist::PersistError),
    #[error("the microVM's pre-created shell failed")]
    VmShell(#[from] microvm::shell::ShellError),
}

/// One runtime per process: it knows where its helper is and what the host supports.
#[derive(Debug, Clone)]
pub struct Runtime {
    helper: PathBuf,
    support: HostSupport,
    trace: bool,
    /// Airlock's state directories, hidden from every sandbox.
    state_dirs: Vec<PathBuf>,
    /// Tags the cgroups of long-lived sandboxes (see [`Runtime::set_owner`]).
    owner: String,
    /// On-disk scratch space for long-lived sandboxes; without it, theirs is a tmpfs.
    storage: Option<std::sync::Arc<Storage>>,
    /// Forks helpers instead of exec'ing them (see [`Runtime::start_zygote`]).
    zygote: Option<std::sync::Arc<Zygote>>,
}

impl Runtime {
    /// Finds the helper and probes the host.
    pub fn new() -> Result<Runtime, RuntimeError> {
        Ok(Runtime::with_helper(airlock_jail::find_helper()?))
    }

    /// The `airlock-jail` binary this runtime execs (or starts its zygote from).
    pub fn helper(&self) -> &std::path::Path {
        &self.helper
    }

    pub fn with_helper(helper: PathBuf) -> Runtime {
        Runtime {
            helper,
            support: HostSupport::probe(),
            trace: false,
            state_dirs: default_state_dirs(),
            owner: "run".to_owned(),
            storage: None,
            zygote: None,
        }
    }

    /// Starts the helper zygote: from now on each sandbox's helper is forked from one freshly
    /// exec'd, single-threaded `airlock-jail --zygote` instead of exec'd (about 0.4 ms less per
    /// start here). For long-lived runtimes (a daemon, a benchmark); it ends when the last clone
    /// of this runtime is dropped. See `airlock_jail::zygote`.
    pub fn start_zygote(&mut self) -> Result<(), RuntimeError> {
        let zygote = Zygote::start(&self.helper).map_err(|source| {
            RuntimeError::Jail(JailError::Spawn {
                path: self.helper.clone(),
                source,
            })
        })?;
        self.zygote = Some(std::sync::Arc::new(zygote));
        Ok(())
    }

    /// The zygote's pid, when one runs.
    pub fn zygote_pid(&self) -> Option<i32> {
        self.zygote.as_ref().map(|zygote| zygote.pid())
    }

    /// How many view templates the zygote's sandboxes were given so far, when one runs (see
    /// `airlock_jail::view_template`).
    pub fn view_template_builds(&self) -> Option<u64> {
        self.zygote
            .as_ref()
            .map(|zygote| zygote.view_templates().builds())
    }

    /// How many helpers the zygote has forked, when one runs.
    pub fn zygote_forks(&self) -> Option<u64> {
        self.zygote.as_ref().map(|zygote| zygote.forks())
    }

    /// How many sandboxes got a network namespace the host made (`network_pool`), from the
    /// zygote's pool or from their helper, when a zygote runs.
    pub fn host_networks(&self) -> Option<airlock_jail::HostNetworks> {
        self.zygote.as_ref().map(|zygote| zygote.host_networks())
    }

    /// Puts long-lived sandboxes' scratch space (`/tmp` and a fresh `/workspace`) on `storage`,
    /// one quota-limited volume each, instead of a tmpfs.
    pub fn set_storage(&mut self, storage: Storage) {
        self.storage = Some(std::sync::Arc::new(storage));
    }

    pub fn storage(&self) -> Option<&Storage> {
        self.storage.as_deref()
    }

    /// Times each phase of every sandbox's life into [`Outcome::phases`](airlock_jail::Outcome).
    pub fn set_tracing(&mut self, on: bool) {
        self.trace = on;
    }

    /// Adds directories that no sandbox may see (a daemon's state directory).
    pub fn set_state_dirs(&mut self, dirs: Vec<PathBuf>) {
        for dir in dirs {
            if !self.state_dirs.contains(&dir) {
                self.state_dirs.push(dir);
            }
        }
    }

    pub fn support(&self) -> &HostSupport {
        &self.support
    }

    /// The backends of this build and whether this host can run each.
    pub fn backends(&self) -> Vec<BackendSupport> {
        Backend::all()
            .iter()
            .map(|b| b.probe(&self.support))
            .collect()
    }

    /// Whether this host can run `tier`'s backend; None when this build has none for it.
    /// Probes that one backend only (a create asks for one; the microvm probe opens /dev/kvm).
    pub fn backend(&self, tier: airlock_api::Tier) -> Option<BackendSupport> {
        Backend::all()
            .iter()
            .find(|b| b.tier() == tier)
            .map(|b| b.probe(&self.support))
    }

    /// Starts a sandbox; returns it with its deadline.
    pub fn start(
        &self,
        config: &SandboxConfig,
    ) -> Result<(Sandbox, Option<Instant>), RuntimeError> {
        self.start_with(config, |_, _| {})
    }

    /// Starts a sandbox after `adjust` has seen its plan and spawn options (security
    /// evaluation only; see `evaluation.rs`).
    fn start_with(
        &self,
        config: &SandboxConfig,
        adjust: impl FnOnce(&mut airlock_policy::Plan, &mut SpawnOptions),
    ) -> Result<(Sandbox, Option<Instant>), RuntimeError> {
        let backend = Backend::for_tier(config.tier).available(&self.support)?;
        backend.check(config)?;
        let mut plan = airlock_policy::compile(&microvm::jail_config(config), &self.facts())?;
        let mut options = self.spawn_options();
        // The helper holds the range's lock until the sandbox has ended.
        if let Some(range) = self.id_range(&plan)? {
            plan.use_id_range(range.base());
            options.hold = Some(range.lock());
        }
        adjust(&mut plan, &mut options);
        let sandbox = backend.start(&plan, &options)?;
        let deadline = config
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        Ok((sandbox, deadline))
    }

    /// Runs a sandbox to its end. `signals`, when given, tear it down on SIGINT/SIGTERM/SIGHUP.
    pub fn run(
        &self,
        config: &SandboxConfig,
        signals: Option<&TerminationSignals>,
        on_warning: impl FnMut(&str),
    ) -> Result<Outcome, RuntimeError> {
        self.run_with(config, EgressOptions::default(), signals, on_warning)
    }

    /// [`Runtime::run`] with options for a `proxy`-mode sandbox's egress proxy.
    pub fn run_with(
        &self,
        config: &SandboxConfig,
        egress: EgressOptions,
        signals: Option<&TerminationSignals>,
        on_warning: impl FnMut(&str),
    ) -> Result<Outcome, RuntimeError> {
        self.run_adjusted(config, egress, signals, on_warning, |_, _| {})
    }

    /// [`Runtime::run_with`], after `adjust` has seen the plan and spawn options (security
    /// evaluation only; see `evaluation.rs`).
    fn run_adjusted(
        &self,
        config: &SandboxConfig,
        egress: EgressOptions,
        signals: Option<&TerminationSignals>,
        on_warning: impl FnMut(&str),
        adjust: impl FnOnce(&mut airlock_policy::Plan, &mut SpawnOptions),
    ) -> Result<Outcome, RuntimeError> {
        // The proxy's directory lives in a private (0700) scratch directory of this process.
        let (scratch, session) = match self.egress_plan(config)? {
            Some(plan) => {
                let scratch = ScratchDir::new()?;
                let session =
                    EgressSession::start(&scratch.name, &plan, &scratch.path, egress, None)?;
                (Some(scratch), Some(session))
            }
            None => (None, None),
        };
        let (sandbox, deadline) = self.start_with(config, |plan, options| {
            if let Some(session) = &session {
                session.attach(plan);
            }
            adjust(plan, options);
        })?;
        let outcome = sandbox.wait(deadline, signals, on_warning);
        drop(session);
        drop(scratch);
        Ok(outcome?)
    }

    /// The egress plan of a `proxy`-mode sandbox; `None` without network access.
    pub fn egress_plan(&self, config: &SandboxConfig) -> Result<Option<EgressPlan>, RuntimeError> {
        let Some(document) = &config.policy else {
            return Ok(None);
        };
        let policy = airlock_policy::Policy::from_document(document)
            .map_err(|e| RuntimeError::Compile(CompileError::InvalidPolicy(e)))?;
        let plan = airlock_policy::egress_plan(&policy);
        match plan.mode {
            NetworkMode::None => Ok(None),
            NetworkMode::Proxy => Ok(Some(plan)),
            NetworkMode::Full => Err(RuntimeError::NetworkMode("full")),
        }
    }

    fn spawn_options(&self) -> SpawnOptions {
        SpawnOptions {
            helper: self.helper.clone(),
            cgroups: self.support.cgroups.clone(),
            trace: self.trace,
            evaluation: airlock_jail::spec::Evaluation::default(),
            hold: None,
            stdio: None,
            zygote: self.zygote.clone(),
        }
    }

    /// A host id range of its own for a root caller's sandbox (see [`IdRange`]).
    fn id_range(&self, plan: &airlock_policy::Plan) -> Result<Option<IdRange>, RuntimeError> {
        if !plan.identity.privileged_caller {
            return Ok(None);
        }
        Ok(Some(IdRange::allocate()?))
    }

    fn facts(&self) -> HostFacts {
        HostFacts {
            caller_uid: self.support.caller_uid,
            caller_gid: self.support.caller_gid,
            state_dirs: self.state_dirs.clone(),
        }
    }
}

/// A private (0700) directory for one sandbox's host-side files, removed on drop.
struct ScratchDir {
    path: PathBuf,
    name: String,
}

impl ScratchDir {
    const PREFIX: &str = "airlock-run";

    fn new() -> Result<ScratchDir, RuntimeError> {
        use std::os::unix::fs::DirBuilderExt;
        // Those of `airlock` processes that were killed (no destructor ran) go first.
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(ScratchDir::sweep_stale);
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = format!(
            "run{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(format!("airlock-{name}"));
        debug_assert!(path.to_string_lossy().contains(ScratchDir::PREFIX));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| {
                RuntimeError::Egress(egress::EgressSetupError::Directory {
                    path: path.clone(),
                    source,
                })
            })?;
        Ok(ScratchDir { path, name })
    }
}

impl ScratchDir {
    /// Removes `airlock-run<pid>x<n>` directories whose process no longer exists.
    fn sweep_stale() {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(ScratchDir::PREFIX))
                .and_then(|rest| rest.split('x').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Where Airlock keeps state by default; masked from every sandbox even when unused.
fn default_state_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/var/lib/airlock")];
    if let Some(home) = std::env::var_os("HOME") {
        let home = PathBuf::from(home);
        dirs.push(home.join(".local/share/airlock"));
        dirs.push(home.join(".local/state/airlock"));
    }
    if let Some(state) = std::env::var_os("XDG_STATE_HOME") {
        dirs.push(PathBuf::from(state).join("airlock"));
    }
    dirs
}

pub(crate) fn check_paths(config: &SandboxConfig) -> Result<(), RuntimeError> {
    if let WorkspaceSource::Host { path } = &config.workspace
        && !path.is_dir()
    {
        return Err(RuntimeError::WorkspaceMissing(path.clone()));
    }
    if let Some(rootfs) = &config.rootfs
        && !rootfs.is_dir()
    {
        return Err(RuntimeError::RootfsMissing(rootfs.clone()));
    }
    if let Some(bind) = config
        .root_binds
        .iter()
        .flatten()
        .find(|bind| !bind.host.exists())
    {
        return Err(RuntimeError::BindMissing(bind.host.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod scratch_tests {
    use super::ScratchDir;

    #[test]
    fn test_stale_scratch_directories_of_dead_processes_are_swept() {
        let tmp = std::env::temp_dir();
        // Above the kernel's largest pid (PID_MAX_LIMIT), so never a live process.
        let dead = tmp.join("airlock-run4194305x7");
        let alive = tmp.join(format!("airlock-run{}x4242", std::process::id()));
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::create_dir_all(&alive).unwrap();
        ScratchDir::sweep_stale();
        assert!(!dead.exists(), "a dead process's directory is removed");
        assert!(alive.exists(), "a live process's directory stays");
        std::fs::remove_dir_all(&alive).unwrap();
    }
}
