//! Compiles a [`SandboxConfig`](airlock_api::SandboxConfig) into a [`Plan`]: the exact list of
//! confinement steps that `airlock-jail` carries out. Everything here is a pure function of its
//! inputs; facts about the host arrive as a [`HostFacts`] value and no syscall is made.

mod compile;
mod plan;
pub mod seccomp;

pub use compile::{CompileError, HostFacts, compile};
pub use plan::{
    CgroupLimits, IdMap, IdentityPlan, LandlockPlan, Mask, MaskKind, Plan, ProcessPlan, Rlimit,
    RlimitResource, ViewPlan, WorkspacePlan,
};
pub use seccomp::{ArgCheck, SeccompRule, SyscallAction};
