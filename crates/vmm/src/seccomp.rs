//! The VMM's own seccomp allow-list, installed once everything is set up and before the vCPU
//! first runs (as Firecracker does per thread). Anything not listed kills the process; a
//! foreign ABI (i386, x32) kills it too; `ioctl` is allowed only with a KVM request (type
//! 0xAE), so the VMM cannot drive another device or a terminal even through a descriptor it
//! was handed; `socket` only as `socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
//! _)`, the vsock device's forwards (the guest's connections to the egress proxy's socket), so
//! the VMM can make no network socket, and no Unix datagram one either.
//!
//! This filter stacks on the process tier's deny-list when the VMM runs inside the jail.

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_W_ABS: u16 = 0x20;
const ALU_AND_K: u16 = 0x54;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
/// `seccomp_data.args[1]`, low half (x86_64 is little-endian): an ioctl's request, a
/// socket's type.
const OFFSET_IOCTL_REQUEST: u32 = 16 + 8;
const OFFSET_SOCKET_TYPE: u32 = 16 + 8;
/// `seccomp_data.args[0]`, low half: a socket's family (the kernel reads an int).
const OFFSET_SOCKET_FAMILY: u32 = 16;
const KVMIO: u32 = 0xae;

/// The syscalls the run loop makes, and why.
pub const ALLOWED: &[(&str, libc::c_long)] = &[
    // KVM_RUN and the KVM_GET_*/SET_* of snapshots (request type 0xAE only, see below).
    ("ioctl", libc::SYS_ioctl),
    // Console output to stdout, eventfd signals to the irqfds, snapshot files.
    ("write", libc::SYS_write),
    ("writev", libc::SYS_writev),
    ("read", libc::SYS_read),
    // Dropping descriptors at the end of a run; std checks each one with F_GETFD first
    // (debug builds).
    ("close", libc::SYS_close),
    ("fcntl", libc::SYS_fcntl),
    // The allocator (console buffer, snapshot state) and guest memory teardown.
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("brk", libc::SYS_brk),
    ("madvise", libc::SYS_madvise),
    // A thread's malloc arena grows by mprotect over its reserved heap (the vsock thread).
    ("mprotect", libc::SYS_mprotect),
    // Mutexes (the console buffer) and the std runtime.
    ("futex", libc::SYS_futex),
    ("sched_yield", libc::SYS_sched_yield),
    // The entropy device.
    ("getrandom", libc::SYS_getrandom),
    // The block device: positioned reads and writes on the disk files opened before the
    // filter, and its flush. Nothing here opens a file.
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("fdatasync", libc::SYS_fdatasync),
    // The CMOS clock (vDSO normally; the syscall where the vDSO is unavailable).
    ("clock_gettime", libc::SYS_clock_gettime),
    // Signals: a KVM_RUN interrupted by one, and exit.
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
    // The vsock device's host thread: waiting on its sockets, taking host connections
    // (non-blocking through fcntl, not ioctl), closing them, and its back-off sleep. Nothing
    // here creates a socket or opens a file.
    ("poll", libc::SYS_poll),
    ("ppoll", libc::SYS_ppoll),
    ("accept4", libc::SYS_accept4),
    // std reads and writes sockets with recv/send (the descriptors it already holds).
    ("recvfrom", libc::SYS_recvfrom),
    ("sendto", libc::SYS_sendto),
    ("shutdown", libc::SYS_shutdown),
    ("clock_nanosleep", libc::SYS_clock_nanosleep),
    // The vsock device's forwards (`virtio::vsock_forward`): a guest's connection to a
    // forwarded host port makes a non-blocking Unix stream socket (only AF_UNIX with exactly
    // that type, see below) and connects it to the forward's path, which the jail's view
    // holds. Nothing else makes a socket; connect on the VMM's other sockets fails.
    ("socket", libc::SYS_socket),
    ("connect", libc::SYS_connect),
];

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("setting no_new_privs failed")]
    NoNewPrivs(#[source] std::io::Error),
    #[error("installing the VMM's seccomp filter failed")]
    Install(#[source] std::io::Error),
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

fn program() -> Vec<Insn> {
    let mut p = vec![
        // The architecture: anything but x86_64 dies.
        insn(LD_W_ABS, 0, 0, 4),
        insn(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(RET_K, 0, 0, RET_KILL_PROCESS),
        // The number; the x32 ABI dies.
        insn(LD_W_ABS, 0, 0, 0),
        insn(JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(RET_K, 0, 0, RET_KILL_PROCESS),
        // ioctl: only KVM requests.
        insn(JEQ_K, 0, 5, libc::SYS_ioctl as u32),
        insn(LD_W_ABS, 0, 0, OFFSET_IOCTL_REQUEST),
        insn(ALU_AND_K, 0, 0, 0xff00),
        insn(JEQ_K, 0, 1, KVMIO << 8),
        insn(RET_K, 0, 0, RET_ALLOW),
        insn(RET_K, 0, 0, RET_KILL_PROCESS),
        // socket: only the forwards' AF_UNIX stream (the accumulator still holds the number).
        insn(JEQ_K, 0, 6, libc::SYS_socket as u32),
        insn(LD_W_ABS, 0, 0, OFFSET_SOCKET_FAMILY),
        insn(JEQ_K, 0, 3, libc::AF_UNIX as u32),
        insn(LD_W_ABS, 0, 0, OFFSET_SOCKET_TYPE),
        insn(
            JEQ_K,
            0,
            1,
            crate::virtio::vsock_forward::SOCKET_TYPE as u32,
        ),
        insn(RET_K, 0, 0, RET_ALLOW),
        insn(RET_K, 0, 0, RET_KILL_PROCESS),
    ];
    // The list, from the number again (ioctl and socket returned either way above).
    p.push(insn(LD_W_ABS, 0, 0, 0));
    for (_, number) in ALLOWED
        .iter()
        .filter(|(name, _)| !matches!(*name, "ioctl" | "socket"))
    {
        p.push(insn(JEQ_K, 0, 1, *number as u32));
        p.push(insn(RET_K, 0, 0, RET_ALLOW));
    }
    p.push(insn(RET_K, 0, 0, RET_KILL_PROCESS));
    p
}

/// Installs the allow-list on the calling thread (the VMM is single-threaded).
pub fn install() -> Result<(), SeccompError> {
    install_with(false)
}

/// [`install`] on every thread of the process at once (`SECCOMP_FILTER_FLAG_TSYNC`): a Linux
/// guest's VMM has its vsock host thread running already.
pub fn install_all_threads() -> Result<(), SeccompError> {
    install_with(true)
}

fn install_with(all_threads: bool) -> Result<(), SeccompError> {
    let program = program();
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with integer arguments only; the result is checked.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(SeccompError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    let result = if all_threads {
        // SAFETY: as below; seccomp(2) with TSYNC applies the same copied program to every
        // thread, and fails (checked) if one of them cannot take it.
        unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                &fprog as *const libc::sock_fprog,
            ) as libc::c_int
        }
    } else {
        // SAFETY: `fprog` points at `program`, a live array of `len` instructions laid out as
        // `struct sock_filter` (repr(C), same fields); the kernel copies it before returning.
        unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const libc::sock_fprog,
                0,
                0,
            )
        }
    };
    if result != 0 {
        return Err(SeccompError::Install(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Keeps glibc's malloc to one arena. Otherwise it sizes its arena limit on the first
/// contended allocation of a second thread by reading `/sys/devices/system/cpu/online`: an
/// `openat`, which the allow-list answers by killing the VMM (seen in the nested rig during a
/// 2 MB vsock transfer, the vCPU and vsock threads allocating at once). With a fixed limit it
/// never reads it. Call before any thread exists: the limit is computed once.
pub fn single_malloc_arena() {
    // SAFETY: mallopt takes two integers and changes only the allocator's tuning.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter for the instructions [`program`] uses.
    fn run(program: &[Insn], nr: u32, arch: u32, arg1: u32) -> u32 {
        run_args(program, nr, arch, [0, arg1])
    }

    fn run_args(program: &[Insn], nr: u32, arch: u32, args: [u32; 2]) -> u32 {
        let data = |offset: u32| match offset {
            0 => nr,
            4 => arch,
            OFFSET_SOCKET_FAMILY => args[0],
            OFFSET_IOCTL_REQUEST => args[1],
            _ => 0,
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = program[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => acc = data(i.k),
                ALU_AND_K => acc &= i.k,
                JEQ_K => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
                JGE_K => pc += usize::from(if acc >= i.k { i.jt } else { i.jf }),
                RET_K => return i.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    #[test]
    fn test_vmm_filter_allows_its_list_and_kvm_ioctls_only() {
        let p = program();
        let x86 = AUDIT_ARCH_X86_64;
        for (name, nr) in ALLOWED
            .iter()
            .filter(|(n, _)| !matches!(*n, "ioctl" | "socket"))
        {
            assert_eq!(run(&p, *nr as u32, x86, 0), RET_ALLOW, "{name}");
        }
        // KVM_RUN is _IO(0xAE, 0x80); TCGETS is 0x5401.
        assert_eq!(run(&p, libc::SYS_ioctl as u32, x86, 0xae80), RET_ALLOW);
        assert_eq!(
            run(&p, libc::SYS_ioctl as u32, x86, 0x5401),
            RET_KILL_PROCESS
        );
        for nr in [
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_socket,
            libc::SYS_clone,
        ] {
            assert_eq!(run(&p, nr as u32, x86, 0), RET_KILL_PROCESS, "{nr}");
        }
        assert_eq!(
            run(&p, libc::SYS_write as u32, 0x4000_0003, 0),
            RET_KILL_PROCESS
        );
        assert_eq!(
            run(&p, libc::SYS_write as u32 | X32_SYSCALL_BIT, x86, 0),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn test_vmm_filter_allows_only_the_forwards_unix_stream_socket() {
        let p = program();
        let x86 = AUDIT_ARCH_X86_64;
        let socket = |family: i32, type_: i32| {
            run_args(
                &p,
                libc::SYS_socket as u32,
                x86,
                [family as u32, type_ as u32],
            )
        };
        let forward = crate::virtio::vsock_forward::SOCKET_TYPE;
        assert_eq!(socket(libc::AF_UNIX, forward), RET_ALLOW);
        for (family, type_) in [
            (libc::AF_INET, forward),
            (libc::AF_INET6, forward),
            (libc::AF_VSOCK, forward),
            (libc::AF_NETLINK, forward),
            (
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            ),
            (libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC),
            (
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            ),
        ] {
            assert_eq!(
                socket(family, type_),
                RET_KILL_PROCESS,
                "{family} {type_:#x}"
            );
        }
        assert_eq!(run(&p, libc::SYS_connect as u32, x86, 0), RET_ALLOW);
        // Still no other way to a socket or a listening one.
        for nr in [libc::SYS_socketpair, libc::SYS_bind, libc::SYS_listen] {
            assert_eq!(run(&p, nr as u32, x86, 0), RET_KILL_PROCESS, "{nr}");
        }
    }
}
