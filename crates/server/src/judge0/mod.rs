//! The Judge0 CE 1.13.1-compatible API (`--judge0-listen`), on a listener of its own, for
//! online judges and code-evaluation pipelines that speak Judge0 (the official `judge0`
//! Python SDK works unmodified).
//!
//! # Layout
//!
//! - [`config`]: the `--judge0-*` flags, Judge0's limits and `/config_info`;
//!   [`languages`]: the language table (defaults for this host, the operator's file).
//! - [`routes`]: the routes, authentication (`X-Auth-Token` carries an API key) and the
//!   handlers; [`wire`]: reading and checking a create request (Judge0's 422 shape);
//!   [`submission`]: the stored submission and its rendering (`fields`, base64, decimals);
//!   [`encoding`]: Ruby's base64, decimals, UUID tokens; [`status`]: the statuses and the
//!   verdict of a run; [`system_info`]: `GET /system_info`.
//! - [`queue`]: the queue in the store and its workers; [`runner`]: one submission in fresh
//!   sandboxes; [`agent_io`]: files and scripts through a sandbox's agent;
//!   [`callback`]: `callback_url`, allow-listed and vetted.
//! - The table is `judge0_submissions` in the daemon's store (`store/judge0.rs`).
//!
//! # Decisions
//!
//! - **One sandbox per run**, created and deleted through the lifecycle, on the process
//!   tier: the workload's memory cgroup is `memory_limit`, its pids cgroup
//!   `max_processes_and_or_threads`, CPU time is every workload process's (Judge0's default,
//!   isolate's `--cg-timing`), read from the host and enforced by polling with `RLIMIT_CPU`
//!   behind it; no network unless the operator gives a policy for it.
//! - **No host file operations on sandbox paths**: files go in through the agent before any
//!   submitted code runs, outputs come out through it, and the daemon only reads what the
//!   kernel says about the workload's processes and cgroups.
//! - **Strict input, compatible output**: unknown attributes are 422s naming them (Judge0
//!   drops them); answers have Judge0's shapes, types and status codes.
//! - **Auth**: every route needs an API key in `X-Auth-Token` (or the query parameter of that
//!   name), as Judge0's `AUTHN_TOKEN` does (401 with an empty body); listing submissions also
//!   needs one in `X-Auth-User` (Judge0's `AUTHZ`, 403). `--insecure-no-auth` lifts both.

pub mod agent_io;
pub mod callback;
pub mod config;
pub mod encoding;
pub mod languages;
pub mod queue;
pub mod routes;
pub mod runner;
pub mod status;
pub mod submission;
pub mod system_info;
pub mod wire;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub use config::{Judge0Args, Judge0Config, Judge0ConfigError};

use crate::lifecycle::Daemon;
use crate::store::StoreError;

/// A client must send its request headers within this time.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The Judge0 API of one daemon.
#[derive(Debug)]
pub struct Judge0 {
    pub daemon: Arc<Daemon>,
    pub config: Arc<Judge0Config>,
    pub queue: Arc<queue::Queue>,
    /// `GET /system_info`'s answer.
    pub system_info: serde_json::Value,
}

impl Judge0 {
    /// Starts the queue's workers (after the lifecycle has reconciled the store).
    pub async fn start(
        daemon: Arc<Daemon>,
        config: Judge0Config,
    ) -> Result<Arc<Judge0>, StoreError> {
        let config = Arc::new(config);
        let runner = runner::Runner {
            daemon: daemon.clone(),
            config: config.clone(),
        };
        let queue = queue::Queue::start(runner).await?;
        let system_info = tokio::task::spawn_blocking(system_info::collect)
            .await
            .unwrap_or_default();
        Ok(Arc::new(Judge0 {
            daemon,
            config,
            queue,
            system_info,
        }))
    }

    /// Serves `listener` until `stop` turns true; each connection holds a clone of `done`.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut stop: watch::Receiver<bool>,
        done: mpsc::Sender<()>,
    ) {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(self.clone().connection(stream, stop.clone(), done.clone()));
                    }
                    Err(err) => {
                        eprintln!("airlockd: judge0: accept failed: {err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = stop.changed() => return,
            }
        }
    }

    async fn connection(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        mut stop: watch::Receiver<bool>,
        _done: mpsc::Sender<()>,
    ) {
        let service = service_fn(move |request| {
            let judge0 = self.clone();
            async move { Ok::<_, Infallible>(routes::serve(&judge0, request).await) }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT);
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}
