//! Compiles a [`SandboxConfig`](airlock_api::SandboxConfig) into a [`Plan`]: the exact list of
//! confinement steps that `airlock-jail` carries out. Everything here is a pure function of its
//! inputs; facts about the host arrive as a [`HostFacts`] value and no syscall is made.
//!
//! A policy document (`airlock_api::policy`) is read into a [`Policy`] (`document`,
//! `profiles`, `validate`), applied to the plan and turned into an [`egress::EgressPlan`]
//! (`document_compile`), explained per tier (`explain`) and diffed (`prover`).

mod compile;
mod document;
mod document_compile;
pub mod egress;
mod explain;
pub mod fuzzing;
pub mod image_user;
pub mod net;
mod paths;
mod plan;
pub mod profiles;
pub mod prover;
pub mod seccomp;
mod settings;
pub mod syscalls;
mod validate;

pub use compile::{CompileError, HostFacts, SANDBOX_ID_BASE, SANDBOX_ID_COUNT, compile};
pub use document::{MAX_POLICY_BYTES, Policy, PolicyError, Problem};
pub use document_compile::{FsEffect, FsOutcome, egress_plan, filesystem_effects};
pub use explain::explain;
pub use plan::{
    CgroupLimits, EGRESS_CA, EGRESS_DIR, EGRESS_SOCKET, EGRESS_TRUST_BUNDLE, EgressSetup, IdMap,
    IdentityPlan, LandlockPlan, Mask, MaskKind, Plan, ProcessPlan, ROOT_FILE_CAPABILITIES, Rlimit,
    RlimitResource, RootPlan, SCRATCH_TMP, SCRATCH_UPPER, SCRATCH_WORK, SCRATCH_WORKSPACE,
    SYSTEM_TRUST_STORE, ScratchPlan, UserLookup, ViewPlan, WorkspacePlan, id_range,
};
pub use prover::{Counterexample, Finding, FindingKind, diff, within};
pub use seccomp::{ArgCheck, SeccompRule, SyscallAction};
pub use settings::{Limit, Settings};
