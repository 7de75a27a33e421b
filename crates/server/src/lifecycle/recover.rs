//! Start-up reconciliation (`Daemon::recover`, see the lifecycle module's docs): rows are
//! matched with what still runs, live sandboxes re-adopted, and everything else destroyed with
//! an event saying why.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use airlock_runtime::LiveSandbox;

use super::{Daemon, LifecycleError};
use crate::store::RowState;

impl Daemon {
    /// Removes snapshots a crash left half-made, and snapshot volumes no row names.
    pub(super) fn recover_snapshots(&self) -> Result<(), crate::store::StoreError> {
        let mut known = std::collections::HashSet::new();
        for (id, complete) in self.store.all_snapshot_ids()? {
            if complete {
                known.insert(id);
            } else {
                self.runtime.remove_snapshot(&id);
                self.remove_vm_snapshot(&id);
                self.store.delete_snapshot(&id)?;
                self.event(
                    None,
                    "orphan_destroyed",
                    &format!("half-made snapshot {id}"),
                );
            }
        }
        self.sweep_vm_snapshots(&known);
        for id in self.runtime.snapshot_ids() {
            if !known.contains(&id) {
                self.runtime.remove_snapshot(&id);
                self.event(
                    None,
                    "orphan_destroyed",
                    &format!("stale snapshot volume {id}"),
                );
            }
        }
        Ok(())
    }

    /// Reconciles the store with what runs (see the module docs). Call once, before serving,
    /// from a blocking context.
    ///
    /// Only this daemon's sandboxes are touched: the runtime tags their cgroups with an owner
    /// derived from the state directory, so that daemons sharing a host leave each other alone.
    pub fn recover(self: &Arc<Self>) -> Result<(), LifecycleError> {
        let mut adopted = Vec::new();
        let mut paused = Vec::new();
        for row in self.store.list_sandboxes()? {
            let live: Option<LiveSandbox> = row
                .live
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok());
            let reason = match (row.state, live) {
                (RowState::Running, Some(record)) => {
                    // A pause or resume cut short: the row is the truth, so it runs.
                    if record.is_frozen() {
                        let _ = record.thaw();
                    }
                    if self.runtime.adopt(&record).is_ok() && agent_answers(&record.socket) {
                        adopted.push((row, record));
                        continue;
                    }
                    self.runtime.destroy(&record);
                    "its agent died while the daemon was down"
                }
                (RowState::Paused, Some(record)) => match self.recover_paused(&row, &record) {
                    Ok(()) => {
                        paused.push((row, record));
                        continue;
                    }
                    Err(reason) => {
                        self.runtime.destroy(&record);
                        reason
                    }
                },
                (state, live) => {
                    let record = live.unwrap_or_else(|| self.unrecorded(&row.id));
                    self.runtime.destroy(&record);
                    match state {
                        RowState::Creating | RowState::Committing => {
                            "a daemon crash interrupted its creation"
                        }
                        RowState::Deleting => "a daemon crash interrupted its removal",
                        RowState::Running | RowState::Paused => "its stored record is unreadable",
                    }
                }
            };
            let _ = std::fs::remove_dir_all(self.config.sandboxes_dir().join(&row.id));
            self.store.delete_sandbox(&row.id)?;
            self.event(Some(&row.id), "orphan_destroyed", reason);
        }
        let live_ids: HashSet<String> = adopted
            .iter()
            .chain(&paused)
            .map(|(row, _)| row.id.clone())
            .collect();
        self.recover_snapshots()?;
        // Image leases of sandboxes that no longer exist (a crash between lease and row).
        for holder in self.images.holders().unwrap_or_default() {
            if let Some(id) = holder.strip_prefix("sandbox:")
                && !live_ids.contains(id)
            {
                let _ = self.images.release(&holder);
            }
        }
        self.recover_builds();
        if let Ok(entries) = std::fs::read_dir(self.config.sandboxes_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if live_ids.contains(&name) {
                    continue;
                }
                if crate::auth::plausible_sandbox_id(&name) {
                    self.runtime.destroy(&self.unrecorded(&name));
                }
                let _ = std::fs::remove_dir_all(entry.path());
                self.event(
                    Some(&name),
                    "orphan_destroyed",
                    "stale directory of an unknown sandbox",
                );
            }
        }
        for id in self.runtime.sweep_orphans(&live_ids) {
            self.event(
                Some(&id),
                "orphan_destroyed",
                "stale cgroup of an unknown sandbox",
            );
        }
        for (row, record) in adopted {
            self.audit.open_sandbox(&row.id);
            self.event(
                Some(&row.id),
                "adopted",
                "re-adopted after a daemon restart",
            );
            let egress = self.restart_egress(&row);
            self.install_running(&row.id, &row.token_hash, record, egress, row.deadline_ms);
        }
        for (row, record) in paused {
            self.audit.open_sandbox(&row.id);
            self.event(
                Some(&row.id),
                "adopted",
                "re-adopted paused after a daemon restart",
            );
            self.install_paused(&row, record);
        }
        Ok(())
    }

    /// A record for a sandbox whose runtime record was never stored (its create was cut
    /// short): no helper to signal (its parent-death signal ended it with the old daemon), but
    /// possibly a cgroup and a directory.
    fn unrecorded(&self, id: &str) -> LiveSandbox {
        let dir = self.config.sandboxes_dir().join(id);
        LiveSandbox {
            id: id.to_owned(),
            socket: dir.join("agent.sock"),
            helper_pid: 0,
            helper_start_ticks: 0,
            cgroup: Some(self.runtime.cgroup_name(id)),
            cgroup_dirs: Vec::new(),
            dir,
            id_range: None,
        }
    }
}

/// Whether the agent behind `socket` answers `GET /health` with a success status.
/// Blocking, with a short timeout: used once per sandbox at start-up.
fn agent_answers(socket: &std::path::Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let timeout = Some(Duration::from_secs(3));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    let request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 12];
    stream.write_all(request).is_ok()
        && stream.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.1 2")
}
