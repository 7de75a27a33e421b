//! `airlock bench`: Airlock's benchmarks, each measured beside a baseline taken in the same run
//! and printed as figures and ratios, never asserted. The `airlock` binary's `bench` command is
//! this crate's [`bench`]; the benchmarks are its product, the CLI only parses and dispatches.
//!
//! This file holds `bench start` (the full create → run `/bin/true` → teardown cycle, against
//! bwrap, a bare spawn of `/bin/true` and the start-up floor); each other benchmark is a module.

mod api;
mod container;
mod desktop;
mod e2b;
mod e2b_null;
mod egress;
mod git;
mod image;
mod interpreter;
mod judge0;
mod load;
mod pause;
mod soak;
mod vm;
mod vm_linux;
mod vm_process;
mod wasm;

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_api::SandboxConfig;
use airlock_runtime::{Phase, Runtime};
use anyhow::Context;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Sandbox start-up: create, run /bin/true, tear down.
    Start {
        /// Measured iterations per contender (after 5 warm-up runs each).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Also time each phase of Airlock's cycle and print the median of each step.
        #[arg(long)]
        phases: bool,
        /// `container`: the container tier beside the process tier, `crun run` of a bundle
        /// over the same rootfs and `podman run --rm` of the same image. `wasm`: JavaScript
        /// and Python isolates of the wasm worker beside the process tier's cycle.
        #[arg(long, value_enum, default_value = "process")]
        tier: BenchTier,
        /// The container tier's image (as `airlock run --image` takes it; default: a busybox
        /// rootfs made for the run).
        #[arg(long, value_name = "REF", requires = "tier")]
        image: Option<String>,
    },
    /// The daemon's API: create->ready, exec round-trip, delete, file throughput.
    Api {
        /// A running daemon to measure (default: start a private one).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Measured iterations per operation (after 5 warm-up runs).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Size of the file put and got, in MiB.
        #[arg(long, default_value_t = 100)]
        file_mib: u64,
        /// Also creates claimed from a warm pool of `base` of SIZE members (default 4), beside
        /// the cold ones; the pool is refilled before each timed create.
        #[arg(long, value_name = "SIZE", num_args = 0..=1, default_missing_value = "4")]
        pool: Option<u32>,
    },
    /// The E2B Python SDK's cycle: Sandbox.create() + commands.run("true") + kill().
    E2b {
        /// A running daemon to measure (default: start a private one); needs E2B_API_KEY.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Measured cycles (after 5 warm-up cycles).
        #[arg(long, default_value_t = 100)]
        iterations: usize,
        /// The Python that has the e2b SDK [default: target/e2b-venv-latest/bin/python].
        #[arg(long, value_name = "PATH")]
        python: Option<std::path::PathBuf>,
        /// Serve the creates from a warm pool of `base` of SIZE members (default 4).
        #[arg(long, value_name = "SIZE", num_args = 0..=1, default_missing_value = "4")]
        pool: Option<u32>,
        /// Skip the SDK's floor (the same cycles against a null server, after Airlock's).
        #[arg(long)]
        no_floor: bool,
    },
    /// The daemon under load: concurrent clients create a sandbox, run one command in it and
    /// delete it, then what was left is counted (a private daemon).
    Load {
        /// Sandboxes to create in all.
        #[arg(long, default_value_t = 1000)]
        sandboxes: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 50)]
        clients: usize,
    },
    /// The Judge0 API (`--judge0-listen`): p50/p95 of one `wait=true` submission, and
    /// submissions per second for a batch of small Python programs, beside python3 on the host.
    Judge0 {
        /// A running Judge0 API to measure (default: start a private daemon); an API key, when
        /// it needs one, in AIRLOCK_API_KEY.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Measured `wait=true` submissions (after 2 warm-ups).
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Submissions in the throughput batch (sent as Judge0 batches of 20).
        #[arg(long, default_value_t = 200)]
        submissions: usize,
        /// The private daemon's --judge0-workers.
        #[arg(long, default_value_t = 2)]
        workers: usize,
    },
    /// Host memory per idle sandbox.
    Density {
        /// A running daemon to measure (default: start a private one).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// How many idle sandboxes to start.
        #[arg(long, default_value_t = 500)]
        count: usize,
    },
    /// The daemon over long create/delete soaks: its RSS and the store's size after each
    /// cycle (a private daemon).
    Soak {
        /// Cycles to run.
        #[arg(long, default_value_t = 20)]
        cycles: usize,
        /// Sandboxes created, then deleted, per cycle.
        #[arg(long, default_value_t = 300)]
        sandboxes: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 20)]
        clients: usize,
    },
    /// Pause and resume (idle, and 256 MiB resident), snapshots of 100 MB in 5,000 files, and
    /// creates from them beside plain creates (a private daemon).
    Pause {
        /// Pause/resume cycles per sandbox.
        #[arg(long, default_value_t = 50)]
        iterations: usize,
        /// Snapshots taken, each followed by a create from it and a plain create.
        #[arg(long, default_value_t = 10)]
        snapshots: usize,
    },
    /// The code-interpreter template: create + first run_code("1+1"), and run_code round
    /// trips through the data plane (a private daemon unless --url).
    Interpreter {
        /// A running daemon to measure (default: start a private one).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Creates measured, each with its first run_code (a kernel start each).
        #[arg(long, default_value_t = 5)]
        creates: usize,
        /// run_code round trips on one warm context (after 5 warm-up ones).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// The desktop template through the computer API: create + first screenshot (cold and
    /// from a pool), screenshot and click round trips, beside the host's own tools (a private
    /// daemon unless --url).
    Desktop {
        /// A running daemon to measure (default: start a private one).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Creates measured each way (no pool, and from a pool of one).
        #[arg(long, default_value_t = 5)]
        creates: usize,
        /// Screenshots and clicks on one desktop (after 5 warm-up ones each).
        #[arg(long, default_value_t = 50)]
        iterations: usize,
    },
    /// Image pull and unpack from a local registry, against skopeo copy to an OCI directory.
    Image(crate::image::ImageBenchArgs),
    /// Create-with-repository, cold and from the cache, beside `git clone` on the host of the
    /// same repository (made for the run and served on loopback).
    Git {
        /// The repository's size: this many MiB of random files.
        #[arg(long, default_value_t = 50)]
        size_mib: u64,
        /// Interleaved rounds (after one warm-up round).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// The microVM tier's VMM with a freestanding guest: fork-ready time from a snapshot with
    /// and without pre-created VM shells, and host memory per idle fork; on hardware KVM, the
    /// operator's Linux guest from create and from restore to its agent ready.
    Vm {
        /// Timed forks per contender (after 20 warm-up ones).
        #[arg(long, default_value_t = 1000)]
        iterations: usize,
        /// Live idle forks for the memory figure.
        #[arg(long, default_value_t = 200)]
        forks: usize,
        /// Guest RAM in MiB.
        #[arg(long, default_value_t = 64)]
        memory_mib: u64,
        /// Runs of the Linux guest lines (hardware KVM and the operator's guest only; 0: none).
        #[arg(long, default_value_t = 10)]
        linux_runs: usize,
        /// The Linux guest lines alone (the freestanding guest's are skipped).
        #[arg(long)]
        only_linux: bool,
    },
    /// The egress proxy: added latency of small GETs and CONNECT pass-through throughput, each
    /// against direct access on loopback.
    Egress {
        /// Small GETs per contender (after 100 warm-up requests).
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        /// Size of the bulk download, in MiB.
        #[arg(long, default_value_t = 1024)]
        download_mib: u64,
    },
}

const BWRAP_ARGS: &[&str] = &[
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "true",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchTier {
    Process,
    Container,
    /// The wasm worker's JavaScript and Python isolates beside the process tier.
    Wasm,
}

/// How `--image REF` becomes an image (the CLI's `airlock run --image` rules: the local store,
/// an OCI layout, a rootfs directory or an image description).
pub type ImageResolver<'a> = &'a dyn Fn(&str) -> anyhow::Result<airlock_api::ImageRootfs>;

/// Runs one benchmark and prints its figures.
pub fn bench(command: BenchCommand, resolve_image: ImageResolver<'_>) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Start {
            iterations,
            phases,
            tier: BenchTier::Process,
            image: None,
        } => start(iterations, phases),
        BenchCommand::Start {
            tier: BenchTier::Process,
            ..
        } => anyhow::bail!("--image needs --tier container"),
        BenchCommand::Start {
            iterations,
            image,
            tier: BenchTier::Container,
            ..
        } => crate::container::start(iterations, image, resolve_image),
        BenchCommand::Start {
            iterations,
            tier: BenchTier::Wasm,
            image: None,
            ..
        } => crate::wasm::start(iterations),
        BenchCommand::Start {
            tier: BenchTier::Wasm,
            ..
        } => anyhow::bail!("--image needs --tier container"),
        BenchCommand::Api {
            url,
            iterations,
            file_mib,
            pool,
        } => crate::api::api(url, iterations, file_mib, pool),
        BenchCommand::Load { sandboxes, clients } => crate::load::load(sandboxes, clients),
        BenchCommand::Density { url, count } => crate::api::density(url, count),
        BenchCommand::Soak {
            cycles,
            sandboxes,
            clients,
        } => crate::soak::soak(cycles, sandboxes, clients),
        BenchCommand::E2b {
            url,
            iterations,
            python,
            pool,
            no_floor,
        } => crate::e2b::e2b(url, iterations, python, pool, !no_floor),
        BenchCommand::Judge0 {
            url,
            iterations,
            submissions,
            workers,
        } => crate::judge0::judge0(url, iterations, submissions, workers),
        BenchCommand::Egress {
            requests,
            download_mib,
        } => crate::egress::egress(requests, download_mib),
        BenchCommand::Pause {
            iterations,
            snapshots,
        } => crate::pause::pause(iterations, snapshots),
        BenchCommand::Vm {
            iterations,
            forks,
            memory_mib,
            linux_runs,
            only_linux,
        } => crate::vm::vm(&crate::vm::VmArgs {
            iterations,
            forks,
            memory_mib,
            linux_runs,
            only_linux,
        }),
        BenchCommand::Image(args) => crate::image::image(args),
        BenchCommand::Interpreter {
            url,
            creates,
            iterations,
        } => crate::interpreter::interpreter(url, creates, iterations),
        BenchCommand::Desktop {
            url,
            creates,
            iterations,
        } => crate::desktop::desktop(url, creates, iterations),
        BenchCommand::Git { size_mib, rounds } => crate::git::git_bench(size_mib, rounds),
    }
}

fn start(iterations: usize, phases: bool) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 10, "--iterations must be at least 10");
    let mut runtime = Runtime::new()?;
    runtime.set_tracing(phases);
    let config = SandboxConfig::new(vec!["/bin/true".into()]);
    let mut steps: Vec<Vec<(Phase, Phase, u64)>> = Vec::new();
    let mut airlock = || -> anyhow::Result<()> {
        let outcome = runtime.run(&config, None, |_| {})?;
        anyhow::ensure!(
            outcome.exit_code() == 0,
            "airlock sandbox failed: {:?}",
            outcome.ending
        );
        steps.push(
            outcome
                .phases
                .windows(2)
                .map(|pair| (pair[0].0, pair[1].0, pair[1].1.saturating_sub(pair[0].1)))
                .collect(),
        );
        Ok(())
    };
    let bwrap_present = Command::new("bwrap")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let bwrap = || spawn_wait("bwrap", BWRAP_ARGS);
    let bare = || spawn_wait("/bin/true", &[]);
    let helper = runtime.helper().to_path_buf();
    let helper_exec = || exec_helper_without_spec(&helper);
    let mut floor = Floor::start();

    let mut samples: Vec<(&str, Vec<Duration>)> = vec![
        ("airlock process tier", Vec::new()),
        ("fork+exec+wait /bin/true", Vec::new()),
    ];
    if bwrap_present {
        samples.push(("bwrap --unshare-all", Vec::new()));
    }
    if floor.is_some() {
        samples.push((FLOOR, Vec::new()));
    }
    samples.push((HELPER_EXEC, Vec::new()));
    for round in 0..iterations + 5 {
        // Interleave the contenders so that machine noise hits them alike.
        for (name, times) in &mut samples {
            let start = Instant::now();
            match *name {
                "airlock process tier" => airlock()?,
                "bwrap --unshare-all" => bwrap()?,
                HELPER_EXEC => helper_exec()?,
                FLOOR => {
                    // The floor times its own cycle, without the pipe's round trip.
                    let took = floor.as_mut().map_or(Ok(Duration::ZERO), Floor::cycle)?;
                    if round >= 5 {
                        times.push(took);
                    }
                    continue;
                }
                _ => bare()?,
            }
            if round >= 5 {
                times.push(start.elapsed());
            }
        }
    }
    println!("{iterations} iterations each, interleaved, after 5 warm-up runs");
    println!(
        "{:<28} {:>9} {:>9} {:>9}",
        "contender", "p50 ms", "p95 ms", "p99 ms"
    );
    let mut p50s = Vec::new();
    for (name, times) in &mut samples {
        times.sort();
        let (p50, p95, p99) = (
            percentile(times, 50),
            percentile(times, 95),
            percentile(times, 99),
        );
        println!("{name:<28} {p50:>9.3} {p95:>9.3} {p99:>9.3}");
        p50s.push((*name, p50));
    }
    let p50 = |wanted: &str| p50s.iter().find(|(n, _)| *n == wanted).map(|(_, v)| *v);
    if let (Some(ours), Some(bare)) = (p50("airlock process tier"), p50("fork+exec+wait /bin/true"))
    {
        println!("ratio airlock / fork+exec (p50): {:.2}x", ours / bare);
    }
    match (p50("airlock process tier"), p50("bwrap --unshare-all")) {
        (Some(ours), Some(bwrap)) => {
            println!("ratio airlock / bwrap (p50): {:.2}x", ours / bwrap);
        }
        _ => println!("bwrap is not installed: no bwrap column (apt-get install bubblewrap)"),
    }
    match (p50("airlock process tier"), p50(FLOOR)) {
        (Some(ours), Some(floor)) => {
            let ratio = ours / floor;
            let verdict = if ratio <= 1.1 { "meets" } else { "misses" };
            println!(
                "ratio airlock / the start-up floor (p50): {ratio:.2}x ({verdict} the 1.1x target)"
            );
        }
        _ => println!(
            "no start-up floor column: build it with `cc -O2 -o target/startup-floor scripts/startup-floor.c -lpthread`"
        ),
    }
    // `airlock run` execs its helper, which the floor (a fork) does not, and the issue keeps that
    // exec; its price moves with the host and the C library (glibc's start-up `cpuid`s trap to
    // the hypervisor here), so it is shown apart.
    if let (Some(ours), Some(floor), Some(exec)) =
        (p50("airlock process tier"), p50(FLOOR), p50(HELPER_EXEC))
    {
        println!(
            "ratio airlock / (the start-up floor + one exec of the helper) (p50): {:.2}x (for reading the ratio above; the target is against the floor)",
            ours / (floor + exec)
        );
    }
    if phases {
        print_phases(&steps[steps.len().saturating_sub(iterations)..]);
    }
    Ok(ExitCode::SUCCESS)
}

const FLOOR: &str = "start-up floor (minimal C)";
/// `airlock-jail` exec'd with no spec, which fails at once: what the one exec `airlock run` adds
/// to the floor costs, with the helper as built.
const HELPER_EXEC: &str = "helper exec (no spec)";
/// Where `scripts/test.sh` builds `scripts/startup-floor.c`.
const FLOOR_BINARY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/startup-floor");

/// `startup-floor --serve`: one cycle of the minimal sandbox per request, timed by itself.
struct Floor {
    child: std::process::Child,
    answers: std::io::BufReader<std::process::ChildStdout>,
}

impl Floor {
    fn start() -> Option<Floor> {
        let mut child = Command::new(FLOOR_BINARY)
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let answers = std::io::BufReader::new(child.stdout.take()?);
        Some(Floor { child, answers })
    }

    fn cycle(&mut self) -> anyhow::Result<Duration> {
        use std::io::{BufRead, Write};
        let stdin = self
            .child
            .stdin
            .as_mut()
            .context("the floor's stdin is closed")?;
        stdin.write_all(b"x")?;
        stdin.flush()?;
        let mut line = String::new();
        self.answers.read_line(&mut line)?;
        let ns: u64 = line
            .trim()
            .parse()
            .with_context(|| format!("the floor answered {line:?}"))?;
        Ok(Duration::from_nanos(ns))
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The median time of each step of the cycle, in the order the steps happen.
fn print_phases(runs: &[Vec<(Phase, Phase, u64)>]) {
    let mut by_step: Vec<((Phase, Phase), Vec<u64>)> = Vec::new();
    for (from, to, ns) in runs.iter().flatten() {
        match by_step.iter_mut().find(|(step, _)| *step == (*from, *to)) {
            Some((_, times)) => times.push(*ns),
            None => by_step.push(((*from, *to), vec![*ns])),
        }
    }
    by_step.sort_by_key(|((_, to), _)| *to);
    println!(
        "phases of the airlock cycle (median of {} runs):",
        runs.len()
    );
    for ((from, to), mut times) in by_step {
        times.sort_unstable();
        let median = times.get(times.len() / 2).copied().unwrap_or(0);
        let step = format!("{} -> {}", from.name(), to.name());
        println!("  {step:<42} {:>7.3} ms", median as f64 / 1e6);
    }
}

/// Execs the helper with no spec (no descriptor 3): it reports the failure and exits at once.
fn exec_helper_without_spec(helper: &std::path::Path) -> anyhow::Result<()> {
    let status = Command::new(helper)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("cannot exec {}", helper.display()))?;
    anyhow::ensure!(
        status.code().is_some_and(|code| code != 0),
        "{} without a spec should fail and exit: {status}",
        helper.display()
    );
    Ok(())
}

pub fn spawn_wait(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "{program} failed: {status}");
    Ok(())
}

pub fn percentile(sorted: &[Duration], pct: usize) -> f64 {
    let index = (sorted.len() * pct)
        .div_ceil(100)
        .saturating_sub(1)
        .min(sorted.len().saturating_sub(1));
    sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
