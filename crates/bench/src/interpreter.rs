//! `airlock bench interpreter`: the code-interpreter template through a daemon's data plane,
//! as E2B's SDK drives it: create + first `run_code("1+1")`, and `run_code` round trips on a
//! warm context. Figures are printed, never asserted.
//!
//! A cold create waits, as E2B's template engine does, for the default python kernel; from a
//! warm pool of one (whose member's kernel is already up) the create only claims it. Each
//! pooled round waits for the pool to refill first (untimed).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use airlock_api::v1::CreateSandboxRequest;
use airlock_server::client::Client;
use airlock_server::lifecycle::{INTERPRETER_PORT, INTERPRETER_TEMPLATE};
use anyhow::Context;
use hyper::{Method, StatusCode};

use crate::api::BenchDaemon;
use crate::percentile;

/// One `POST /execute` of `code` on the default python context; the `text` of its result.
async fn run_code(client: &Client, id: &str, code: &str) -> anyhow::Result<String> {
    let port = INTERPRETER_PORT.to_string();
    let headers = [
        ("content-type", "application/json"),
        ("e2b-sandbox-id", id),
        ("e2b-sandbox-port", port.as_str()),
    ];
    let body =
        serde_json::json!({"code": code, "context_id": null, "language": null, "env_vars": null});
    let (status, _, answer) = client
        .raw(Method::POST, "/execute", &headers, body.to_string())
        .await?;
    let text = String::from_utf8_lossy(&answer);
    anyhow::ensure!(
        status == StatusCode::OK,
        "POST /execute answered {status}: {text}"
    );
    let result = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["type"] == "result")
        .and_then(|line| line["text"].as_str().map(str::to_owned));
    result.with_context(|| format!("no result in the answer: {text}"))
}

/// Waits (untimed) until the interpreter template's pool has a ready member.
async fn wait_pool(client: &Client) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(300);
    loop {
        let status = client.pool(INTERPRETER_TEMPLATE).await?;
        if status.ready >= 1 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < give_up,
            "the warm pool never filled: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn row(name: &str, times: &mut [Duration]) -> f64 {
    times.sort();
    let (p50, p95) = (percentile(times, 50), percentile(times, 95));
    println!("{name:<40} {p50:>10.3} {p95:>10.3}");
    p50
}

pub fn interpreter(
    url: Option<String>,
    creates: usize,
    iterations: usize,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        creates >= 1 && iterations >= 10,
        "need --creates >= 1 and --iterations >= 10"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut daemon = BenchDaemon::start(url, 16)?;
        daemon.wait_ready().await?;
        let client = daemon.client.clone();
        let request = CreateSandboxRequest {
            template: Some(INTERPRETER_TEMPLATE.to_owned()),
            ..CreateSandboxRequest::default()
        };
        let (mut create, mut first, mut cycle) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..creates {
            let start = Instant::now();
            let id = client.create(&request).await?.sandbox.id;
            let created = start.elapsed();
            let answer = run_code(&client, &id, "1+1").await;
            let whole = start.elapsed();
            client.delete(&id).await?;
            anyhow::ensure!(answer? == "2", "1+1 was not 2");
            create.push(created);
            first.push(whole - created);
            cycle.push(whole);
        }
        let mut pooled = Vec::new();
        client.set_pool(INTERPRETER_TEMPLATE, 1).await?;
        let filled = async {
            for _ in 0..creates {
                wait_pool(&client).await?;
                let start = Instant::now();
                let id = client.create(&request).await?.sandbox.id;
                let answer = run_code(&client, &id, "1+1").await;
                let whole = start.elapsed();
                client.delete(&id).await?;
                anyhow::ensure!(answer? == "2", "1+1 was not 2");
                pooled.push(whole);
            }
            Ok(())
        }
        .await;
        client.set_pool(INTERPRETER_TEMPLATE, 0).await?;
        filled?;
        let id = client.create(&request).await?.sandbox.id;
        let mut round_trip = Vec::new();
        let measured = async {
            for round in 0..iterations + 5 {
                let start = Instant::now();
                let text = run_code(&client, &id, "1+1").await?;
                anyhow::ensure!(text == "2", "1+1 was {text}");
                if round >= 5 {
                    round_trip.push(start.elapsed());
                }
            }
            Ok(())
        }
        .await;
        client.delete(&id).await?;
        measured?;
        println!(
            "code-interpreter-v1 on the process tier: {creates} creates, {iterations} round trips after 5 warm-up ones"
        );
        println!("{:<40} {:>10} {:>10}", "step", "p50 ms", "p95 ms");
        row("create (default python kernel ready)", &mut create);
        row("first run_code(\"1+1\") after create", &mut first);
        let cold = row("create + first result, no pool", &mut cycle);
        let warm = row("create + first result, from a pool", &mut pooled);
        let trip = row("run_code(\"1+1\") round trip", &mut round_trip);
        let verdict = |value: f64, target: f64| if value <= target { "meets" } else { "misses" };
        println!("run_code round trip p50: {trip:.3} ms ({} the 15 ms target)", verdict(trip, 15.0));
        println!(
            "create + first result p50: {warm:.1} ms from a pool ({} the 100 ms target), {cold:.1} ms without",
            verdict(warm, 100.0)
        );
        Ok(ExitCode::SUCCESS)
    })
}
