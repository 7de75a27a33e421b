//! Security evaluation only: a sandbox with one confinement layer taken away, or with the
//! seccomp filter's answers marked, so that `airlock seceval` can prove which layer stops an
//! attack rather than only that it failed (docs/seceval.md).
//!
//! This is reachable only through [`Runtime::run_for_evaluation`], which the CLI calls only
//! under `airlock seceval`. `airlock run`, `Runtime::start` and airlockd (whose API carries a
//! [`SandboxConfig`], never an [`Ablation`]) always apply every layer.

use airlock_api::SandboxConfig;
use airlock_jail::{Outcome, SpawnOptions, TerminationSignals};
use airlock_policy::{CgroupLimits, Plan};

use crate::{EgressOptions, Runtime, RuntimeError};

/// The errno the seccomp filter answers instead of `EPERM` under [`Ablation::SeccompTag`]:
/// `EHWPOISON`, which none of the filtered syscalls returns on its own.
pub const SECCOMP_TAG_ERRNO: u16 = 133;

/// One change to the confinement of an evaluation run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ablation {
    /// No Landlock ruleset at all.
    Landlock,
    /// A seccomp filter with no rules (the architecture check stays).
    Seccomp,
    /// The filter unchanged, but its `EPERM` answers become [`SECCOMP_TAG_ERRNO`].
    SeccompTag,
    /// No masks: credentials, Airlock's state directories, `/run` and `/var/run` show through
    /// the view (Landlock's read exceptions stay: they are the Landlock layer).
    Masks,
    /// No memory, pids or CPU limits.
    Cgroup,
}

impl Runtime {
    /// Runs a sandbox to its end, like [`Runtime::run_with`], with `ablations` applied: for
    /// `airlock seceval` only.
    pub fn run_for_evaluation(
        &self,
        config: &SandboxConfig,
        ablations: &[Ablation],
        egress: EgressOptions,
        signals: Option<&TerminationSignals>,
        on_warning: impl FnMut(&str),
    ) -> Result<Outcome, RuntimeError> {
        self.run_adjusted(config, egress, signals, on_warning, |plan, options| {
            apply(ablations, plan, options);
        })
    }
}

fn apply(ablations: &[Ablation], plan: &mut Plan, options: &mut SpawnOptions) {
    for ablation in ablations {
        match ablation {
            Ablation::Landlock => options.evaluation.skip_landlock = true,
            Ablation::Seccomp => plan.seccomp.clear(),
            Ablation::SeccompTag => options.evaluation.seccomp_tag = Some(SECCOMP_TAG_ERRNO),
            Ablation::Masks => plan.view.masks.clear(),
            Ablation::Cgroup => {
                plan.cgroup = CgroupLimits {
                    cpu_period_us: plan.cgroup.cpu_period_us,
                    ..CgroupLimits::default()
                };
            }
        }
    }
}
