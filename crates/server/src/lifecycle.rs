//! Sandbox lifecycle: create, time out, delete, watch, and reconcile after a restart.
//!
//! The store is the durable truth and the `slots` map the in-memory view of what this daemon
//! manages. The order of writes makes a crash at any point recoverable:
//!
//! 1. the row is inserted as `creating` before the runtime starts anything;
//! 2. the runtime starts the sandbox (`create_live`, blocking until its agent serves);
//! 3. the row becomes `running` with the runtime's record (helper pid, start time, cgroup);
//! 4. only then is the sandbox committed, which lets it outlive the daemon, and the create
//!    answers 201.
//!
//! Until its commit, a sandbox dies with the daemon (its helper sees the control pipe close),
//! but not at the same instant. A `running` row whose sandbox died that way (a crash between
//! steps 3 and 4) is found dead at start-up and destroyed. (Daemons before this order wrote a
//! `committing` state between 3 and 4.) So at start-up (`recover`), `creating`, `committing` and
//! `deleting` rows are destroyed (through the stored record when there is one) and removed,
//! whatever still runs; `running` rows whose helper is gone are destroyed, live ones are
//! re-adopted with their stored deadline, and then stale cgroups and directories that no row owns are removed. Each of
//! these is an event. Every running sandbox has a watcher task that ends it at its deadline or
//! when its helper exits (the pidfd becomes readable), removing everything it owned.
//!
//! A `proxy`-mode sandbox's egress proxy (`crate::egress`) starts after step 1, before the
//! runtime, and its placeholders are stored with it; a re-adopted sandbox gets its proxy back
//! with them. Hot reload, approvals and the events API are in `egress_ops`.

mod checks;
mod computer;
mod create;
mod desktop;
mod desktop_warm;
mod egress_ops;
mod git;
mod interpreter;
mod normalize;
mod pause;
mod pool;
mod ready;
mod recover;
mod scratch;
mod teardown;
mod vm_persist;
mod wasm;
mod wasm_tools;
pub use wasm_tools::{META_TOOLS, tools_from_metadata};
mod watcher;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use airlock_api::v1::{ErrorCode, PauseMode, Sandbox, SandboxState};
use airlock_jail::cgroup::SandboxCgroup;
use airlock_runtime::{LiveSandbox, Runtime, RuntimeError};
use tokio::sync::watch;

use crate::agent::Agent;
use crate::audit::Audit;
use crate::auth;
use crate::config::{Config, ConfigError, LOCK_FILE, prepare_state_dir};
use crate::egress::SandboxEgress;
use crate::error::ApiError;
use crate::metrics::Metrics;
pub use checks::{check_map, check_resources, env_key_ok};
pub use computer::{DEFAULT_RESOLUTION, RESOLUTION_KEY, parse_resolution};
pub use desktop::{CDP_PORT, DESKTOP_DESCRIPTION, DESKTOP_TEMPLATE, DOWNLOADS_DIR};
pub use git::{GitState, META_BRANCH, META_REF, META_URL, workspace_from_metadata};
pub use interpreter::{INTERPRETER_PORT, INTERPRETER_TEMPLATE};
pub(crate) use normalize::{Normalized, image_holder};
pub use wasm::{
    WASM_JS_DESCRIPTION, WASM_JS_TEMPLATE, WASM_PYTHON_DESCRIPTION, WASM_PYTHON_TEMPLATE,
    is_wasm_template,
};

use crate::store::{BASE_TEMPLATE, RowState, SandboxRow, Store, StoreError, now_ms};

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot open the lock file {0}")]
    Lock(PathBuf, #[source] std::io::Error),
    #[error("another airlockd already uses the state directory {0}")]
    Busy(PathBuf),
    #[error("cannot start the sandbox runtime")]
    Runtime(#[source] RuntimeError),
    #[error("--scratch disk: {0}")]
    Storage(String),
    #[error("cannot open the image store")]
    Images(#[source] airlock_image::StoreError),
    #[error(
        "--base-image {0}: not in the daemon's image store (airlock image import/pull into <state>/images, or POST /v1/images/pull)"
    )]
    BaseImage(String, #[source] airlock_image::StoreError),
    #[error("the repository cache: {0}")]
    GitCache(String),
}

/// A running sandbox's in-memory state.
#[derive(Debug)]
struct Live {
    record: LiveSandbox,
    /// The record's cgroup, found at its first use (the watch, which starts beside the create's
    /// answer, not before it): every exec reads its OOM count twice.
    cgroup: OnceLock<SandboxCgroup>,
    /// The egress proxy of a `proxy`-mode sandbox.
    egress: Option<Arc<SandboxEgress>>,
    /// The deadline (Unix ms); the watcher re-arms when it changes. `u64::MAX` stops it.
    deadline: watch::Sender<u64>,
}

impl Live {
    fn new(
        record: LiveSandbox,
        egress: Option<Arc<SandboxEgress>>,
        deadline: watch::Sender<u64>,
    ) -> Live {
        Live {
            record,
            cgroup: OnceLock::new(),
            egress,
            deadline,
        }
    }

    fn cgroup(&self) -> &SandboxCgroup {
        self.cgroup.get_or_init(|| self.record.cgroup())
    }
}

#[derive(Debug, Clone)]
enum SlotState {
    Creating,
    Running(Arc<Live>),
    /// Being paused, resumed or snapshotted: other operations wait their turn (409).
    Busy(Arc<Live>),
    /// Paused; the record is the stopped sandbox's (its helper gone, for `Filesystem`).
    Paused(Arc<Live>, PauseMode),
    Deleting,
}

#[derive(Debug, Clone)]
struct Slot {
    state: SlotState,
    token_hash: String,
}

/// The daemon's core, shared by every request.
#[derive(Debug)]
pub struct Daemon {
    pub config: Config,
    pub store: Arc<Store>,
    pub audit: Audit,
    /// The image store (`<state>/images`): pulls, imports, and what template builds make.
    pub images: airlock_image::ImageStore,
    /// Template builds in progress and their log followers.
    pub builds: crate::templates::Builds,
    pub metrics: Arc<Metrics>,
    runtime: Arc<Runtime>,
    slots: Mutex<HashMap<String, Slot>>,
    /// The repository cache (`lifecycle::git`).
    git: GitState,
    /// Language servers waiting for their WebSocket (`crate::lsp`).
    pub lsp: Arc<crate::lsp::LspSessions>,
    pools: Arc<pool::Pools>,
    /// Deleted sandboxes whose teardown still runs (`lifecycle::teardown`).
    teardowns: Arc<teardown::Teardowns>,
    /// The code interpreter's contexts of wasm sandboxes (`e2b::wasm_interpreter`).
    pub(crate) code_contexts: crate::e2b::wasm_interpreter::CodeContexts,
    /// Held (locked) for the daemon's whole life.
    _lock: File,
}

impl Daemon {
    /// Prepares the state directory, takes its lock, opens the store, finds the runtime and
    /// reconciles what survived the previous daemon. Blocking.
    pub fn open(config: Config) -> Result<Arc<Daemon>, LifecycleError> {
        prepare_state_dir(&config.state_dir)?;
        let lock_path = config.state_dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| LifecycleError::Lock(lock_path.clone(), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LifecycleError::Busy(config.state_dir.clone()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(LifecycleError::Lock(lock_path, e)),
        }
        let store = Arc::new(Store::open(&config.store_path())?);
        let mut runtime = Runtime::new().map_err(LifecycleError::Runtime)?;
        runtime.set_state_dirs(vec![config.state_dir.clone()]);
        runtime
            .set_owner(&owner_tag(&config.state_dir))
            .map_err(LifecycleError::Runtime)?;
        if let Some(storage) = scratch::open_storage(&config)? {
            runtime.set_storage(storage);
        }
        let git = GitState::open(&config.git_cache_dir())?;
        if let Err(err) = runtime.start_zygote() {
            tracing::warn!(
                error = %airlock_runtime::error_chain(&err),
                "no helper zygote: each sandbox's helper is exec'd"
            );
        }
        let metrics = Arc::new(Metrics::new());
        let audit = Audit::new(
            &config.state_dir,
            config.sandboxes_dir(),
            config.audit_max_bytes,
        )
        .counting(metrics.clone());
        let images = airlock_image::ImageStore::open(
            &config.images_dir(),
            airlock_image::StoreOptions::default(),
        )
        .map_err(LifecycleError::Images)?;
        if let Some(base) = &config.base_image {
            images
                .digest_of(base)
                .map_err(|e| LifecycleError::BaseImage(base.clone(), e))?;
        }
        let daemon = Arc::new(Daemon {
            config,
            store,
            audit,
            images,
            builds: crate::templates::Builds::default(),
            metrics,
            runtime: Arc::new(runtime),
            slots: Mutex::new(HashMap::new()),
            git,
            lsp: Arc::default(),
            pools: Arc::default(),
            teardowns: Arc::default(),
            code_contexts: Default::default(),
            _lock: lock,
        });
        Ok(daemon)
    }

    /// Unmounts the disk scratch storage if no sandbox uses it any more (at shutdown).
    pub fn release_storage(&self) {
        if let Some(storage) = self.runtime.storage() {
            storage.release();
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The sandbox runtime (template builds run their steps on it).
    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// What `GET /metrics` reads at a scrape: sandboxes by state.
    pub fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let mut counts: BTreeMap<&'static str, i64> =
            ["creating", "running", "paused", "busy", "deleting"]
                .into_iter()
                .map(|state| (state, 0))
                .collect();
        for slot in self.slots().values() {
            let state = match slot.state {
                SlotState::Creating => "creating",
                SlotState::Running(_) => "running",
                SlotState::Busy(_) => "busy",
                SlotState::Paused(..) => "paused",
                SlotState::Deleting => "deleting",
            };
            *counts.entry(state).or_default() += 1;
        }
        crate::metrics::Snapshot {
            sandboxes: counts
                .into_iter()
                .map(|(state, n)| (state.to_owned(), n))
                .collect(),
            pools: self.pool_gauges(),
            host_networks: self
                .runtime
                .host_networks()
                .map_or((0, 0), |counts| (counts.pooled, counts.made_by_helper)),
        }
    }

    /// A lifecycle event: in the store and in the audit logs.
    pub(crate) fn event(&self, id: Option<&str>, kind: &str, message: &str) {
        let _ = self.store.record_event(id, kind, message);
        self.audit.lifecycle(id, kind, message);
    }

    /// Registers a running sandbox and starts its watcher.
    fn install_running(
        self: &Arc<Self>,
        id: &str,
        token_hash: &str,
        record: LiveSandbox,
        egress: Option<Arc<SandboxEgress>>,
        deadline_ms: u64,
    ) {
        let (deadline, receiver) = watch::channel(deadline_ms);
        let live = Arc::new(Live::new(record, egress, deadline));
        self.slots().insert(
            id.to_owned(),
            Slot {
                state: SlotState::Running(live.clone()),
                token_hash: token_hash.to_owned(),
            },
        );
        tokio::spawn(self.clone().watch(id.to_owned(), live, receiver));
    }

    /// Ends a running sandbox: marks it deleting, destroys it, drops its row, records why.
    /// Returns false if it was not running (unknown, still creating, already ending).
    async fn end(self: &Arc<Self>, id: &str, kind: &str, message: &str) -> bool {
        let live = {
            let mut slots = self.slots();
            let Some(slot) = slots.get_mut(id) else {
                return false;
            };
            let (SlotState::Running(live) | SlotState::Paused(live, _)) = &slot.state else {
                return false;
            };
            let live = live.clone();
            slot.state = SlotState::Deleting;
            live
        };
        live.deadline.send_replace(u64::MAX);
        let _ = self.store.set_state(id, RowState::Deleting);
        // Killed now, so that nothing of it runs once this answers; the rest of the teardown
        // (the kernel's, and what it owned on the host) is awaited by later creates and lists.
        let ending = self.runtime.begin_destroy(&live.record);
        let ticket = self.teardowns.begin();
        let daemon = self.clone();
        let record = live.record.clone();
        let egress = live.egress.clone();
        let owner = id.to_owned();
        tokio::spawn(async move {
            let runtime = daemon.runtime.clone();
            let _ = tokio::task::spawn_blocking(move || {
                runtime.finish_destroy(ending);
                record.reap();
                if let Some(egress) = egress {
                    egress.end();
                }
            })
            .await;
            let _ = daemon.images.release(&image_holder(&owner));
            daemon.teardowns.done(ticket);
        });
        self.audit.close_sandbox(id);
        self.code_contexts.forget_sandbox(id);
        // The event with the row's deletion, in one write: whoever sees the sandbox gone must
        // also find why.
        if self.store.delete_sandbox_noting(id, kind, message).is_err() {
            let _ = self.store.record_event(Some(id), kind, message);
            let _ = self.store.delete_sandbox(id);
        }
        self.audit.lifecycle(Some(id), kind, message);
        self.slots().remove(id);
        true
    }

    /// Returns once the teardowns of every sandbox deleted before the call have ended: its
    /// processes, cgroup, volume and directory are gone.
    pub async fn torn_down(&self) {
        self.teardowns.settled().await;
    }

    /// A listed sandbox (creating or running), or 404.
    pub fn get(&self, id: &str) -> Result<Sandbox, ApiError> {
        match self.store.get_sandbox(id)? {
            Some(row) if row.state != RowState::Deleting => Ok(view(&row)),
            _ => Err(ApiError::no_sandbox(id)),
        }
    }

    /// Sandboxes in `states` (all listed states when empty) whose metadata has every pair.
    pub fn list(
        &self,
        states: &[SandboxState],
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<Sandbox>, ApiError> {
        Ok(self
            .store
            .list_sandboxes()?
            .into_iter()
            .filter(|row| row.state != RowState::Deleting)
            .map(|row| view(&row))
            .filter(|s| states.is_empty() || states.contains(&s.state))
            .filter(|s| metadata.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
            .collect())
    }

    /// Deletes a running or paused sandbox (a paused one is never resumed to be deleted);
    /// 409 while it is still being created or in a transition.
    pub async fn delete(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        if let Err(err) = self.running(id)
            && err.code != ErrorCode::SandboxPaused
        {
            return Err(err);
        }
        if self.end(id, "delete", "deleted through the API").await {
            Ok(())
        } else {
            Err(ApiError::no_sandbox(id))
        }
    }

    /// Moves a running sandbox's deadline to `timeout_ms` from now.
    pub fn set_timeout(&self, id: &str, timeout_ms: u64) -> Result<Sandbox, ApiError> {
        self.check_timeout(timeout_ms)?;
        let live = self.running(id)?;
        let deadline_ms = now_ms().saturating_add(timeout_ms);
        if !self.store.set_deadline(id, deadline_ms)? {
            return Err(ApiError::no_sandbox(id));
        }
        live.deadline.send_replace(deadline_ms);
        self.event(Some(id), "timeout_set", &format!("ends in {timeout_ms} ms"));
        self.get(id)
    }

    /// `err`, an agent's failure during a request for sandbox `id`, or what it really was: the
    /// sandbox being removed (409 `sandbox_stopping`) or gone (404) by the time it failed.
    pub fn agent_failure(&self, id: &str, err: ApiError) -> ApiError {
        match self.running(id) {
            Err(state)
                if matches!(state.code, ErrorCode::SandboxStopping | ErrorCode::NotFound) =>
            {
                state
            }
            _ => err,
        }
    }

    fn running(&self, id: &str) -> Result<Arc<Live>, ApiError> {
        running_in(id, self.slots().get(id).map(|slot| &slot.state))
    }

    /// The agent of a running sandbox. A paused one created with `lifecycle.auto_resume` is
    /// resumed first (a data-plane request is its cue).
    pub async fn agent(self: &Arc<Self>, id: &str) -> Result<Agent, ApiError> {
        match self.running(id) {
            Err(err) if err.code == ErrorCode::SandboxPaused => {
                let Some(lifetime_ms) = self.auto_resumes(id) else {
                    return Err(err);
                };
                self.resume(id, Some(lifetime_ms)).await?;
                Ok(Agent::new(&self.running(id)?.record.socket))
            }
            other => Ok(Agent::new(&other?.record.socket)),
        }
    }

    /// How many workload processes of a running sandbox the OOM killer has ended so far.
    pub fn oom_kills(&self, id: &str) -> Result<u64, ApiError> {
        Ok(self.running(id)?.cgroup().workload_oom_kills())
    }

    /// A running sandbox's runtime record (the Judge0 API steers its workload through it).
    pub fn live_record(&self, id: &str) -> Result<LiveSandbox, ApiError> {
        Ok(self.running(id)?.record.clone())
    }

    /// The stored hash of a sandbox's access token, if the daemon knows the sandbox.
    pub fn token_hash(&self, id: &str) -> Option<String> {
        self.slots().get(id).map(|slot| slot.token_hash.clone())
    }

    /// The environment every command of the sandbox gets (from its create request).
    pub fn sandbox_env(&self, id: &str) -> Result<BTreeMap<String, String>, ApiError> {
        let mut env = self
            .store
            .get_sandbox(id)?
            .map(|row| row.request.env)
            .unwrap_or_default();
        // The current credentials' placeholders win, as they do in the agent's environment.
        if let Ok(live) = self.running(id)
            && let Some(egress) = &live.egress
        {
            env.extend(egress.environment());
        }
        Ok(env)
    }

    /// The sandbox's events and the tail of its agent's log. Events outlive the sandbox.
    pub fn logs(&self, id: &str) -> Result<(Vec<airlock_api::v1::Event>, String), ApiError> {
        let events = self.store.events(Some(id), 1000)?;
        let agent_log = match self.slots().get(id).map(|slot| &slot.state) {
            Some(SlotState::Running(live)) => live.record.agent_log(64 << 10).unwrap_or_default(),
            _ => String::new(),
        };
        if events.is_empty() && agent_log.is_empty() && self.token_hash(id).is_none() {
            return Err(ApiError::no_sandbox(id));
        }
        Ok((events, agent_log))
    }
}

/// Tags this daemon's sandboxes (their cgroups) by its state directory, so that daemons
/// sharing a host never sweep each other's.
fn owner_tag(state_dir: &std::path::Path) -> String {
    let canonical = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    auth::hash_secret(&canonical.to_string_lossy())[..12].to_owned()
}

/// A running sandbox's state, or the error its slot's state means (no lock taken: callers
/// that hold the slots' lock use this directly).
fn running_in(id: &str, state: Option<&SlotState>) -> Result<Arc<Live>, ApiError> {
    match state {
        Some(SlotState::Running(live)) => Ok(live.clone()),
        Some(SlotState::Creating) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("sandbox {id} is still being created"),
        )),
        Some(SlotState::Deleting) => Err(ApiError::new(
            ErrorCode::SandboxStopping,
            format!("sandbox {id} is being removed"),
        )),
        Some(SlotState::Busy(_)) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("sandbox {id} is being paused, resumed or snapshotted; try again"),
        )),
        Some(SlotState::Paused(..)) => Err(ApiError::new(
            ErrorCode::SandboxPaused,
            format!("sandbox {id} is paused; resume it first"),
        )),
        None => Err(ApiError::no_sandbox(id)),
    }
}

fn row_state(state: RowState) -> SandboxState {
    match state {
        RowState::Creating | RowState::Committing => SandboxState::Creating,
        RowState::Running | RowState::Deleting => SandboxState::Running,
        RowState::Paused => SandboxState::Paused,
    }
}

fn view(row: &SandboxRow) -> Sandbox {
    // A paused sandbox's clock stands still: it has what it had left, from now.
    let expires_at_ms = match &row.pause {
        Some(pause) => now_ms().saturating_add(pause.remaining_ms),
        None => row.deadline_ms,
    };
    Sandbox {
        id: row.id.clone(),
        state: row_state(row.state),
        pause_mode: row.pause.map(|pause| pause.mode),
        lifecycle: row.request.lifecycle,
        tier: row.request.tier,
        image: row.request.image.clone(),
        template: row
            .request
            .template
            .clone()
            .unwrap_or_else(|| BASE_TEMPLATE.to_owned()),
        resources: row.request.resources,
        workspace: row.request.workspace.clone(),
        metadata: row.request.metadata.clone(),
        created_at_ms: row.created_ms,
        expires_at_ms,
        pool: false,
    }
}

fn runtime_error(err: &RuntimeError) -> ApiError {
    let code = match err {
        RuntimeError::TierUnavailable { .. }
        | RuntimeError::WorkspaceMissing(_)
        | RuntimeError::RootfsMissing(_)
        | RuntimeError::BindMissing(_)
        | RuntimeError::Compile(_) => ErrorCode::Unprocessable,
        _ => ErrorCode::Internal,
    };
    ApiError::from_chain(code, err)
}
