//! `airlock bench load`: concurrent clients each create a sandbox through the API, run one
//! command in it and delete it, until `--sandboxes` have been through; then what the daemon
//! left is counted: processes, cgroups, mounts, directories and store rows, each of which
//! must be zero. Figures are printed, never asserted; the exit code says whether anything
//! failed or leaked.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use airlock_api::v1::{CreateSandboxRequest, ExecRequest};
use airlock_server::client::Client;
use anyhow::Context;

use crate::api::BenchDaemon;
use crate::percentile;

/// What one client saw.
#[derive(Debug, Default)]
struct Outcome {
    creates: Vec<Duration>,
    ids: Vec<String>,
    errors: BTreeMap<String, usize>,
}

impl Outcome {
    fn error(&mut self, step: &str, err: &airlock_server::client::ClientError) {
        let kind = err
            .code()
            .map_or_else(|| "transport".to_owned(), |code| code.as_str().to_owned());
        *self.errors.entry(format!("{step}: {kind}")).or_default() += 1;
    }
}

async fn client_loop(client: Client, next: Arc<AtomicUsize>, total: usize) -> Outcome {
    let mut outcome = Outcome::default();
    let request = CreateSandboxRequest::default();
    let command = ExecRequest {
        argv: Some(vec!["/bin/true".into()]),
        ..ExecRequest::default()
    };
    while next.fetch_add(1, Ordering::SeqCst) < total {
        let start = Instant::now();
        let id = match client.create(&request).await {
            Ok(created) => created.sandbox.id,
            Err(err) => {
                outcome.error("create", &err);
                continue;
            }
        };
        outcome.creates.push(start.elapsed());
        match client.exec_collect(&id, &command).await {
            Ok(output) if output.exit_code == 0 => {}
            Ok(_) => {
                *outcome
                    .errors
                    .entry("exec: non-zero exit".into())
                    .or_default() += 1
            }
            Err(err) => outcome.error("exec", &err),
        }
        if let Err(err) = client.delete(&id).await {
            outcome.error("delete", &err);
        }
        outcome.ids.push(id);
    }
    outcome
}

/// What is left of the sandboxes in `ids` and of the daemon's state after the run.
#[derive(Debug, Default)]
struct Leftovers {
    processes: usize,
    cgroups: usize,
    mounts: usize,
    directories: usize,
    rows: usize,
}

impl Leftovers {
    fn total(&self) -> usize {
        self.processes + self.cgroups + self.mounts + self.directories + self.rows
    }
}

/// Children of the daemon other than its helper zygote: sandbox helpers come back to the
/// daemon as children (`CLONE_PARENT`), so any left is a sandbox still running.
fn daemon_children(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
                return false;
            };
            let parent = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            parent == Some(pid) && !cmdline.ends_with(b"--zygote\0")
        })
        .count()
}

/// Cgroup directories whose name ends with one of the ids.
fn cgroups_of(ids: &std::collections::HashSet<&str>) -> usize {
    let mut found = 0;
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return 0;
    };
    let mut dirs: Vec<(std::path::PathBuf, usize)> =
        hierarchies.flatten().map(|e| (e.path(), 0)).collect();
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("airlock-sbx-")
                && name.rsplit('-').next().is_some_and(|id| ids.contains(id))
            {
                found += 1;
            } else if depth < 3 {
                dirs.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

fn leftovers(pid: u32, state_dir: &Path, ids: &[String]) -> anyhow::Result<Leftovers> {
    let ids: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    let sandboxes = state_dir.join(airlock_server::config::SANDBOXES_DIR);
    let directories = std::fs::read_dir(&sandboxes)
        .with_context(|| format!("reading {}", sandboxes.display()))?
        .count();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mounts = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(&sandboxes))
        .count()
        + mountinfo
            .lines()
            .filter(|line| ids.iter().any(|id| line.contains(id)))
            .count();
    let store =
        airlock_server::store::Store::open(&state_dir.join(airlock_server::config::STORE_FILE))?;
    Ok(Leftovers {
        processes: daemon_children(pid),
        cgroups: cgroups_of(&ids),
        mounts,
        directories,
        rows: store.list_sandboxes()?.len(),
    })
}

/// `bench load`.
/// The daemon's counts of network namespaces the host made (`airlock_network_namespaces_total`
/// in `/metrics`): from the zygote's pool, and by helpers. `None` when the scrape fails.
async fn host_networks(client: &Client) -> Option<(u64, u64)> {
    let (_, _, body) = client
        .raw(hyper::Method::GET, "/metrics", &[], "")
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&body);
    let count = |source: &str| {
        let series = format!("airlock_network_namespaces_total{{source=\"{source}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series)?.trim().parse::<u64>().ok())
    };
    Some((count("pool")?, count("helper")?))
}

pub fn load(sandboxes: usize, clients: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(sandboxes >= 1, "--sandboxes must be at least 1");
    anyhow::ensure!(clients >= 1, "--clients must be at least 1");
    let clients = clients.min(sandboxes);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut daemon = BenchDaemon::start(None, clients + 8)?;
        daemon.wait_ready().await?;
        let pid = daemon.pid().context("the benchmark's daemon has no pid")?;
        let state_dir = daemon
            .state_dir()
            .context("the benchmark's daemon has no state directory")?
            .to_owned();
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..clients {
            tasks.spawn(client_loop(daemon.client.clone(), next.clone(), sandboxes));
        }
        let mut all = Outcome::default();
        while let Some(done) = tasks.join_next().await {
            let outcome = done?;
            all.creates.extend(outcome.creates);
            all.ids.extend(outcome.ids);
            for (kind, n) in outcome.errors {
                *all.errors.entry(kind).or_default() += n;
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        all.creates.sort();
        // Deletes answer once the sandbox is killed; a list waits for their teardowns. Then a
        // moment for reaped helpers to leave /proc.
        daemon
            .client
            .list(&[], &Default::default())
            .await
            .context("listing after the run")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let left = leftovers(pid, &state_dir, &all.ids)?;
        let networks = host_networks(&daemon.client).await;
        let errors: usize = all.errors.values().sum();
        println!(
            "{sandboxes} sandboxes by {clients} concurrent clients (create, exec /bin/true, delete), one private daemon"
        );
        println!(
            "{} creates in {elapsed:.2} s: {:.0} creates per second (whole cycles per second, each with its exec and delete)",
            all.creates.len(),
            all.creates.len() as f64 / elapsed
        );
        println!(
            "create -> ready under load: p50 {:.3} ms, p95 {:.3} ms, p99 {:.3} ms",
            percentile(&all.creates, 50),
            percentile(&all.creates, 95),
            percentile(&all.creates, 99)
        );
        if errors == 0 {
            println!("errors: none");
        } else {
            for (kind, n) in &all.errors {
                println!("errors: {n} x {kind}");
            }
        }
        if let Some((pooled, made)) = networks {
            println!(
                "network namespaces made by the host: {pooled} from the zygote's pool, {made} by helpers that found it empty"
            );
        }
        println!(
            "left after the run: {} processes, {} cgroups, {} mounts, {} directories, {} store rows",
            left.processes, left.cgroups, left.mounts, left.directories, left.rows
        );
        let rate = all.creates.len() as f64 / elapsed;
        let verdict = if rate >= 200.0 && errors == 0 && left.total() == 0 {
            "meets"
        } else {
            "misses"
        };
        println!("{verdict} the target of 200 creates per second with zero errors and zero leaks");
        Ok(if errors == 0 && left.total() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
}
