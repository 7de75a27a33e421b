//! The worker confines itself once its listener is bound and before any thread starts (both
//! Landlock and seccomp bind the calling thread and what it creates later), on top of the
//! sandbox's own jail: an engine or guest escape gets fewer rights than the sandbox's programs.
//!
//! - Landlock: read only the guest modules' directory and the preopens, write only the
//!   writable preopens; abstract sockets and signals scoped to the worker.
//! - seccomp: no new programs (`execve`, `execveat`), no new processes (`fork`, `vfork`, a
//!   `clone` without `CLONE_THREAD`; `clone3` answers `ENOSYS`, so the C library falls back to
//!   `clone`), no tracing or cross-process memory, no new listeners (`bind`, `listen`), no
//!   Unix or raw sockets (fetch's TCP to the egress proxy stays).

use std::path::PathBuf;

use airlock_jail::seccomp;
use airlock_policy::{ArgCheck, LandlockPlan, SeccompRule, SyscallAction};

use crate::python::Preopen;

/// Why the worker could not confine itself.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("cannot set no_new_privs")]
    NoNewPrivs(#[source] std::io::Error),
    #[error("cannot restrict the worker's filesystem with Landlock")]
    Landlock(#[source] airlock_jail::landlock::LandlockError),
    #[error("cannot install the worker's seccomp filter")]
    Seccomp(#[source] airlock_jail::seccomp::SeccompError),
}

const CLONE_THREAD: u32 = 0x0001_0000;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

fn deny(syscall: &str, checks: Vec<ArgCheck>, action: SyscallAction, why: &str) -> SeccompRule {
    SeccompRule {
        syscall: syscall.to_owned(),
        checks,
        action,
        why: why.to_owned(),
    }
}

/// The worker's own seccomp rules (a deny-list over the sandbox's).
pub fn seccomp_rules() -> Vec<SeccompRule> {
    let eperm = SyscallAction::Eperm;
    let check = |arg, mask, value, equal| ArgCheck {
        arg,
        mask,
        value,
        equal,
    };
    let mut rules = Vec::new();
    for name in [
        "execve",
        "execveat",
        "fork",
        "vfork",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "bind",
        "listen",
    ] {
        rules.push(deny(
            name,
            Vec::new(),
            eperm,
            "the wasm worker runs no programs",
        ));
    }
    rules.push(deny(
        "clone",
        vec![check(0, CLONE_THREAD, 0, true)],
        eperm,
        "threads only",
    ));
    rules.push(deny(
        "clone3",
        Vec::new(),
        SyscallAction::Enosys,
        "falls back to clone",
    ));
    rules.push(deny(
        "socket",
        vec![
            check(0, u32::MAX, AF_INET, false),
            check(0, u32::MAX, AF_INET6, false),
        ],
        eperm,
        "TCP to the egress proxy only",
    ));
    rules
}

/// Applies Landlock and seccomp to the calling thread (and every thread it starts later).
pub fn confine(guests: &std::path::Path, preopens: &[Preopen]) -> Result<(), ConfineError> {
    airlock_jail::procctl::set_no_new_privs().map_err(ConfineError::NoNewPrivs)?;
    // wasmtime-wasi seeds each instance's random generator from the system's.
    let mut read: Vec<PathBuf> = vec![
        guests.to_owned(),
        "/dev/urandom".into(),
        "/dev/random".into(),
    ];
    let mut write_trees = Vec::new();
    for preopen in preopens {
        read.push(preopen.host.clone());
        if preopen.writable {
            write_trees.push(preopen.host.clone());
        }
    }
    let plan = LandlockPlan {
        read,
        read_except: Vec::new(),
        write_trees,
        write_files: Vec::new(),
        scoped: true,
    };
    airlock_jail::landlock::apply(&plan).map_err(ConfineError::Landlock)?;
    let program = seccomp::compile(&seccomp_rules()).map_err(ConfineError::Seccomp)?;
    seccomp::install(&program).map_err(ConfineError::Seccomp)
}
