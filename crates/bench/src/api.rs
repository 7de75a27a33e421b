//! `airlock bench api` and `airlock bench density`: the daemon measured through its HTTP API.
//!
//! Each starts its own `airlockd` (as `airlock serve`, on a free loopback port, with a scratch
//! state directory) unless `--url` names a running one, and prints figures, never asserts them.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_api::v1::{CreateSandboxRequest, ExecRequest};
use airlock_server::client::Client;
use anyhow::{Context, bail};

use crate::percentile;

/// A daemon for the benchmark: ours (removed on drop) or the one at `--url`.
pub struct BenchDaemon {
    child: Option<Child>,
    state_dir: Option<PathBuf>,
    pub client: Client,
}

impl BenchDaemon {
    pub fn start(url: Option<String>, max_sandboxes: usize) -> anyhow::Result<BenchDaemon> {
        BenchDaemon::start_with(url, max_sandboxes, &[])
    }

    /// [`BenchDaemon::start`] with more flags for the private daemon.
    pub fn start_with(
        url: Option<String>,
        max_sandboxes: usize,
        extra: &[String],
    ) -> anyhow::Result<BenchDaemon> {
        if let Some(url) = url {
            let key = std::env::var("AIRLOCK_API_KEY").ok();
            return Ok(BenchDaemon {
                child: None,
                state_dir: None,
                client: Client::new(&url, key)?,
            });
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let state_dir =
            std::env::temp_dir().join(format!("airlock-bench-{}-{port}", std::process::id()));
        let child = Command::new(std::env::current_exe()?)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(&state_dir)
            .args([
                "--insecure-no-auth",
                "--log-level",
                "warn",
                "--max-sandboxes",
            ])
            .arg(max_sandboxes.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting airlock serve")?;
        let daemon = BenchDaemon {
            child: Some(child),
            state_dir: Some(state_dir),
            client: Client::new(&format!("http://127.0.0.1:{port}"), None)?,
        };
        Ok(daemon)
    }

    /// The daemon's pid, when the benchmark started it.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon's state directory, when the benchmark started it.
    pub fn state_dir(&self) -> Option<&std::path::Path> {
        self.state_dir.as_deref()
    }

    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            if self.client.health().await.is_ok() {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                bail!("airlock serve exited: {status}");
            }
            if Instant::now() > give_up {
                bail!("airlockd did not answer within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM leaves sandboxes running by design; the benchmark deletes its own first.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        if let Some(dir) = self.state_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn report(name: &str, times: &mut [Duration]) -> f64 {
    times.sort();
    let (p50, p95, p99) = (
        percentile(times, 50),
        percentile(times, 95),
        percentile(times, 99),
    );
    println!("{name:<34} {p50:>9.3} {p95:>9.3} {p99:>9.3}");
    p50
}

/// Sets `base`'s warm pool to `size` and waits until it is full.
pub async fn fill_pool(client: &Client, size: u32) -> anyhow::Result<()> {
    client.set_pool("base", size).await?;
    wait_pool(client, size).await
}

async fn wait_pool(client: &Client, ready: u32) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let status = client.pool("base").await?;
        if status.ready >= ready {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!("the warm pool never filled: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn exec_true() -> ExecRequest {
    ExecRequest {
        argv: Some(vec!["/bin/true".into()]),
        ..ExecRequest::default()
    }
}

/// `bench api`: create→ready, exec round-trip, delete, and 100 MB file throughput.
pub fn api(
    url: Option<String>,
    iterations: usize,
    file_mib: u64,
    pool: Option<u32>,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 10, "--iterations must be at least 10");
    runtime()?.block_on(async move {
        let mut daemon = BenchDaemon::start(url, 64)?;
        daemon.wait_ready().await?;
        let client = daemon.client.clone();
        let request = CreateSandboxRequest::default();
        let (mut create, mut delete, mut health) = (Vec::new(), Vec::new(), Vec::new());
        let mut bare = Vec::new();
        for round in 0..iterations + 5 {
            let start = Instant::now();
            client.health().await?;
            let health_time = start.elapsed();
            let start = Instant::now();
            crate::spawn_wait("/bin/true", &[])?;
            let bare_time = start.elapsed();
            let start = Instant::now();
            let created = client.create(&request).await?;
            let create_time = start.elapsed();
            let start = Instant::now();
            client.delete(&created.sandbox.id).await?;
            let delete_time = start.elapsed();
            if round >= 5 {
                health.push(health_time);
                bare.push(bare_time);
                create.push(create_time);
                delete.push(delete_time);
            }
        }
        // Claims, measured after the cold creates so that no fill runs beside those; each
        // starts with the pool full, so that every timed create is a claim.
        let mut claim = Vec::new();
        if let Some(size) = pool {
            fill_pool(&client, size).await?;
            let before = client.pool("base").await?.claims_total;
            for round in 0..iterations + 5 {
                wait_pool(&client, size).await?;
                let start = Instant::now();
                let created = client.create(&request).await?;
                let claim_time = start.elapsed();
                client.delete(&created.sandbox.id).await?;
                if round >= 5 {
                    claim.push(claim_time);
                }
            }
            let claimed = client.pool("base").await?.claims_total - before;
            anyhow::ensure!(
                claimed == (iterations + 5) as u64,
                "only {claimed} of {} creates were claims",
                iterations + 5
            );
            client.set_pool("base", 0).await?;
        }
        let sandbox = client.create(&request).await?.sandbox;
        let mut exec = Vec::new();
        for round in 0..iterations + 5 {
            let start = Instant::now();
            let output = client.exec_collect(&sandbox.id, &exec_true()).await?;
            anyhow::ensure!(output.exit_code == 0, "exec of /bin/true failed: {output:?}");
            if round >= 5 {
                exec.push(start.elapsed());
            }
        }
        let payload = vec![0x5au8; usize::try_from(file_mib << 20)?];
        let (mut put, mut get) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let start = Instant::now();
            client
                .write_file(&sandbox.id, "/tmp/bench.bin", payload.clone())
                .await?;
            put.push(start.elapsed());
            let start = Instant::now();
            let back = client.read_file(&sandbox.id, "/tmp/bench.bin").await?;
            get.push(start.elapsed());
            anyhow::ensure!(back.len() == payload.len(), "the download came back short");
        }
        client.delete(&sandbox.id).await?;
        println!("{iterations} iterations each, after 5 warm-up runs; one daemon, loopback HTTP");
        println!("{:<34} {:>9} {:>9} {:>9}", "operation", "p50 ms", "p95 ms", "p99 ms");
        let bare_p50 = report("fork+exec+wait /bin/true (baseline)", &mut bare);
        let health_p50 = report("GET /v1/health (HTTP floor)", &mut health);
        let create_p50 = report("create -> ready (cold)", &mut create);
        let claim_p50 = (!claim.is_empty()).then(|| {
            claim.sort();
            let p99 = percentile(&claim, 99);
            (report("create -> ready (warm pool)", &mut claim), p99)
        });
        let exec_p50 = report("exec /bin/true round-trip", &mut exec);
        report("delete", &mut delete);
        for (name, times) in [("file put", &mut put), ("file get", &mut get)] {
            times.sort();
            let median = times[times.len() / 2].as_secs_f64();
            println!(
                "{name:<34} {:>9.1} MiB/s ({file_mib} MiB, median of 3)",
                file_mib as f64 / median
            );
        }
        let verdict = |value: f64, target: f64| if value <= target { "meets" } else { "misses" };
        println!(
            "cold create -> ready p50: {create_p50:.3} ms = {:.1}x fork+exec ({} the 3 ms target)",
            create_p50 / bare_p50,
            verdict(create_p50, 3.0)
        );
        if let Some((p50, p99)) = claim_p50 {
            println!(
                "warm-pool create p50: {p50:.3} ms = {:.1}x the HTTP floor ({} the 1 ms target), p99: {p99:.3} ms ({} the 3 ms target)",
                p50 / health_p50,
                verdict(p50, 1.0),
                verdict(p99, 3.0)
            );
        }
        println!(
            "exec round-trip p50: {exec_p50:.3} ms = {:.1}x fork+exec, {:.1}x the HTTP floor ({} the 2 ms target)",
            exec_p50 / bare_p50,
            exec_p50 / health_p50,
            verdict(exec_p50, 2.0)
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// Used memory as the kernel sees it: everything not available to new allocations.
pub(crate) fn used_bytes() -> anyhow::Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kb| kb * 1024)
            .with_context(|| format!("{name} missing from /proc/meminfo"))
    };
    Ok(field("MemTotal:")? - field("MemAvailable:")?)
}

/// `bench density`: N idle sandboxes, and the host memory each one costs.
pub fn density(url: Option<String>, count: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(count >= 1, "--count must be at least 1");
    runtime()?.block_on(async move {
        let mut daemon = BenchDaemon::start(url, count + 8)?;
        daemon.wait_ready().await?;
        let client = daemon.client.clone();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = used_bytes()?;
        let started = Instant::now();
        let mut ids = Vec::with_capacity(count);
        let request = CreateSandboxRequest::default();
        for _ in 0..count {
            match client.create(&request).await {
                Ok(created) => ids.push(created.sandbox.id),
                Err(err) => {
                    eprintln!("stopped after {} sandboxes: {err}", ids.len());
                    break;
                }
            }
        }
        let elapsed = started.elapsed();
        // Let lazily freed memory settle before reading the figure.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = used_bytes()?;
        let live = client.list(&[], &Default::default()).await?.len();
        for id in &ids {
            let _ = client.delete(id).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let released = used_bytes()?;
        let n = ids.len().max(1) as f64;
        let per = after.saturating_sub(before) as f64 / n / f64::from(1u32 << 20);
        println!("{} idle sandboxes started in {:.2} s ({} listed)", ids.len(), elapsed.as_secs_f64(), live);
        println!(
            "host memory used: {:.1} MiB before, {:.1} MiB with them, {:.1} MiB after deleting them",
            before as f64 / f64::from(1u32 << 20),
            after as f64 / f64::from(1u32 << 20),
            released as f64 / f64::from(1u32 << 20)
        );
        let verdict = if per <= 4.0 { "meets" } else { "misses" };
        println!("per idle sandbox: {per:.2} MiB of system memory (MemTotal - MemAvailable); {verdict} the 4 MiB target");
        Ok(ExitCode::SUCCESS)
    })
}
