//! Linux confinement for Airlock's process tier.
//!
//! The supervisor side ([`supervisor`]) runs in the caller: it creates the sandbox's cgroup,
//! spawns the freshly exec'd `airlock-jail` helper with the plan on descriptor 3, watches the
//! report channel, enforces the wall-clock limit and cleans up. The helper side ([`helper`])
//! applies the layers. This crate (and, once it exists, `vmm`) is the only one allowed `unsafe`.
#![allow(
    unsafe_code,
    reason = "the jail is one of the two crates that talk to the kernel directly"
)]

pub mod beneath;
pub mod cgroup;
mod cgroup_kind;
pub mod child;
pub mod disk;
pub mod entropy;
pub mod freezer;
pub mod helper;
mod helper_live;
pub mod host;
pub mod inotify;
pub mod landlock;
pub mod live;
pub mod mountfs;
mod network_pool;
pub mod oom;
pub mod procctl;
mod relay;
pub mod report;
mod scm;
pub mod seccomp;
pub mod spec;
pub mod supervisor;
mod sys;
mod view;
mod view_binds;
mod view_image;
pub mod view_template;
mod view_vmm;
pub mod zygote;

pub use host::HostSupport;
pub use network_pool::HostNetworks;
pub use supervisor::{
    Ending, JailError, Outcome, Sandbox, SpawnOptions, Stdio, TerminationSignals, find_helper,
};
/// Brings the current network namespace's loopback up: a microVM guest's agent, before its
/// egress relay listens there (the guest has no other interface).
pub use sys::loopback_up;

/// Formats an error with its chain of causes on one line: `what failed: why: deeper why`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}
