//! `airlock-agent --listen-fd N` (an inherited, listening AF_UNIX stream socket) or
//! `airlock-agent --listen PATH` (binds PATH; for tests and development).

use std::os::unix::fs::FileTypeExt;

use anyhow::{Context, bail};

enum Listen {
    Fd(i32),
    Path(std::path::PathBuf),
}

fn parse_args() -> anyhow::Result<Listen> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, fd] if flag == "--listen-fd" => {
            Ok(Listen::Fd(fd.parse().with_context(|| {
                format!("--listen-fd needs a descriptor number, got '{fd}'")
            })?))
        }
        [flag, path] if flag == "--listen" => Ok(Listen::Path(path.into())),
        _ => bail!("usage: airlock-agent --listen-fd N | --listen PATH"),
    }
}

fn listener(listen: Listen) -> anyhow::Result<std::os::unix::net::UnixListener> {
    match listen {
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
    // The workload shares the agent's uid; exec made the agent dumpable again, so the workload
    // could otherwise read its memory and environment and take its descriptors.
    airlock_jail::procctl::set_non_dumpable().context("PR_SET_DUMPABLE")?;
    let listener = listener(parse_args()?)?;
    listener
        .set_nonblocking(true)
        .context("making the listener non-blocking")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let listener =
            tokio::net::UnixListener::from_std(listener).context("registering the listener")?;
        eprintln!("airlock-agent: serving (pid {})", std::process::id());
        airlock_agent::run(listener).await.context("serving")
    })
}
