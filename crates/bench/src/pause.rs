//! `airlock bench pause`: pause and resume, snapshots and creates from them, through a private
//! daemon's API, in one run. Figures are printed, never asserted; the ratio of a create from a
//! snapshot is against plain creates measured beside it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use airlock_api::v1::{CreateSandboxRequest, ExecRequest, PauseMode};
use airlock_server::client::Client;
use anyhow::{Context, bail};

use crate::api::BenchDaemon;
use crate::percentile;

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

async fn run(client: &Client, id: &str, command: &str) -> anyhow::Result<()> {
    let out = client.exec_collect(id, &shell(command)).await?;
    if out.exit_code != 0 {
        bail!(
            "`{command}` failed in the benchmark sandbox: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

async fn create(client: &Client, template: Option<&str>) -> anyhow::Result<(String, Duration)> {
    let started = Instant::now();
    let created = client
        .create(&CreateSandboxRequest {
            template: template.map(str::to_owned),
            ..CreateSandboxRequest::default()
        })
        .await?;
    Ok((created.sandbox.id, started.elapsed()))
}

fn line(name: &str, times: &mut [Duration]) -> f64 {
    times.sort();
    let (p50, p95) = (percentile(times, 50), percentile(times, 95));
    println!("{name:<44} {p50:>9.3} {p95:>9.3}");
    p50
}

/// Pause then resume `id` `iterations` times; pushes each figure.
async fn cycles(
    client: &Client,
    id: &str,
    iterations: usize,
    pauses: &mut Vec<Duration>,
    resumes: &mut Vec<Duration>,
) -> anyhow::Result<()> {
    for _ in 0..iterations {
        let started = Instant::now();
        client.pause(id, PauseMode::Frozen).await?;
        pauses.push(started.elapsed());
        let started = Instant::now();
        client.resume(id, None).await?;
        resumes.push(started.elapsed());
    }
    Ok(())
}

pub fn pause(iterations: usize, snapshots: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 5, "--iterations must be at least 5");
    anyhow::ensure!(snapshots >= 3, "--snapshots must be at least 3");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(measure(iterations, snapshots))
}

async fn measure(iterations: usize, snapshots: usize) -> anyhow::Result<ExitCode> {
    let mut daemon = BenchDaemon::start(None, 64)?;
    daemon.wait_ready().await?;
    let client = daemon.client.clone();
    let mut made = Vec::new();
    let result = async {
        let (idle, _) = create(&client, None).await?;
        made.push(idle.clone());
        let (holder, _) = create(&client, None).await?;
        made.push(holder.clone());
        // 256 MiB touched and kept resident by a sleeping Python.
        run(
            &client,
            &holder,
            "nohup python3 -c 'import time; b = bytearray(256 << 20); time.sleep(86400)' >/dev/null 2>&1 & sleep 1",
        )
        .await?;
        let (files, _) = create(&client, None).await?;
        made.push(files.clone());
        // 100 MB in 5,000 files of 20 kB.
        run(
            &client,
            &files,
            "mkdir -p /workspace/data && cd /workspace/data && head -c 20000 /dev/urandom > seed && for i in $(seq 1 5000); do cp seed f$i; done && rm seed",
        )
        .await
        .context("filling the workspace")?;
        println!(
            "{iterations} pause/resume cycles per sandbox, {snapshots} snapshots and creates, through the daemon's API"
        );
        println!("{:<44} {:>9} {:>9}", "operation", "p50 ms", "p95 ms");
        let (mut pause_idle, mut resume_idle) = (Vec::new(), Vec::new());
        let (mut pause_busy, mut resume_busy) = (Vec::new(), Vec::new());
        cycles(&client, &idle, 2, &mut Vec::new(), &mut Vec::new()).await?;
        cycles(&client, &idle, iterations, &mut pause_idle, &mut resume_idle).await?;
        cycles(&client, &holder, iterations, &mut pause_busy, &mut resume_busy).await?;
        let p_idle = line("pause, idle sandbox", &mut pause_idle);
        let r_idle = line("resume, idle sandbox", &mut resume_idle);
        line("pause, 256 MiB resident", &mut pause_busy);
        line("resume, 256 MiB resident", &mut resume_busy);
        let (mut snaps, mut from_snap, mut plain) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..snapshots {
            let started = Instant::now();
            let snapshot = client.snapshot(&files, None).await?;
            snaps.push(started.elapsed());
            // Interleaved: a plain create, then one from the snapshot (whose spare clone is
            // then made again in the background, over the deletes rather than the next create).
            let (other, took) = create(&client, None).await?;
            plain.push(took);
            client.delete(&other).await?;
            let (child, took) = create(&client, Some(&snapshot.id)).await?;
            from_snap.push(took);
            client.delete(&child).await?;
            client.delete_snapshot(&snapshot.id).await?;
        }
        let snap = line("snapshot, 100 MB in 5,000 files", &mut snaps);
        let from = line("create from that snapshot", &mut from_snap);
        let base = line("plain create, beside it", &mut plain);
        println!(
            "pause p50 {p_idle:.3} ms (target 10 ms), resume p50 {r_idle:.3} ms (target 5 ms), snapshot p50 {snap:.3} ms (target 1000 ms)"
        );
        println!(
            "create from a snapshot / plain create (p50): {:.2}x (target 1.5x)",
            from / base
        );
        Ok::<(), anyhow::Error>(())
    }
    .await;
    for id in made {
        let _ = client.delete(&id).await;
    }
    result?;
    Ok(ExitCode::SUCCESS)
}
