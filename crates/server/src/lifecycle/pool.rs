//! Warm pools: per template, sandboxes started ahead of time whose agents already serve, so
//! that a create for the template only has to claim one.
//!
//! A member is a sandbox started exactly as a cold create of the bare template would start it
//! (its image attached, its start command run and its ready check passed), but never committed
//! and never stored: it dies with this daemon (its helper sees the control
//! pipe close), and the next daemon's orphan sweep removes what it left. A claim hands it to
//! one create, once: the agent takes the create's environment for every process it starts
//! (`POST /airlock/claim`), the row is inserted as running with the create's metadata,
//! timeout and a new access token, and only then is the sandbox committed. Its id was made when
//! it was started and is first shown by the create that claims it.
//!
//! A create is served from the pool only when it asks for nothing the member lacks: after
//! normalizing, its request must equal the bare template's but for `env`, `metadata`,
//! `timeout_ms` and `lifecycle`, which a claim applies. Anything else (resources, a policy, a
//! workspace, a tier) goes cold. Members count against `--max-sandboxes`; a cold create that
//! finds the daemon full evicts one instead of failing.
//!
//! Fillers (`--pool-fill-concurrency`, one by default) start one member at a time, and none
//! while a create (cold, or a claim) is in flight, so that refilling never competes with a
//! user's create.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_api::SandboxConfig;
use airlock_api::v1::{
    CreateSandboxRequest, CreateSandboxResponse, ErrorCode, MAX_POOL_SIZE, PoolStatus, Sandbox,
};
use airlock_policy::Policy;
use airlock_runtime::{LiveSpec, Pending, VolumeSource};

mod key;
mod vm_shell;

use key::{bare_request, pool_key};

use super::normalize::image_holder;
use super::{Daemon, Slot, SlotState, runtime_error};
use crate::agent::Agent;
use crate::auth;
use crate::egress::{SandboxEgress, proxy_plan};
use crate::error::ApiError;
use crate::store::{RowState, SandboxRow, now_ms};

/// How often idle fillers look again without being woken (a backoff ending, a cold create
/// finishing elsewhere).
const RECHECK: Duration = Duration::from_millis(250);
/// The longest wait after failed fills of one pool.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a stopping daemon waits for the sandboxes it is still starting.
const STOP_WAIT: Duration = Duration::from_secs(15);

/// Every template's pool.
#[derive(Debug, Default)]
pub(super) struct Pools {
    inner: Mutex<BTreeMap<String, Pool>>,
    wake: tokio::sync::Notify,
    /// Creates in flight (cold ones and claims): fills wait while there are any.
    creates_in_flight: AtomicUsize,
    /// Members being destroyed now.
    destroying: AtomicUsize,
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct Pool {
    size: u32,
    ready: VecDeque<Member>,
    starting: u32,
    claims_total: u64,
    /// The bare template's request key at the last fill; members with another are stale.
    key: Option<String>,
    last_error: Option<String>,
    failures: u32,
    no_fill_before: Option<Instant>,
}

/// A started, unclaimed sandbox.
#[derive(Debug)]
struct Member {
    id: String,
    /// The bare template's normalized request, and its [`pool_key`].
    request: CreateSandboxRequest,
    key: String,
    dir: PathBuf,
    pending: Pending,
    egress: Option<Arc<SandboxEgress>>,
    warnings: Vec<String>,
    started_ms: u64,
    /// Set for a pre-created VM shell of a microvm snapshot ([`vm_shell`]).
    shell: Option<vm_shell::ShellMember>,
}

/// Counts a create in flight (cold, or a claim) until it ends, however it ends.
pub(super) struct CreateInFlight<'a>(&'a Pools);

impl Drop for CreateInFlight<'_> {
    fn drop(&mut self) {
        self.0.creates_in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.wake.notify_waiters();
    }
}

impl Pools {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Pool>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Members and creates being started now, and members being destroyed.
    fn busy(&self) -> usize {
        let members: usize = self
            .lock()
            .values()
            .map(|pool| pool.starting as usize)
            .sum();
        members
            + self.creates_in_flight.load(Ordering::SeqCst)
            + self.destroying.load(Ordering::SeqCst)
    }

    /// Members ready or starting, in every pool: what they hold of `--max-sandboxes`.
    pub(super) fn members(&self) -> usize {
        self.lock()
            .values()
            .map(|pool| pool.ready.len() + pool.starting as usize)
            .sum()
    }

    pub(super) fn create_in_flight(&self) -> CreateInFlight<'_> {
        self.creates_in_flight.fetch_add(1, Ordering::SeqCst);
        CreateInFlight(self)
    }

    /// Removes one ready member (of the pool with the most) to make room for a cold create.
    fn evict_one(&self) -> Option<Member> {
        let mut pools = self.lock();
        let pool = pools.values_mut().max_by_key(|pool| pool.ready.len())?;
        pool.ready.pop_back()
    }

    /// The template whose pool most needs a member, reserving its start; None when nothing
    /// is to be filled now.
    fn reserve_fill(&self, room: usize) -> Option<String> {
        if room == 0
            || self.creates_in_flight.load(Ordering::SeqCst) > 0
            || self.closed.load(Ordering::SeqCst)
        {
            return None;
        }
        let now = Instant::now();
        let mut pools = self.lock();
        let (template, pool) = pools
            .iter_mut()
            .filter(|(_, pool)| pool.no_fill_before.is_none_or(|at| at <= now))
            .map(|(template, pool)| {
                let have = pool.ready.len() + pool.starting as usize;
                let missing = (pool.size as usize).saturating_sub(have);
                (template, pool, missing)
            })
            .filter(|(_, _, missing)| *missing > 0)
            .max_by_key(|(_, _, missing)| *missing)
            .map(|(template, pool, _)| (template, pool))?;
        pool.starting += 1;
        Some(template.clone())
    }
}

impl Daemon {
    /// Loads the stored pools and the `--warm-pool` ones (which are stored too), and starts
    /// the fillers. Call once, after `recover`, inside the async runtime.
    pub fn start_pools(self: &Arc<Self>) {
        let mut sizes: BTreeMap<String, u32> = match self.store.list_pools() {
            Ok(pools) => pools.into_iter().collect(),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the stored warm pools");
                BTreeMap::new()
            }
        };
        for (template, size) in &self.config.warm_pools {
            let template = match self.check_pool(template, *size) {
                Ok(name) => name,
                Err(err) => {
                    tracing::warn!(template, error = %err.message, "--warm-pool ignored");
                    continue;
                }
            };
            if let Err(err) = self.store.set_pool(&template, *size) {
                tracing::warn!(template, error = %err, "cannot store the warm pool");
            }
            sizes.insert(template, *size);
        }
        {
            let mut pools = self.pools.lock();
            for (template, size) in sizes.into_iter().filter(|(_, size)| *size > 0) {
                tracing::info!(template, size, "warm pool");
                pools.entry(template).or_default().size = size;
            }
        }
        for _ in 0..self.config.pool_fill_concurrency.max(1) {
            tokio::spawn(self.clone().fill());
        }
    }

    /// The name pools know `template` by: the one a create's request is normalized to
    /// (`name` finds `name:latest`).
    fn pool_name(&self, template: &str) -> Result<String, ApiError> {
        if let Some(snapshot) = self.vm_snapshot_pool(template)? {
            return Ok(snapshot);
        }
        match self.find_template(template)? {
            Some(found) => Ok(found.name),
            None => Err(ApiError::new(
                ErrorCode::NotFound,
                format!("no template {template:?} (GET /v1/templates lists them)"),
            )),
        }
    }

    /// Whether `template` may have a pool of `size`; its pool name if so.
    fn check_pool(&self, template: &str, size: u32) -> Result<String, ApiError> {
        let template = self.pool_name(template)?;
        let most = MAX_POOL_SIZE.min(u32::try_from(self.config.max_sandboxes).unwrap_or(u32::MAX));
        if size > most {
            return Err(ApiError::unprocessable(format!(
                "size {size} is more than a pool may hold here ({most}: at most {MAX_POOL_SIZE}, and at most --max-sandboxes)"
            )));
        }
        if size > 0 {
            // The template must start as it is: refuse now what every fill would fail on.
            let normalized = self.normalize(bare_request(&template))?;
            if matches!(normalized.volume, VolumeSource::Snapshot(_)) {
                Self::check_shell_template(&normalized.template)?;
            }
        }
        Ok(template)
    }

    /// `GET /v1/templates/{name}/pool`.
    pub fn pool_status(&self, template: &str) -> Result<PoolStatus, ApiError> {
        let template = self.pool_name(template)?;
        let pools = self.pools.lock();
        let pool = pools.get(&template);
        Ok(PoolStatus {
            template: template.clone(),
            size: pool.map_or(0, |pool| pool.size),
            ready: pool.map_or(0, |pool| {
                u32::try_from(pool.ready.len()).unwrap_or(u32::MAX)
            }),
            starting: pool.map_or(0, |pool| pool.starting),
            claims_total: pool.map_or(0, |pool| pool.claims_total),
            last_error: pool.and_then(|pool| pool.last_error.clone()),
        })
    }

    /// `PUT /v1/templates/{name}/pool`: the new size, stored; a smaller pool's extra members
    /// are destroyed, a larger one fills in the background.
    pub async fn set_pool(
        self: &Arc<Self>,
        template: &str,
        size: u32,
    ) -> Result<PoolStatus, ApiError> {
        let template = self.check_pool(template, size)?;
        let template = template.as_str();
        self.store.set_pool(template, size)?;
        let extra: Vec<Member> = {
            let mut pools = self.pools.lock();
            let pool = pools.entry(template.to_owned()).or_default();
            pool.size = size;
            pool.failures = 0;
            pool.no_fill_before = None;
            pool.last_error = None;
            let keep = size as usize;
            let extra = if pool.ready.len() > keep {
                pool.ready.split_off(keep)
            } else {
                VecDeque::new()
            };
            extra.into()
        };
        self.event(
            None,
            "pool",
            &format!("template {template}: warm pool size {size}"),
        );
        self.destroy_members(extra).await;
        self.pools.wake.notify_waiters();
        self.pool_status(template)
    }

    /// Unclaimed members, for `GET /v1/sandboxes?include=pool`.
    pub fn pool_views(&self) -> Vec<Sandbox> {
        let pools = self.pools.lock();
        pools
            .iter()
            .flat_map(|(template, pool)| pool.ready.iter().map(move |m| (template, m)))
            .map(|(_, member)| {
                let row = SandboxRow {
                    id: member.id.clone(),
                    state: RowState::Running,
                    request: member.request.clone(),
                    token_hash: String::new(),
                    live: None,
                    created_ms: member.started_ms,
                    deadline_ms: 0,
                    egress: None,
                    pause: None,
                };
                Sandbox {
                    pool: true,
                    ..super::view(&row)
                }
            })
            .collect()
    }

    /// Per pool: (template, ready, size), for `/metrics`.
    pub(super) fn pool_gauges(&self) -> Vec<(String, i64, i64)> {
        self.pools
            .lock()
            .iter()
            .map(|(template, pool)| {
                let ready = i64::try_from(pool.ready.len()).unwrap_or(i64::MAX);
                (template.clone(), ready, i64::from(pool.size))
            })
            .collect()
    }

    /// Stops the fillers, waits (at most [`STOP_WAIT`]) for the members and creates still
    /// starting, and destroys every member (a daemon's graceful stop). A start cut short by
    /// the process's exit would leave its cgroup behind, with no record for a later daemon.
    pub async fn stop_pools(&self) {
        self.pools.closed.store(true, Ordering::SeqCst);
        self.pools.wake.notify_waiters();
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        while self.pools.busy() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let members: Vec<Member> = self
            .pools
            .lock()
            .values_mut()
            .flat_map(|pool| pool.ready.drain(..))
            .collect();
        self.destroy_members(members).await;
    }

    /// Makes room for a cold create when pool members hold the last places: evicts one.
    /// Returns whether there is room.
    pub(super) async fn room_for_cold_create(&self) -> bool {
        let used = self.slots().len() + self.pools.members();
        if used < self.config.max_sandboxes {
            return true;
        }
        match self.pools.evict_one() {
            Some(member) => {
                self.destroy_members(vec![member]).await;
                true
            }
            None => false,
        }
    }

    async fn destroy_members(&self, members: Vec<Member>) {
        if members.is_empty() {
            return;
        }
        // Spawned at once: it runs to its end even if this future is dropped.
        let _ = tokio::task::spawn_blocking(self.destroyer(members)).await;
    }

    /// The blocking work that destroys unclaimed `members`, counted as destroying from now
    /// until it ends. A member with an egress proxy has its audit log open (the proxy opened
    /// it): closed here.
    fn destroyer(&self, members: Vec<Member>) -> impl FnOnce() + Send + 'static {
        for member in &members {
            self.audit.close_sandbox(&member.id);
        }
        let images = self.images.clone();
        let pools = self.pools.clone();
        pools.destroying.fetch_add(1, Ordering::SeqCst);
        move || {
            members
                .into_iter()
                .for_each(|member| destroy(&images, member));
            pools.destroying.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A create served from pool `pool` (its template's, or its microvm snapshot's), or None
    /// (no pool, none ready, a request the pool cannot serve, or a member that failed its
    /// claim: the create goes cold).
    pub(super) async fn claim_from_pool(
        self: &Arc<Self>,
        pool: &str,
        request: &CreateSandboxRequest,
    ) -> Option<CreateSandboxResponse> {
        let template = request.template.as_deref()?;
        // A member's interpreter runs already, with no env: kernels would miss the create's.
        if template == super::INTERPRETER_TEMPLATE && !request.env.is_empty() {
            return None;
        }
        // A wasm sandbox's worker starts with the create's policy mapped to preopens: cold.
        if super::is_wasm_template(template) {
            return None;
        }
        let key = pool_key(request);
        // No refill competes with the claim for the CPU; the guard wakes the fillers after.
        let _claiming = self.pools.create_in_flight();
        let (member, stale) = {
            let mut pools = self.pools.lock();
            let pool = pools.get_mut(pool)?;
            if pool.key.as_deref() != Some(key.as_str()) {
                return None;
            }
            let mut stale = Vec::new();
            let mut found = None;
            while let Some(member) = pool.ready.pop_front() {
                if member.key == key {
                    found = Some(member);
                    break;
                }
                stale.push(member);
            }
            (found, stale)
        };
        self.destroy_members(stale).await;
        let member = member?;
        // The member's place in --max-sandboxes passes to its slot with no gap.
        let id = member.id.clone();
        let token =
            auth::new_access_token().map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e));
        let token = match token {
            Ok(token) => token,
            Err(err) => {
                tracing::warn!(error = %err.message, "no access token for a pool claim");
                self.destroy_members(vec![member]).await;
                return None;
            }
        };
        let token_hash = auth::hash_secret(&token);
        self.slots().insert(
            id.clone(),
            Slot {
                state: SlotState::Creating,
                token_hash: token_hash.clone(),
            },
        );
        let warm_display = template == super::DESKTOP_TEMPLATE;
        match self.claim(pool, member, request, &token_hash).await {
            Ok(sandbox) => {
                if warm_display {
                    // Its display answered as it started: the first action skips the probe.
                    super::computer::note_display_up(&id);
                }
                if let Some(pool) = self.pools.lock().get_mut(pool) {
                    pool.claims_total += 1;
                }
                self.metrics.pool_claim(pool);
                Some(CreateSandboxResponse {
                    sandbox,
                    access_token: token,
                })
            }
            Err(err) => {
                self.slots().remove(&id);
                tracing::warn!(
                    sandbox_id = %id,
                    pool,
                    error = %err.message,
                    "a warm pool's sandbox could not be claimed; the create goes cold"
                );
                None
            }
        }
    }

    /// Applies the create to the member (a VM shell restored first), stores it as running,
    /// commits it.
    async fn claim(
        self: &Arc<Self>,
        pool: &str,
        member: Member,
        request: &CreateSandboxRequest,
        token_hash: &str,
    ) -> Result<Sandbox, ApiError> {
        let (member, created) = if member.pending.is_vm_shell() {
            let (member, took) = self.restore_member(member).await?;
            (member, vm_shell::claimed_event(pool, took))
        } else {
            let created = format!(
                "template {}, claimed from its warm pool",
                request.template.as_deref().unwrap_or_default()
            );
            (member, created)
        };
        if let Err(err) = Agent::new(&member.pending.record().socket)
            .claim(&request.env)
            .await
        {
            self.destroy_members(vec![member]).await;
            return Err(err);
        }
        let Member {
            id,
            pending,
            egress,
            warnings,
            dir,
            ..
        } = member;
        let now = now_ms();
        let timeout_ms = request.timeout_ms.unwrap_or(self.config.default_timeout_ms);
        let row = SandboxRow {
            id: id.clone(),
            state: RowState::Running,
            request: request.clone(),
            token_hash: token_hash.to_owned(),
            live: serde_json::to_string(pending.record()).ok(),
            created_ms: now,
            deadline_ms: now.saturating_add(timeout_ms),
            egress: egress.as_ref().map(|egress| egress.stored().to_json()),
            pause: None,
        };
        let ready = "the sandbox's agent serves";
        let mut events = vec![("create", created.as_str())];
        events.extend(warnings.iter().map(|w| ("warning", w.as_str())));
        events.push(("ready", ready));
        let fail = |err: ApiError, pending: Option<Pending>| {
            drop(pending);
            if let Some(egress) = &egress {
                egress.end();
            }
            let _ = self.store.delete_sandbox(&id);
            let _ = std::fs::remove_dir_all(&dir);
            err
        };
        if let Err(err) = self.store.insert_sandbox_noting(&row, &events) {
            return Err(fail(err.into(), Some(pending)));
        }
        self.audit.open_sandbox(&id);
        self.audit.lifecycle(Some(&id), "create", &created);
        self.audit.lifecycle(Some(&id), "ready", ready);
        let record = pending.record().clone();
        match pending.commit() {
            Ok(record) => {
                self.install_running(&id, token_hash, record, egress.clone(), row.deadline_ms);
                Ok(super::view(&row))
            }
            Err(err) => {
                self.runtime.destroy(&record);
                self.audit.close_sandbox(&id);
                self.event(Some(&id), "create_failed", &err.to_string());
                Err(fail(runtime_error(&err), None))
            }
        }
    }

    /// One filler: starts members while pools miss some, one at a time.
    async fn fill(self: Arc<Self>) {
        loop {
            let mut woken = pin!(self.pools.wake.notified());
            woken.as_mut().enable();
            if self.pools.closed.load(Ordering::SeqCst) {
                return;
            }
            let room = self.config.max_sandboxes.saturating_sub(
                self.slots().len() + self.pools.members() + self.teardowns.running(),
            );
            let Some(template) = self.pools.reserve_fill(room) else {
                let _ = tokio::time::timeout(RECHECK, woken).await;
                continue;
            };
            let started = self.start_member(&template).await;
            self.filled(&template, started).await;
        }
    }

    /// Records a fill's outcome in its pool.
    async fn filled(&self, template: &str, started: Result<Member, ApiError>) {
        let unwanted = {
            let mut pools = self.pools.lock();
            let Some(pool) = pools.get_mut(template) else {
                return;
            };
            pool.starting = pool.starting.saturating_sub(1);
            let mut unwanted = Vec::new();
            match started {
                Ok(member) => {
                    pool.failures = 0;
                    pool.last_error = None;
                    pool.no_fill_before = None;
                    // A template that changed leaves members of its old form behind.
                    if pool.key.as_deref() != Some(member.key.as_str()) {
                        pool.key = Some(member.key.clone());
                        let (keep, stale): (VecDeque<Member>, VecDeque<Member>) =
                            pool.ready.drain(..).partition(|old| old.key == member.key);
                        pool.ready = keep;
                        unwanted = stale.into();
                    }
                    if pool.ready.len() < pool.size as usize
                        && !self.pools.closed.load(Ordering::SeqCst)
                    {
                        pool.ready.push_back(member);
                    } else {
                        unwanted.push(member);
                    }
                }
                Err(err) => {
                    pool.failures = pool.failures.saturating_add(1);
                    let backoff = Duration::from_millis(100)
                        .saturating_mul(1 << pool.failures.min(9))
                        .min(MAX_BACKOFF);
                    pool.no_fill_before = Some(Instant::now() + backoff);
                    tracing::warn!(template, error = %err.message, backoff_ms = backoff.as_millis(), "a warm pool's fill failed");
                    pool.last_error = Some(err.message);
                }
            }
            unwanted
        };
        self.destroy_members(unwanted).await;
    }

    /// Starts a member of `template`'s pool.
    async fn start_member(self: &Arc<Self>, template: &str) -> Result<Member, ApiError> {
        let super::Normalized {
            request,
            config,
            volume,
            template,
            user,
        } = self.normalize(bare_request(template))?;
        let vm_snapshot = match volume {
            VolumeSource::Empty => None,
            VolumeSource::Snapshot(snapshot) if config.tier == airlock_api::Tier::Microvm => {
                Self::check_shell_template(&template)?;
                Some(snapshot)
            }
            _ => {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!(
                        "{template:?} names a snapshot too; warm pools hold templates and microvm snapshots only"
                    ),
                ));
            }
        };
        let daemon = self.clone();
        let (mut member, cwd) = tokio::task::spawn_blocking(move || {
            daemon.start_member_blocking(request, config, user, vm_snapshot)
        })
        .await
        .unwrap_or_else(|join| Err(ApiError::internal(format!("the fill task failed: {join}"))))?;
        if member.pending.is_vm_shell() {
            // Its guest runs at the claim: so does the template's start command.
            member.shell = Some(vm_shell::ShellMember { template, cwd });
            return Ok(member);
        }
        // The template's start command runs as the member starts, as it would at a create; the
        // claim's environment reaches the processes started after it.
        let socket = member.pending.record().socket.clone();
        if let Err(err) = self
            .start_template_at(&member.id, &socket, &template, &cwd)
            .await
        {
            self.destroy_members(vec![member]).await;
            return Err(err);
        }
        if template.name == super::INTERPRETER_TEMPLATE {
            // A member's kernel is warm before any claim: the point of its pool.
            let agent = Agent::new(&socket);
            let started = super::interpreter::start_in(&agent, &BTreeMap::new(), || true).await;
            if let Err(err) = started {
                self.destroy_members(vec![member]).await;
                return Err(match err {
                    super::interpreter::StartError::Failed(err) => err,
                    super::interpreter::StartError::Gone => {
                        ApiError::internal("the pool's sandbox ended while its interpreter started")
                    }
                });
            }
        }
        if template.builtin && template.name == super::DESKTOP_TEMPLATE {
            // Its display and XFCE session are up before any claim (lifecycle/desktop_warm.rs).
            let agent = Agent::new(&socket);
            let env = member.request.env.clone();
            if let Err(err) = super::desktop_warm::start_warm_display(&agent, &env).await {
                self.destroy_members(vec![member]).await;
                return Err(err);
            }
        }
        Ok(member)
    }

    fn start_member_blocking(
        &self,
        request: CreateSandboxRequest,
        mut config: SandboxConfig,
        user: Option<airlock_api::UserSpec>,
        vm_snapshot: Option<String>,
    ) -> Result<(Member, String), ApiError> {
        let key = pool_key(&request);
        let id =
            auth::new_sandbox_id().map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let dir = self.config.sandboxes_dir().join(&id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
        // Whatever fails from here leaves nothing: no lease, no directory, no proxy.
        let abandon = |err: ApiError, egress: Option<&SandboxEgress>| {
            if let Some(egress) = egress {
                egress.end();
                // Its proxy opened the member's audit log.
                self.audit.close_sandbox(&id);
            }
            let _ = self.images.release(&image_holder(&id));
            let _ = std::fs::remove_dir_all(&dir);
            err
        };
        // A fork's directory, as a cold fork's create makes it (`create_blocking`).
        if let Some(snapshot) = &vm_snapshot
            && let Err(err) = self.prepare_vm_fork(snapshot, &dir)
        {
            return Err(abandon(err, None));
        }
        if let Some(digest) = &request.image
            && let Err(err) = self.attach_image(&mut config, digest, user, &id)
        {
            return Err(abandon(err, None));
        }
        let cwd = config.cwd.clone();
        let egress = match config.policy.as_deref().map(Policy::from_document) {
            Some(Ok(policy)) if proxy_plan(&policy).is_some() => Some(
                self.launch_egress(&id, &dir, policy)
                    .map_err(|e| abandon(e, None))?,
            ),
            Some(Err(err)) => {
                let err = ApiError::unprocessable(format!("invalid policy: {err}"));
                return Err(abandon(err, None));
            }
            _ => None,
        };
        let spec = LiveSpec {
            id: id.clone(),
            dir: dir.clone(),
            config,
            volume: VolumeSource::Empty,
            vm_shell: vm_snapshot.is_some(),
        };
        let pending = self
            .create_live(&spec, egress.as_deref())
            .map_err(|err| abandon(runtime_error(&err), egress.as_deref()))?;
        let member = Member {
            warnings: pending.warnings().to_vec(),
            id: id.clone(),
            request,
            key,
            dir: dir.clone(),
            pending,
            egress,
            started_ms: now_ms(),
            shell: None,
        };
        Ok((member, cwd))
    }
}

/// Ends an unclaimed member and removes everything it had, its image lease included.
fn destroy(images: &airlock_image::ImageStore, member: Member) {
    let Member {
        id,
        pending,
        egress,
        dir,
        ..
    } = member;
    drop(pending);
    if let Some(egress) = egress {
        egress.end();
    }
    let _ = images.release(&image_holder(&id));
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(test)]
mod tests;
