//! The CPU priority of a warm pool's fill: a member starts at the lowest priority, so that
//! filling a pool never slows a sandbox in use, and is put back to the normal priority before it
//! is handed to a create, so that a claimed sandbox is indistinguishable from a cold one.
//!
//! Niceness is per thread on Linux and inherited by every thread and process a thread creates:
//! the helper lowers itself before it clones init, so init, the agent and whatever the
//! template's start command runs inherit it. Nothing inside the sandbox can lower it again (that
//! needs `CAP_SYS_NICE` in the host's user namespace, or an `RLIMIT_NICE` above the default 0),
//! so at the claim every thread of the member is at [`BACKGROUND_NICE`], and [`restore_normal`]
//! sets each back to 0.

use std::collections::BTreeSet;
use std::io;

use crate::cgroup::SandboxCgroup;
use crate::live::LiveRecord;

/// The nice value a fill runs at: the lowest priority `SCHED_OTHER` has.
pub const BACKGROUND_NICE: i32 = 19;
/// The nice value every sandbox otherwise runs at.
pub const NORMAL_NICE: i32 = 0;

/// Lowers the calling thread to [`BACKGROUND_NICE`] (the helper, before it creates init).
pub(crate) fn enter_background() -> io::Result<()> {
    crate::sys::set_nice(0, BACKGROUND_NICE)
}

/// A thread's nice value, from `/proc/TID/stat` (field 19); `None` once it has exited.
pub fn nice_of(tid: libc::pid_t) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    parse_nice(&stat)
}

fn parse_nice(stat: &str) -> Option<i32> {
    // Fields resume after the command name's last `)`, with field 3 first; 19 is the 17th.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(16)?.parse().ok()
}

/// Puts a started sandbox back to the normal priority: its helper and every thread in its
/// cgroups at [`BACKGROUND_NICE`] go to [`NORMAL_NICE`]. Passes repeat until one finds nothing
/// left to restore, so that a thread created during a pass (by a thread not yet restored) is
/// caught by the next. Returns how many threads were restored.
pub fn restore_normal(record: &LiveRecord) -> io::Result<usize> {
    let cgroup = SandboxCgroup::from_dirs(&record.cgroup_dirs);
    let mut restored = 0;
    let mut done: BTreeSet<libc::pid_t> = BTreeSet::new();
    // A sandbox has a bounded number of threads (its pids limit); the bound only guards against
    // a cgroup that never settles.
    for _ in 0..64 {
        let mut threads: BTreeSet<libc::pid_t> = cgroup.threads().into_iter().collect();
        if record.helper_pid > 0 {
            threads.insert(record.helper_pid);
        }
        let mut changed = false;
        for tid in threads {
            if nice_of(tid) != Some(BACKGROUND_NICE) {
                continue;
            }
            match crate::sys::set_nice(tid, NORMAL_NICE) {
                Ok(()) => {
                    changed = true;
                    if done.insert(tid) {
                        restored += 1;
                    }
                }
                // It exited between the read and the write.
                Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
                Err(err) => return Err(err),
            }
        }
        if !changed {
            return Ok(restored);
        }
    }
    Err(io::Error::other(
        "threads at the background priority kept appearing",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_nice_reads_field_19_past_a_name_with_spaces() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 19 1 0 123 4096 10";
        assert_eq!(parse_nice(stat), Some(19));
        assert_eq!(parse_nice("42 (x) S 1"), None);
    }

    #[test]
    fn test_nice_of_this_thread_is_read() {
        let tid = i32::try_from(std::process::id()).unwrap_or(0);
        assert!(nice_of(tid).is_some_and(|nice| (-20..=19).contains(&nice)));
    }
}
