//! A live sandbox's workload seen and steered from the host, for a judge that runs one
//! program after another in it: its memory and pids limits changed between steps, its peak
//! memory, its CPU time, and the end of every process but the agent.

use std::fs;
use std::io;
use std::time::Duration;

use super::{CgroupError, Controller, SandboxCgroup, write};
use crate::procctl::{CpuTicks, clock_ticks_per_second, cpu_ticks};

impl SandboxCgroup {
    /// The memory cgroup whose limit binds the workload: its own, else the sandbox's.
    fn workload_memory(&self) -> Option<&std::path::PathBuf> {
        self.workload
            .as_ref()
            .or_else(|| self.dir(Controller::Memory))
    }

    fn memory_is_v2(&self, dir: &std::path::Path) -> bool {
        dir.join("memory.max").exists()
    }

    /// Sets the workload's memory limit (no swap on top). On v1 the memory-plus-swap limit
    /// must never be below the memory limit, so the order depends on the direction.
    pub fn set_workload_memory_max(&self, bytes: u64) -> Result<(), CgroupError> {
        let Some(dir) = self.workload_memory() else {
            return Err(CgroupError::MissingController("memory"));
        };
        let value = bytes.to_string();
        if self.memory_is_v2(dir) {
            return write(dir.join("memory.max"), &value);
        }
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if !memsw.exists() {
            return write(dir.join("memory.limit_in_bytes"), &value);
        }
        match write(dir.join("memory.limit_in_bytes"), &value) {
            Ok(()) => write(memsw, &value),
            // Raising: memory+swap first.
            Err(_) => {
                write(memsw, &value)?;
                write(dir.join("memory.limit_in_bytes"), &value)
            }
        }
    }

    /// The workload's peak memory in bytes since the last reset (v1), or since it started
    /// (v2's `memory.peak` has no global reset).
    pub fn workload_memory_peak(&self) -> Option<u64> {
        let dir = self.workload_memory()?;
        let file = if self.memory_is_v2(dir) {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Reclaims the page cache the workload's cgroup is charged for (what an earlier step
    /// read or wrote), so that the next step's peak starts near zero. Best effort: v1's
    /// `force_empty` needs the cgroup to be empty of tasks; tmpfs pages without swap stay.
    pub fn reclaim_workload_memory(&self) {
        let Some(dir) = self.workload_memory() else {
            return;
        };
        if self.memory_is_v2(dir) {
            let _ = fs::write(dir.join("memory.reclaim"), "16G");
        } else {
            let _ = fs::write(dir.join("memory.force_empty"), "0");
        }
    }

    /// Starts the peak over from the current usage (v1 only).
    pub fn reset_workload_memory_peak(&self) {
        if let Some(dir) = self.workload_memory()
            && !self.memory_is_v2(dir)
        {
            let _ = fs::write(dir.join("memory.max_usage_in_bytes"), "0");
        }
    }

    /// Sets the sandbox's pids limit: `tasks` processes and threads for the workload, plus
    /// the agent.
    pub fn set_workload_pids_max(&self, tasks: u64) -> Result<(), CgroupError> {
        let Some(dir) = self.dir(Controller::Pids) else {
            return Err(CgroupError::MissingController("pids"));
        };
        write(dir.join("pids.max"), &tasks.saturating_add(1).to_string())
    }

    /// The sandbox's processes other than `agent` (its pid 1, seen from the host).
    fn workload_processes(&self, agent: libc::pid_t) -> Vec<libc::pid_t> {
        self.pids()
            .into_iter()
            .filter(|pid| *pid != agent)
            .collect()
    }

    /// Kills every process of the sandbox but its agent, until none is left (a fork racing
    /// the kill is caught next round). The agent reaps them.
    pub fn kill_workload(&self, agent: libc::pid_t) {
        if let Some(dir) = &self.workload
            && self.memory_is_v2(dir)
            && fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        for _ in 0..1000 {
            let pids = self.workload_processes(agent);
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
            std::thread::yield_now();
        }
    }

    /// The sandbox's agent: its process whose parent is the helper `helper_pid`.
    pub fn agent_pid(&self, helper_pid: libc::pid_t) -> Option<libc::pid_t> {
        self.pids()
            .into_iter()
            .find(|pid| cpu_ticks(*pid).is_some_and(|t| t.ppid == helper_pid))
    }

    /// A clock of the workload's CPU time from now on.
    pub fn workload_clock(&self, agent: libc::pid_t) -> io::Result<WorkloadClock> {
        let base = cpu_ticks(agent).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the sandbox's agent is gone")
        })?;
        Ok(WorkloadClock {
            agent,
            base_children: base.children,
            ticks_per_second: clock_ticks_per_second(),
        })
    }
}

/// The CPU time of a sandbox's workload, from the kernel's per-process accounting: every
/// process but the agent counts with what it has used and what its reaped children did, and
/// the agent (pid 1, which reaps every orphan) counts only what its reaped children did. Each
/// CPU tick is thus counted once, wherever in the tree it was spent, and the agent's own work
/// never. Resolution: one clock tick (10 ms).
#[derive(Debug, Clone, Copy)]
pub struct WorkloadClock {
    agent: libc::pid_t,
    base_children: u64,
    ticks_per_second: u64,
}

impl WorkloadClock {
    /// CPU time used since the clock started. A process that exits while it is read may be
    /// missed (or, reaped in between, counted twice) for that one reading; once every process
    /// has been reaped the figure is exact.
    pub fn elapsed(&self, cgroup: &SandboxCgroup) -> Duration {
        let agent = cpu_ticks(self.agent).map_or(0, |t: CpuTicks| t.children);
        let mut ticks = agent.saturating_sub(self.base_children);
        for pid in cgroup.workload_processes(self.agent) {
            if let Some(t) = cpu_ticks(pid) {
                ticks = ticks.saturating_add(t.own).saturating_add(t.children);
            }
        }
        Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / self.ticks_per_second.max(1)))
    }
}
