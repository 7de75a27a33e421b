//! `airlock bench e2b`: what a user of the E2B Python SDK pays for a throwaway sandbox,
//! `Sandbox.create()` + `commands.run("true")` + `kill()`, measured through the real SDK.
//!
//! The driver is `tests/e2b/bench_e2b.py` (compiled in); it runs under the Python of the SDK's
//! venv (`scripts/e2b-tests.sh` makes it) against a private daemon, or the one at `--url`, and
//! prints p50 and p95 of each step. It never asserts a timing.
//!
//! The same cycles then run against a null server (`e2b_null.rs`, answering the three calls at
//! once): its p50 is the SDK's own floor, and Airlock's p50 minus it is what the daemon, the
//! agent and the sandbox cost.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context;

use crate::api::BenchDaemon;
use crate::e2b_null::NullServer;

const DRIVER: &str = include_str!("../../../tests/e2b/bench_e2b.py");
/// The venv `scripts/e2b-tests.sh` installs the newest SDK into.
const DEFAULT_PYTHON: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../target/e2b-venv-latest/bin/python"
);

pub fn e2b(
    url: Option<String>,
    iterations: usize,
    python: Option<PathBuf>,
    pool: Option<u32>,
    floor: bool,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 10, "--iterations must be at least 10");
    let python = python.unwrap_or_else(|| PathBuf::from(DEFAULT_PYTHON));
    anyhow::ensure!(
        python.is_file(),
        "no Python with the e2b SDK at {}: run scripts/e2b-tests.sh --install-only, or pass --python",
        python.display()
    );
    let key = match &url {
        Some(_) => std::env::var("E2B_API_KEY")
            .context("--url needs E2B_API_KEY: an Airlock API key in E2B's e2b_<hex> form")?,
        // The private daemon runs with --insecure-no-auth, so any key of E2B's form passes.
        None => format!("e2b_{}", "0".repeat(32)),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut daemon = BenchDaemon::start(url, 64)?;
    runtime.block_on(daemon.wait_ready())?;
    if let Some(size) = pool {
        runtime.block_on(crate::api::fill_pool(&daemon.client, size))?;
    }
    let base_url = daemon.client.base_url();
    let null = if floor {
        Some(NullServer::start().context("cannot start the null E2B server")?)
    } else {
        None
    };
    let mut driver = Command::new(&python);
    driver
        .arg("-c")
        .arg(DRIVER)
        .arg("--iterations")
        .arg(iterations.to_string())
        // With a warm pool, issue 14's target; cold, the foundation's.
        .args(["--target-ms", if pool.is_some() { "10" } else { "25" }]);
    if let Some(null) = &null {
        driver.arg("--floor-url").arg(null.url());
    }
    let status = driver
        .env("E2B_API_URL", &base_url)
        .env("E2B_SANDBOX_URL", &base_url)
        .env("E2B_API_KEY", key)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .status()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if pool.is_some() {
        let status = runtime.block_on(daemon.client.pool("base"))?;
        println!(
            "warm pool of {}: {} of the creates claimed a member, the others were cold",
            status.size, status.claims_total
        );
        runtime.block_on(daemon.client.set_pool("base", 0))?;
    }
    // Stops the private daemon; the driver has killed every sandbox it made.
    drop(daemon);
    let unexpected = null.as_ref().map_or(0, NullServer::unexpected);
    anyhow::ensure!(
        unexpected == 0,
        "the SDK made {unexpected} calls the null server does not answer: its floor is not the same cycle"
    );
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
