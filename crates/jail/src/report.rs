//! The one-way report channel from the helper (and the sandbox's init) to the supervisor: one
//! message per line, so that a partial write can never be mistaken for a message.

use std::os::fd::RawFd;

use crate::sys::write_all_raw;

/// The descriptor number the helper receives its spec on.
pub const SPEC_FD: RawFd = 3;
/// The descriptor number the helper reports on.
pub const REPORT_FD: RawFd = 4;

/// A message from the sandbox side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A layer that `best-effort` skipped.
    Warning(String),
    /// Setup failed; the supervisor exits with `code`.
    Failed { code: i32, message: String },
    /// The workload ended with this raw wait status.
    Ended(libc::c_int),
}

impl Report {
    pub fn encode(&self) -> String {
        let flat = |s: &str| s.replace(['\n', '\r'], " ");
        match self {
            Report::Warning(message) => format!("W {}\n", flat(message)),
            Report::Failed { code, message } => format!("E {code} {}\n", flat(message)),
            Report::Ended(status) => format!("X {status}\n"),
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
