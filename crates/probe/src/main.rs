//! `airlock-probe`: attempts one action and prints what happened, so that tests can prove a
//! denial from inside a sandbox and show, as a control, that the same action works outside.
//!
//! Output is one line: `ok [detail]` or `errno <N> <name>`. The exit code is 0 whenever the
//! attempt itself ran, so that a failed attempt is never confused with a broken sandbox; the
//! `exit` and `kill-self` actions exist to test exit-status propagation.
//!
//! This binary is test equipment, not part of the runtime. It needs raw syscalls to attempt
//! attacks, which is why it is the one crate besides `jail` allowed `unsafe`.

mod files;
mod kernel;
mod net;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let number = |i: usize| arg(i).parse::<i64>().unwrap_or(0);
    let result = match arg(0).as_str() {
        "read" => read_file(&arg(1)),
        "write" => write_file(&arg(1)),
        "ptrace" => ptrace_child(),
        "mount" => mount_tmpfs(),
        "userns" => nested_user_namespace(),
        "connect" => connect(&arg(1)),
        "loopback" => loopback_round_trip(),
        "pid-visible" => pid_visible(number(1)),
        "alloc" => alloc_mib(number(1)),
        "forkbomb" => fork_bomb(number(1)),
        "daemon" => daemonize(&arg(1)),
        "sleep-marker" => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        "exit" => std::process::exit(i32::try_from(number(1)).unwrap_or(1)),
        "kill-self" => kill_self(number(1)),
        "spew" => spew(number(1)),
        "cat" => cat(),
        "whoami" => whoami(),
        "fds" => open_descriptors(),
        "await-read" => await_then_read(&args[1..]),
        "int80" => legacy_i386_syscall(),
        "tcp-queue" => tcp_queue_mib(number(1)),
        "unix-queue" => unix_queue_mib(number(1)),
        "x32" => x32_syscall(),
        "socket" => open_socket(number(1), number(2), number(3)),
        "vsock-connect" => vsock_connect(number(1), number(2)),
        "chmod-setuid" => chmod_setuid(&arg(1)),
        "open-write" => files::open_write(&arg(1)),
        "stat" => files::stat(&arg(1)),
        "symlink-write" => files::symlink_write(&arg(1), &arg(2)),
        "symlink-read" => files::symlink_read(&arg(1), &arg(2)),
        "hardlink" => files::hard_link(&arg(1), &arg(2)),
        "rename" => files::rename(&arg(1), &arg(2)),
        "mknod-char" => files::mknod_char(&arg(1)),
        "truncate" => files::truncate(&arg(1)),
        "setxattr" => files::set_xattr(&arg(1)),
        "create-setuid" => files::create_setuid(&arg(1)),
        "fill" => files::fill(&arg(1), number(2)),
        "sparse" => files::sparse(&arg(1), number(2)),
        "fd-exhaust" => files::exhaust_descriptors(),
        "rename-race" => files::rename_race(&arg(1), &arg(2), number(3)),
        "fifo-race" => files::fifo_race(&arg(1), number(2)),
        "late-read" => late_read(&arg(1), &arg(2)),
        "kallsyms" => files::kallsyms(),
        "exec" => files::exec(&arg(1), args.get(2..).unwrap_or_default()),
        "syscall" => kernel::syscall(&arg(1)),
        "tiocsti" => kernel::tiocsti(),
        "tioclinux" => kernel::tioclinux(),
        "process-vm-readv" => kernel::process_vm_read(),
        "pidfd-getfd" => kernel::pidfd_getfd(number(1), number(2)),
        "clone-newuser" => kernel::clone_newuser(),
        "clone3" => kernel::clone3(),
        "kill" => kernel::kill(number(1), number(2)),
        "status" => kernel::status_summary(),
        "threadbomb" => kernel::thread_bomb(number(1)),
        "getenv" => kernel::getenv(&arg(1)),
        "connect-unix" => net::connect_unix(&arg(1)),
        "udp-echo" => net::udp_echo(&arg(1)),
        "dns" => net::dns_query(&arg(1), &arg(2)),
        "icmp-ping" => net::icmp_ping(&arg(1)),
        "listen-wait" => net::listen_wait(number(1), number(2)),
        "hold-listener" => net::hold_listener(&arg(1), number(2), number(3)),
        "http-get" => net::http_get(&arg(1), &arg(2)),
        "proxy-connect" => net::proxy_connect(&arg(1), &arg(2)),
        "fake-servers" => net::fake_servers(&arg(1), args.get(2..).unwrap_or_default()),
        other => {
            eprintln!("airlock-probe: unknown action `{other}`");
            std::process::exit(2);
        }
    };
    match result {
        Ok(detail) if detail.is_empty() => println!("ok"),
        Ok(detail) => println!("ok {detail}"),
        Err(err) => {
            let errno = err.raw_os_error().unwrap_or(0);
            println!("errno {errno} {}", errno_name(errno));
        }
    }
}

type Outcome = io::Result<String>;

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EMFILE => "EMFILE",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EBUSY => "EBUSY",
        libc::ENOTTY => "ENOTTY",
        libc::ENOTSUP => "EOPNOTSUPP",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ELOOP => "ELOOP",
        libc::ENOMEM => "ENOMEM",
        libc::EHWPOISON => "EHWPOISON",
        _ => "other",
    }
}

/// `Err(errno)` for a raw syscall's -1 return, the value otherwise.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstr(text: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(text).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Runs a libc call that returns -1 on error.
fn unsafe_call(call: impl FnOnce() -> libc::c_long) -> io::Result<libc::c_long> {
    let ret = call();
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn sys(call: impl FnOnce() -> io::Result<libc::c_long>) -> Outcome {
    call().map(|_| String::new())
}

pub(crate) fn read_file(path: &str) -> Outcome {
    let mut contents = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut contents)?;
    Ok(contents.len().to_string())
}

fn write_file(path: &str) -> Outcome {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?
        .write_all(b"probe")?;
    Ok(String::new())
}

pub(crate) fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: the probe is single-threaded, so the child may keep running Rust code.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

pub(crate) fn child_that_sleeps() -> io::Result<libc::pid_t> {
    let pid = fork()?;
    if pid == 0 {
        std::thread::sleep(Duration::from_secs(30));
        // SAFETY: ends only this child.
        unsafe { libc::_exit(0) };
    }
    Ok(pid)
}

pub(crate) fn reap(pid: libc::pid_t) {
    // SAFETY: kill and waitpid on our own child, with a valid status pointer.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
}

fn ptrace_child() -> Outcome {
    let child = child_that_sleeps()?;
    // SAFETY: PTRACE_ATTACH takes a pid and null pointers.
    let result = unsafe_call(|| unsafe {
        libc::ptrace(
            libc::PTRACE_ATTACH,
            child,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    });
    reap(child);
    sys(|| result)
}

/// Mounts a tmpfs in a private mount namespace of this process (so that, as a control on the
/// host, nothing outside it changes).
fn mount_tmpfs() -> Outcome {
    // SAFETY: unshare takes flags only.
    let _ = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    // SAFETY: all strings are NUL-terminated literals.
    let _ = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    sys(|| {
        // SAFETY: all strings are NUL-terminated literals.
        unsafe_call(|| unsafe {
            libc::mount(
                c"none".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ) as libc::c_long
        })
    })
}

fn nested_user_namespace() -> Outcome {
    // SAFETY: unshare takes flags only.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
    sys(|| unsafe_call(|| libc::c_long::from(ret)))
}

fn connect(address: &str) -> Outcome {
    let address = address
        .parse()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    Ok(String::new())
}

fn loopback_round_trip() -> Outcome {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let mut client = TcpStream::connect(address)?;
    let (mut server, _) = listener.accept()?;
    client.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn pid_visible(pid: i64) -> Outcome {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: signal 0 only checks for existence.
    sys(|| unsafe_call(|| unsafe { libc::kill(pid, 0) as libc::c_long }))?;
    Ok(format!(
        "proc={}",
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    ))
}

fn alloc_mib(mib: i64) -> Outcome {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        blocks.push(vec![1u8; 1 << 20]);
    }
    Ok(blocks.len().to_string())
}

/// Forks sleeping children until `limit` or the first failure, then kills and reaps them all,
/// so that a control run on the host leaves nothing behind either.
fn fork_bomb(limit: i64) -> Outcome {
    let mut children = Vec::new();
    let mut failure = None;
    while i64::try_from(children.len()).unwrap_or(i64::MAX) < limit {
        match child_that_sleeps() {
            Ok(pid) => children.push(pid),
            Err(err) => {
                failure = Some(err.raw_os_error().unwrap_or(0));
                break;
            }
        }
    }
    let forked = children.len();
    for pid in children {
        reap(pid);
    }
    Ok(match failure {
        Some(errno) => format!("forked {forked} errno {errno}"),
        None => format!("forked {forked}"),
    })
}

/// setsid + double fork, the classic daemon: the grandchild re-executes this probe with a
/// marker in its argv so the test can look for it on the host afterwards.
fn daemonize(marker: &str) -> Outcome {
    let exe = std::env::current_exe()?;
    if fork()? == 0 {
        // SAFETY: setsid takes no arguments.
        unsafe { libc::setsid() };
        if fork().unwrap_or(-1) == 0 {
            let err = std::os::unix::process::CommandExt::exec(
                std::process::Command::new(exe)
                    .args(["sleep-marker", marker])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null()),
            );
            eprintln!("exec failed: {err}");
        }
        // SAFETY: ends only the intermediate child.
        unsafe { libc::_exit(0) };
    }
    std::thread::sleep(Duration::from_millis(200));
    Ok(String::new())
}

fn kill_self(signal: i64) -> Outcome {
    let signal = libc::c_int::try_from(signal).unwrap_or(libc::SIGKILL);
    io::stdout().flush()?;
    // SAFETY: restoring the default action (std handles SIGSEGV itself) and raising the signal
    // on ourselves.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
    Ok("survived".into())
}

/// Writes `bytes` of a position-dependent pattern, so truncation or reordering shows.
fn spew(bytes: i64) -> Outcome {
    let total = usize::try_from(bytes).unwrap_or(0);
    let mut out = io::stdout().lock();
    let mut written = 0;
    let mut chunk = vec![0u8; 64 * 1024];
    while written < total {
        let n = chunk.len().min(total - written);
        for (i, byte) in chunk[..n].iter_mut().enumerate() {
            *byte = ((written + i) % 251) as u8;
        }
        out.write_all(&chunk[..n])?;
        written += n;
    }
    out.flush()?;
    std::process::exit(0)
}

fn cat() -> Outcome {
    let mut input = Vec::new();
    io::stdin().read_to_end(&mut input)?;
    io::stdout().write_all(&input)?;
    io::stdout().flush()?;
    std::process::exit(0)
}

fn whoami() -> Outcome {
    // SAFETY: these getters cannot fail.
    let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
    Ok(format!("uid={uid} gid={gid} euid={euid}"))
}

/// `getpid` through the i386 entry point (`int 0x80`), which a filter that checks only x86_64
/// numbers would not see. Returns the raw result.
fn legacy_i386_syscall() -> Outcome {
    const I386_GETPID: i64 = 20;
    let mut ret = I386_GETPID;
    // SAFETY: `int 0x80` runs i386 getpid, which takes no arguments and touches no memory; the
    // kernel clobbers only eax (and preserves the other registers on this entry path).
    unsafe { std::arch::asm!("int 0x80", inout("rax") ret, options(nostack)) };
    if ret < 0 {
        Err(io::Error::from_raw_os_error(
            i32::try_from(-ret).unwrap_or(0),
        ))
    } else {
        Ok(String::new())
    }
}

/// `getpid` with the x32 ABI bit set.
fn x32_syscall() -> Outcome {
    const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;
    // SAFETY: getpid takes no arguments; an unknown number only returns ENOSYS.
    let ret = unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) };
    sys(|| unsafe_call(|| ret))
}

/// Queues up to `cap` MiB in loopback TCP connections that nobody reads, and reports how much
/// the kernel accepted. Kernel socket memory must count against the sandbox's memory limit.
fn tcp_queue_mib(cap: i64) -> Outcome {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    queue_mib(cap, || {
        let client = TcpStream::connect(address)?;
        let (server, _) = listener.accept()?;
        client.set_nonblocking(true)?;
        Ok((client, server))
    })
}

/// The same with Unix socket pairs.
fn unix_queue_mib(cap: i64) -> Outcome {
    queue_mib(cap, || {
        let (writer, reader) = std::os::unix::net::UnixStream::pair()?;
        writer.set_nonblocking(true)?;
        Ok((writer, reader))
    })
}

/// Fills non-blocking connections from `connect` (writer, reader) until `cap` MiB are queued or
/// the kernel accepts no more, keeping every connection open.
fn queue_mib<W: Write, R>(cap: i64, mut connect: impl FnMut() -> io::Result<(W, R)>) -> Outcome {
    let cap = usize::try_from(cap).unwrap_or(0) << 20;
    let chunk = vec![7u8; 1 << 16];
    let mut queued = 0usize;
    let mut held = Vec::new();
    while queued < cap {
        let (mut writer, reader) = connect()?;
        let before = queued;
        while queued < cap {
            match writer.write(&chunk) {
                Ok(n) => queued += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        held.push((writer, reader));
        if queued == before {
            break;
        }
    }
    Ok(format!("queued {} MiB", queued >> 20))
}

/// Prints `started`, waits (at most 20 s) until `paths[0]` exists, then tries to read each of
/// the other paths, printing one verdict line per path: for secrets that appear only after the
/// sandbox started.
fn await_then_read(paths: &[String]) -> Outcome {
    let (ready, files) = paths
        .split_first()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    println!("started");
    io::stdout().flush()?;
    for _ in 0..1000 {
        if std::path::Path::new(ready).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for file in files {
        match read_file(file) {
            Ok(n) => println!("{file}: ok {n}"),
            Err(e) => println!("{file}: errno {}", e.raw_os_error().unwrap_or(0)),
        }
    }
    Ok("done".into())
}

/// Prints `started`, waits (at most 20 s) until `ready` exists, then reads `file`: for a secret
/// that appears only after the sandbox started.
fn late_read(ready: &str, file: &str) -> Outcome {
    println!("started");
    io::stdout().flush()?;
    for _ in 0..1000 {
        if std::path::Path::new(ready).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    read_file(file)
}

/// The descriptors open in this process, other than the one listing them.
fn open_descriptors() -> Outcome {
    let mut fds: Vec<i32> = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        if let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            fds.push(fd);
        }
    }
    fds.sort_unstable();
    // The highest is read_dir's own descriptor.
    fds.pop();
    Ok(fds
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(","))
}

fn open_socket(domain: i64, kind: i64, protocol: i64) -> Outcome {
    let int = |v: i64| libc::c_int::try_from(v).unwrap_or(-1);
    // SAFETY: socket takes integers; the descriptor is closed right after.
    let fd = unsafe_call(|| unsafe {
        libc::socket(int(domain), int(kind), int(protocol)) as libc::c_long
    })?;
    // SAFETY: closing the descriptor we just opened.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(String::new())
}

/// Connects an AF_VSOCK stream socket to CID:PORT: a microVM guest reaching a vsock service
/// of its host (CID 2).
fn vsock_connect(cid: i64, port: i64) -> Outcome {
    let cid = u32::try_from(cid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let port = u32::try_from(port).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: socket takes integers; the descriptor is closed below.
    let fd = unsafe_call(|| unsafe {
        libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) as libc::c_long
    })?;
    // SAFETY: sockaddr_vm is plain integers, for which all zeroes is valid.
    let mut address: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    address.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    address.svm_cid = cid;
    address.svm_port = port;
    let length = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: `fd` is the socket opened above; `address` is a valid sockaddr_vm of `length`.
    let connected = unsafe_call(|| unsafe {
        libc::connect(
            fd as libc::c_int,
            (&raw const address).cast::<libc::sockaddr>(),
            length,
        ) as libc::c_long
    });
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd as libc::c_int) };
    connected.map(|_| String::new())
}

fn chmod_setuid(path: &str) -> Outcome {
    std::fs::write(path, b"#!/bin/sh\n")?;
    let c_path =
        std::ffi::CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid NUL-terminated path and a mode.
    sys(|| unsafe_call(|| unsafe { libc::chmod(c_path.as_ptr(), 0o4755) as libc::c_long }))
}
