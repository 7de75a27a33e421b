//! Pause and resume, snapshots and forks (issue 12's design; the module docs of `lifecycle`
//! give the crash-safety argument, which these follow).
//!
//! - **Frozen pause**: the watcher is stopped, the cgroup frozen, then the row marked
//!   `paused` with the time the sandbox had left. Resume thaws, then marks the row `running`
//!   with a deadline of now plus that time (or later, never earlier). The row is the truth:
//!   a restart between the two steps makes the cgroup match it (frozen or thawed again).
//! - **Filesystem-only pause**: the row is marked first, then the processes end; the volume
//!   and the sandbox's directory stay. Resume starts the sandbox again on the kept volume
//!   (`VolumeSource::Keep`) with the same id and token.
//! - **Snapshots** are rows completed only after their read-only btrfs copy exists; **forks**
//!   are creates from a snapshot that exists for the fork alone.
//!
//! A microvm sandbox's filesystem pause, snapshots and forks are its VM's (`vm_persist`).

use std::sync::Arc;
use std::time::Duration;

use airlock_api::v1::{
    CreateSandboxRequest, ErrorCode, Fork, OnTimeout, PauseMode, Sandbox, Snapshot,
};
use airlock_runtime::{LiveSpec, VolumeSource};

use super::{Daemon, Live, SlotState, running_in, runtime_error};
use crate::error::ApiError;
use crate::store::{PauseRecord, RowState, SnapshotRow, now_ms};

/// What a resume grants at least when it names no timeout: E2B's connect default.
pub const RESUME_DEFAULT_MS: u64 = 300_000;
/// A pause with this little time left was its timeout's: resume starts its lifetime over.
const TIMED_OUT_MS: u64 = 1_000;

/// How long an auto-resumed sandbox lives at least (E2B: its timeout, and at least 5 min).
pub(super) fn auto_resume_ms(request: &CreateSandboxRequest) -> u64 {
    request.timeout_ms.unwrap_or(0).max(RESUME_DEFAULT_MS)
}

impl Daemon {
    /// Takes a sandbox into `Busy` if `accept` says its state allows the operation; returns
    /// what it was.
    fn take(
        &self,
        id: &str,
        accept: impl Fn(&SlotState) -> Result<(), ApiError>,
    ) -> Result<SlotState, ApiError> {
        let mut slots = self.slots();
        let slot = slots.get_mut(id).ok_or_else(|| ApiError::no_sandbox(id))?;
        accept(&slot.state)?;
        let live = match &slot.state {
            SlotState::Running(live) | SlotState::Paused(live, _) => live.clone(),
            other => return Err(state_error(id, other)),
        };
        Ok(std::mem::replace(&mut slot.state, SlotState::Busy(live)))
    }

    /// Puts a sandbox back in `state` after an operation.
    fn settle(&self, id: &str, state: SlotState) {
        if let Some(slot) = self.slots().get_mut(id) {
            slot.state = state;
        }
    }

    /// Whether a paused sandbox resumes on its next data-plane request.
    /// `Some(lifetime)` when a paused sandbox resumes on its next data-plane request.
    pub(super) fn auto_resumes(&self, id: &str) -> Option<u64> {
        match self.store.get_sandbox(id) {
            Ok(Some(row))
                if row.request.lifecycle.auto_resume
                    && row.pause.is_some_and(|p| p.mode == PauseMode::Frozen) =>
            {
                Some(auto_resume_ms(&row.request))
            }
            _ => None,
        }
    }

    pub fn is_running(&self, id: &str) -> bool {
        self.running(id).is_ok()
    }

    /// Pauses a running sandbox. 409 `sandbox_paused` when it already is.
    pub async fn pause(self: &Arc<Self>, id: &str, mode: PauseMode) -> Result<Sandbox, ApiError> {
        if mode == PauseMode::Filesystem && !self.keeps_files(id)? {
            return Err(ApiError::unprocessable(
                "a filesystem-only pause needs the sandbox's files on disk (airlockd --scratch disk, or a host workspace); this one keeps them in memory",
            ));
        }
        let SlotState::Running(live) = self.take(id, |state| match state {
            SlotState::Running(_) => Ok(()),
            other => Err(state_error(id, other)),
        })?
        else {
            return Err(ApiError::internal(
                "a sandbox changed state during its pause",
            ));
        };
        let deadline_ms = *live.deadline.borrow();
        // The watcher stops first: it must not time the sandbox out while it is paused.
        live.deadline.send_replace(u64::MAX);
        let pause = PauseRecord {
            mode,
            paused_ms: now_ms(),
            remaining_ms: deadline_ms.saturating_sub(now_ms()).max(1),
        };
        let microvm = self.is_microvm(id)?;
        let result = match mode {
            PauseMode::Frozen => self.freeze(id, &live, &pause).await,
            PauseMode::Filesystem if microvm => self.pause_vm(id, &live, &pause).await,
            PauseMode::Filesystem => self.stop_keeping_files(id, &live, &pause).await,
        };
        match result {
            Ok(()) => {
                self.settle(id, SlotState::Paused(live, mode));
                self.watch_paused(id, pause);
                self.get(id)
            }
            Err(err) if microvm && self.runtime.adopt(&live.record).is_err() => {
                // The VMM ended without a whole snapshot: the VM is lost.
                self.settle(id, SlotState::Running(live));
                self.end(id, "pause_failed", &err.message).await;
                Err(err)
            }
            Err(err) => {
                // Still running as it was: a new watcher with the old deadline.
                let token = self.token_hash(id).unwrap_or_default();
                let (record, egress) = (live.record.clone(), live.egress.clone());
                self.install_running(id, &token, record, egress, deadline_ms);
                Err(err)
            }
        }
    }

    async fn freeze(&self, id: &str, live: &Live, pause: &PauseRecord) -> Result<(), ApiError> {
        let record = live.record.clone();
        tokio::task::spawn_blocking(move || record.freeze())
            .await
            .map_err(|e| ApiError::internal(format!("the pause task failed: {e}")))?
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let stored = self.store.set_paused(
            id,
            pause,
            ("paused", "frozen: its processes keep their memory"),
        );
        if !matches!(stored, Ok(true)) {
            let _ = live.record.thaw();
            return Err(stored.map_or_else(ApiError::from, |_| ApiError::no_sandbox(id)));
        }
        self.audit.lifecycle(Some(id), "paused", "frozen");
        Ok(())
    }

    /// Ends a sandbox's processes and its egress proxy in the blocking pool; its files stay.
    pub(super) async fn end_processes(&self, live: &Live) {
        let runtime = self.runtime.clone();
        let record = live.record.clone();
        let egress = live.egress.clone();
        let _ = tokio::task::spawn_blocking(move || {
            runtime.stop(&record);
            record.reap();
            if let Some(egress) = egress {
                egress.end();
            }
        })
        .await;
    }

    async fn stop_keeping_files(
        &self,
        id: &str,
        live: &Live,
        pause: &PauseRecord,
    ) -> Result<(), ApiError> {
        // The intent first: a crash from here on leaves a paused row whose processes the
        // next daemon ends.
        if !self.store.set_paused(
            id,
            pause,
            (
                "paused",
                "filesystem only: the processes ended, the files are kept",
            ),
        )? {
            return Err(ApiError::no_sandbox(id));
        }
        self.end_processes(live).await;
        self.audit.lifecycle(Some(id), "paused", "filesystem only");
        Ok(())
    }

    /// Whether a sandbox's files survive its processes (disk scratch, or a host workspace;
    /// a microvm sandbox's VM is written to its directory).
    fn keeps_files(&self, id: &str) -> Result<bool, ApiError> {
        let row = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        Ok(self.runtime.has_volumes()
            || row.request.tier == airlock_api::Tier::Microvm
            || matches!(
                row.request.workspace,
                airlock_api::v1::Workspace::Host { .. }
            ))
    }

    /// Resumes a paused sandbox; returns it and whether it was paused (E2B: 201, else 200).
    /// Its deadline becomes now plus what it had left, or `timeout_ms` from now if later.
    pub async fn resume(
        self: &Arc<Self>,
        id: &str,
        timeout_ms: Option<u64>,
    ) -> Result<(Sandbox, bool), ApiError> {
        if self.is_running(id) {
            if let Some(timeout_ms) = timeout_ms {
                self.extend(id, timeout_ms)?;
            }
            return Ok((self.get(id)?, false));
        }
        let SlotState::Paused(live, mode) = self.take(id, |state| match state {
            SlotState::Paused(..) => Ok(()),
            other => Err(state_error(id, other)),
        })?
        else {
            return Err(ApiError::internal(
                "a sandbox changed state during its resume",
            ));
        };
        let row = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let mut remaining = row.pause.map_or(RESUME_DEFAULT_MS, |p| p.remaining_ms);
        if remaining <= TIMED_OUT_MS {
            // Paused at its timeout: it had nothing left, so it gets its lifetime again.
            remaining = row.request.timeout_ms.unwrap_or(RESUME_DEFAULT_MS);
        }
        let deadline_ms = now_ms().saturating_add(remaining.max(timeout_ms.unwrap_or(0)));
        let resumed = match mode {
            PauseMode::Frozen => self
                .thaw(id, &live, deadline_ms)
                .await
                .map(|()| live.clone()),
            PauseMode::Filesystem => self.restart(row.clone(), deadline_ms).await,
        };
        match resumed {
            Ok(live) => {
                let token = self.token_hash(id).unwrap_or_default();
                let (record, egress) = (live.record.clone(), live.egress.clone());
                self.install_running(id, &token, record, egress, deadline_ms);
                self.audit.lifecycle(Some(id), "resumed", mode.as_str());
                // Started again on its files: the template's start command (and its interpreter or
                // wasm worker) runs again.
                // A microvm sandbox's processes went on where they stopped.
                if mode == PauseMode::Filesystem
                    && row.request.tier != airlock_api::Tier::Microvm
                    && let Some(name) = &row.request.template
                    && let Some(template) = self.find_template(name)?
                {
                    let cwd = self.sandbox_cwd(&row.request);
                    let started = match self.start_template(id, &template, &cwd).await {
                        Ok(()) if template.name == super::INTERPRETER_TEMPLATE => {
                            Box::pin(self.start_interpreter(id)).await
                        }
                        Ok(()) if super::is_wasm_template(&template.name) => {
                            // Boxed: the worker's start finds the agent, which may resume.
                            Box::pin(self.restart_wasm_worker(id, &template.name, &row.request))
                                .await
                        }
                        other => other,
                    };
                    if let Err(err) = started {
                        self.end(id, "resume_failed", &err.message).await;
                        return Err(err);
                    }
                }
                Ok((self.get(id)?, true))
            }
            Err(err) => {
                self.settle(id, SlotState::Paused(live, mode));
                Err(err)
            }
        }
    }

    async fn thaw(&self, id: &str, live: &Live, deadline_ms: u64) -> Result<(), ApiError> {
        let record = live.record.clone();
        tokio::task::spawn_blocking(move || record.thaw())
            .await
            .map_err(|e| ApiError::internal(format!("the resume task failed: {e}")))?
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let json = serde_json::to_string(&live.record)
            .map_err(|e| ApiError::internal(format!("cannot encode the sandbox record: {e}")))?;
        if !self
            .store
            .set_started(id, &json, deadline_ms, ("resumed", "thawed"))?
        {
            return Err(ApiError::no_sandbox(id));
        }
        Ok(())
    }

    /// Starts a filesystem-paused sandbox again on its kept volume.
    async fn restart(
        self: &Arc<Self>,
        row: crate::store::SandboxRow,
        deadline_ms: u64,
    ) -> Result<Arc<Live>, ApiError> {
        let daemon = self.clone();
        tokio::task::spawn_blocking(move || daemon.restart_blocking(row, deadline_ms))
            .await
            .map_err(|e| ApiError::internal(format!("the resume task failed: {e}")))?
    }

    fn restart_blocking(
        &self,
        row: crate::store::SandboxRow,
        deadline_ms: u64,
    ) -> Result<Arc<Live>, ApiError> {
        let id = row.id.clone();
        let super::Normalized {
            mut config, user, ..
        } = self.normalize(row.request.clone())?;
        if let Some(digest) = &row.request.image {
            self.attach_image(&mut config, digest, user, &id)?;
        }
        let dir = self.config.sandboxes_dir().join(&id);
        let microvm = row.request.tier == airlock_api::Tier::Microvm;
        if microvm {
            self.check_vm_paused(&id, &dir)?;
        }
        let egress = self.restart_egress(&row);
        let spec = LiveSpec {
            id: id.clone(),
            dir,
            config,
            // A microvm sandbox's files are its VM's disks, in its directory.
            volume: if microvm && !self.runtime.has_volumes() {
                VolumeSource::Empty
            } else {
                VolumeSource::Keep
            },
            vm_shell: false,
        };
        let pending = self
            .create_live(&spec, egress.as_deref())
            .map_err(|err| runtime_error(&err))?;
        let json = serde_json::to_string(pending.record())
            .map_err(|e| ApiError::internal(format!("cannot encode the sandbox record: {e}")))?;
        // Committed before its row says so, unlike a create: a crash in between leaves a
        // paused row, whose sandbox (found by its cgroup's name) the next daemon stops, so
        // the files are never lost with an uncommitted start.
        let record = pending.commit().map_err(|err| runtime_error(&err))?;
        let resumed = ("resumed", "started again on its files");
        if !self.store.set_started(&id, &json, deadline_ms, resumed)? {
            self.runtime.stop(&record);
            return Err(ApiError::no_sandbox(&id));
        }
        let (deadline, _) = tokio::sync::watch::channel(deadline_ms);
        Ok(Arc::new(Live::new(record, egress, deadline)))
    }

    /// Moves a running sandbox's deadline to at least `timeout_ms` from now.
    fn extend(&self, id: &str, timeout_ms: u64) -> Result<(), ApiError> {
        let live = self.running(id)?;
        let wanted = now_ms().saturating_add(timeout_ms);
        if wanted > *live.deadline.borrow() {
            self.store.set_deadline(id, wanted)?;
            live.deadline.send_replace(wanted);
        }
        Ok(())
    }

    /// At the deadline: a sandbox created with `on_timeout: pause` is paused, others end.
    pub(super) async fn expire(self: &Arc<Self>, id: &str) {
        let lifecycle = self
            .store
            .get_sandbox(id)
            .ok()
            .flatten()
            .map(|row| row.request.lifecycle)
            .unwrap_or_default();
        if lifecycle.on_timeout == OnTimeout::Pause
            && self.pause(id, lifecycle.pause_mode).await.is_ok()
        {
            self.event(
                Some(id),
                "timeout_paused",
                "paused at its timeout (lifecycle.on_timeout: pause)",
            );
            return;
        }
        self.end(id, "timeout", "the sandbox reached its timeout")
            .await;
    }

    /// While a sandbox stays paused: `--pause-to-disk-after` turns a frozen pause into a
    /// filesystem-only one, and `--paused-retention` deletes it. Each timer checks that the
    /// pause it was armed for is still the current one.
    fn watch_paused(self: &Arc<Self>, id: &str, pause: PauseRecord) {
        let to_disk = (pause.mode == PauseMode::Frozen)
            .then_some(self.config.pause_to_disk_after_ms)
            .flatten();
        let retention = self.config.paused_retention_ms;
        if to_disk.is_none() && retention.is_none() {
            return;
        }
        let daemon = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            let same_pause = |daemon: &Daemon| {
                matches!(daemon.store.get_sandbox(&id), Ok(Some(row))
                    if row.state == RowState::Paused && row.pause.map(|p| p.paused_ms) == Some(pause.paused_ms))
            };
            let elapsed = now_ms().saturating_sub(pause.paused_ms);
            if let Some(after) = to_disk
                && retention.is_none_or(|r| after < r)
            {
                tokio::time::sleep(Duration::from_millis(after.saturating_sub(elapsed))).await;
                if !same_pause(&daemon) {
                    return;
                }
                if let Err(err) = daemon.pause_to_disk(&id).await {
                    daemon.event(Some(&id), "pause_to_disk_failed", &err.message);
                }
                return;
            }
            if let Some(retention) = retention {
                tokio::time::sleep(Duration::from_millis(retention.saturating_sub(elapsed))).await;
                if same_pause(&daemon) {
                    daemon
                        .end(
                            &id,
                            "paused_retention",
                            "paused longer than --paused-retention",
                        )
                        .await;
                }
            }
        });
    }

    /// Turns a frozen pause into a filesystem-only one (frees the memory; E2B's
    /// `connect(memory: false)`, a reboot on the sandbox's files).
    pub async fn pause_to_disk(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        if !self.keeps_files(id)? {
            return Err(ApiError::unprocessable(
                "its files live in memory: it stays frozen",
            ));
        }
        let SlotState::Paused(live, PauseMode::Frozen) = self.take(id, |state| match state {
            SlotState::Paused(_, PauseMode::Frozen) => Ok(()),
            _ => Err(ApiError::new(ErrorCode::Conflict, "no longer frozen")),
        })?
        else {
            return Err(ApiError::internal("a sandbox changed state"));
        };
        let row = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let pause = PauseRecord {
            mode: PauseMode::Filesystem,
            paused_ms: now_ms(),
            remaining_ms: row.pause.map_or(RESUME_DEFAULT_MS, |p| p.remaining_ms),
        };
        if self.is_microvm(id)? {
            // The VMM runs again (thawed) to write its snapshot, then ends.
            if let Err(err) = self.pause_vm(id, &live, &pause).await {
                self.settle(id, SlotState::Paused(live, PauseMode::Frozen));
                return Err(err);
            }
        } else {
            self.stop_keeping_files(id, &live, &pause).await?;
        }
        self.event(
            Some(id),
            "pause_to_disk",
            "frozen longer than --pause-to-disk-after: now a filesystem-only pause",
        );
        self.settle(id, SlotState::Paused(live, PauseMode::Filesystem));
        self.watch_paused(id, pause);
        Ok(())
    }

    // --- after a restart ---

    /// Makes a paused row's sandbox match it: frozen processes stay frozen (or are frozen
    /// again: a resume cut short), a filesystem pause has no processes. Err: why it is lost.
    pub(super) fn recover_paused(
        &self,
        row: &crate::store::SandboxRow,
        record: &airlock_runtime::LiveSandbox,
    ) -> Result<(), &'static str> {
        match row.pause.map(|pause| pause.mode) {
            Some(PauseMode::Frozen) => {
                if self.runtime.adopt(record).is_err() {
                    return Err("its frozen processes ended while the daemon was down");
                }
                if !record.is_frozen() && record.freeze().is_err() {
                    return Err("it could not be frozen again after a daemon restart");
                }
                Ok(())
            }
            Some(PauseMode::Filesystem) => {
                // A pause cut short may have left processes: they end now, the files stay.
                self.runtime.stop(record);
                // A microvm snapshot written but not yet named (the state is written last,
                // so a whole one is named and a partial one refused).
                if row.request.tier == airlock_api::Tier::Microvm
                    && !airlock_runtime::microvm::persist::is_paused(&record.dir)
                {
                    let _ = airlock_runtime::microvm::persist::finish_pause(&record.dir);
                }
                Ok(())
            }
            None => Err("its stored pause is unreadable"),
        }
    }

    /// Registers a paused sandbox found at start-up.
    pub(super) fn install_paused(
        self: &Arc<Self>,
        row: &crate::store::SandboxRow,
        record: airlock_runtime::LiveSandbox,
    ) {
        let Some(pause) = row.pause else {
            return;
        };
        let egress = match pause.mode {
            PauseMode::Frozen => self.restart_egress(row),
            PauseMode::Filesystem => None,
        };
        let (deadline, _) = tokio::sync::watch::channel(u64::MAX);
        let live = Arc::new(Live::new(record, egress, deadline));
        self.slots().insert(
            row.id.clone(),
            super::Slot {
                state: SlotState::Paused(live, pause.mode),
                token_hash: row.token_hash.clone(),
            },
        );
        self.watch_paused(&row.id, pause);
    }

    // --- snapshots and forks ---

    /// Snapshots a running or paused sandbox's files; the sandbox is frozen only for the copy.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
    ) -> Result<Snapshot, ApiError> {
        if let Some(name) = &name
            && (self.store.snapshot_name_taken(name)? || self.store.get_template(name)?.is_some())
        {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("the name {name:?} is taken"),
            ));
        }
        if self.is_microvm(id)? {
            return self.snapshot_vm(id, name).await;
        }
        if !self.runtime.has_volumes() {
            return Err(ApiError::unprocessable(
                "snapshots need the sandbox's files on disk (airlockd --scratch disk)",
            ));
        }
        let source = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        if matches!(
            source.request.workspace,
            airlock_api::v1::Workspace::Host { .. }
        ) {
            return Err(ApiError::unprocessable(
                "a sandbox on a host workspace has no files of its own to snapshot",
            ));
        }
        let before = self.take(id, |state| match state {
            SlotState::Running(_) | SlotState::Paused(..) => Ok(()),
            other => Err(state_error(id, other)),
        })?;
        let taken = self.take_snapshot(id, name).await;
        self.settle(id, before);
        let row = taken?;
        Ok(snapshot_view(&row))
    }

    /// The snapshot itself, with the sandbox in `Busy`.
    async fn take_snapshot(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
    ) -> Result<SnapshotRow, ApiError> {
        let source = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let live = match self.slots().get(id).map(|slot| &slot.state) {
            Some(SlotState::Busy(live)) => live.clone(),
            _ => return Err(ApiError::no_sandbox(id)),
        };
        let snapshot_id = crate::auth::new_sandbox_id()
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let row = SnapshotRow {
            id: snapshot_id.clone(),
            name,
            source_id: id.to_owned(),
            request: source.request.clone(),
            created_ms: now_ms(),
        };
        self.store.insert_snapshot(&row)?;
        let runtime = self.runtime.clone();
        let record = live.record.clone();
        // A paused sandbox writes nothing (and a stopped one has no cgroup to freeze).
        let freeze = source.state != RowState::Paused;
        let copy_id = snapshot_id.clone();
        let made = tokio::task::spawn_blocking(move || runtime.snapshot(&record, &copy_id, freeze))
            .await
            .map_err(|e| ApiError::internal(format!("the snapshot task failed: {e}")))?;
        if let Err(err) = made {
            self.runtime.remove_snapshot(&snapshot_id);
            let _ = self.store.delete_snapshot(&snapshot_id);
            return Err(runtime_error(&err));
        }
        if !self.store.complete_snapshot(&snapshot_id, id)? {
            self.runtime.remove_snapshot(&snapshot_id);
            return Err(ApiError::internal("the snapshot's row vanished"));
        }
        self.audit.lifecycle(
            Some(id),
            "snapshot",
            &format!("snapshot {snapshot_id} taken"),
        );
        Ok(row)
    }

    pub fn list_snapshots(&self) -> Result<Vec<Snapshot>, ApiError> {
        Ok(self
            .store
            .list_snapshots()?
            .iter()
            .map(snapshot_view)
            .collect())
    }

    pub fn get_snapshot(&self, id_or_name: &str) -> Result<Snapshot, ApiError> {
        self.store
            .get_snapshot(id_or_name)?
            .map(|row| snapshot_view(&row))
            .ok_or_else(|| {
                ApiError::new(ErrorCode::NotFound, format!("no snapshot {id_or_name:?}"))
            })
    }

    /// Deletes a snapshot; the sandboxes made from it keep their copies. False if unknown.
    pub fn delete_snapshot(&self, id_or_name: &str) -> Result<bool, ApiError> {
        let Some(row) = self.store.get_snapshot(id_or_name)? else {
            return Ok(false);
        };
        self.store.delete_snapshot(&row.id)?;
        self.runtime.remove_snapshot(&row.id);
        self.remove_vm_snapshot(&row.id);
        self.end_snapshot_pool(&row.id);
        self.event(
            Some(&row.source_id),
            "snapshot_deleted",
            &format!("snapshot {} deleted", row.id),
        );
        Ok(true)
    }

    /// If the request's template names a snapshot: the snapshot's id, with the source's
    /// settings filled in where the request leaves them out.
    pub(super) fn snapshot_template(
        &self,
        request: &mut CreateSandboxRequest,
    ) -> Result<Option<String>, ApiError> {
        let Some(name) = request.template.clone() else {
            return Ok(None);
        };
        let Some(snapshot) = self.store.get_snapshot(&name)? else {
            return Ok(None);
        };
        let source = snapshot.request;
        request.template = source.template.clone();
        // A VM's snapshot restores on the microvm tier alone.
        if source.tier == airlock_api::Tier::Microvm {
            request.tier = airlock_api::Tier::Microvm;
        }
        // The snapshot's files include the root's upper directory: the same layers below.
        if request.image.is_none() {
            request.image = source.image.clone();
        }
        let r = &mut request.resources;
        r.memory_bytes = r.memory_bytes.or(source.resources.memory_bytes);
        r.pids_max = r.pids_max.or(source.resources.pids_max);
        r.cpu_millis = r.cpu_millis.or(source.resources.cpu_millis);
        r.disk_bytes = r.disk_bytes.or(source.resources.disk_bytes);
        for (key, value) in source.env {
            request.env.entry(key).or_insert(value);
        }
        if request.policy.is_none() {
            request.policy = source.policy;
        }
        if request.workspace != source.workspace {
            return Err(ApiError::unprocessable(
                "a sandbox from a snapshot gets the snapshot's workspace: leave workspace out",
            ));
        }
        Ok(Some(snapshot.id))
    }

    /// `count` new sandboxes from a consistent copy of a sandbox's files; each fork succeeds
    /// or fails on its own. The source keeps running, with its id and deadline.
    pub async fn fork(
        self: &Arc<Self>,
        id: &str,
        count: u32,
        timeout_ms: Option<u64>,
    ) -> Result<Vec<Fork>, ApiError> {
        if !(1..=airlock_api::v1::MAX_FORKS).contains(&count) {
            return Err(ApiError::invalid(format!(
                "count must be 1 to {}, not {count}",
                airlock_api::v1::MAX_FORKS
            )));
        }
        let snapshot = self.snapshot(id, None).await?;
        let source = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let mut forks = Vec::new();
        for _ in 0..count {
            let request = CreateSandboxRequest {
                template: Some(snapshot.id.clone()),
                timeout_ms: timeout_ms.or(source.request.timeout_ms),
                metadata: source.request.metadata.clone(),
                lifecycle: source.request.lifecycle,
                workspace: source.request.workspace.clone(),
                ..CreateSandboxRequest::default()
            };
            forks.push(match self.create(request).await {
                Ok(created) => Fork {
                    sandbox: Some(created.sandbox),
                    access_token: Some(created.access_token),
                    error: None,
                },
                Err(err) => Fork {
                    sandbox: None,
                    access_token: None,
                    error: Some(err.body()),
                },
            });
        }
        // The forks have their copies; the snapshot was theirs alone.
        let _ = self.delete_snapshot(&snapshot.id);
        Ok(forks)
    }
}

/// The error a sandbox's state means for an operation that does not accept it. Never
/// locks: `take` calls it with the slots' lock held.
fn state_error(id: &str, state: &SlotState) -> ApiError {
    running_in(id, Some(state))
        .err()
        .unwrap_or_else(|| ApiError::new(ErrorCode::Conflict, format!("sandbox {id} is running")))
}

pub(super) fn snapshot_view(row: &SnapshotRow) -> Snapshot {
    Snapshot {
        id: row.id.clone(),
        name: row.name.clone(),
        source_id: row.source_id.clone(),
        template: row
            .request
            .template
            .clone()
            .unwrap_or_else(|| crate::store::BASE_TEMPLATE.to_owned()),
        created_at_ms: row.created_ms,
    }
}
