//! Host-side scenarios that need no daemon: several `airlock run` sandboxes at once, looked at
//! from the host.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::catalog::Outcome;
use super::runner::Env;

/// The scenarios this module runs (the others are the daemon's).
const RUN_SCENARIOS: &[&str] = &["distinct-host-uids"];

pub fn is_run_scenario(name: Option<&str>) -> bool {
    name.is_some_and(|name| RUN_SCENARIOS.contains(&name))
}

pub fn run(env: &Env, name: &str) -> anyhow::Result<Outcome> {
    match name {
        "distinct-host-uids" => distinct_host_uids(env),
        other => bail!("unknown scenario `{other}`"),
    }
}

/// Two sandboxes of the tier under test, alive at the same time: their workloads (uid 0
/// inside both) must run as different host uids, each a range of its own above the
/// unprivileged base. `ok=distinct` when they do; `ok=shared UID` when they share one.
fn distinct_host_uids(env: &Env) -> anyhow::Result<Outcome> {
    let values = env.fixtures.per_attempt()?;
    let markers = [0, 1].map(|n| {
        format!(
            "{}-{n}",
            values
                .get("marker")
                .map_or("airlock-seceval-uids", String::as_str)
        )
    });
    let mut children = Vec::new();
    for marker in &markers {
        let mut command = Command::new(&env.airlock);
        command.args(["run", "--timeout", "60s"]);
        if env.tier == airlock_api::Tier::Container {
            let image = values.get("image").context("the test image is missing")?;
            command.args(["--image", image, "--", super::fixtures::IMAGE_PROBE]);
        } else {
            command.arg("--").arg(&env.probe);
        }
        command.args(["sleep-marker", marker]);
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a sandbox")?;
        children.push(child);
    }
    let uids: anyhow::Result<Vec<u32>> = markers.iter().map(|marker| host_uid_of(marker)).collect();
    for child in &mut children {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    for mut child in children {
        let _ = child.wait();
    }
    let uids = uids?;
    const BASE: u32 = airlock_policy::SANDBOX_ID_BASE;
    if let Some(unranged) = uids.iter().find(|uid| **uid < BASE) {
        return Ok(Outcome::Ok(format!(
            "unprivileged-range-missing {unranged}"
        )));
    }
    Ok(Outcome::Ok(if uids[0] == uids[1] {
        format!("shared {}", uids[0])
    } else {
        "distinct".to_owned()
    }))
}

/// The host uid of the probe process whose command line holds `marker`, once it runs.
fn host_uid_of(marker: &str) -> anyhow::Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let program = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            if !program.ends_with(b"airlock-probe")
                || !String::from_utf8_lossy(&cmdline).contains(marker)
            {
                continue;
            }
            let status = std::fs::read_to_string(entry.path().join("status"))?;
            if let Some(uid) = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next())
                .and_then(|uid| uid.parse().ok())
            {
                return Ok(uid);
            }
        }
        if Instant::now() > deadline {
            bail!("the sandbox of {marker} never started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
