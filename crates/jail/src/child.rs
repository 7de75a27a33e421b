//! Starting and reaping the workload processes of the in-sandbox agent (`airlock-agent`).
//!
//! The agent has no `unsafe`; everything it needs from the kernel for its children lives here
//! behind a small safe API: [`spawn`] (a clone that shares the agent's memory until its exec, in
//! a new session, optional identity switch, pipes or a pseudo-terminal), [`reap_any`],
//! [`signal_group`], [`set_window_size`], [`current_ids`] and [`inherited_listener`]. Between
//! the clone and the exec the child only makes raw syscalls (no allocation, no locks):
//! everything it needs is prepared before the clone, and a failure is reported to the parent
//! through a close-on-exec pipe as `(stage, errno)`.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Mutex;

/// How the child's standard descriptors are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// stdout and stderr are pipes; stdin is a pipe when `stdin` is true, else `/dev/null`.
    Pipes { stdin: bool },
    /// A new pseudo-terminal of this size is the child's controlling terminal and its
    /// stdin, stdout and stderr.
    Pty { cols: u16, rows: u16 },
}

/// What to run. `program` is the path that is executed; `argv[0]` is passed as given.
#[derive(Debug, Clone)]
pub struct ChildSpec<'a> {
    pub program: &'a Path,
    pub argv: &'a [OsString],
    /// `KEY=VALUE` entries: the whole environment of the child.
    pub env: &'a [OsString],
    pub cwd: &'a Path,
    /// Switch to this `(uid, gid)` (supplementary groups: just `gid`) before the exec.
    /// `None` keeps the caller's identity.
    pub switch_ids: Option<(u32, u32)>,
    pub stdio: Stdio,
    /// A cgroup's `cgroup.procs`, opened for writing: the child moves itself into that cgroup
    /// first thing after the clone (the workload's own memory cgroup, see
    /// `CgroupLimits::workload_memory_bytes`).
    pub cgroup_procs: Option<RawFd>,
}

/// The parent's ends of the child's standard descriptors. All are non-blocking and
/// close-on-exec.
#[derive(Debug)]
pub enum ChildIo {
    Pipes {
        stdin: Option<File>,
        stdout: File,
        stderr: File,
    },
    /// The pseudo-terminal's master side: read for output, write for input.
    Pty { master: File },
}

/// A started child. Its process group id equals its pid (it leads a new session).
#[derive(Debug)]
pub struct Child {
    pub pid: u32,
    pub io: ChildIo,
}

/// Where the child failed between the clone and the exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Cgroup,
    Session,
    ControllingTerminal,
    Descriptors,
    Groups,
    SetGid,
    SetUid,
    Chdir,
    Exec,
}

impl Stage {
    const ALL: [Stage; 9] = [
        Stage::Cgroup,
        Stage::Session,
        Stage::ControllingTerminal,
        Stage::Descriptors,
        Stage::Groups,
        Stage::SetGid,
        Stage::SetUid,
        Stage::Chdir,
        Stage::Exec,
    ];

    fn code(self) -> i32 {
        let index = Self::ALL.iter().position(|s| *s == self).unwrap_or(0);
        i32::try_from(index).unwrap_or(0)
    }

    fn from_code(code: i32) -> Stage {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .unwrap_or(Stage::Exec)
    }

    /// Whether the failure is a refused identity switch (setgroups/setresgid/setresuid).
    pub fn is_identity_switch(self) -> bool {
        matches!(self, Stage::Groups | Stage::SetGid | Stage::SetUid)
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Cgroup => "enter the workload's cgroup",
            Stage::Session => "setsid",
            Stage::ControllingTerminal => "set the controlling terminal",
            Stage::Descriptors => "set up stdin/stdout/stderr",
            Stage::Groups => "setgroups",
            Stage::SetGid => "setresgid",
            Stage::SetUid => "setresuid",
            Stage::Chdir => "chdir",
            Stage::Exec => "execve",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("{what} contains a NUL byte")]
    NulByte { what: &'static str },
    #[error("cannot prepare the child's descriptors")]
    Prepare(#[source] io::Error),
    #[error("cannot create the child process")]
    Clone(#[source] io::Error),
    #[error("the child could not {stage}")]
    Setup {
        stage: Stage,
        #[source]
        source: io::Error,
    },
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstring(bytes: &OsStr, what: &'static str) -> Result<CString, ChildError> {
    CString::new(bytes.as_bytes()).map_err(|_| ChildError::NulByte { what })
}

/// `pipe2(O_CLOEXEC)` with both ends moved above the standard descriptors, so that the
/// child's `dup2` onto 0..=2 never clobbers one of them.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned these descriptors; nothing else owns them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC takes integers and returns a new descriptor that we own.
    let new = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: fresh descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take integers and only change this descriptor's flags.
    unsafe {
        let flags = check(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        check(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            flags | libc::O_NONBLOCK,
        ))?;
    }
    Ok(())
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_SETFD takes integers and only changes this descriptor's flags.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// `openpty`: (master, slave), both close-on-exec and above the standard descriptors.
fn open_pty(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut master: libc::c_int = -1;
    let mut slave: libc::c_int = -1;
    let size = winsize(cols, rows);
    // SAFETY: the out-pointers are valid ints, name and termios may be null, and `size` lives
    // for the call.
    check(unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    })?;
    // SAFETY: openpty just returned these descriptors; nothing else owns them.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    set_cloexec(master.as_raw_fd())?;
    set_cloexec(slave.as_raw_fd())?;
    Ok((above_stdio(master)?, above_stdio(slave)?))
}

/// Descriptors prepared before the clone: (child's 0, 1, 2) and the parent's ends.
struct Prepared {
    child_fds: [OwnedFd; 3],
    /// The slave side when the child gets a terminal (it is also child_fds[0..3]).
    pty_slave: Option<RawFd>,
    parent: ChildIo,
}

fn prepare_stdio(stdio: Stdio) -> io::Result<Prepared> {
    match stdio {
        Stdio::Pipes { stdin } => {
            let (stdin_child, stdin_parent) = if stdin {
                let (r, w) = pipe()?;
                set_nonblocking(&w)?;
                (r, Some(File::from(w)))
            } else {
                (above_stdio(File::open("/dev/null")?.into())?, None)
            };
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            set_nonblocking(&out_r)?;
            set_nonblocking(&err_r)?;
            Ok(Prepared {
                child_fds: [stdin_child, out_w, err_w],
                pty_slave: None,
                parent: ChildIo::Pipes {
                    stdin: stdin_parent,
                    stdout: File::from(out_r),
                    stderr: File::from(err_r),
                },
            })
        }
        Stdio::Pty { cols, rows } => {
            let (master, slave) = open_pty(cols, rows)?;
            set_nonblocking(&master)?;
            let raw = slave.as_raw_fd();
            let slave_out = slave.try_clone()?;
            let slave_err = slave.try_clone()?;
            Ok(Prepared {
                child_fds: [slave, slave_out, slave_err],
                pty_slave: Some(raw),
                parent: ChildIo::Pty {
                    master: File::from(master),
                },
            })
        }
    }
}

/// Writes `(stage, errno)` to the error pipe and exits. Only raw syscalls: runs in the child.
fn fail_in_child(error_fd: RawFd, stage: Stage) -> ! {
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let mut message = [0u8; 8];
    message[..4].copy_from_slice(&stage.code().to_ne_bytes());
    message[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: `message` is a valid 8-byte buffer; a pipe write of 8 bytes is atomic. _exit
    // ends the child without running any of the parent's destructors.
    unsafe {
        libc::write(error_fd, message.as_ptr().cast(), message.len());
        libc::_exit(127)
    }
}

/// What the child needs between the clone and its exec, prepared by the parent: C strings,
/// pointer arrays and descriptor numbers that stay alive and unchanged while the parent waits.
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    child_fds: [RawFd; 3],
    error_fd: RawFd,
    pty_slave: Option<RawFd>,
    switch_ids: Option<(u32, u32)>,
    cgroup_procs: Option<RawFd>,
}

/// The child's stack until its exec: a few frames of raw syscalls.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Starts the child with `clone(CLONE_VM | CLONE_VFORK)`: it shares this process's memory until
/// its exec, and this thread waits until then. A fork would copy the agent's page tables and
/// then take a copy-on-write fault for each page the agent writes while the child starts, which
/// costs more than the exec of a small program on a nested host. Every signal is blocked around
/// the clone, so that no handler of this process runs on the child's side of the shared memory;
/// the child resets the handlers before it unblocks them.
fn clone_vfork(args: &ChildArgs) -> io::Result<libc::pid_t> {
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let saved = crate::sys::block_all_signals()?;
    // SAFETY: `child_main` runs on `stack`, which outlives the child's use of it (this thread
    // is suspended until the child has exec'd or exited, CLONE_VFORK), and reads `args`, which
    // stays borrowed and unchanged for the same time. The child makes only raw syscalls and
    // never returns into Rust code that could allocate or take a lock.
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(args).cast_mut().cast(),
        )
    };
    let cloned = check(pid);
    crate::sys::restore_signal_mask(&saved);
    drop(stack);
    cloned
}

/// The child, from the clone to the exec. It shares the parent's memory, so it makes only raw
/// syscalls on what `arg` points to; libc's `setgroups`, `setresgid` and `setresuid` would
/// signal the parent's threads, so those are made with `syscall`.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` the parent lent to `clone_vfork`, alive while it waits.
    let args = unsafe { &*arg.cast::<ChildArgs>() };
    // SAFETY: raw syscalls on prepared data only (see `clone_vfork`).
    unsafe {
        // The parent's handlers must not run here: every one goes back to its default before
        // the signals are unblocked. Rust's runtime ignores SIGPIPE, and an ignored signal
        // stays ignored across exec, so it goes back too; others ignored stay ignored.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=64 {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) == 0
                && (current.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
                && current.sa_sigaction != libc::SIG_DFL
            {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // From here on the workload's memory is charged to the workload's cgroup, where the
        // OOM killer cannot pick the agent (what the exec maps is the workload's).
        if let Some(fd) = args.cgroup_procs
            && libc::write(fd, b"0".as_ptr().cast(), 1) != 1
        {
            fail_in_child(args.error_fd, Stage::Cgroup);
        }
        if libc::setsid() == -1 {
            fail_in_child(args.error_fd, Stage::Session);
        }
        if let Some(slave) = args.pty_slave
            && libc::ioctl(slave, libc::TIOCSCTTY, 0) == -1
        {
            fail_in_child(args.error_fd, Stage::ControllingTerminal);
        }
        for (target, fd) in (0..).zip(args.child_fds.iter()) {
            if libc::dup2(*fd, target) == -1 {
                fail_in_child(args.error_fd, Stage::Descriptors);
            }
        }
        if let Some((uid, gid)) = args.switch_ids {
            let groups = [gid];
            if libc::syscall(libc::SYS_setgroups, 1, groups.as_ptr()) == -1 {
                fail_in_child(args.error_fd, Stage::Groups);
            }
            if libc::syscall(libc::SYS_setresgid, gid, gid, gid) == -1 {
                fail_in_child(args.error_fd, Stage::SetGid);
            }
            if libc::syscall(libc::SYS_setresuid, uid, uid, uid) == -1 {
                fail_in_child(args.error_fd, Stage::SetUid);
            }
        }
        if libc::chdir(args.cwd) == -1 {
            fail_in_child(args.error_fd, Stage::Chdir);
        }
        // Nothing but 0..=2 may reach the workload (best effort: needs Linux 5.11).
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        libc::execve(args.program, args.argv, args.envp);
    }
    fail_in_child(args.error_fd, Stage::Exec)
}

/// Starts a child as described by `spec`, in a new session (so its process group id is its
/// pid). Returns once the child has exec'd, or with the error it met on the way.
pub fn spawn(spec: &ChildSpec<'_>) -> Result<Child, ChildError> {
    let program = cstring(spec.program.as_os_str(), "the program path")?;
    let cwd = cstring(spec.cwd.as_os_str(), "the working directory")?;
    let argv_c = spec
        .argv
        .iter()
        .map(|a| cstring(a, "an argument"))
        .collect::<Result<Vec<_>, _>>()?;
    let env_c = spec
        .env
        .iter()
        .map(|e| cstring(e, "an environment entry"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env_c.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());

    let prepared = prepare_stdio(spec.stdio).map_err(ChildError::Prepare)?;
    let (error_r, error_w) = pipe().map_err(ChildError::Prepare)?;
    let args = ChildArgs {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: cwd.as_ptr(),
        child_fds: [
            prepared.child_fds[0].as_raw_fd(),
            prepared.child_fds[1].as_raw_fd(),
            prepared.child_fds[2].as_raw_fd(),
        ],
        error_fd: error_w.as_raw_fd(),
        pty_slave: prepared.pty_slave,
        switch_ids: spec.switch_ids,
        cgroup_procs: spec.cgroup_procs,
    };
    let pid = clone_vfork(&args).map_err(ChildError::Clone)?;
    drop(error_w);
    drop(prepared.child_fds);
    let mut message = [0u8; 8];
    let mut got = 0;
    let mut error_file = File::from(error_r);
    while got < message.len() {
        match error_file.read(&mut message[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let pid_u32 = u32::try_from(pid).unwrap_or(0);
    if got == message.len() {
        let stage = Stage::from_code(i32::from_ne_bytes([
            message[0], message[1], message[2], message[3],
        ]));
        let errno = i32::from_ne_bytes([message[4], message[5], message[6], message[7]]);
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; the child is ours and about to _exit.
        while unsafe { libc::waitpid(pid, &mut status, 0) } == -1
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        return Err(ChildError::Setup {
            stage,
            source: io::Error::from_raw_os_error(errno),
        });
    }
    Ok(Child {
        pid: pid_u32,
        io: prepared.parent,
    })
}

/// Reaps one exited child of this process, any child (orphans re-parented to us included),
/// without blocking. `None` when no child has exited (or there are no children).
pub fn reap_any() -> Option<(u32, ExitStatus)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; waitpid touches nothing else.
        let ret = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if ret > 0 {
            return Some((
                u32::try_from(ret).unwrap_or(0),
                ExitStatus::from_raw(status),
            ));
        }
        if ret == -1 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// Sends `signal` to every process of the group `pgid`.
pub fn signal_group(pgid: u32, signal: i32) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill takes plain integers and has no memory effects.
    check(unsafe { libc::kill(-pgid, signal) }).map(drop)
}

/// Sets the size of the terminal whose master side is `master`.
pub fn set_window_size(master: &File, cols: u16, rows: u16) -> io::Result<()> {
    let size = winsize(cols, rows);
    // SAFETY: `master` is a live descriptor and `size` a valid winsize for TIOCSWINSZ.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) }).map(drop)
}

/// This process's real `(uid, gid)`.
pub fn current_ids() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail and have no memory effects.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Takes ownership of an inherited descriptor that must be an open regular file or cgroup
/// file (the workload cgroup's files the helper opened), marks it close-on-exec and returns
/// it. Each number can be taken once.
pub fn inherited_file(fd: RawFd) -> io::Result<File> {
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("fd {fd} {why}"));
    if fd < 0 {
        return Err(invalid("is negative"));
    }
    let mut taken = TAKEN_FDS.lock().map_err(|_| invalid("table poisoned"))?;
    if taken.contains(&fd) {
        return Err(invalid("was already taken"));
    }
    // SAFETY: a zeroed stat is a valid buffer for the kernel to fill.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `stat` is a valid out-pointer; fstat fails cleanly on a closed descriptor.
    if unsafe { libc::fstat(fd, &mut stat) } == -1 {
        return Err(invalid("is not open"));
    }
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(invalid("is not a regular file"));
    }
    set_cloexec(fd)?;
    taken.push(fd);
    // SAFETY: the descriptor is open (checked above), and the table makes sure that this
    // process takes ownership of it only once.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Descriptors already taken by [`inherited_listener`], so that none is owned twice.
static TAKEN_FDS: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

/// Takes ownership of an inherited descriptor that must be a listening `AF_UNIX` stream
/// socket, marks it close-on-exec and returns it as a listener. Each number can be taken once.
pub fn inherited_listener(fd: RawFd) -> io::Result<UnixListener> {
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("fd {fd} {why}"));
    if fd < 0 {
        return Err(invalid("is negative"));
    }
    let mut taken = TAKEN_FDS.lock().map_err(|_| invalid("table poisoned"))?;
    if taken.contains(&fd) {
        return Err(invalid("was already taken"));
    }
    let option = |name: libc::c_int| -> io::Result<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are valid out-pointers sized for an int option.
        check(unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
        Ok(value)
    };
    let domain = option(libc::SO_DOMAIN).map_err(|_| invalid("is not an open socket"))?;
    if domain != libc::AF_UNIX || option(libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(invalid("is not an AF_UNIX stream socket"));
    }
    if option(libc::SO_ACCEPTCONN)? == 0 {
        return Err(invalid("is not listening"));
    }
    set_cloexec(fd)?;
    taken.push(fd);
    // SAFETY: the descriptor is an open listening socket (checked above), and the table makes
    // sure that this process takes ownership of it only once.
    Ok(unsafe { UnixListener::from_raw_fd(fd) })
}

#[cfg(test)]
#[path = "child_tests.rs"]
mod tests;
