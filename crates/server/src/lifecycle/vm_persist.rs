//! Pause to disk, snapshots and forks of microvm sandboxes: the VM's own, not the process
//! tier's (`airlock_runtime::microvm::persist` has the files).
//!
//! - **Pause to disk** (`PauseMode::Filesystem`): the row is marked first, then the VMM
//!   snapshots the guest into the sandbox's directory (memory, vCPU and device state; the
//!   overlay disk is as the ended VMM left it) and ends. Resume starts the sandbox again on
//!   its directory, which restores the VM: its processes go on where they stopped, with fresh
//!   entropy. A frozen pause stays the cgroup freeze.
//! - **Snapshots** of a running sandbox are a pause to disk, a copy of the paused VM into
//!   `<state>/vm-snapshots/<id>/` (memory hard-linked, overlay disk copied) and a resume.
//! - **Forks** are creates whose directory starts as a copy of a snapshot's: each maps the
//!   memory copy-on-write, has its own overlay disk, and at resume its own entropy, sandbox
//!   id and access token.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_api::Tier;
use airlock_api::v1::{ErrorCode, PauseMode, Snapshot};
use airlock_runtime::microvm::persist;

use super::{Daemon, Live};
use crate::error::ApiError;
use crate::store::{PauseRecord, RowState, SnapshotRow, now_ms};

/// Where microvm snapshots live, under the state directory.
const VM_SNAPSHOTS_DIR: &str = "vm-snapshots";

impl Daemon {
    /// Whether a sandbox runs on the microvm tier (its row's request).
    pub(super) fn is_microvm(&self, id: &str) -> Result<bool, ApiError> {
        let row = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        Ok(row.request.tier == Tier::Microvm)
    }

    /// The directory of microvm snapshot `snapshot`.
    pub(super) fn vm_snapshot_dir(&self, snapshot: &str) -> PathBuf {
        self.config.state_dir.join(VM_SNAPSHOTS_DIR).join(snapshot)
    }

    /// Pauses a microvm sandbox to disk: the intent stored first (a crash from here on leaves
    /// a paused row, whose VMM the next daemon ends: its snapshot is whole or absent), then the
    /// VMM snapshots and ends. Err with the VMM still running: the row is running again.
    pub(super) async fn pause_vm(
        &self,
        id: &str,
        live: &Live,
        pause: &PauseRecord,
    ) -> Result<(), ApiError> {
        let note = (
            "paused",
            "to disk: its VMM writes the VM's memory, vCPU and devices, then ends",
        );
        if !self.store.set_paused(id, pause, note)? {
            return Err(ApiError::no_sandbox(id));
        }
        let runtime = self.runtime.clone();
        let record = live.record.clone();
        let saved = tokio::task::spawn_blocking(move || runtime.pause_vm(&record))
            .await
            .map_err(|e| ApiError::internal(format!("the pause task failed: {e}")))?;
        if let Err(err) = saved {
            let err = ApiError::from_chain(ErrorCode::Internal, &err);
            if self.runtime.adopt(&live.record).is_ok() {
                let json = serde_json::to_string(&live.record).map_err(|e| {
                    ApiError::internal(format!("cannot encode the sandbox record: {e}"))
                })?;
                let deadline_ms = now_ms().saturating_add(pause.remaining_ms);
                let back = ("resumed", "the pause to disk failed; still running");
                self.store.set_started(id, &json, deadline_ms, back)?;
            }
            return Err(err);
        }
        self.end_processes(live).await;
        self.audit.lifecycle(Some(id), "paused", "to disk (the VM)");
        Ok(())
    }

    /// Before a microvm sandbox's resume: its directory must hold its paused VM, or the
    /// start would boot a fresh guest in its place.
    pub(super) fn check_vm_paused(&self, id: &str, dir: &Path) -> Result<(), ApiError> {
        if persist::is_paused(dir) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "sandbox {id}'s VM snapshot is missing (its pause to disk did not finish): it cannot resume; delete it"
            ),
        ))
    }

    /// A named (or a fork's) snapshot of a microvm sandbox: running, it is paused to disk,
    /// copied and resumed (its deadline and token kept); paused to disk, copied.
    pub(super) async fn snapshot_vm(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
    ) -> Result<Snapshot, ApiError> {
        let source = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let was_running = match (source.state, source.pause.map(|p| p.mode)) {
            (RowState::Running, _) => true,
            (RowState::Paused, Some(PauseMode::Filesystem)) => false,
            (RowState::Paused, _) => {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!(
                        "sandbox {id} is frozen: a microvm sandbox's snapshot is written by its VMM, which a freeze stops; resume it, or pause it to disk (keep: files), first"
                    ),
                ));
            }
            (other, _) => {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!("sandbox {id} is {other:?}"),
                ));
            }
        };
        if was_running {
            self.pause(id, PauseMode::Filesystem).await?;
        }
        let taken = self.copy_vm_snapshot(id, name, &source.request).await;
        if was_running {
            self.resume(id, None).await?;
        }
        taken
    }

    async fn copy_vm_snapshot(
        &self,
        id: &str,
        name: Option<String>,
        request: &airlock_api::v1::CreateSandboxRequest,
    ) -> Result<Snapshot, ApiError> {
        let snapshot_id = crate::auth::new_sandbox_id()
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let row = SnapshotRow {
            id: snapshot_id.clone(),
            name,
            source_id: id.to_owned(),
            request: request.clone(),
            created_ms: now_ms(),
        };
        // The row first: a crash before it completes leaves a row the next daemon removes
        // with its directory.
        self.store.insert_snapshot(&row)?;
        let from = self.config.sandboxes_dir().join(id);
        let to = self.vm_snapshot_dir(&snapshot_id);
        let copied = tokio::task::spawn_blocking(move || {
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            persist::copy_vm(&from, &to).map_err(|e| airlock_runtime::error_chain(&e))
        })
        .await
        .map_err(|e| ApiError::internal(format!("the snapshot task failed: {e}")))?;
        if let Err(message) = copied {
            self.remove_vm_snapshot(&snapshot_id);
            let _ = self.store.delete_snapshot(&snapshot_id);
            return Err(ApiError::internal(format!(
                "copying the paused VM failed: {message}"
            )));
        }
        if !self.store.complete_snapshot(&snapshot_id, id)? {
            self.remove_vm_snapshot(&snapshot_id);
            return Err(ApiError::internal("the snapshot's row vanished"));
        }
        self.audit.lifecycle(
            Some(id),
            "snapshot",
            &format!("snapshot {snapshot_id} taken (the VM: memory, vCPU, devices, overlay disk)"),
        );
        Ok(super::pause::snapshot_view(&row))
    }

    /// Removes a microvm snapshot's files (none for another tier's snapshot).
    pub(super) fn remove_vm_snapshot(&self, snapshot: &str) {
        let dir = self.vm_snapshot_dir(snapshot);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(dir.with_extension("partial"));
    }

    /// The microvm snapshot directories no row names (`known`), and half-made copies.
    pub(super) fn sweep_vm_snapshots(&self, known: &std::collections::HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(self.config.state_dir.join(VM_SNAPSHOTS_DIR)) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                let _ = std::fs::remove_dir_all(entry.path());
                self.event(
                    None,
                    "orphan_destroyed",
                    &format!("stale microvm snapshot {name}"),
                );
            }
        }
    }

    /// A fork's directory `dir` (made, empty) from microvm snapshot `snapshot`: its start
    /// then restores the snapshot's VM.
    pub(super) fn prepare_vm_fork(&self, snapshot: &str, dir: &Path) -> Result<(), ApiError> {
        persist::copy_vm(&self.vm_snapshot_dir(snapshot), dir).map_err(|e| {
            ApiError::from_chain(ErrorCode::Internal, &airlock_runtime::RuntimeError::from(e))
        })
    }
}
