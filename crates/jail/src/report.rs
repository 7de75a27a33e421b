//! The one-way report channel from the helper (and the sandbox's init) to the supervisor: one
//! message per line, so that a partial write can never be mistaken for a message.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sys::{self, write_all_raw};

/// The descriptor number the helper receives its spec on.
pub const SPEC_FD: RawFd = 3;
/// The descriptor number the helper reports on.
pub const REPORT_FD: RawFd = 4;
/// A long-lived sandbox's helper reads the supervisor's commit on this descriptor.
pub const CONTROL_FD: RawFd = 5;
/// A descriptor the helper holds, never reads and never passes on, for as long as the sandbox
/// lives: the lock of the sandbox's host id range, so that the range stays taken as long as
/// the sandbox exists, whoever started it and whether or not that process is still there.
pub const HOLD_FD: RawFd = 6;
/// The view's template (`view_template`), when the supervisor passes one.
pub const TEMPLATE_FD: RawFd = 7;
/// A network namespace from the zygote's pool (`network_pool`), with its sysfs at `SYSFS_FD`.
pub const NETNS_FD: RawFd = 8;
pub const SYSFS_FD: RawFd = 9;

/// A message from the sandbox side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A layer that `best-effort` skipped.
    Warning(String),
    /// Setup failed; the supervisor exits with `code`.
    Failed { code: i32, message: String },
    /// The workload ended with this raw wait status.
    Ended(libc::c_int),
    /// A setup phase finished at this `CLOCK_MONOTONIC` time (only when tracing).
    Phase { phase: Phase, at_ns: u64 },
    /// A long-lived sandbox's agent runs and its socket accepts connections (helper only).
    Ready,
}

/// The steps of a sandbox's life that `airlock bench start --phases` times, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Start,
    HelperSpawned,
    CgroupCreated,
    HelperRunning,
    InitCloned,
    InitReleased,
    ViewBuilt,
    PrivilegesDropped,
    LandlockApplied,
    SeccompInstalled,
    WorkloadExited,
    SandboxGone,
    CleanedUp,
}

impl Phase {
    pub const ALL: [Phase; 13] = [
        Phase::Start,
        Phase::HelperSpawned,
        Phase::CgroupCreated,
        Phase::HelperRunning,
        Phase::InitCloned,
        Phase::InitReleased,
        Phase::ViewBuilt,
        Phase::PrivilegesDropped,
        Phase::LandlockApplied,
        Phase::SeccompInstalled,
        Phase::WorkloadExited,
        Phase::SandboxGone,
        Phase::CleanedUp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::HelperSpawned => "helper spawned",
            Phase::CgroupCreated => "cgroup created",
            Phase::HelperRunning => "helper running",
            Phase::InitCloned => "init cloned",
            Phase::InitReleased => "init released",
            Phase::ViewBuilt => "view built",
            Phase::PrivilegesDropped => "privileges dropped",
            Phase::LandlockApplied => "landlock applied",
            Phase::SeccompInstalled => "seccomp installed",
            Phase::WorkloadExited => "workload exited",
            Phase::SandboxGone => "sandbox gone",
            Phase::CleanedUp => "cleaned up",
        }
    }

    fn index(self) -> usize {
        Phase::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}

static TRACING: AtomicBool = AtomicBool::new(false);

/// Turns phase reports on for this process and the processes it forks.
pub fn set_tracing(on: bool) {
    TRACING.store(on, Ordering::Relaxed);
}

/// Reports that `phase` just finished, when tracing.
pub fn mark(phase: Phase) {
    if TRACING.load(Ordering::Relaxed) {
        send(&Report::Phase {
            phase,
            at_ns: sys::monotonic_ns(),
        });
    }
}

impl Report {
    pub fn encode(&self) -> String {
        let flat = |s: &str| s.replace(['\n', '\r'], " ");
        match self {
            Report::Warning(message) => format!("W {}\n", flat(message)),
            Report::Failed { code, message } => format!("E {code} {}\n", flat(message)),
            Report::Ended(status) => format!("X {status}\n"),
            Report::Phase { phase, at_ns } => format!("T {} {at_ns}\n", phase.index()),
            Report::Ready => "R -\n".to_owned(),
        }
    }

    pub fn decode(line: &str) -> Option<Report> {
        let (tag, rest) = line.split_once(' ')?;
        match tag {
            "W" => Some(Report::Warning(rest.to_owned())),
            "E" => {
                let (code, message) = rest.split_once(' ')?;
                Some(Report::Failed {
                    code: code.parse().ok()?,
                    message: message.to_owned(),
                })
            }
            "X" => rest.parse().ok().map(Report::Ended),
            "R" => Some(Report::Ready),
            "T" => {
                let (index, at_ns) = rest.split_once(' ')?;
                Some(Report::Phase {
                    phase: *Phase::ALL.get(index.parse::<usize>().ok()?)?,
                    at_ns: at_ns.parse().ok()?,
                })
            }
            _ => None,
        }
    }
}

/// The longest message init may relay through the helper.
pub const MAX_MESSAGE: usize = 4096;

/// Sends a report. A failure to report cannot be reported, so it is ignored: the supervisor
/// then sees the channel close without the message and treats the sandbox as failed.
pub fn send(report: &Report) {
    let _ = write_all_raw(REPORT_FD, report.encode().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_report_round_trips() {
        for report in [
            Report::Warning("cgroups are not enforced".into()),
            Report::Failed {
                code: 127,
                message: "nope: command not found".into(),
            },
            Report::Ended(0x0900),
            Report::Ready,
            Report::Phase {
                phase: Phase::ViewBuilt,
                at_ns: 123_456_789,
            },
        ] {
            let line = report.encode();
            assert!(line.ends_with('\n'));
            assert_eq!(Report::decode(line.trim_end_matches('\n')), Some(report));
        }
    }

    #[test]
    fn test_report_newlines_cannot_forge_messages() {
        let line = Report::Warning("a\nX 0".into()).encode();
        assert_eq!(line.matches('\n').count(), 1);
    }

    #[test]
    fn test_report_garbage_is_ignored() {
        assert_eq!(Report::decode("Z what"), None);
        assert_eq!(Report::decode("P notanumber"), None);
        assert_eq!(Report::decode(""), None);
    }
}
