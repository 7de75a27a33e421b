//! `airlock bench soak`: cycles of creating and deleting many sandboxes against one private
//! daemon, printing after each cycle what the daemon holds: its resident memory (VmRSS, with
//! its anonymous part), threads and descriptors, and the store's size on disk (`airlock.db`
//! and its WAL). After warm-up the figures should stay flat; a leak shows as a rise cycle over
//! cycle. Figures are printed, never asserted.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use airlock_api::v1::CreateSandboxRequest;
use anyhow::Context;

use crate::api::BenchDaemon;

/// What the daemon holds at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rss_kib: u64,
    anon_kib: u64,
    threads: u64,
    fds: usize,
    db_bytes: u64,
    wal_bytes: u64,
}

fn status_field(status: &str, name: &str) -> anyhow::Result<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.trim().trim_end_matches(" kB").trim().parse().ok())
        .with_context(|| format!("{name} missing from /proc/PID/status"))
}

fn sample(pid: u32, state_dir: &Path) -> anyhow::Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let size = |name: &str| std::fs::metadata(state_dir.join(name)).map_or(0, |m| m.len());
    Ok(Sample {
        rss_kib: status_field(&status, "VmRSS:")?,
        anon_kib: status_field(&status, "RssAnon:")?,
        threads: status_field(&status, "Threads:")?,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count(),
        db_bytes: size(airlock_server::config::STORE_FILE),
        wal_bytes: size(&format!("{}-wal", airlock_server::config::STORE_FILE)),
    })
}

fn mib_of_kib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

fn print_row(cycle: &str, seconds: f64, s: &Sample) {
    println!(
        "{cycle:>6} {seconds:>8.2} {:>9.1} {:>9.1} {:>7} {:>5} {:>9.2} {:>9.2}",
        mib_of_kib(s.rss_kib),
        mib_of_kib(s.anon_kib),
        s.threads,
        s.fds,
        mib(s.db_bytes),
        mib(s.wal_bytes),
    );
}

/// Creates `count` sandboxes with `clients` concurrent clients, then deletes them all the same
/// way; fails on the first error.
async fn cycle(daemon: &BenchDaemon, count: usize, clients: usize) -> anyhow::Result<()> {
    let request = CreateSandboxRequest::default();
    let mut creating = tokio::task::JoinSet::new();
    for worker in 0..clients {
        let client = daemon.client.clone();
        let request = request.clone();
        let share = count / clients + usize::from(worker < count % clients);
        creating.spawn(async move {
            let mut ids = Vec::with_capacity(share);
            for _ in 0..share {
                ids.push(client.create(&request).await?.sandbox.id);
            }
            anyhow::Ok(ids)
        });
    }
    let mut ids = Vec::with_capacity(count);
    while let Some(done) = creating.join_next().await {
        ids.extend(done??);
    }
    let mut deleting = tokio::task::JoinSet::new();
    for chunk in ids.chunks(ids.len().div_ceil(clients).max(1)) {
        let client = daemon.client.clone();
        let chunk = chunk.to_vec();
        deleting.spawn(async move {
            for id in chunk {
                client.delete(&id).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = deleting.join_next().await {
        done??;
    }
    Ok(())
}

/// `bench soak`: `cycles` rounds of `sandboxes` creates and deletes by `clients` clients.
pub fn soak(cycles: usize, sandboxes: usize, clients: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(cycles >= 1, "--cycles must be at least 1");
    anyhow::ensure!(sandboxes >= 1, "--sandboxes must be at least 1");
    anyhow::ensure!(clients >= 1, "--clients must be at least 1");
    let clients = clients.min(sandboxes);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut daemon = BenchDaemon::start(None, sandboxes + 8)?;
        daemon.wait_ready().await?;
        let pid = daemon
            .pid()
            .context("the benchmark's own daemon has no pid")?;
        let state_dir = daemon
            .state_dir()
            .context("the benchmark's own daemon has no state directory")?
            .to_owned();
        println!(
            "{cycles} cycles of {sandboxes} sandboxes created then deleted by {clients} clients; \
             the daemon (pid {pid}) after each cycle"
        );
        println!(
            "{:>6} {:>8} {:>9} {:>9} {:>7} {:>5} {:>9} {:>9}",
            "cycle", "seconds", "RSS MiB", "anon MiB", "threads", "fds", "db MiB", "WAL MiB"
        );
        let mut samples = vec![sample(pid, &state_dir)?];
        print_row("start", 0.0, &samples[0]);
        for n in 1..=cycles {
            let started = Instant::now();
            cycle(&daemon, sandboxes, clients)
                .await
                .with_context(|| format!("cycle {n}"))?;
            let now = sample(pid, &state_dir)?;
            print_row(&n.to_string(), started.elapsed().as_secs_f64(), &now);
            samples.push(now);
        }
        // Warm-up fills the allocator's arenas, the store's cache and the runtime's pools; a
        // leak shows as a rise that goes on, so the slope is taken over the second half.
        if cycles >= 2 {
            let (first, mid, last) = (&samples[1], &samples[cycles.div_ceil(2)], &samples[cycles]);
            let half = (cycles - cycles.div_ceil(2)).max(1) as f64;
            println!(
                "RSS after cycle 1: {:.1} MiB, cycle {}: {:.1} MiB, cycle {cycles}: {:.1} MiB \
                 ({:+.1} KiB per cycle over the second half); store {:.2} MiB -> {:.2} MiB",
                mib_of_kib(first.rss_kib),
                cycles.div_ceil(2),
                mib_of_kib(mid.rss_kib),
                mib_of_kib(last.rss_kib),
                (last.rss_kib as f64 - mid.rss_kib as f64) / half,
                mib(first.db_bytes + first.wal_bytes),
                mib(last.db_bytes + last.wal_bytes),
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}
