//! `airlock-agent`: the in-sandbox agent. It runs as PID 1 of a sandbox's pid namespace,
//! already confined, and serves E2B's envd protocol (Connect RPCs for processes and the
//! filesystem, plain-HTTP file transfer, health) over HTTP/1.1 on a Unix socket, so that the
//! unmodified E2B SDKs work through the daemon's proxy. It also opens byte tunnels to TCP ports
//! on the sandbox's loopback for the daemon ([`tunnel`]), which carry the E2B data plane to
//! servers that the sandbox's programs start.
//!
//! Everything runs on one thread (a current-thread tokio runtime): idle memory matters with
//! hundreds of sandboxes. The kernel-facing parts (fork/exec, ptys, reaping, inotify) are in
//! `airlock_jail::child` and `airlock_jail::inotify`; this crate has no `unsafe`.

/// `eprintln!` in one `write` (the agent's log is its stderr, a file): `eprintln!` writes each
/// piece of its format separately, and a process's end took 25 writes.
#[macro_export]
macro_rules! log_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

pub mod claim;
pub mod connect;
pub mod files;
pub mod filesystem;
pub mod fuzzing;
pub mod http;
pub mod multipart;
pub mod process;
mod process_io;
pub mod relay;
pub mod resume;
pub mod tunnel;
pub mod user;
pub mod watch;
pub mod wire;
pub mod workload;

use std::ffi::OsString;
use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};

/// Shared state of the agent.
#[derive(Debug)]
pub struct Agent {
    pub processes: Arc<process::ProcessTable>,
    pub watchers: watch::Watchers,
    /// The sandbox's base environment (the agent's own, plus a claim's); processes get it plus
    /// their `envs`.
    pub base_env: std::sync::RwLock<Vec<(OsString, OsString)>>,
    /// Whether a warm pool's claim has been applied (`claim`).
    pub claimed: std::sync::atomic::AtomicBool,
    /// The egress relay a microVM guest's resume started (`resume`), if any.
    pub egress_relay: std::sync::Mutex<Option<resume::EgressRelay>>,
}

/// Serves forever on `listener`. Must run inside a tokio runtime (current-thread is enough).
/// Reaps every child of this process, orphans included, as PID 1 must. Processes join
/// `workload`'s cgroup when there is one.
pub async fn run(
    listener: http::Listener,
    workload: Option<workload::WorkloadCgroup>,
) -> std::io::Result<()> {
    let agent = Arc::new(Agent {
        processes: Arc::new(process::ProcessTable::new(workload)),
        watchers: watch::Watchers::default(),
        base_env: std::sync::RwLock::new(std::env::vars_os().collect()),
        claimed: std::sync::atomic::AtomicBool::new(false),
        egress_relay: std::sync::Mutex::new(None),
    });
    // The SIGCHLD handler exists before the first child does.
    let mut sigchld = signal(SignalKind::child())?;
    let table = agent.processes.clone();
    tokio::spawn(async move {
        loop {
            while let Some((pid, status)) = airlock_jail::child::reap_any() {
                if !table.route_exit(pid, status) {
                    crate::log_line!("airlock-agent: reaped orphan {pid} ({status})");
                }
            }
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    });
    http::serve(listener, agent).await;
    Ok(())
}
