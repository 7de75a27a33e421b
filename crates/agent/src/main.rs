//! `airlock-agent --listen-fd N` (an inherited, listening AF_UNIX stream socket),
//! `airlock-agent --listen PATH` (binds PATH; for tests and development) or
//! `airlock-agent --listen-vsock PORT` (AF_VSOCK, any CID: a microVM guest's init), optionally with
//! `--egress-relay PORT:SOCKET` (see `relay`); or `--egress-relay PORT:SOCKET` alone, for a
//! sandbox whose pid 1 is not the agent. `--workload-cgroup-fd N --oom-events-fd M` hand it
//! the workload's cgroup (see `airlock_agent::workload`).
//!
//! `airlock-agent interpreter ...` is E2B's code interpreter instead (`airlock_interpreter`):
//! the agent's binary is in every sandbox, so a template's start command can run it.

use std::os::unix::fs::FileTypeExt;

use airlock_agent::relay::RelaySpec;
use anyhow::{Context, bail};

enum Listen {
    Fd(i32),
    Path(std::path::PathBuf),
    /// An AF_VSOCK port on any CID: the agent as a microVM guest's init.
    Vsock(u32),
}

const USAGE: &str = "usage: airlock-agent (--listen-fd N | --listen PATH | --listen-vsock PORT) [--egress-relay PORT:SOCKET] [--workload-cgroup-fd N --oom-events-fd M] | --egress-relay PORT:SOCKET";

#[derive(Default)]
struct Args {
    listen: Option<Listen>,
    relay: Option<RelaySpec>,
    workload_cgroup_fd: Option<i32>,
    oom_events_fd: Option<i32>,
}

fn fd_arg(flag: &str, value: &str) -> anyhow::Result<i32> {
    value
        .parse()
        .with_context(|| format!("{flag} needs a descriptor number, got '{value}'"))
}

fn parse_args() -> anyhow::Result<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut parsed = Args::default();
    let Args {
        listen,
        relay,
        workload_cgroup_fd,
        oom_events_fd,
    } = &mut parsed;
    let mut rest = args.as_slice();
    while let [flag, value, tail @ ..] = rest {
        match flag.as_str() {
            "--listen-fd" if listen.is_none() => {
                *listen = Some(Listen::Fd(fd_arg(flag, value)?));
            }
            "--listen" if listen.is_none() => *listen = Some(Listen::Path(value.into())),
            "--listen-vsock" if listen.is_none() => {
                let port = value.parse().with_context(|| {
                    format!("--listen-vsock needs a port number, got '{value}'")
                })?;
                *listen = Some(Listen::Vsock(port));
            }
            "--egress-relay" if relay.is_none() => {
                *relay = Some(RelaySpec::parse(value).map_err(anyhow::Error::msg)?);
            }
            "--workload-cgroup-fd" if workload_cgroup_fd.is_none() => {
                *workload_cgroup_fd = Some(fd_arg(flag, value)?);
            }
            "--oom-events-fd" if oom_events_fd.is_none() => {
                *oom_events_fd = Some(fd_arg(flag, value)?);
            }
            _ => bail!("{USAGE}"),
        }
        rest = tail;
    }
    if !rest.is_empty()
        || (listen.is_none() && relay.is_none())
        || workload_cgroup_fd.is_some() != oom_events_fd.is_some()
    {
        bail!("{USAGE}");
    }
    Ok(parsed)
}

/// A listening socket before the runtime exists: Unix sockets are opened here (so that a
/// bad path fails before anything starts); a vsock port is bound inside the runtime.
enum Opened {
    Unix(std::os::unix::net::UnixListener),
    Vsock(u32),
}

fn listener(listen: Listen) -> anyhow::Result<Opened> {
    if let Listen::Vsock(port) = listen {
        return Ok(Opened::Vsock(port));
    }
    unix_listener(listen).map(Opened::Unix)
}

fn unix_listener(listen: Listen) -> anyhow::Result<std::os::unix::net::UnixListener> {
    match listen {
        Listen::Vsock(_) => bail!("{USAGE}"),
        Listen::Fd(fd) => {
            airlock_jail::child::inherited_listener(fd).with_context(|| format!("--listen-fd {fd}"))
        }
        Listen::Path(path) => {
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                if !meta.file_type().is_socket() {
                    bail!(
                        "{} exists and is not a socket; not replacing it",
                        path.display()
                    );
                }
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing the stale socket {}", path.display()))?;
            }
            std::os::unix::net::UnixListener::bind(&path)
                .with_context(|| format!("binding {}", path.display()))
        }
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("interpreter") {
        let rest: Vec<String> = args.collect();
        return airlock_interpreter::cli::main(&rest).map_err(anyhow::Error::from);
    }
    // The workload shares the agent's uid; exec made the agent dumpable again, so the workload
    // could otherwise read its memory and environment and take its descriptors.
    airlock_jail::procctl::set_non_dumpable().context("PR_SET_DUMPABLE")?;
    let args = parse_args()?;
    let workload = match (args.workload_cgroup_fd, args.oom_events_fd) {
        (Some(procs), Some(oom)) => Some(
            airlock_agent::workload::WorkloadCgroup::inherited(procs, oom)
                .context("the workload cgroup's descriptors")?,
        ),
        _ => None,
    };
    let relay = args.relay;
    let listener = args.listen.map(listener).transpose()?;
    if let Some(Opened::Unix(listener)) = &listener {
        listener
            .set_nonblocking(true)
            .context("making the listener non-blocking")?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        if let Some(relay) = relay {
            let port = relay.port;
            let relaying = airlock_agent::relay::serve(relay);
            if listener.is_none() {
                return relaying
                    .await
                    .with_context(|| format!("the egress relay on port {port}"));
            }
            tokio::spawn(async move {
                if let Err(err) = relaying.await {
                    airlock_agent::log_line!(
                        "airlock-agent: the egress relay on port {port} stopped: {err}"
                    );
                }
            });
        }
        let Some(listener) = listener else {
            return Ok(());
        };
        let listener = match listener {
            Opened::Unix(listener) => airlock_agent::http::Listener::Unix(
                tokio::net::UnixListener::from_std(listener).context("registering the listener")?,
            ),
            Opened::Vsock(port) => airlock_agent::http::Listener::Vsock(
                tokio_vsock::VsockListener::bind(tokio_vsock::VsockAddr::new(
                    tokio_vsock::VMADDR_CID_ANY,
                    port,
                ))
                .with_context(|| format!("binding vsock port {port}"))?,
            ),
        };
        airlock_agent::log_line!("airlock-agent: serving (pid {})", std::process::id());
        airlock_agent::run(listener, workload)
            .await
            .context("serving")
    })
}
