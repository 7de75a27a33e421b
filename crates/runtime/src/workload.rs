//! A live sandbox's workload steered from the host, for callers that run one program after
//! another in a sandbox of their own (the daemon's Judge0 API): the workload's memory and
//! pids limits between steps, its peak memory and CPU time, and the end of every process but
//! the agent. Nothing here touches the sandbox's files.

use std::io;
use std::time::Duration;

use airlock_jail::cgroup::{CgroupError, SandboxCgroup, WorkloadClock};

use crate::LiveSandbox;

/// The workload of one live sandbox (every process but its agent).
#[derive(Debug)]
pub struct Workload {
    cgroup: SandboxCgroup,
    agent: i32,
}

impl LiveSandbox {
    /// Its workload; fails when the sandbox (its agent) is gone.
    pub fn workload(&self) -> io::Result<Workload> {
        let cgroup = SandboxCgroup::from_dirs(&self.cgroup_dirs);
        let agent = cgroup.agent_pid(self.helper_pid).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the sandbox's agent is not running",
            )
        })?;
        Ok(Workload { cgroup, agent })
    }
}

impl Workload {
    /// The workload's memory limit (bytes, no swap) and its processes and threads at once.
    pub fn set_limits(&self, memory_bytes: u64, tasks: u64) -> Result<(), CgroupError> {
        self.cgroup.set_workload_memory_max(memory_bytes)?;
        self.cgroup.set_workload_pids_max(tasks)
    }

    /// Peak memory in bytes since [`Workload::reset_memory_peak`] (on cgroup v2: since the
    /// sandbox started).
    pub fn memory_peak(&self) -> Option<u64> {
        self.cgroup.workload_memory_peak()
    }

    /// Drops the page cache charged to the workload (best effort), then starts the peak over.
    pub fn reset_memory_peak(&self) {
        self.cgroup.reclaim_workload_memory();
        self.cgroup.reset_workload_memory_peak();
    }

    /// SIGKILLs every process but the agent.
    pub fn kill(&self) {
        self.cgroup.kill_workload(self.agent);
    }

    /// Starts counting the workload's CPU time.
    pub fn clock(&self) -> io::Result<WorkloadClock> {
        self.cgroup.workload_clock(self.agent)
    }

    /// CPU time used since `clock` started (see [`WorkloadClock::elapsed`]).
    pub fn cpu_time(&self, clock: &WorkloadClock) -> Duration {
        clock.elapsed(&self.cgroup)
    }
}
