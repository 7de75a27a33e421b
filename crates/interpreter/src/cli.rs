//! `airlock-agent interpreter [--listen ADDR]`: the service, until SIGTERM or SIGINT.
//! `airlock-agent interpreter --ready [ADDR]`: a template's ready check; exits 0 when
//! `GET /health` answers 200 (the default python kernel runs), else prints why and exits 1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::context::Service;
use crate::languages::Kernels;

const USAGE: &str = "usage: airlock-agent interpreter [--listen ADDR] | --ready [ADDR]";

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{USAGE}")]
    Usage,
    #[error("bad address {0:?}: expected IP:PORT")]
    Address(String),
    #[error("cannot start the runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot prepare the kernels' directory {}", .0.display())]
    RuntimeDir(PathBuf, #[source] std::io::Error),
    #[error("cannot listen on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
    #[error("cannot wait for signals")]
    Signals(#[source] std::io::Error),
    #[error("the code interpreter at {0} is not ready: {1}")]
    NotReady(SocketAddr, String),
}

fn address(text: Option<&str>) -> Result<SocketAddr, CliError> {
    match text {
        None => Ok(SocketAddr::from(([127, 0, 0, 1], crate::PORT))),
        Some(text) => text.parse().map_err(|_| CliError::Address(text.to_owned())),
    }
}

/// Runs the command line after `interpreter`.
pub fn main(args: &[String]) -> Result<(), CliError> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--ready"] => ready(address(None)?),
        ["--ready", addr] => ready(address(Some(addr))?),
        [] => serve(address(None)?),
        ["--listen", addr] => serve(address(Some(addr))?),
        _ => Err(CliError::Usage),
    }
}

/// One `GET /health`, with short timeouts (the template engine retries).
fn ready(addr: SocketAddr) -> Result<(), CliError> {
    let not_ready = |why: String| CliError::NotReady(addr, why);
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| not_ready(format!("cannot connect ({e})")))?;
    let timeout = Some(Duration::from_secs(5));
    let _ = stream.set_read_timeout(timeout);
    let _ = stream.set_write_timeout(timeout);
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .map_err(|e| not_ready(format!("cannot send ({e})")))?;
    let mut answer = Vec::new();
    let _ = stream.take(64 << 10).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    if status == "200" {
        return Ok(());
    }
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Err(not_ready(format!("{status} {}", body.trim())))
}

/// The private directory of this service's kernels: connection files, the IPython profile,
/// matplotlib's cache.
fn prepare_runtime_dir() -> Result<PathBuf, CliError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("airlock-interpreter-{}", std::process::id()));
    let fail = |e| CliError::RuntimeDir(dir.clone(), e);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(fail)?;
    let startup = dir.join("ipython/profile_default/startup");
    std::fs::create_dir_all(&startup).map_err(fail)?;
    std::fs::write(startup.join("00-airlock.py"), crate::IPYTHON_STARTUP).map_err(fail)?;
    std::fs::create_dir_all(dir.join("matplotlib")).map_err(fail)?;
    Ok(dir)
}

/// What every kernel gets besides the sandbox's environment.
fn kernel_env(runtime_dir: &Path) -> Vec<(String, String)> {
    let dir = |name: &str| runtime_dir.join(name).display().to_string();
    let mut env = vec![
        ("IPYTHONDIR".to_owned(), dir("ipython")),
        // Debian's ipykernel warns about frozen modules on every start otherwise.
        ("PYDEVD_DISABLE_FILE_VALIDATION".to_owned(), "1".to_owned()),
        ("PIP_DISABLE_PIP_VERSION_CHECK".to_owned(), "1".to_owned()),
    ];
    let unless_set = [
        ("MPLCONFIGDIR", dir("matplotlib")),
        // `!pip install` must work: the sandbox's system site is read-only or disposable,
        // so pip installs into the user site (or the sandbox's own root) either way.
        ("PIP_BREAK_SYSTEM_PACKAGES", "1".to_owned()),
    ];
    for (name, value) in unless_set {
        if std::env::var_os(name).is_none() {
            env.push((name.to_owned(), value));
        }
    }
    env
}

fn serve(addr: SocketAddr) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let runtime_dir = prepare_runtime_dir()?;
    let result = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(CliError::Signals)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(CliError::Signals)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| CliError::Listen(addr, e))?;
        let kernels = Kernels::discover().await;
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let service = Arc::new(Service::new(
            kernels,
            cwd,
            runtime_dir.clone(),
            kernel_env(&runtime_dir),
        ));
        eprintln!(
            "airlock-interpreter: listening on {addr}; kernels for {}",
            service.kernels().languages().join(", ")
        );
        let warming = service.clone();
        tokio::spawn(async move { warming.warm_up().await });
        let serving = tokio::spawn(crate::http::serve(listener, service.clone()));
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        serving.abort();
        service.shutdown().await;
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&runtime_dir);
    result
}
