//! Warm pools of a microvm snapshot: members are pre-created VM shells. Each is a fork's
//! directory copied from the snapshot (memory hard-linked, overlay disk copied) and its
//! jailed VMM with the VM made, waiting (`airlock_runtime::microvm::shell`). A claim asks the
//! VMM to restore, waits for the guest's agent to take the sandbox's environment and fresh
//! entropy, and runs the template's start command as a cold fork's create does; the rest is
//! the ordinary claim. The guest starts from the snapshot as it was taken, however long the
//! member waited, and a member that fails its restore is destroyed and the create goes cold.
//!
//! The pool is named by the snapshot's id (`PUT /v1/templates/{snapshot}/pool` takes its
//! name or id); a fork's create (`template` naming the snapshot) claims from it.

use std::time::Duration;

use airlock_api::Tier;
use airlock_api::v1::{ErrorCode, Template};
use airlock_runtime::VolumeSource;

use super::Member;
use crate::error::ApiError;
use crate::lifecycle::{Daemon, runtime_error};

/// What a shell member's claim still runs once the guest is restored.
#[derive(Debug)]
pub(super) struct ShellMember {
    pub template: Template,
    pub cwd: String,
}

impl Daemon {
    /// The pool name of `name` when it names a snapshot: a microvm one's id (another tier's
    /// snapshot has no pool).
    pub(super) fn vm_snapshot_pool(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.store.get_snapshot(name)? {
            Some(row) if row.request.tier == Tier::Microvm => Ok(Some(row.id)),
            Some(_) => Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "{name:?} names a snapshot of the process or container tier: warm pools hold templates and microvm snapshots"
                ),
            )),
            None => Ok(None),
        }
    }

    /// The pool a normalized create may claim from: its template's, or a microvm fork's
    /// snapshot's; none for another snapshot's.
    pub(crate) fn pool_for(
        volume: &VolumeSource,
        tier: Tier,
        template: Option<&str>,
    ) -> Option<String> {
        match volume {
            VolumeSource::Empty => template.map(str::to_owned),
            VolumeSource::Snapshot(snapshot) if tier == Tier::Microvm => Some(snapshot.clone()),
            _ => None,
        }
    }

    /// Whether a member of `template` can wait as a VM shell: its guest runs nothing before
    /// the claim, so a template whose member must be warmed first cannot.
    pub(super) fn check_shell_template(template: &Template) -> Result<(), ApiError> {
        let warmed = [
            crate::lifecycle::INTERPRETER_TEMPLATE,
            crate::lifecycle::DESKTOP_TEMPLATE,
        ];
        if warmed.contains(&template.name.as_str()) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "a warm pool of a microvm snapshot holds VM shells, which run nothing before a claim: the {:?} template's sandboxes are warmed as they start, so this snapshot cannot have a pool",
                    template.name
                ),
            ));
        }
        Ok(())
    }

    /// Restores a shell member's guest and runs its template's start command; on failure the
    /// member is destroyed. Returns the member and the time the VMM took to restore.
    pub(super) async fn restore_member(
        &self,
        mut member: Member,
    ) -> Result<(Member, Duration), ApiError> {
        let restored = tokio::task::spawn_blocking(move || {
            let took = member.pending.restore_in_shell();
            (member, took)
        })
        .await
        .map_err(|join| ApiError::internal(format!("the restore task failed: {join}")))?;
        let (member, took) = match restored {
            (member, Ok(took)) => (member, took),
            (member, Err(err)) => {
                self.destroy_members(vec![member]).await;
                return Err(runtime_error(&err));
            }
        };
        if let Some(shell) = &member.shell {
            let socket = member.pending.record().socket.clone();
            if let Err(err) = self
                .start_template_at(&member.id, &socket, &shell.template, &shell.cwd)
                .await
            {
                self.destroy_members(vec![member]).await;
                return Err(err);
            }
        }
        Ok((member, took))
    }
}

/// The claim's `create` event of a shell member.
pub(super) fn claimed_event(pool: &str, took: Duration) -> String {
    format!(
        "snapshot {pool}, forked into a pre-created VM shell of its warm pool (the VMM restored in {} us)",
        took.as_micros()
    )
}

impl Daemon {
    /// A deleted snapshot's pool goes with it: its stored size, and its unclaimed members
    /// (each has its own copy, but no create can name the snapshot any more). Members still
    /// starting are destroyed as they finish (the pool wants none).
    pub(crate) fn end_snapshot_pool(&self, snapshot: &str) {
        if let Err(err) = self.store.set_pool(snapshot, 0) {
            tracing::warn!(snapshot, error = %err, "cannot remove a deleted snapshot's pool");
        }
        let members: Vec<Member> = {
            let mut pools = self.pools.lock();
            let Some(pool) = pools.get_mut(snapshot) else {
                return;
            };
            pool.size = 0;
            pool.ready.drain(..).collect()
        };
        if members.is_empty() {
            return;
        }
        // Off the caller's (async) thread: a destroy waits for the sandbox's processes.
        std::thread::spawn(self.destroyer(members));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_pool_for_a_create_is_its_template_or_its_microvm_snapshot() {
        let empty = VolumeSource::Empty;
        let snapshot = VolumeSource::Snapshot("snap1".into());
        assert_eq!(
            Daemon::pool_for(&empty, Tier::Process, Some("base")).as_deref(),
            Some("base")
        );
        assert_eq!(Daemon::pool_for(&empty, Tier::Process, None), None);
        assert_eq!(
            Daemon::pool_for(&snapshot, Tier::Microvm, Some("base")).as_deref(),
            Some("snap1")
        );
        // Another tier's snapshot copies files at each create: no pool.
        assert_eq!(
            Daemon::pool_for(&snapshot, Tier::Process, Some("base")),
            None
        );
        assert_eq!(
            Daemon::pool_for(&VolumeSource::Keep, Tier::Microvm, None),
            None
        );
    }

    #[test]
    fn test_shell_members_refuse_templates_warmed_as_they_start() {
        let named = |name: &str| Template {
            name: name.to_owned(),
            ..Template::default()
        };
        assert!(Daemon::check_shell_template(&named("base")).is_ok());
        for warmed in [
            crate::lifecycle::INTERPRETER_TEMPLATE,
            crate::lifecycle::DESKTOP_TEMPLATE,
        ] {
            let err = Daemon::check_shell_template(&named(warmed)).unwrap_err();
            assert!(err.message.contains(warmed), "{}", err.message);
        }
    }
}
