//! The worker confines itself once its listener is bound and before any thread starts (both
//! Landlock and seccomp bind the calling thread and what it creates later), on top of the
//! sandbox's own jail: an engine or guest escape gets fewer rights than the sandbox's programs.
//!
//! - Landlock: read only the guest modules' directory and the preopens, write only the
//!   writable preopens; abstract sockets and signals scoped to the worker.
//! - seccomp: an allow-list written for the engine ([`ENGINE_SYSCALLS`], from a trace of the
//!   worker's evaluations: JavaScript, Python, files, fetch over http and https, tools,
//!   contexts, timeouts, memory and output limits), with `EPERM` for everything else: no new
//!   programs (`execve`), no new processes (a `clone` without `CLONE_THREAD`; `clone3`
//!   answers `ENOSYS`, so the C library falls back to `clone`), no tracing or cross-process
//!   memory, no new listeners (`bind`, `listen`), no Unix or raw sockets (fetch's TCP to the
//!   egress proxy stays), no mounts, namespaces, keyrings, BPF or io_uring.

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
const AF_UNIX: u32 = 1;
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

/// What the engine calls once confined (the sandbox's own filter still applies beneath).
pub const ENGINE_SYSCALLS: &[&str] = &[
    // Memory: wasmtime's linear memories, guard pages and code; QuickJS's and CPython's heaps.
    "mmap",
    "munmap",
    "mprotect",
    "madvise",
    "mremap",
    "brk",
    "membarrier",
    // Threads: the epoch ticker, instance and connection threads, tokio's workers.
    "clone",
    "clone3",
    "futex",
    "set_robust_list",
    "rseq",
    "set_tid_address",
    "gettid",
    "sched_yield",
    "sched_getaffinity",
    "exit",
    "exit_group",
    "nanosleep",
    "clock_nanosleep",
    "arch_prctl",
    "prctl",
    // Signals: wasmtime turns guest faults into traps with a SIGSEGV handler.
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sigaltstack",
    "tgkill",
    // Time and randomness.
    "clock_gettime",
    "gettimeofday",
    "getrandom",
    // Files, within Landlock's view: the guest modules and the preopens.
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "lseek",
    "openat",
    "openat2",
    "close",
    "fstat",
    "newfstatat",
    "statx",
    "fstatfs",
    "getdents64",
    "readlinkat",
    "readlink",
    "fcntl",
    "ioctl",
    "ftruncate",
    "fallocate",
    "fsync",
    "fdatasync",
    "fadvise64",
    "mkdirat",
    "unlinkat",
    "renameat",
    "renameat2",
    "linkat",
    "symlinkat",
    "utimensat",
    "faccessat",
    "faccessat2",
    "pipe2",
    // A connected pair inside the worker (the runtime's wake-ups): it reaches nothing outside.
    "socketpair",
    "dup",
    "dup3",
    // Sockets: the accepted evaluation connections, and TCP to the egress proxy.
    "accept4",
    "socket",
    "connect",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "shutdown",
    "setsockopt",
    "getsockopt",
    "getsockname",
    "getpeername",
    // Waiting: tokio (wasmtime-wasi's runtime) and std's timeouts.
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "eventfd2",
    "poll",
    "ppoll",
    // Added when the Python instance failed under the list inside the sandbox's jail (after
    // merging main); which of these it needed was not isolated, and none starts a process.
    "restart_syscall",
    "getcwd",
    "sysinfo",
    "getrusage",
    "times",
    "getppid",
    "sched_getparam",
    "sched_getscheduler",
    "sched_setaffinity",
    "mincore",
    "msync",
    "rt_sigtimedwait",
    "tkill",
    "capget",
    "get_mempolicy",
    "memfd_create",
    "sync_file_range",
    "readahead",
    "close_range",
    "statfs",
    "access",
    "stat",
    "lstat",
    "open",
    "pipe",
    "select",
    "pselect6",
    "epoll_pwait2",
    "timerfd_create",
    "timerfd_settime",
    "getresuid",
    "getresgid",
    // Looking at itself.
    "getpid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "prlimit64",
    "uname",
];

/// The worker's own seccomp rules on top of the allow-list: argument checks for calls it
/// allows in part (they also kept the deny-list's meaning when the list was added).
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
    rules.push(deny(
        "socketpair",
        vec![check(0, u32::MAX, AF_UNIX, false)],
        eperm,
        "an anonymous Unix pair only",
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
    let program =
        seccomp::compile_allow_list(ENGINE_SYSCALLS, &seccomp_rules(), SyscallAction::Eperm)
            .map_err(ConfineError::Seccomp)?;
    seccomp::install(&program).map_err(ConfineError::Seccomp)
}
