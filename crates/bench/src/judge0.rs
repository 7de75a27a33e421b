//! `airlock bench judge0`: the Judge0-compatible API (`--judge0-listen`) under the load of an
//! online judge: the p50 and p95 latency of one submission with `wait=true`, and submissions
//! per second for a batch of small Python programs sent as Judge0 batches of 20 and polled
//! until all are done. The baseline is the same program run by language 71's own run command
//! directly on the host in the same run (no sandbox, no queue). Figures are printed, never
//! asserted.

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_server::client::Client;
use anyhow::{Context, bail};
use hyper::Method;
use serde_json::{Value, json};

/// Judge0's id for Python 3, and the program each submission runs.
const PYTHON: u32 = 71;
const PROGRAM: &str = "print(sum(range(1000)))";
const EXPECTED: &str = "499500";
/// Judge0's `max_submission_batch_size`.
const BATCH: usize = 20;

/// The Judge0 API to measure: a private daemon, or the one at `--url`.
struct Target {
    client: Client,
    key: Option<String>,
    _daemon: Option<PrivateDaemon>,
}

struct PrivateDaemon {
    child: std::process::Child,
    state_dir: std::path::PathBuf,
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        // Every submission's sandbox is gone once its submission finished.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

impl Target {
    fn start(url: Option<String>, workers: usize, submissions: usize) -> anyhow::Result<Target> {
        if let Some(url) = url {
            let key = std::env::var("AIRLOCK_API_KEY").ok();
            return Ok(Target {
                client: Client::new(&url, None)?,
                key,
                _daemon: None,
            });
        }
        let free_port = || -> anyhow::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let (api, judge0) = (free_port()?, free_port()?);
        let state_dir = std::env::temp_dir().join(format!(
            "airlock-bench-judge0-{}-{judge0}",
            std::process::id()
        ));
        let child = Command::new(std::env::current_exe()?)
            .args(["serve", "--insecure-no-auth", "--listen"])
            .arg(format!("127.0.0.1:{api}"))
            .arg("--judge0-listen")
            .arg(format!("127.0.0.1:{judge0}"))
            .arg("--judge0-workers")
            .arg(workers.to_string())
            .arg("--judge0-max-queue")
            .arg(submissions.max(100).to_string())
            .arg("--state-dir")
            .arg(&state_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting airlock serve")?;
        Ok(Target {
            client: Client::new(&format!("http://127.0.0.1:{judge0}"), None)?,
            key: None,
            _daemon: Some(PrivateDaemon { child, state_dir }),
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(key) = &self.key {
            headers.push(("x-auth-token", key.as_str()));
        }
        let bytes = body
            .map(serde_json::to_vec)
            .transpose()?
            .unwrap_or_default();
        let (status, _, answer) = self.client.raw(method, path, &headers, bytes).await?;
        let value = if answer.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&answer)
                .with_context(|| format!("{path} answered {status} with no JSON"))?
        };
        Ok((status.as_u16(), value))
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            match self.call(Method::GET, "/about", None).await {
                Ok((200, _)) => return Ok(()),
                Ok((status, _)) => {
                    bail!("GET /about answered {status} (set AIRLOCK_API_KEY for --url)")
                }
                Err(_) if Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(err) => return Err(err.context("the Judge0 API did not answer within 30 s")),
            }
        }
    }
}

fn submission() -> Value {
    json!({"source_code": PROGRAM, "language_id": PYTHON, "expected_output": EXPECTED})
}

pub fn judge0(
    url: Option<String>,
    iterations: usize,
    submissions: usize,
    workers: usize,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 5, "--iterations must be at least 5");
    anyhow::ensure!(
        submissions >= BATCH,
        "--submissions must be at least {BATCH}"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let private = url.is_none();
    let target = Target::start(url, workers, submissions)?;
    runtime.block_on(target.wait_ready())?;

    // The baseline: the language's own run command (`GET /languages/71`), straight on the
    // host, in a scratch directory that holds the program.
    let (status, language) = runtime.block_on(target.call(Method::GET, "/languages/71", None))?;
    let run_cmd = language["run_cmd"]
        .as_str()
        .filter(|_| status == 200)
        .with_context(|| format!("GET /languages/71 answered {status} {language}"))?
        .to_owned();
    let scratch =
        std::env::temp_dir().join(format!("airlock-bench-judge0-host-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let source_file = language["source_file"].as_str().unwrap_or("script.py");
    std::fs::write(scratch.join(source_file), PROGRAM)?;
    let mut host = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let output = Command::new("/bin/bash")
            .args(["-c", &run_cmd])
            .current_dir(&scratch)
            .output()?;
        anyhow::ensure!(output.status.success(), "`{run_cmd}` on the host failed");
        host.push(started.elapsed());
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let mut wait = runtime.block_on(wait_latencies(&target, iterations))?;
    let (elapsed, total) = runtime.block_on(throughput(&target, submissions))?;

    let daemon = if private {
        format!("a private daemon with {workers} workers")
    } else {
        "the API at --url".to_owned()
    };
    println!("airlock bench judge0: Python 3 ({PROGRAM}) against {daemon}");
    println!("{:<52} {:>9} {:>9}", "", "p50 ms", "p95 ms");
    let host_p50 = report(&format!("`{run_cmd}` on the host (baseline)"), &mut host);
    let wait_p50 = report("one submission, wait=true", &mut wait);
    println!(
        "wait=true p50 / host p50: {:.1}x",
        wait_p50 / host_p50.max(0.001)
    );
    let rate = total as f64 / elapsed.as_secs_f64();
    println!(
        "batch of {total} ({} Judge0 batches of {BATCH}): {:.2} s, {rate:.1} submissions/s \
         (host baseline, one at a time: {:.1}/s)",
        total.div_ceil(BATCH),
        elapsed.as_secs_f64(),
        1000.0 / host_p50.max(0.001)
    );
    Ok(ExitCode::SUCCESS)
}

/// `iterations` single submissions with `wait=true`, after two warm-ups.
async fn wait_latencies(target: &Target, iterations: usize) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(iterations);
    for n in 0..iterations + 2 {
        let started = Instant::now();
        let (status, answer) = target
            .call(Method::POST, "/submissions?wait=true", Some(&submission()))
            .await?;
        let took = started.elapsed();
        if status != 201 || answer["status"]["id"] != 3 {
            bail!("a wait=true submission was not accepted: {status} {answer}");
        }
        if n >= 2 {
            times.push(took);
        }
    }
    Ok(times)
}

/// Sends `count` submissions as batches of 20, polls them as batches until every one is
/// done, and checks each was accepted. Returns the time from the first POST to the last
/// answer.
async fn throughput(target: &Target, count: usize) -> anyhow::Result<(Duration, usize)> {
    let started = Instant::now();
    let mut tokens = Vec::with_capacity(count);
    for chunk in 0..count.div_ceil(BATCH) {
        let size = BATCH.min(count - chunk * BATCH);
        let body = json!({ "submissions": vec![submission(); size] });
        let (status, answer) = target
            .call(Method::POST, "/submissions/batch", Some(&body))
            .await?;
        if status != 201 {
            bail!("a batch was refused: {status} {answer}");
        }
        for entry in answer.as_array().into_iter().flatten() {
            tokens.push(
                entry["token"]
                    .as_str()
                    .with_context(|| format!("a batch entry without a token: {entry}"))?
                    .to_owned(),
            );
        }
    }
    let mut pending = tokens;
    while !pending.is_empty() {
        let mut still = Vec::new();
        for chunk in pending.chunks(BATCH) {
            let path = format!(
                "/submissions/batch?fields=token,status_id&tokens={}",
                chunk.join(",")
            );
            let (status, answer) = target.call(Method::GET, &path, None).await?;
            if status != 200 {
                bail!("GET /submissions/batch answered {status} {answer}");
            }
            for (token, entry) in chunk
                .iter()
                .zip(answer["submissions"].as_array().into_iter().flatten())
            {
                match entry["status_id"].as_i64() {
                    Some(1 | 2) => still.push(token.clone()),
                    Some(3) => {}
                    other => bail!("submission {token} ended with status {other:?}"),
                }
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok((started.elapsed(), count))
}

fn report(name: &str, times: &mut [Duration]) -> f64 {
    times.sort();
    let at = |p: usize| {
        let index = (times.len().saturating_sub(1) * p).div_ceil(100);
        times.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let (p50, p95) = (at(50), at(95));
    println!("{name:<52} {p50:>9.1} {p95:>9.1}");
    p50
}
