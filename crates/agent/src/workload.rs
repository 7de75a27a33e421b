//! The workload's own memory cgroup, when the sandbox has one: every process the agent starts
//! moves itself into it before it runs anything, so that the OOM killer, which acts inside the
//! cgroup whose limit was reached, can only ever pick a workload process, never the agent. Its
//! OOM counter tells an OOM kill from any other SIGKILL.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;

/// The descriptors the helper opened on the host (the sandbox cannot open cgroup files).
#[derive(Debug)]
pub struct WorkloadCgroup {
    /// The cgroup's `cgroup.procs`, write-only.
    procs: File,
    /// `memory.events` (v2) or `memory.oom_control` (v1), read-only.
    oom_events: File,
}

impl WorkloadCgroup {
    /// Takes the inherited descriptors `--workload-cgroup-fd` and `--oom-events-fd`.
    pub fn inherited(procs_fd: RawFd, oom_events_fd: RawFd) -> io::Result<WorkloadCgroup> {
        Ok(WorkloadCgroup {
            procs: airlock_jail::child::inherited_file(procs_fd)?,
            oom_events: airlock_jail::child::inherited_file(oom_events_fd)?,
        })
    }

    /// What a child writes `0` to, to join the cgroup.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// How many processes the OOM killer has ended in the cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let mut buf = [0u8; 512];
        let n = self.oom_events.read_at(&mut buf, 0).unwrap_or(0);
        airlock_jail::cgroup::parse_oom_kills(&String::from_utf8_lossy(&buf[..n]))
    }
}
