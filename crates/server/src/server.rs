//! The listener: accepts connections, serves each with hyper's HTTP/1.1, and shuts down
//! gracefully on SIGTERM or SIGINT (stop accepting, let in-flight requests finish for a
//! while, leave every sandbox running for the next daemon to adopt).

use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, ConfigError, ServeArgs};
use crate::lifecycle::{Daemon, LifecycleError};
use crate::store::now_ms;

/// How long in-flight requests may run after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// A client must send its request headers within this time.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Threads for blocking work (creates wait for a sandbox's agent, deletes for its helper,
/// store queries). tokio's default is 512: a burst of concurrent creates then leaves dozens of
/// threads, each with its stack pages, its allocator caches and, up to glibc's cap, its own
/// malloc arena. Past 16, more threads bought no measurable throughput on this 2-core machine
/// (`airlock bench soak`, 20 clients); further work, the egress proxies' DNS lookups included,
/// waits in the queue. No blocking task waits for another, so the cap cannot deadlock.
const MAX_BLOCKING_THREADS: usize = 16;
/// glibc's malloc arenas (its default is 8 per core). Memory freed in one arena serves no
/// other thread's allocations, so each arena keeps its own free memory: with many threads
/// that mostly wait, RSS crept up soak after soak. Two arenas keep the worker threads from
/// contending on one lock.
const MALLOC_ARENAS: i32 = 2;
/// Bounds of the event log's trimming period (half the retention).
const TRIM_MIN_PERIOD: Duration = Duration::from_millis(250);
const TRIM_MAX_PERIOD: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot install the signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("a start-up task failed: {0}")]
    Join(String),
    #[error("cannot set up TLS")]
    Tls(#[from] crate::tls::TlsError),
}

/// Runs the daemon until SIGTERM or SIGINT. Prints `airlockd listening on http://ADDR` on
/// stdout once it accepts connections.
pub fn run(args: &ServeArgs) -> Result<(), ServeError> {
    crate::logging::init(args.log_format, args.log_level);
    let config = Config::from_args(args)?;
    // Before any thread starts, so that none gets an arena of its own beyond the cap.
    airlock_jail::procctl::limit_malloc_arenas(MALLOC_ARENAS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let result = runtime.block_on(serve(config));
    // Creates still blocking in the pool belong to a daemon that is going away; their rows
    // say `creating`, and the next daemon cleans them up.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

async fn serve(config: Config) -> Result<(), ServeError> {
    let mut terminate = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;
    let listen = config.listen;
    let daemon = tokio::task::spawn_blocking(move || {
        let daemon = Daemon::open(config)?;
        daemon.recover()?;
        Ok::<_, LifecycleError>(daemon)
    })
    .await
    .map_err(|e| ServeError::Join(e.to_string()))??;
    let tls = crate::tls::Listener::new(&daemon.config.tls, &daemon.config.state_dir)?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Listen {
        addr: listen,
        source,
    })?;
    let _ = daemon
        .store
        .record_event(None, "daemon_start", &format!("listening on {local}"));
    crate::mcp::set_daemon_address(local);
    tokio::spawn(trim_events(daemon.clone()));
    daemon.start_pools();
    let judge0 = match daemon.config.judge0.clone() {
        Some(config) => Some(start_judge0(&daemon, config).await?),
        None => None,
    };
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "airlockd listening on http://{local}");
    if let Some((_, judge0_listener)) = &judge0
        && let Ok(address) = judge0_listener.local_addr()
    {
        let _ = writeln!(stdout, "airlockd judge0 API listening on http://{address}");
    }
    // After the listeners' lines, which scripts read first.
    if let Some(ca) = tls.as_ref().and_then(|tls| tls.local_ca.as_ref()) {
        let _ = writeln!(
            stdout,
            "airlockd TLS for https://<port>-<sandbox>.localhost:{}: trust the local CA {}",
            local.port(),
            ca.display()
        );
    }
    let _ = stdout.flush();

    let acceptor = tls.map(|tls| tls.acceptor);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a clone; `recv` returns None once all have finished.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    if let Some((judge0, listener)) = judge0 {
        tokio::spawn(judge0.serve(listener, stop_rx.clone(), done_tx.clone()));
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(daemon.clone(), stream, acceptor.clone(), stop_rx.clone(), done_tx.clone()));
                }
                Err(err) => {
                    // Out of descriptors or a reset during accept: wait a little, keep serving.
                    tracing::warn!(error = %err, "accept failed; serving goes on");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(done_tx);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, done_rx.recv()).await;
    let _ = daemon.store.record_event(
        None,
        "daemon_stop",
        "stopped by a signal; sandboxes keep running",
    );
    // Unclaimed warm-pool members were never committed: they end here, not with the process.
    daemon.stop_pools().await;
    // Deletes that answered before the stop still tear their sandboxes down.
    daemon.torn_down().await;
    daemon.release_storage();
    Ok(())
}

/// Starts the Judge0 API's queue and binds its listener.
async fn start_judge0(
    daemon: &Arc<Daemon>,
    config: crate::judge0::Judge0Config,
) -> Result<(Arc<crate::judge0::Judge0>, TcpListener), ServeError> {
    let listen = config.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: listen,
            source,
        })?;
    let judge0 = crate::judge0::Judge0::start(daemon.clone(), config)
        .await
        .map_err(|e| ServeError::Lifecycle(LifecycleError::Store(e)))?;
    Ok((judge0, listener))
}

/// Keeps the store's event log within `--events-retention` and `--events-max` for the
/// daemon's whole life: a trim at start-up, then one every half retention, at least every
/// 5 s and at most every 250 ms (a trim with nothing to do looks at two rows).
async fn trim_events(daemon: Arc<Daemon>) {
    let retention_ms = daemon.config.events_retention_ms;
    let max_rows = daemon.config.events_max;
    let period = Duration::from_millis(retention_ms / 2).clamp(TRIM_MIN_PERIOD, TRIM_MAX_PERIOD);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let store = daemon.store.clone();
        let trimmed = tokio::task::spawn_blocking(move || {
            store.trim_events(now_ms().saturating_sub(retention_ms), max_rows)
        })
        .await;
        if let Ok(Err(err)) = trimmed {
            tracing::warn!(error = %err, "cannot trim the event log");
        }
    }
}

async fn connection(
    daemon: Arc<Daemon>,
    stream: tokio::net::TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
) {
    let Some(acceptor) = tls else {
        return serve_connection(daemon, TokioIo::new(stream), false, stop, done).await;
    };
    let Some((stream, over_tls)) = crate::tls::starts_tls(stream, HEADER_TIMEOUT).await else {
        return;
    };
    if !over_tls {
        return serve_connection(daemon, TokioIo::new(stream), false, stop, done).await;
    }
    let Ok(Ok(stream)) = tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await else {
        return;
    };
    serve_connection(daemon, TokioIo::new(stream), true, stop, done).await;
}

async fn serve_connection<I>(
    daemon: Arc<Daemon>,
    io: I,
    over_tls: bool,
    mut stop: watch::Receiver<bool>,
    _done: mpsc::Sender<()>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        let daemon = daemon.clone();
        if over_tls {
            request.extensions_mut().insert(crate::tls::OverTls);
        }
        async move { Ok::<_, Infallible>(crate::e2b::serve(daemon, request).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    // Upgrades carry WebSockets to servers inside sandboxes (the E2B data plane).
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
