//! Process handles that survive the supervisor: pidfds, sessions, inheritable descriptors and
//! process start times. A long-lived sandbox's helper is found again by pid and start time, and
//! then only ever addressed through a pidfd, so that a reused pid can never be signalled.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(pid)`: a descriptor for the process, readable once it has exited.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a new descriptor (close-on-exec by default).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `signal` to the process behind `pidfd`; `Ok` also when it has already exited.
pub fn pidfd_send_signal(pidfd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: integers only; a null siginfo means "as if by kill(2)".
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    match ret {
        -1 => {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ESRCH) {
                Ok(())
            } else {
                Err(err)
            }
        }
        _ => Ok(()),
    }
}

/// Whether the process behind `pidfd` has exited, waiting up to `timeout_ms` (-1: forever).
pub fn pidfd_exited(pidfd: &OwnedFd, timeout_ms: libc::c_int) -> io::Result<bool> {
    Ok(crate::sys::poll_readable(&[pidfd.as_raw_fd()], timeout_ms)?
        .first()
        .copied()
        .unwrap_or(false))
}

/// Makes this process non-dumpable: processes of the same uid without `CAP_SYS_PTRACE` can no
/// longer read its memory, environment or descriptors through `/proc` or `pidfd_getfd`. An
/// exec resets the flag, so a program that needs it sets it itself, first thing.
pub fn set_non_dumpable() -> io::Result<()> {
    crate::sys::prctl(libc::PR_SET_DUMPABLE, 0).map(drop)
}

/// Sets `no_new_privs` (a seccomp filter needs it without `CAP_SYS_ADMIN`); exec keeps it.
pub fn set_no_new_privs() -> io::Result<()> {
    crate::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map(drop)
}

/// Caps glibc's malloc arenas for this process (`mallopt(M_ARENA_MAX)`): glibc otherwise gives
/// each new thread an arena of its own, up to 8 per core. Call before starting threads.
/// Returns whether the allocator took the setting (never, on other C libraries).
pub fn limit_malloc_arenas(max: libc::c_int) -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt takes two integers and changes only the allocator's parameters.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, max) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = max;
        false
    }
}

/// Starts a new session, leaving the caller's terminal and process group.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    if unsafe { libc::setsid() } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Duplicates `fd` onto `target`, inherited across exec (unlike `sys::dup_onto`).
pub fn dup_inheritable(fd: RawFd, target: RawFd) -> io::Result<()> {
    if fd == target {
        // dup2 onto itself keeps close-on-exec: clear the flag instead.
        // SAFETY: fcntl on integers; F_SETFD with 0 clears FD_CLOEXEC of a descriptor we own.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
            return Err(io::Error::last_os_error());
        }
        return Ok(());
    }
    // SAFETY: dup2 takes integers; replacing `target` is the point, and its old file is ours.
    if unsafe { libc::dup2(fd, target) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/PID/stat`):
/// with the pid, it names one process for the life of the machine.
pub fn start_ticks(pid: libc::pid_t) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_ticks(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/PID/stat"))
}

fn parse_start_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields resume after the last
    // `)`, with field 3 first; field 22 is the 20th from there.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether a `/proc/PID/stat` line describes a process that has exited but is not yet reaped.
fn is_zombie(stat: &str) -> bool {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

/// Opens a pidfd for `pid` if, and only if, it is still the process that started at `ticks`
/// and is still running (a zombie has ended).
pub fn open_if_same(pid: libc::pid_t, ticks: u64) -> Option<OwnedFd> {
    if pid <= 0 {
        return None;
    }
    let pidfd = pidfd_open(pid).ok()?;
    // Checked after opening: from now on the pidfd pins this process, whatever the pid does.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    (parse_start_ticks(&stat)? == ticks && !is_zombie(&stat)).then_some(pidfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_start_ticks_skips_a_hostile_command_name() {
        let stat = "42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 200";
        assert_eq!(parse_start_ticks(stat), Some(98765));
        assert_eq!(parse_start_ticks("42 (x"), None);
        assert!(!is_zombie(stat));
        assert!(is_zombie("42 (a) Z) Z 1 42"));
    }

    #[test]
    #[cfg(target_env = "gnu")]
    fn test_glibc_takes_an_arena_cap() {
        // The test process's allocator is glibc's: a generous cap changes nothing else here.
        assert!(limit_malloc_arenas(64));
    }

    #[test]
    fn test_own_process_is_found_by_pid_and_start_time() {
        let pid = std::process::id().cast_signed();
        let ticks = start_ticks(pid).unwrap();
        let pidfd = open_if_same(pid, ticks).expect("our own process");
        assert!(!pidfd_exited(&pidfd, 0).unwrap());
        assert!(open_if_same(pid, ticks + 1).is_none(), "another start time");
    }
}

/// CPU time a process has used, from `/proc/PID/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    pub ppid: libc::pid_t,
    /// User plus system time of all its threads (`utime + stime`).
    pub own: u64,
    /// That of its children it has waited for, and theirs in turn (`cutime + cstime`).
    pub children: u64,
}

/// The CPU time of process `pid`; `None` once it is gone.
pub fn cpu_ticks(pid: libc::pid_t) -> Option<CpuTicks> {
    parse_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_cpu_ticks(stat: &str) -> Option<CpuTicks> {
    // Fields resume after the command name's last `)` with field 3 (state) first: ppid is
    // field 4, utime to cstime are fields 14 to 17.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |index: usize| fields.get(index)?.parse::<u64>().ok();
    Some(CpuTicks {
        ppid: fields.get(1)?.parse().ok()?,
        own: number(11)?.saturating_add(number(12)?),
        children: number(13)?.saturating_add(number(14)?),
    })
}

/// The unit of [`CpuTicks`] (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes an integer and only reads system constants.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100)
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn test_cpu_ticks_parse_fields_after_the_command_name() {
        let stat = "1729 (a (b) c) S 1727 0 0 0 -1 4194560 1 2 3 4 40 31 7 9 20 0 1 0 5 6";
        assert_eq!(
            parse_cpu_ticks(stat),
            Some(CpuTicks {
                ppid: 1727,
                own: 71,
                children: 16
            })
        );
        assert_eq!(parse_cpu_ticks("1 (x) S 0"), None);
        let own = cpu_ticks(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert!(own.ppid > 0);
        assert!(clock_ticks_per_second() >= 100);
    }
}
