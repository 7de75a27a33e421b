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
mod evaluation;
mod live;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_api::{SandboxConfig, WorkspaceSource};
use airlock_jail::{HostSupport, JailError, Outcome, Sandbox, SpawnOptions, TerminationSignals};
use airlock_policy::{CompileError, HostFacts};

pub use airlock_jail::report::Phase;
pub use airlock_jail::{Ending, TerminationSignals as Signals};
pub use backend::{Backend, BackendSupport};
pub use evaluation::{Ablation, SECCOMP_TAG_ERRNO};
pub use live::{LiveSandbox, LiveSpec, Pending, find_agent};

/// Why a sandbox could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid sandbox configuration")]
    Compile(#[from] CompileError),
    #[error("workspace {0} does not exist or is not a directory")]
    WorkspaceMissing(PathBuf),
    #[error("rootfs {0} does not exist or is not a directory")]
    RootfsMissing(PathBuf),
    #[error("the {tier} tier cannot run on this host: {reason}")]
    TierUnavailable { tier: &'static str, reason: String },
    #[error(transparent)]
    Jail(#[from] JailError),
    #[error("`{0}` is not a sandbox id (1 to 32 lower-case letters and digits)")]
    BadSandboxId(String),
    #[error("cannot find the airlock-agent binary at {0} (set AIRLOCK_AGENT_BIN)")]
    AgentNotFound(PathBuf),
    #[error("sandbox {0} is no longer running")]
    Gone(String),
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
}

impl Runtime {
    /// Finds the helper and probes the host.
    pub fn new() -> Result<Runtime, RuntimeError> {
        Ok(Runtime::with_helper(airlock_jail::find_helper()?))
    }

    pub fn with_helper(helper: PathBuf) -> Runtime {
        Runtime {
            helper,
            support: HostSupport::probe(),
            trace: false,
            state_dirs: default_state_dirs(),
            owner: "run".to_owned(),
        }
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
        let backend = Backend::for_tier(config.tier);
        let support = backend.probe(&self.support);
        if let Some(reason) = support.unavailable {
            return Err(RuntimeError::TierUnavailable {
                tier: config.tier.as_str(),
                reason,
            });
        }
        check_paths(config)?;
        let mut plan = airlock_policy::compile(config, &self.facts())?;
        let mut options = self.spawn_options();
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
        let (sandbox, deadline) = self.start(config)?;
        Ok(sandbox.wait(deadline, signals, on_warning)?)
    }

    fn spawn_options(&self) -> SpawnOptions {
        SpawnOptions {
            helper: self.helper.clone(),
            cgroups: self.support.cgroups.clone(),
            trace: self.trace,
            evaluation: airlock_jail::spec::Evaluation::default(),
        }
    }

    fn facts(&self) -> HostFacts {
        HostFacts {
            caller_uid: self.support.caller_uid,
            caller_gid: self.support.caller_gid,
            state_dirs: self.state_dirs.clone(),
        }
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

fn check_paths(config: &SandboxConfig) -> Result<(), RuntimeError> {
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
    Ok(())
}
