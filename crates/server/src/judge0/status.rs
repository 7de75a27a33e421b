//! Judge0's fourteen statuses and how a finished run gets one (Judge0 CE 1.13.1's
//! `IsolateJob#determine_status`, with isolate's meta `status` derived from what Airlock saw).

use serde::Serialize;

/// A submission's status: Judge0's ids and descriptions, verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    InQueue,
    Processing,
    Accepted,
    WrongAnswer,
    TimeLimitExceeded,
    CompilationError,
    SigSegv,
    SigXfsz,
    SigFpe,
    SigAbrt,
    Nzec,
    OtherRuntimeError,
    InternalError,
    ExecFormatError,
}

/// `GET /statuses` and a submission's `status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StatusView {
    pub id: u8,
    pub description: &'static str,
}

impl Status {
    pub const ALL: [Status; 14] = [
        Status::InQueue,
        Status::Processing,
        Status::Accepted,
        Status::WrongAnswer,
        Status::TimeLimitExceeded,
        Status::CompilationError,
        Status::SigSegv,
        Status::SigXfsz,
        Status::SigFpe,
        Status::SigAbrt,
        Status::Nzec,
        Status::OtherRuntimeError,
        Status::InternalError,
        Status::ExecFormatError,
    ];

    pub fn id(self) -> u8 {
        match self {
            Status::InQueue => 1,
            Status::Processing => 2,
            Status::Accepted => 3,
            Status::WrongAnswer => 4,
            Status::TimeLimitExceeded => 5,
            Status::CompilationError => 6,
            Status::SigSegv => 7,
            Status::SigXfsz => 8,
            Status::SigFpe => 9,
            Status::SigAbrt => 10,
            Status::Nzec => 11,
            Status::OtherRuntimeError => 12,
            Status::InternalError => 13,
            Status::ExecFormatError => 14,
        }
    }

    pub fn from_id(id: i64) -> Option<Status> {
        Status::ALL.into_iter().find(|s| i64::from(s.id()) == id)
    }

    pub fn description(self) -> &'static str {
        match self {
            Status::InQueue => "In Queue",
            Status::Processing => "Processing",
            Status::Accepted => "Accepted",
            Status::WrongAnswer => "Wrong Answer",
            Status::TimeLimitExceeded => "Time Limit Exceeded",
            Status::CompilationError => "Compilation Error",
            Status::SigSegv => "Runtime Error (SIGSEGV)",
            Status::SigXfsz => "Runtime Error (SIGXFSZ)",
            Status::SigFpe => "Runtime Error (SIGFPE)",
            Status::SigAbrt => "Runtime Error (SIGABRT)",
            Status::Nzec => "Runtime Error (NZEC)",
            Status::OtherRuntimeError => "Runtime Error (Other)",
            Status::InternalError => "Internal Error",
            Status::ExecFormatError => "Exec Format Error",
        }
    }

    pub fn view(self) -> StatusView {
        StatusView {
            id: self.id(),
            description: self.description(),
        }
    }

    /// Whether the submission is still waiting or running.
    pub fn is_pending(self) -> bool {
        matches!(self, Status::InQueue | Status::Processing)
    }

    /// The runtime error of a process killed by `signal` (Judge0's
    /// `find_runtime_error_by_status_code`).
    pub fn for_signal(signal: i32) -> Status {
        match signal {
            11 => Status::SigSegv,
            25 => Status::SigXfsz,
            8 => Status::SigFpe,
            6 => Status::SigAbrt,
            _ => Status::OtherRuntimeError,
        }
    }
}

/// SIGKILL and SIGXCPU: what the per-process CPU backstop (`RLIMIT_CPU`) sends.
const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;

/// How a program (compile step or run) ended, as the agent and the daemon saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ending {
    /// Its exit code, or the signal that ended it.
    pub exit: Exit,
    /// The daemon killed it because its CPU or wall-clock time ran past the limit plus the
    /// extra time.
    pub killed_for_time: bool,
    /// CPU seconds used (every process of the workload).
    pub cpu_seconds: f64,
    /// Wall-clock seconds from the start to the end of the main process.
    pub wall_seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// The limits a run's time is judged against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeLimits {
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
}

/// isolate's verdict on a run (its meta file's `status`), with the `message` it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Exited with status 0 within the limits.
    Ok,
    /// `TO`: the time ran out.
    TimedOut { message: String },
    /// `SG`: a fatal signal.
    Signaled { signal: i32, message: String },
    /// `RE`: a non-zero exit status.
    Failed { code: i32, message: String },
}

impl Verdict {
    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Ok => None,
            Verdict::TimedOut { message }
            | Verdict::Signaled { message, .. }
            | Verdict::Failed { message, .. } => Some(message),
        }
    }
}

/// isolate's verdict, in its order: a kill for time is `TO`; a signal is `SG` (unless it is
/// the CPU backstop's, on a program past its CPU limit: `TO` too); a non-zero status `RE`,
/// even past the limit; a clean exit past a limit `TO`; else `OK`.
pub fn verdict(ending: &Ending, limits: &TimeLimits) -> Verdict {
    let cpu_over = ending.cpu_seconds > limits.cpu_seconds;
    let wall_over = ending.wall_seconds > limits.wall_seconds;
    let timed_out = |wall_only: bool| Verdict::TimedOut {
        message: if wall_only {
            "Time limit exceeded (wall clock)".to_owned()
        } else {
            "Time limit exceeded".to_owned()
        },
    };
    if ending.killed_for_time {
        return timed_out(wall_over && !cpu_over);
    }
    match ending.exit {
        Exit::Signal(signal) if signal == SIGXCPU || (signal == SIGKILL && cpu_over) => {
            timed_out(false)
        }
        Exit::Signal(signal) => Verdict::Signaled {
            signal,
            message: format!("Caught fatal signal {signal}"),
        },
        Exit::Code(code) if code != 0 => Verdict::Failed {
            code,
            message: format!("Exited with error status {code}"),
        },
        Exit::Code(_) if cpu_over || wall_over => timed_out(wall_over && !cpu_over),
        Exit::Code(_) => Verdict::Ok,
    }
}

/// The submission's status for a run's verdict (`determine_status`): `OK` is Accepted when no
/// output is expected or the outputs match after [`normalize_output`], else Wrong Answer.
pub fn run_status(verdict: &Verdict, expected: Option<&[u8]>, stdout: Option<&[u8]>) -> Status {
    match verdict {
        Verdict::TimedOut { .. } => Status::TimeLimitExceeded,
        Verdict::Signaled { signal, .. } => Status::for_signal(*signal),
        Verdict::Failed { .. } => Status::Nzec,
        Verdict::Ok => match expected {
            None => Status::Accepted,
            Some(expected) => {
                let actual = stdout.map(normalize_output);
                if actual.as_deref() == Some(normalize_output(expected).as_slice()) {
                    Status::Accepted
                } else {
                    Status::WrongAnswer
                }
            }
        },
    }
}

/// Judge0's comparison form of an output: split at `\n` (Ruby drops the trailing empty
/// pieces), each line right-trimmed, joined with `\n`, then right-trimmed. Ruby's `rstrip`
/// removes ASCII whitespace and NUL; leading whitespace counts.
pub fn normalize_output(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(rstrip(line));
    }
    let kept = rstrip(&out).len();
    out.truncate(kept);
    out
}

fn rstrip(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0))
        .map_or(0, |i| i + 1);
    &bytes[..end]
}

/// The signal number in the agent's end-event `status` (Go's wording, `signal: killed`),
/// the inverse of the agent's `signal_description`.
pub fn signal_from_status(status: &str) -> Option<i32> {
    let description = status.strip_prefix("signal: ")?;
    let description = description
        .strip_suffix(" (core dumped)")
        .unwrap_or(description);
    let number = match description {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "illegal instruction" => 4,
        "trace/breakpoint trap" => 5,
        "aborted" => 6,
        "bus error" => 7,
        "floating point exception" => 8,
        "killed" => 9,
        "user defined signal 1" => 10,
        "segmentation fault" => 11,
        "user defined signal 2" => 12,
        "broken pipe" => 13,
        "alarm clock" => 14,
        "terminated" => 15,
        "CPU time limit exceeded" => 24,
        "file size limit exceeded" => 25,
        "bad system call" => 31,
        other => other.strip_prefix("signal ")?.parse().ok()?,
    };
    Some(number)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
