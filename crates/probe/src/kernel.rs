//! Kernel surface: one raw syscall per name, with arguments that would do as little as
//! possible if the call were allowed, plus terminal injection, process attacks and the
//! namespace and mount calls.

use std::io;

use crate::{Outcome, check, sys};

/// Tries the syscall `name` once. Arguments are chosen so that an allowed call changes
/// nothing lasting: `settimeofday(NULL, NULL)`, `acct(NULL)`, a module of zero bytes, and so on.
pub fn syscall(name: &str) -> Outcome {
    let null = std::ptr::null::<libc::c_void>();
    // SAFETY: in every arm, each call passes integers, NULL, or pointers to locals that live
    // across the call with the sizes the kernel expects.
    let ret: libc::c_long = unsafe {
        match name {
            "bpf" => {
                // BPF_MAP_CREATE of a one-entry array map.
                let mut attr = [0u32; 30];
                attr[0] = 2; // BPF_MAP_TYPE_ARRAY
                attr[1] = 4;
                attr[2] = 4;
                attr[3] = 1;
                libc::syscall(
                    libc::SYS_bpf,
                    0,
                    attr.as_ptr(),
                    std::mem::size_of_val(&attr),
                )
            }
            "perf_event_open" => {
                // A software task-clock counter on this process only.
                let mut attr = [0u8; 128];
                attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
                attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
                attr[8..16].copy_from_slice(&1u64.to_ne_bytes()); // TASK_CLOCK
                // exclude_kernel | exclude_hv
                attr[40..48].copy_from_slice(&((1u64 << 5) | (1u64 << 6)).to_ne_bytes());
                libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0)
            }
            // UFFD_USER_MODE_ONLY, which even unprivileged callers may use.
            "userfaultfd" => libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1),
            "io_uring_setup" => {
                let mut params = [0u32; 30];
                libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr())
            }
            // KEYCTL_GET_KEYRING_ID of the session keyring, without creating it.
            "keyctl" => libc::syscall(libc::SYS_keyctl, 0, -3, 0),
            "add_key" => libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                c"airlock-probe".as_ptr(),
                c"x".as_ptr(),
                1,
                -2, // KEY_SPEC_PROCESS_KEYRING
            ),
            "init_module" => libc::syscall(libc::SYS_init_module, null, 0, c"".as_ptr()),
            "finit_module" => libc::syscall(libc::SYS_finit_module, -1, c"".as_ptr(), 0),
            "kexec_load" => libc::syscall(libc::SYS_kexec_load, 0, 0, null, 0),
            "iopl" => libc::syscall(libc::SYS_iopl, 3),
            "ioperm" => libc::syscall(libc::SYS_ioperm, 0x80, 1, 1),
            "acct" => libc::syscall(libc::SYS_acct, null),
            "swapon" => libc::syscall(libc::SYS_swapon, c"/airlock-probe-no-swap".as_ptr(), 0),
            "settimeofday" => libc::syscall(libc::SYS_settimeofday, null, null),
            // LINUX_REBOOT_CMD_CAD_ON: only re-enables ctrl-alt-del.
            "reboot" => libc::syscall(
                libc::SYS_reboot,
                0xfee1_deadu32 as libc::c_long,
                672_274_793,
                0x89ab_cdef_u32 as libc::c_long,
                null,
            ),
            // READ_IMPLIES_EXEC
            "personality" => libc::syscall(libc::SYS_personality, 0x0040_0000),
            "open_by_handle_at" => {
                let mut handle = [0u8; 16];
                handle[0..4].copy_from_slice(&8u32.to_ne_bytes());
                libc::syscall(
                    libc::SYS_open_by_handle_at,
                    libc::AT_FDCWD,
                    handle.as_ptr(),
                    libc::O_RDONLY,
                )
            }
            "fsopen" => libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 1),
            // OPEN_TREE_CLONE | AT_RECURSIVE of /
            "open_tree" => libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                c"/".as_ptr(),
                1 | 0x8000,
            ),
            "chroot" => libc::syscall(libc::SYS_chroot, c"/tmp".as_ptr()),
            "pivot_root" => libc::syscall(libc::SYS_pivot_root, c"/tmp".as_ptr(), c"/tmp".as_ptr()),
            "umount" => libc::syscall(libc::SYS_umount2, c"/proc".as_ptr(), libc::MNT_DETACH),
            "setns" => {
                let fd = libc::open(
                    c"/proc/self/ns/net".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let ret = libc::syscall(libc::SYS_setns, fd, libc::CLONE_NEWNET);
                let err = io::Error::last_os_error();
                libc::close(fd);
                return if ret < 0 { Err(err) } else { Ok(String::new()) };
            }
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    };
    check(ret)?;
    Ok(String::new())
}

/// A new pseudo-terminal pair in this sandbox's devpts; returns (master, slave).
fn open_pty() -> io::Result<(libc::c_int, libc::c_int)> {
    // SAFETY: plain descriptor calls on a path literal; ptsname_r writes into a local buffer of
    // the length passed.
    unsafe {
        let master =
            check(libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY).into())? as libc::c_int;
        if libc::grantpt(master) != 0 || libc::unlockpt(master) != 0 {
            let err = io::Error::last_os_error();
            libc::close(master);
            return Err(err);
        }
        let mut name = [0 as libc::c_char; 64];
        if libc::ptsname_r(master, name.as_mut_ptr(), name.len()) != 0 {
            let err = io::Error::last_os_error();
            libc::close(master);
            return Err(err);
        }
        let slave = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        if slave < 0 {
            let err = io::Error::last_os_error();
            libc::close(master);
            return Err(err);
        }
        Ok((master, slave))
    }
}

/// Pushes a character into a terminal's input queue (`TIOCSTI`), on a pty of our own.
pub fn tiocsti() -> Outcome {
    let (master, slave) = open_pty()?;
    let byte: libc::c_char = b'x' as libc::c_char;
    // SAFETY: TIOCSTI reads one byte from the pointer; both descriptors are ours.
    let ret = unsafe { libc::ioctl(slave, libc::TIOCSTI, &byte) };
    let err = io::Error::last_os_error();
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(slave);
        libc::close(master);
    }
    if ret < 0 { Err(err) } else { Ok(String::new()) }
}

/// `TIOCLINUX` (subcode 2, set selection) on a pty of our own.
pub fn tioclinux() -> Outcome {
    let (master, slave) = open_pty()?;
    let mut subcode = [2u8; 12];
    // SAFETY: TIOCLINUX reads the subcode buffer; both descriptors are ours.
    let ret = unsafe { libc::ioctl(slave, libc::TIOCLINUX, subcode.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(slave);
        libc::close(master);
    }
    if ret < 0 { Err(err) } else { Ok(String::new()) }
}

/// Reads a word of a sleeping child's memory with `process_vm_readv`.
pub fn process_vm_read() -> Outcome {
    static WORD: u64 = 0x5eed;
    let child = crate::child_that_sleeps()?;
    let mut buf = 0u64;
    let local = libc::iovec {
        iov_base: (&raw mut buf).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: (&raw const WORD).cast_mut().cast(),
        iov_len: 8,
    };
    // SAFETY: one local iovec over `buf` and one remote iovec; the kernel checks the remote.
    let ret = unsafe { libc::process_vm_readv(child, &local, 1, &remote, 1, 0) };
    let result = check(ret as libc::c_long);
    crate::reap(child);
    result?;
    Ok(String::new())
}

/// `pidfd_open(pid)` then `pidfd_getfd(fd)`: steals a descriptor from another process.
pub fn pidfd_getfd(pid: i64, fd: i64) -> Outcome {
    // SAFETY: integer arguments only; the returned descriptors are closed below.
    let pidfd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: as above.
    let stolen = check(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) });
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(pidfd as libc::c_int);
        if let Ok(fd) = stolen {
            libc::close(fd as libc::c_int);
        }
    }
    stolen?;
    Ok(String::new())
}

/// `clone(CLONE_NEWUSER)`: a child in a nested user namespace, which exits at once.
pub fn clone_newuser() -> Outcome {
    // SAFETY: clone without CLONE_VM and a NULL stack behaves like fork: the child gets a copy
    // of our address space and only calls _exit.
    let pid = check(unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::CLONE_NEWUSER | libc::SIGCHLD,
            0,
            0,
            0,
            0,
        )
    })?;
    if pid == 0 {
        // SAFETY: ends only the child.
        unsafe { libc::_exit(0) };
    }
    crate::reap(pid as libc::pid_t);
    Ok(String::new())
}

/// `clone3` with no flags (a plain fork); the child exits at once.
pub fn clone3() -> Outcome {
    #[repr(C)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
    }
    let args = CloneArgs {
        flags: 0,
        pidfd: 0,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
    };
    // SAFETY: without CLONE_VM or a stack, the child runs on a copy of our address space, like
    // fork, and only calls _exit.
    let pid =
        check(unsafe { libc::syscall(libc::SYS_clone3, &args, std::mem::size_of::<CloneArgs>()) })?;
    if pid == 0 {
        // SAFETY: ends only the child.
        unsafe { libc::_exit(0) };
    }
    crate::reap(pid as libc::pid_t);
    Ok(String::new())
}

/// Sends `signal` to `pid`.
pub fn kill(pid: i64, signal: i64) -> Outcome {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let signal = libc::c_int::try_from(signal).unwrap_or(0);
    // SAFETY: kill takes integers.
    sys(|| check(unsafe { libc::kill(pid, signal).into() }))
}

/// The capability sets and confinement flags of this process, from /proc/self/status.
pub fn status_summary() -> Outcome {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or_else(
                || "?".to_owned(),
                |v| v.trim().trim_start_matches('0').to_owned(),
            )
    };
    let show = |v: String| if v.is_empty() { "0".to_owned() } else { v };
    Ok(format!(
        "CapEff={} CapPrm={} CapBnd={} CapAmb={} NoNewPrivs={} Seccomp={}",
        show(field("CapEff:")),
        show(field("CapPrm:")),
        show(field("CapBnd:")),
        show(field("CapAmb:")),
        show(field("NoNewPrivs:")),
        show(field("Seccomp:")),
    ))
}

/// Creates `count` threads that sleep, until the kernel refuses one; reports how many.
pub fn thread_bomb(count: i64) -> Outcome {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let stop_rx = std::sync::Arc::new(std::sync::Mutex::new(stop_rx));
    let mut handles = Vec::new();
    let mut failure = None;
    while i64::try_from(handles.len()).unwrap_or(i64::MAX) < count {
        let stop = stop_rx.clone();
        match std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let _ = stop.lock().map(|rx| rx.recv());
            }) {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                failure = Some(e.raw_os_error().unwrap_or(0));
                break;
            }
        }
    }
    let started = handles.len();
    drop(stop_tx);
    for handle in handles {
        let _ = handle.join();
    }
    Ok(match failure {
        Some(errno) => format!("threads {started} errno {errno}"),
        None => format!("threads {started}"),
    })
}

/// `getenv(name)`: the value, or ENOENT.
pub fn getenv(name: &str) -> Outcome {
    std::env::var(name).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))
}
