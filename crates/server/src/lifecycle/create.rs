//! The create path: a claim from a warm pool, or steps 1 to 4 of the parent module's docs.

use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;

use airlock_api::SandboxConfig;
use airlock_api::v1::{CreateSandboxRequest, CreateSandboxResponse, ErrorCode};
use airlock_policy::Policy;
use airlock_runtime::{LiveSandbox, LiveSpec, VolumeSource};

use super::{
    Daemon, INTERPRETER_TEMPLATE, Normalized, Slot, SlotState, git, image_holder, runtime_error,
    view, wasm, wasm_tools,
};
use crate::auth;
use crate::egress::{SandboxEgress, proxy_plan};
use crate::error::ApiError;
use crate::metrics::CreateSource;
use crate::store::{BASE_TEMPLATE, RowState, SandboxRow, now_ms};

impl Daemon {
    /// Creates a sandbox and returns once it is usable.
    pub async fn create(
        self: &Arc<Self>,
        request: CreateSandboxRequest,
    ) -> Result<CreateSandboxResponse, ApiError> {
        let started_at = std::time::Instant::now();
        // Sandboxes still being torn down count against the limit until they are gone.
        if self.slots().len() + self.pools.members() + self.teardowns.running()
            >= self.config.max_sandboxes
        {
            self.torn_down().await;
        }
        let result = self.create_counted(request).await;
        let (source, ok) = match &result {
            Ok((_, source)) => (*source, true),
            Err((_, source)) => (*source, false),
        };
        self.metrics
            .create(source, ok, started_at.elapsed().as_secs_f64());
        result.map(|(response, _)| response).map_err(|(err, _)| err)
    }

    async fn create_counted(
        self: &Arc<Self>,
        request: CreateSandboxRequest,
    ) -> Result<(CreateSandboxResponse, CreateSource), (ApiError, CreateSource)> {
        let source = CreateSource::Cold;
        if request.image.is_some() && request.template.is_some() {
            return Err((
                ApiError::unprocessable(
                    "give an image or a template, not both (a template built from an image brings it)",
                ),
                source,
            ));
        }
        let normalized = self.normalize(request).map_err(|e| (e, source))?;
        let pool = Self::pool_for(
            &normalized.volume,
            normalized.config.tier,
            normalized.request.template.as_deref(),
        );
        if let Some(pool) = pool
            && let Some(created) = self.claim_from_pool(&pool, &normalized.request).await
        {
            return Ok((created, CreateSource::Pool));
        }
        let source = match normalized.volume {
            VolumeSource::Empty => CreateSource::Cold,
            _ => CreateSource::Snapshot,
        };
        // Pools refill only while no cold create waits.
        let _cold = self.pools.create_in_flight();
        if !self.room_for_cold_create().await {
            return Err((self.capacity_error(), source));
        }
        self.create_normalized(normalized)
            .await
            .map(|response| (response, source))
            .map_err(|err| (err, source))
    }

    async fn create_normalized(
        self: &Arc<Self>,
        normalized: Normalized,
    ) -> Result<CreateSandboxResponse, ApiError> {
        let Normalized {
            mut request,
            mut config,
            volume,
            template,
            user,
        } = normalized;
        // The wasm tier refuses what it cannot honour before anything starts.
        let wasm_preopens = if wasm::is_wasm_template(&template.name) {
            Some(wasm::preopens(request.policy.as_deref()).map_err(ApiError::unprocessable)?)
        } else {
            None
        };
        wasm_tools::check_tools(&request, wasm_preopens.is_some(), |id| {
            self.store.get_sandbox(id).ok().flatten().is_some()
        })
        .map_err(ApiError::unprocessable)?;
        let id =
            auth::new_sandbox_id().map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let git = self.prepare_git(&id, &mut request, &mut config, &volume)?;
        let token =
            auth::new_access_token().map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let token_hash = auth::hash_secret(&token);
        {
            let mut slots = self.slots();
            if slots.len() + self.pools.members() >= self.config.max_sandboxes {
                return Err(self.capacity_error());
            }
            slots.insert(
                id.clone(),
                Slot {
                    state: SlotState::Creating,
                    token_hash: token_hash.clone(),
                },
            );
        }
        let timeout_ms = request.timeout_ms.unwrap_or(self.config.default_timeout_ms);
        let row = SandboxRow {
            id: id.clone(),
            state: RowState::Creating,
            request,
            token_hash: token_hash.clone(),
            live: None,
            created_ms: now_ms(),
            deadline_ms: now_ms().saturating_add(timeout_ms),
            egress: None,
            pause: None,
        };
        let daemon = self.clone();
        let started = tokio::task::spawn_blocking(move || {
            daemon.create_blocking(row, config, user, timeout_ms, volume, git)
        })
        .await;
        let started = match started {
            Ok(result) => result,
            Err(join) => Err(ApiError::internal(format!(
                "the create task failed: {join}"
            ))),
        };
        match started {
            Ok((row, record, egress, cwd)) => {
                self.install_running(&id, &token_hash, record, egress, row.deadline_ms);
                let started = match self.start_template(&id, &template, &cwd).await {
                    Ok(()) if template.name == INTERPRETER_TEMPLATE => {
                        self.start_interpreter(&id).await
                    }
                    Ok(()) if let Some(preopens) = &wasm_preopens => {
                        self.start_wasm_worker(&id, &template.name, preopens).await
                    }
                    other => other,
                };
                if let Err(err) = started {
                    self.end(&id, "create_failed", &err.message).await;
                    return Err(err);
                }
                Ok(CreateSandboxResponse {
                    sandbox: view(&row),
                    access_token: token,
                })
            }
            Err(err) => {
                self.slots().remove(&id);
                Err(err)
            }
        }
    }

    fn capacity_error(&self) -> ApiError {
        ApiError::new(
            ErrorCode::Capacity,
            format!(
                "the daemon already has {} sandboxes, its limit (--max-sandboxes)",
                self.config.max_sandboxes
            ),
        )
    }

    /// Steps 1 to 4 of the module docs, in the blocking pool. On failure nothing is left.
    #[allow(
        clippy::type_complexity,
        reason = "one internal call site; the parts are named where they are taken apart"
    )]
    fn create_blocking(
        &self,
        mut row: SandboxRow,
        mut config: SandboxConfig,
        user: Option<airlock_api::UserSpec>,
        timeout_ms: u64,
        volume: VolumeSource,
        git: Option<git::GitPlan>,
    ) -> Result<(SandboxRow, LiveSandbox, Option<Arc<SandboxEgress>>, String), ApiError> {
        let id = row.id.clone();
        let dir = self.config.sandboxes_dir().join(&id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
        self.audit.open_sandbox(&id);
        // A fork of a microvm snapshot: its directory starts as the snapshot's copy, which
        // its start restores; it has no scratch volume to copy.
        let volume = match volume {
            VolumeSource::Snapshot(snapshot) if config.tier == airlock_api::Tier::Microvm => {
                if let Err(err) = self.prepare_vm_fork(&snapshot, &dir) {
                    self.audit.close_sandbox(&id);
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(err);
                }
                VolumeSource::Empty
            }
            other => other,
        };
        let egress: std::cell::OnceCell<Arc<SandboxEgress>> = std::cell::OnceCell::new();
        let fail = |err: ApiError| {
            if let Some(egress) = egress.get() {
                egress.end();
            }
            self.audit.close_sandbox(&id);
            let _ = std::fs::remove_dir_all(&dir);
            let _ = self.store.delete_sandbox(&id);
            let _ = self.images.release(&image_holder(&id));
            self.event(Some(&id), "create_failed", &err.message);
            err
        };
        if let Some(digest) = row.request.image.clone()
            && let Err(err) = self.attach_image(&mut config, &digest, user, &id)
        {
            return Err(fail(err));
        }
        let cwd = config.cwd.clone();
        let created = format!(
            "template {}",
            row.request.template.as_deref().unwrap_or(BASE_TEMPLATE)
        );
        if let Err(err) = self
            .store
            .insert_sandbox_noting(&row, &[("create", &created)])
        {
            return Err(fail(err.into()));
        }
        self.audit.lifecycle(Some(&id), "create", &created);
        let policy = match config.policy.as_deref().map(Policy::from_document) {
            Some(Ok(policy)) => Some(policy),
            Some(Err(err)) => {
                return Err(fail(ApiError::unprocessable(format!(
                    "invalid policy: {err}"
                ))));
            }
            None => None,
        };
        if let Some(policy) = &policy
            && proxy_plan(policy).is_some()
        {
            match self.start_egress(&id, &dir, policy.clone()) {
                Ok(started) => {
                    let _ = egress.set(started);
                }
                Err(err) => return Err(fail(err)),
            }
        }
        let spec = LiveSpec {
            id: id.clone(),
            dir: dir.clone(),
            config,
            volume,
            vm_shell: false,
        };
        let session = egress.get().cloned();
        let fetched = match &git {
            Some(plan) => match self.fetch_repository(&dir, plan, session.as_deref()) {
                Ok(fetched) => Some((plan, fetched)),
                Err(err) => return Err(fail(err)),
            },
            None => None,
        };
        let pending = match self.create_live(&spec, session.as_deref()) {
            Ok(pending) => pending,
            Err(err) => return Err(fail(runtime_error(&err))),
        };
        if let Some((plan, (fetched, header))) = fetched
            && let Err(err) = self.hand_over(&id, plan, fetched, header, &pending.record().socket)
        {
            drop(pending);
            return Err(fail(err));
        }
        for warning in pending.warnings() {
            self.event(Some(&id), "warning", warning);
        }
        let live_json = serde_json::to_string(pending.record())
            .map_err(|e| ApiError::internal(format!("cannot encode the sandbox record: {e}")));
        row.deadline_ms = now_ms().saturating_add(timeout_ms);
        let stored = live_json.and_then(|json| {
            let ready = ("ready", "the sandbox's agent serves");
            let ok = self.store.set_started(&id, &json, row.deadline_ms, ready)?;
            row.live = Some(json);
            if ok {
                Ok(())
            } else {
                Err(ApiError::internal("the sandbox's row vanished"))
            }
        });
        if let Err(err) = stored {
            drop(pending);
            return Err(fail(err));
        }
        let record = pending.record().clone();
        match pending.commit() {
            Ok(record) => {
                self.audit
                    .lifecycle(Some(&id), "ready", "the sandbox's agent serves");
                row.state = RowState::Running;
                Ok((row, record, session, cwd))
            }
            Err(err) => {
                self.runtime.destroy(&record);
                Err(fail(runtime_error(&err)))
            }
        }
    }
}
