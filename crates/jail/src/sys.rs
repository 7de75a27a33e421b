//! Thin, safe wrappers over the Linux syscalls the jail needs. Every `unsafe` block of the
//! helper lives here or in `landlock`/`seccomp`, each with its reasoning.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::Path;

mod mounts;
pub use mounts::{
    MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
    clone_tree, make_private, mount, mount_setattr, move_mount, move_mount_onto, open_dir_in_root,
    open_in_root, open_path, open_path_with, open_tree_clone, pivot_root_here, umount_detach,
};

/// Turns a `-1`-on-error return into an `io::Result`.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_int(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Converts a path into a C string, rejecting interior NUL bytes.
pub fn cpath(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `pipe2(O_CLOEXEC)`: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill; on success both are new
    // descriptors that nothing else owns.
    check_int(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned these descriptors to us, so we own them exclusively.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Result of [`fork`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    Child,
    Parent(libc::pid_t),
}

/// `fork()`. Only called by the single-threaded helper and its init, never by a threaded
/// process, so the child may run arbitrary code.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: the helper and init are single-threaded (they never spawn threads), so the child
    // inherits a consistent copy of the address space, allocator locks included.
    let pid = check_int(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid)
    })
}

/// `clone(flags)` without a new stack: a fork that also creates the namespaces in `flags`.
/// Single-threaded callers only, as for [`fork`].
pub fn fork_into(flags: libc::c_int) -> io::Result<Forked> {
    let flags = libc::c_ulong::try_from(flags | libc::SIGCHLD)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a null stack makes clone behave like fork (the child continues on a copy of this
    // stack); the caller is single-threaded, so the copy is consistent.
    let pid =
        check(unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) })?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid as libc::pid_t)
    })
}

/// A connected `SOCK_SEQPACKET` pair, for messages that may carry a descriptor.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    check_int(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: the kernel just returned these descriptors to us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub use crate::scm::{recv_with_fd, send_with_fd};

/// Starts `path` with an empty environment, the `(fd, target)` pairs installed, every signal
/// unblocked and SIGPIPE at its default. Uses `posix_spawn`, which shares this process's memory
/// until the exec instead of copying its page tables.
pub fn spawn(path: &Path, fds: &[(RawFd, RawFd)]) -> io::Result<libc::pid_t> {
    spawn_with_args(path, &[], fds)
}

/// [`spawn`] with arguments after the program's name.
pub fn spawn_with_args(
    path: &Path,
    args: &[&CStr],
    fds: &[(RawFd, RawFd)],
) -> io::Result<libc::pid_t> {
    let program = cpath(path)?;
    let mut argv = vec![program.as_ptr() as *mut libc::c_char];
    argv.extend(args.iter().map(|arg| arg.as_ptr() as *mut libc::c_char));
    argv.push(std::ptr::null_mut());
    let envp = [std::ptr::null_mut::<libc::c_char>()];
    // SAFETY: zeroed actions/attributes are initialised by the init calls before use and
    // destroyed below; every pointer handed to posix_spawn lives until it returns.
    unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        libc::posix_spawn_file_actions_init(&mut actions);
        libc::posix_spawnattr_init(&mut attr);
        for &(fd, target) in fds {
            libc::posix_spawn_file_actions_adddup2(&mut actions, fd, target);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        let mut defaults = empty;
        libc::sigaddset(&mut defaults, libc::SIGPIPE);
        libc::posix_spawnattr_setsigmask(&mut attr, &empty);
        libc::posix_spawnattr_setsigdefault(&mut attr, &defaults);
        libc::posix_spawnattr_setflags(
            &mut attr,
            (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
        );
        let mut pid: libc::pid_t = 0;
        let ret = libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            &actions,
            &attr,
            argv.as_ptr(),
            envp.as_ptr(),
        );
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attr);
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        Ok(pid)
    }
}

/// Whether descriptor `fd` is open in this process.
pub fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags; a closed one fails with EBADF.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Whether `fd` refers to a directory.
pub fn fstat_is_dir(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: a zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is live and `st` valid; fstat works on O_PATH descriptors.
    check_int(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok((st.st_mode & libc::S_IFMT) == libc::S_IFDIR)
}

/// Receives one datagram into `buf`; 0 means the peer closed.
pub fn recv(socket: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Makes descriptor number `target` refer to `fd`'s file, close-on-exec.
pub fn dup_onto(fd: &OwnedFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup3 takes integers; replacing `target` is the point, and its old file is ours.
    check_int(unsafe { libc::dup3(fd.as_raw_fd(), target, libc::O_CLOEXEC) }).map(drop)
}

/// Duplicates `fd` to a number of at least `min`, close-on-exec.
pub fn dup_above(fd: &OwnedFd, min: RawFd) -> io::Result<OwnedFd> {
    dup_raw_above(fd.as_raw_fd(), min)
}

/// Moves the descriptor at number `fd`, inherited and owned by nobody yet, to a close-on-exec
/// one at or above `min`, and frees the number; `EBADF` when nothing was there.
pub fn move_above(fd: RawFd, min: RawFd) -> io::Result<OwnedFd> {
    let moved = dup_raw_above(fd, min);
    let _ = close_one(fd);
    moved
}

fn dup_raw_above(fd: RawFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC takes integers and fails cleanly on a closed number; the new
    // descriptor is ours.
    let new = check_int(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `waitpid(pid, 0)`, retried on `EINTR`; returns the raw wait status.
pub fn waitpid(pid: libc::pid_t, flags: libc::c_int) -> io::Result<(libc::pid_t, libc::c_int)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; waitpid touches nothing else.
        let ret = unsafe { libc::waitpid(pid, &mut status, flags) };
        if ret == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok((ret, status));
    }
}

pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes plain integers and has no memory effects.
    check_int(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// `CLOCK_MONOTONIC` in nanoseconds: comparable across processes, unlike `Instant`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid cannot fail and has no memory effects.
    unsafe { libc::getpid() }
}

pub fn getppid() -> libc::pid_t {
    // SAFETY: getppid cannot fail and has no memory effects.
    unsafe { libc::getppid() }
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail and has no memory effects.
    unsafe { libc::geteuid() }
}

/// Exits immediately, without running destructors or flushing stdio: the right exit for a
/// forked child.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and only ends this process.
    unsafe { libc::_exit(code) }
}

pub fn getegid() -> u32 {
    // SAFETY: getegid cannot fail and has no memory effects.
    unsafe { libc::getegid() }
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes a flag word and only changes this process's namespaces.
    check_int(unsafe { libc::unshare(flags) }).map(drop)
}

pub fn setns(fd: &OwnedFd, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is a live namespace descriptor owned by the caller.
    check_int(unsafe { libc::setns(fd.as_raw_fd(), nstype) }).map(drop)
}

/// `prctl` with integer arguments only.
pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: every option we pass takes integer arguments, never pointers.
    check_int(unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
}

pub fn prctl_cap_ambient_clear_all() -> io::Result<()> {
    const PR_CAP_AMBIENT_CLEAR_ALL: libc::c_ulong = 4;
    // SAFETY: PR_CAP_AMBIENT takes integer arguments only.
    check_int(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            PR_CAP_AMBIENT_CLEAR_ALL,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
    .map(drop)
}

pub fn setresuid(uid: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments. The raw syscall, not libc's wrapper, because glibc's
    // setxid broadcast is unnecessary in a single-threaded process.
    check(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) }).map(drop)
}

pub fn setresgid(gid: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments, as for setresuid.
    check(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) }).map(drop)
}

/// Drops every supplementary group.
pub fn clear_groups() -> io::Result<()> {
    set_groups(&[])
}

/// Sets the supplementary groups to exactly `groups`.
pub fn set_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: `groups` is a valid array of gid_t of the length passed (a null pointer with
    // length 0 clears the list, as documented).
    check(unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len(),
            if groups.is_empty() {
                std::ptr::null()
            } else {
                groups.as_ptr()
            },
        )
    })
    .map(drop)
}

/// Sets the effective and permitted capability sets to `keep` (bit n is capability n) and
/// empties the inheritable set.
pub fn set_capabilities(keep: u64) -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let low = (keep & 0xffff_ffff) as u32;
    let high = (keep >> 32) as u32;
    let data = [
        Data {
            effective: low,
            permitted: low,
            inheritable: 0,
        },
        Data {
            effective: high,
            permitted: high,
            inheritable: 0,
        },
    ];
    // SAFETY: version 3 takes a header and an array of two data structs, both valid for the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) }).map(drop)
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes, which outlive the call.
    check_int(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// `setrlimit`'s resource argument, which glibc and musl type differently.
#[cfg(target_env = "gnu")]
pub type RlimitResource = libc::__rlimit_resource_t;
/// `setrlimit`'s resource argument, which glibc and musl type differently.
#[cfg(not(target_env = "gnu"))]
pub type RlimitResource = libc::c_int;

/// An ioctl request number as the C library's `ioctl` takes it: an `unsigned long` in glibc, an
/// `int` in musl. The kernel reads 32 bits either way.
#[allow(
    clippy::cast_possible_wrap,
    reason = "musl's int holds the same 32 bits the kernel reads"
)]
pub const fn ioctl_request(number: u32) -> libc::Ioctl {
    number as libc::Ioctl
}

pub fn setrlimit(resource: RlimitResource, soft: u64, hard: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a valid rlimit that outlives the call.
    check_int(unsafe { libc::setrlimit(resource, &limit) }).map(drop)
}

pub fn getrlimit(resource: RlimitResource) -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer.
    check_int(unsafe { libc::getrlimit(resource, &mut limit) })?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

pub fn chdir(path: &Path) -> io::Result<()> {
    let path = cpath(path)?;
    // SAFETY: `path` is a valid NUL-terminated string.
    check_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// Closes every descriptor from `first` up, except those listed (which must be sorted).
pub fn close_from(first: RawFd, keep: &[RawFd]) -> io::Result<()> {
    let mut start = first as libc::c_uint;
    for &fd in keep.iter().filter(|&&fd| fd >= first) {
        let fd = fd as libc::c_uint;
        if fd > start {
            close_range(start, fd - 1)?;
        }
        start = fd + 1;
    }
    close_range(start, libc::c_uint::MAX)
}

/// Closes `fds` with one `close_range` per run of consecutive numbers (descriptors opened one
/// after another mostly are).
pub fn close_all(fds: Vec<OwnedFd>) {
    let mut raw: Vec<RawFd> = fds.into_iter().map(IntoRawFd::into_raw_fd).collect();
    raw.sort_unstable();
    for run in raw.chunk_by(|a, b| b - a == 1) {
        // Every descriptor in the run is one of `fds`, which this call owns.
        let _ = close_range(run[0] as libc::c_uint, run[run.len() - 1] as libc::c_uint);
    }
}

/// Closes descriptor `fd` if it is open (nothing if it is not).
pub fn close_one(fd: RawFd) -> io::Result<()> {
    close_range(fd as libc::c_uint, fd as libc::c_uint)
}

fn close_range(first: libc::c_uint, last: libc::c_uint) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors of this process; the callers own them all.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) }).map(drop)
}

/// Blocks `signals` in this thread and returns the previous mask.
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<libc::sigset_t> {
    block_set(&sigset(signals))
}

/// Blocks every signal in this thread and returns the previous mask.
pub fn block_all_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: sigfillset initialises the zeroed set.
    let all = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        all
    };
    block_set(&all)
}

fn block_set(set: &libc::sigset_t) -> io::Result<libc::sigset_t> {
    // SAFETY: a zeroed sigset_t is a valid out-parameter.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both sets are valid for the call.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, set, &mut old) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(old)
}

/// Makes `mask` (one that [`block_signals`] or [`block_all_signals`] returned) this thread's
/// signal mask again.
pub fn restore_signal_mask(mask: &libc::sigset_t) {
    // SAFETY: `mask` is a valid set; SIG_SETMASK with valid input cannot fail.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// Unblocks every signal and restores default dispositions: the state a new program expects.
pub fn reset_signals() {
    // SAFETY: an empty set is valid; sigprocmask with SIG_SETMASK cannot fail with valid input.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
    for signal in 1..libc::SIGRTMIN() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: SIG_DFL is always a valid disposition; errors for reserved signals are ignored.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
}

pub fn ignore_signal(signal: libc::c_int) {
    // SAFETY: SIG_IGN is always a valid disposition.
    unsafe { libc::signal(signal, libc::SIG_IGN) };
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset only writes within it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// A `signalfd` for `signals`, which the caller has blocked.
pub fn signalfd(signals: &[libc::c_int]) -> io::Result<OwnedFd> {
    let set = sigset(signals);
    // SAFETY: `set` is valid; the returned descriptor is new and ours.
    let fd = check_int(unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) })?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one pending signal from a signalfd.
pub fn read_signal(fd: &OwnedFd) -> io::Result<libc::c_int> {
    // SAFETY: a zeroed signalfd_siginfo is a valid buffer of the exact size read asks for.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: the buffer is valid for `size` bytes.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut info as *mut libc::signalfd_siginfo).cast(),
            size,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    libc::c_int::try_from(info.ssi_signo).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Waits until one of `fds` is readable or `timeout_ms` passes (-1: forever). Returns which
/// entries are ready.
pub fn poll_readable(fds: &[RawFd], timeout_ms: libc::c_int) -> io::Result<Vec<bool>> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: the slice is valid for its length.
    let ret = unsafe {
        libc::poll(
            pollfds.as_mut_ptr(),
            pollfds.len() as libc::nfds_t,
            timeout_ms,
        )
    };
    if ret == -1 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(err);
    }
    Ok(pollfds.iter().map(|p| p.revents != 0).collect())
}

/// Whether `fd` (a `/proc/self/mountinfo`) has a priority event: the mount table changed
/// since it was opened or last polled. The poll consumes the event.
pub fn poll_priority(fd: &OwnedFd) -> io::Result<bool> {
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let ready = check_int(unsafe { libc::poll(&mut pollfd, 1, 0) })?;
    Ok(ready > 0 && pollfd.revents & (libc::POLLPRI | libc::POLLERR) != 0)
}

/// `execve`; returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], env: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    // SAFETY: all pointers are NUL-terminated strings kept alive by the borrowed vectors, and both
    // arrays end in a null pointer.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes integers; we own the result.
    let fd = check_int(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: fresh descriptor from the kernel.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed ifreq is valid; we fill in the name and flags.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS and SIOCSIFFLAGS.
    unsafe {
        check_int(libc::ioctl(
            sock.as_raw_fd(),
            ioctl_request(libc::SIOCGIFFLAGS as u32),
            &mut req,
        ))?;
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check_int(libc::ioctl(
            sock.as_raw_fd(),
            ioctl_request(libc::SIOCSIFFLAGS as u32),
            &req,
        ))?;
    }
    Ok(())
}

/// How many bytes the pipe `fd` holds before a write blocks.
pub fn pipe_capacity(fd: &impl AsRawFd) -> io::Result<usize> {
    // SAFETY: F_GETPIPE_SZ only reads the descriptor's pipe size.
    let size = check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) })?;
    usize::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Sets this process's nice value (19 is the lowest CPU priority).
pub fn set_nice(nice: libc::c_int) -> io::Result<()> {
    // SAFETY: setpriority takes integers and changes only this process.
    check_int(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) }).map(drop)
}

/// Writes the whole buffer to a raw descriptor that the caller keeps owning.
pub fn write_all_raw(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: the buffer is valid for its length; `fd` is open for the caller.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}
