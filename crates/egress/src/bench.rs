//! `airlock bench egress`: the proxy's cost on loopback, measured against direct access in the
//! same run. Small GETs (keep-alive, one at a time, interleaved direct/proxied) give the added
//! latency; a bulk download through a pass-through CONNECT tunnel gives the throughput. The
//! proxy runs in-process on a Unix socket (as in production), with a test resolver pointing
//! the benchmark's names at its loopback upstreams. Nothing is printed here.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_policy::egress::{ApprovalMode, EgressPlan, EgressRule, HostPattern, NetworkMode};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::{AuditSink, EgressError, Placeholders, Proxy, ProxyOptions, Secrets, TestResolver};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Small GETs per contender (after 100 warm-up requests each).
    pub requests: usize,
    /// Size of the bulk download.
    pub download_bytes: u64,
    /// Downloads per contender; the fastest of each is reported.
    pub download_rounds: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            requests: 2000,
            download_bytes: 1 << 30,
            download_rounds: 3,
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p95_us: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    pub requests: usize,
    pub direct: Latency,
    pub proxied: Latency,
    /// Proxied minus direct (may be negative on a noisy machine).
    pub added_p50_us: i64,
    pub added_p95_us: i64,
    pub download_bytes: u64,
    pub direct_download_bytes_per_s: f64,
    pub proxied_download_bytes_per_s: f64,
    /// Proxied throughput over direct throughput.
    pub download_ratio: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("the benchmark needs at least 10 requests and 1 download round of at least 1 MiB")]
    TooSmall,
    #[error("benchmark I/O failed")]
    Io(#[from] io::Error),
    #[error("starting the proxy failed")]
    Proxy(#[from] EgressError),
    #[error("opening the benchmark's audit file failed")]
    Audit(#[from] crate::AuditError),
    #[error("a benchmark request failed: {0}")]
    Request(String),
}

const SMALL_HOST: &str = "small.bench.test";
const BULK_HOST: &str = "bulk.bench.test";
const CHUNK: usize = 256 * 1024;

/// Runs the benchmark on a two-worker runtime of its own.
pub fn bench_blocking(options: &BenchOptions) -> Result<BenchReport, BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(options))
}

pub async fn bench(options: &BenchOptions) -> Result<BenchReport, BenchError> {
    if options.requests < 10 || options.download_rounds == 0 || options.download_bytes < 1 << 20 {
        return Err(BenchError::TooSmall);
    }
    let small = start_small_upstream().await?;
    let bulk = start_bulk_upstream(options.download_bytes).await?;
    let resolver = Arc::new(TestResolver::new());
    resolver.upstream(SMALL_HOST, small);
    resolver.upstream(BULK_HOST, bulk);
    let rule = |name: &str, host: &str| EgressRule {
        name: name.into(),
        host: HostPattern(host.into()),
        ports: vec![80],
        http: vec![],
        git_push_refs: None,
    };
    let plan = EgressPlan {
        mode: NetworkMode::Proxy,
        rules: vec![rule("small", SMALL_HOST), rule("bulk", BULK_HOST)],
        credentials: vec![],
        approvals: ApprovalMode::Deny,
    };
    let options_proxy = ProxyOptions {
        test_resolver: Some(resolver),
        ..ProxyOptions::default()
    };
    let directory = scratch_directory()?;
    let result = run_in(&directory, &plan, options_proxy, options, small, bulk).await;
    let _ = std::fs::remove_dir_all(&directory);
    result
}

async fn run_in(
    directory: &Path,
    plan: &EgressPlan,
    proxy_options: ProxyOptions,
    options: &BenchOptions,
    small: SocketAddr,
    bulk: SocketAddr,
) -> Result<BenchReport, BenchError> {
    // Audit lines go to a file, as in production: their cost is part of the proxy's.
    let audit = AuditSink::file(&directory.join("audit.jsonl"))?;
    let proxy = Proxy::new(
        "bench",
        plan,
        &Secrets::new(),
        &Placeholders::new(),
        audit,
        proxy_options,
    )?;
    let socket = directory.join("proxy.sock");
    let listener = UnixListener::bind(&socket)?;
    let serving = {
        let proxy = proxy.clone();
        tokio::spawn(async move { proxy.serve(listener).await })
    };
    let result = measure(options, small, bulk, &socket).await;
    proxy.close();
    let _ = serving.await;
    result
}

async fn measure(
    options: &BenchOptions,
    small: SocketAddr,
    bulk: SocketAddr,
    socket: &Path,
) -> Result<BenchReport, BenchError> {
    let mut direct = client(TcpStream::connect(small).await?).await?;
    let mut proxied = client(UnixStream::connect(socket).await?).await?;
    let proxied_uri = format!("http://{SMALL_HOST}/");
    for _ in 0..100 {
        get(&mut direct, "/", &small.to_string()).await?;
        get(&mut proxied, &proxied_uri, SMALL_HOST).await?;
    }
    let mut direct_times = Vec::with_capacity(options.requests);
    let mut proxied_times = Vec::with_capacity(options.requests);
    for _ in 0..options.requests {
        let start = Instant::now();
        get(&mut direct, "/", &small.to_string()).await?;
        direct_times.push(start.elapsed());
        let start = Instant::now();
        get(&mut proxied, &proxied_uri, SMALL_HOST).await?;
        proxied_times.push(start.elapsed());
    }
    let direct_latency = percentiles(&mut direct_times);
    let proxied_latency = percentiles(&mut proxied_times);

    let mut best_direct = Duration::MAX;
    let mut best_proxied = Duration::MAX;
    for _ in 0..options.download_rounds {
        let start = Instant::now();
        download(TcpStream::connect(bulk).await?, options.download_bytes).await?;
        best_direct = best_direct.min(start.elapsed());
        let start = Instant::now();
        let mut tunnel = UnixStream::connect(socket).await?;
        open_tunnel(&mut tunnel, &format!("{BULK_HOST}:80")).await?;
        download(tunnel, options.download_bytes).await?;
        best_proxied = best_proxied.min(start.elapsed());
    }
    let rate = |d: Duration| options.download_bytes as f64 / d.as_secs_f64().max(1e-9);
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(BenchReport {
        requests: options.requests,
        direct: direct_latency,
        proxied: proxied_latency,
        added_p50_us: signed(proxied_latency.p50_us) - signed(direct_latency.p50_us),
        added_p95_us: signed(proxied_latency.p95_us) - signed(direct_latency.p95_us),
        download_bytes: options.download_bytes,
        direct_download_bytes_per_s: rate(best_direct),
        proxied_download_bytes_per_s: rate(best_proxied),
        download_ratio: best_direct.as_secs_f64() / best_proxied.as_secs_f64().max(1e-9),
    })
}

fn scratch_directory() -> io::Result<PathBuf> {
    let suffix = crate::credentials::random_hex(8).map_err(|e| io::Error::other(e.to_string()))?;
    let directory = std::env::temp_dir().join(format!(
        "airlock-bench-egress-{}-{suffix}",
        std::process::id()
    ));
    std::fs::create_dir(&directory)?;
    Ok(directory)
}

fn percentiles(times: &mut [Duration]) -> Latency {
    times.sort();
    let at = |q: f64| {
        let index = ((times.len() as f64 - 1.0) * q).round() as usize;
        u64::try_from(times[index.min(times.len() - 1)].as_micros()).unwrap_or(u64::MAX)
    };
    Latency {
        p50_us: at(0.50),
        p95_us: at(0.95),
    }
}

async fn client<S>(stream: S) -> Result<SendRequest<Empty<Bytes>>, BenchError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| BenchError::Request(e.to_string()))?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn get(
    sender: &mut SendRequest<Empty<Bytes>>,
    uri: &str,
    host: &str,
) -> Result<(), BenchError> {
    let failed = |e: String| BenchError::Request(e);
    sender.ready().await.map_err(|e| failed(e.to_string()))?;
    let request = Request::get(uri)
        .header(hyper::header::HOST, host)
        .body(Empty::new())
        .map_err(|e| failed(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("status {}", response.status())));
    }
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok(())
}

/// Sends CONNECT on `stream` and reads the proxy's answer head.
async fn open_tunnel(stream: &mut UnixStream, target: &str) -> Result<(), BenchError> {
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let head = read_head(stream).await?;
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(BenchError::Request(format!(
            "CONNECT answered {}",
            String::from_utf8_lossy(&head)
                .lines()
                .next()
                .unwrap_or_default()
        )));
    }
    Ok(())
}

/// Reads up to the end of an HTTP head, byte by byte (nothing after it is consumed).
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Vec<u8>, BenchError> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = stream.read_u8().await?;
        head.push(byte);
        if head.len() > 16 * 1024 {
            return Err(BenchError::Request("the response head is too long".into()));
        }
    }
    Ok(head)
}

/// GETs the bulk body on `stream` and reads exactly `bytes` of it.
async fn download<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    bytes: u64,
) -> Result<(), BenchError> {
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {BULK_HOST}\r\n\r\n").as_bytes())
        .await?;
    read_head(&mut stream).await?;
    let mut buffer = vec![0u8; CHUNK];
    let mut left = bytes;
    while left > 0 {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Err(BenchError::Request(format!(
                "the download ended {left} bytes short"
            )));
        }
        left = left.saturating_sub(read as u64);
    }
    Ok(())
}

async fn start_small_upstream() -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_request: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(address)
}

async fn start_bulk_upstream(bytes: u64) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_err() {
                    return;
                }
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {bytes}\r\n\r\n");
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; CHUNK];
                let mut left = bytes;
                while left > 0 {
                    let take = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
                    if stream.write_all(&chunk[..take]).await.is_err() {
                        return;
                    }
                    left -= take as u64;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(address)
}
