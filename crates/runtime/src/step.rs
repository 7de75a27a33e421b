//! One-shot sandboxes whose scratch space outlives them: a template build runs each `RUN` in
//! one and keeps what it wrote to the image's root, the container tier's upper directory,
//! which is already in overlay form (whiteouts, opaque directories) and becomes the step's
//! layer.
//!
//! The scratch space is a volume of the runtime's disk storage when it has one (its quota is
//! the sandbox's disk limit, and a daemon's start-up sweep removes what a crash left), else
//! a directory the caller names, without a quota.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_api::SandboxConfig;
use airlock_jail::{Outcome, Stdio};

use crate::storage::{Storage, VolumeOwners, VolumeSource};
use crate::{Backend, EgressOptions, EgressSession, Runtime, RuntimeError, ScratchDir};

/// How to run a step.
#[derive(Debug, Default)]
pub struct StepOptions {
    /// Names the scratch volume (1 to 32 lower-case letters and digits).
    pub scratch_id: String,
    /// Where the scratch space goes when the runtime has no disk storage: a directory that
    /// must not exist yet, in a private (0700) parent.
    pub fallback_dir: PathBuf,
    /// The workload's standard streams (the caller's own without).
    pub stdio: Option<Arc<Stdio>>,
    pub egress: EgressOptions,
}

/// A finished step's scratch space: `tmp/`, `workspace/`, and on the container tier
/// `upper/` (the root's changes) and `work/`. Removed when dropped.
#[derive(Debug)]
pub struct KeptScratch {
    dir: PathBuf,
    volume: Option<(Arc<Storage>, String)>,
}

impl KeptScratch {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The overlay's upper directory: what the workload changed in the image's root. Its
    /// files carry the sandbox's host ids (see [`VolumeOwners::upper`]); the directory's own
    /// owner is the sandbox's root.
    pub fn upper(&self) -> PathBuf {
        self.dir.join(airlock_policy::SCRATCH_UPPER)
    }
}

impl Drop for KeptScratch {
    fn drop(&mut self) {
        match &self.volume {
            Some((storage, id)) => storage.remove_volume(id),
            None => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }
    }
}

/// Makes the scratch directories of a volume in `dir` (which exists) with their owners.
fn make_scratch_dirs(dir: &Path, owners: VolumeOwners) -> io::Result<()> {
    let mut dirs = vec![
        (airlock_policy::SCRATCH_TMP, 0o1777, owners.root),
        (airlock_policy::SCRATCH_WORKSPACE, 0o755, owners.workload),
    ];
    if let Some(upper) = owners.upper {
        dirs.push((airlock_policy::SCRATCH_UPPER, 0o755, upper));
        dirs.push((airlock_policy::SCRATCH_WORK, 0o700, (0, 0)));
    }
    for (name, mode, (uid, gid)) in dirs {
        let path = dir.join(name);
        std::fs::create_dir(&path)?;
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

impl Runtime {
    /// Runs `config` to its end like [`Runtime::run`], on disk scratch space that is kept
    /// for the caller (see the module docs). Blocking.
    pub fn run_keeping_scratch(
        &self,
        config: &SandboxConfig,
        options: StepOptions,
        on_warning: impl FnMut(&str),
    ) -> Result<(Outcome, KeptScratch), RuntimeError> {
        crate::live::check_id(&options.scratch_id)?;
        let backend = Backend::for_tier(config.tier).available(&self.support)?;
        backend.check(config)?;
        let mut plan = airlock_policy::compile(config, &self.facts())?;
        let mut spawn = self.spawn_options();
        spawn.stdio = options.stdio;
        if let Some(range) = self.id_range(&plan)? {
            plan.use_id_range(range.base());
            spawn.hold = Some(range.lock());
        }
        let owners = crate::live::volume_owners(&plan.identity, backend.needs_upper());
        let scratch = match &self.storage {
            Some(storage) => KeptScratch {
                dir: storage.create_volume(
                    &options.scratch_id,
                    config.resources.disk_bytes,
                    owners,
                    &VolumeSource::Empty,
                )?,
                volume: Some((storage.clone(), options.scratch_id.clone())),
            },
            None => {
                let dir = options.fallback_dir.clone();
                let made = std::fs::create_dir(&dir).and_then(|()| make_scratch_dirs(&dir, owners));
                let scratch = KeptScratch { dir, volume: None };
                made.map_err(|source| {
                    RuntimeError::Storage(crate::storage::StorageError::Volume {
                        path: scratch.dir.clone(),
                        source,
                    })
                })?;
                scratch
            }
        };
        plan.use_disk_scratch(scratch.dir.clone());
        let (egress_dir, session) = match self.egress_plan(config)? {
            Some(egress) => {
                let dir = ScratchDir::new()?;
                let session =
                    EgressSession::start(&dir.name, &egress, &dir.path, options.egress, None)?;
                session.attach(&mut plan);
                (Some(dir), Some(session))
            }
            None => (None, None),
        };
        let sandbox = backend.start(&plan, &spawn)?;
        let deadline = config
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let outcome = sandbox.wait(deadline, None, on_warning);
        drop(session);
        drop(egress_dir);
        Ok((outcome?, scratch))
    }
}
