//! Init's last stage: fork and exec the workload, forward signals to it, reap orphans and report
//! how the workload ended.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::Path;

use airlock_policy::Plan;

use super::{Failure, SETUP_FAILED, with_source};
use crate::relay;
use crate::report::{self, Phase, REPORT_FD, Report, mark};
use crate::sys::{self, Forked};

/// Converts strings for execve, rejecting interior NUL bytes.
fn c_strings(items: impl Iterator<Item = String>) -> Result<Vec<CString>, Failure> {
    items
        .map(|s| {
            CString::new(s)
                .map_err(|_| Failure::setup("an argument or variable contains a NUL byte"))
        })
        .collect()
}

/// What the workload's child reports through its exec-error pipe before it exits.
const STAGE_CWD: u8 = 1;
const STAGE_EXEC: u8 = 2;

/// Init's last job: fork the workload, forward signals to it, reap every orphan, and report the
/// workload's wait status. Returning ends init, and the kernel then kills whatever is left in
/// the pid namespace: daemons and double-forked children included.
pub(super) fn supervise(plan: &Plan, relay: Option<std::net::TcpListener>) -> Result<i32, Failure> {
    const FORWARDED: [libc::c_int; 8] = [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGWINCH,
        libc::SIGCONT,
    ];
    let mut watched = FORWARDED.to_vec();
    watched.push(libc::SIGCHLD);
    sys::block_signals(&watched).map_err(|e| with_source("blocking signals", &e))?;
    let signals = sys::signalfd(&watched).map_err(|e| with_source("signalfd", &e))?;
    let argv = c_strings(plan.process.argv.iter().cloned())?;
    let env = c_strings(plan.process.env.iter().map(|(k, v)| format!("{k}={v}")))?;
    let search_path = plan
        .process
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("", |(_, v)| v.as_str());
    let (error_r, error_w) = sys::pipe().map_err(|e| with_source("pipe", &e))?;
    let workload = match sys::fork().map_err(|e| with_source("forking the workload", &e))? {
        Forked::Child => {
            drop(error_r);
            drop(signals);
            sys::reset_signals();
            let _ = sys::close_from(3, &[error_w.as_raw_fd()]);
            let (stage, errno) = match sys::chdir(Path::new(&plan.process.cwd)) {
                Err(e) => (STAGE_CWD, e.raw_os_error().unwrap_or(libc::EIO)),
                Ok(()) => (STAGE_EXEC, exec_search(&argv, &env, search_path)),
            };
            let mut message = [0u8; 5];
            message[0] = stage;
            message[1..].copy_from_slice(&errno.to_ne_bytes());
            let _ = sys::write_all_raw(error_w.as_raw_fd(), &message);
            sys::exit_now(if stage == STAGE_CWD {
                SETUP_FAILED
            } else {
                127
            })
        }
        Forked::Parent(pid) => pid,
    };
    drop(error_w);
    let mut message = Vec::new();
    let _ = File::from(error_r).read_to_end(&mut message);
    if message.len() == 5 {
        let _ = sys::waitpid(workload, 0);
        let errno = i32::from_ne_bytes([message[1], message[2], message[3], message[4]]);
        return Err(exec_error(plan, message[0], errno));
    }
    if let Some(listener) = relay {
        // Threads only now: init forks nothing after the workload.
        let socket = Path::new(airlock_policy::EGRESS_DIR).join(airlock_policy::EGRESS_SOCKET);
        if let Err(e) = relay::start(listener, socket) {
            let _ = sys::kill(workload, libc::SIGKILL);
            let _ = sys::waitpid(workload, 0);
            return Err(with_source("starting the egress relay", &e));
        }
    }
    loop {
        let ready = sys::poll_readable(&[signals.as_raw_fd(), REPORT_FD], -1)
            .map_err(|e| with_source("waiting for signals", &e))?;
        if ready.get(1).copied().unwrap_or(false) {
            // The helper never writes after "go": readable means it is gone. End the sandbox.
            let _ = sys::kill(workload, libc::SIGKILL);
            return Ok(SETUP_FAILED);
        }
        if !ready.first().copied().unwrap_or(false) {
            continue;
        }
        let signal = sys::read_signal(&signals).map_err(|e| with_source("reading signals", &e))?;
        if signal != libc::SIGCHLD {
            let _ = sys::kill(workload, signal);
            continue;
        }
        while let Ok((pid, status)) = sys::waitpid(-1, libc::WNOHANG) {
            if pid <= 0 {
                break;
            }
            if pid == workload {
                mark(Phase::WorkloadExited);
                report::send(&Report::Ended(status));
                return Ok(0);
            }
        }
    }
}

/// Tries each `PATH` entry like a shell does; returns the errno that explains the failure.
fn exec_search(argv: &[CString], env: &[CString], search_path: &str) -> i32 {
    let Some(program) = argv.first() else {
        return libc::ENOENT;
    };
    let bytes = program.as_bytes();
    if bytes.contains(&b'/') {
        return sys::execve(program, argv, env)
            .raw_os_error()
            .unwrap_or(libc::EIO);
    }
    let mut denied = false;
    for dir in search_path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let mut candidate = dir.as_bytes().to_vec();
        candidate.push(b'/');
        candidate.extend_from_slice(bytes);
        let Ok(candidate) = CString::new(candidate) else {
            continue;
        };
        match sys::execve(&candidate, argv, env).raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => {}
            Some(libc::EACCES) => denied = true,
            Some(other) => return other,
            None => return libc::EIO,
        }
    }
    if denied { libc::EACCES } else { libc::ENOENT }
}

fn exec_error(plan: &Plan, stage: u8, errno: i32) -> Failure {
    let error = io::Error::from_raw_os_error(errno);
    if stage == STAGE_CWD {
        return Failure::setup(format!(
            "cannot use working directory {}: {error}",
            plan.process.cwd
        ));
    }
    let program = plan.process.argv.first().map_or("", String::as_str);
    if errno == libc::ENOENT {
        let what = if program.contains('/') {
            "no such file"
        } else {
            "command not found"
        };
        return Failure {
            code: 127,
            message: format!("{program}: {what}"),
        };
    }
    Failure {
        code: 126,
        message: format!("{program}: {error}"),
    }
}
