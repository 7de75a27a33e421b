//! `airlock seceval`: the security evaluation, the `airlock` binary's `seceval` command. Runs the attack catalog (`catalog.json`) from
//! inside sandboxes with `airlock-probe`, proves which layer stops each attack, and prints a
//! scorecard, optionally beside the same attacks under bwrap. docs/seceval.md explains the
//! method; `--markdown` regenerates it from the catalog.
//!
//! Module map: `catalog` (the data and the outcome vocabulary), `fixtures` (host objects the
//! attacks aim at), `fakenet` (the fake internet in network namespaces), `daemon` (the
//! control-plane cases), `judge0` (the daemon's Judge0 API's cases), `runner` (one case, its
//! proofs, control and baseline), `microvm` (the microvm tier's column, with `guest`, its
//! client of the guest's agent), `report` (scorecard, JSON, markdown).

mod catalog;
mod daemon;
mod desktop;
mod fakenet;
mod fixtures;
mod guest;
mod judge0;
mod microvm;
mod report;
mod runner;
mod scenarios;
mod wasm;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_runtime::Runtime;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use catalog::{Catalog, Need};
use report::{CaseResult, TierResults};
use runner::{Env, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TierChoice {
    Process,
    Container,
    Microvm,
    /// Guest snippets in the wasm worker (`wasm.rs`); `all` includes it.
    Wasm,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BaselineChoice {
    Bwrap,
}

#[derive(Debug, Args)]
pub struct SecevalArgs {
    /// The tier to evaluate; `all` reports tiers this build lacks as n/a.
    #[arg(long, value_enum, default_value = "process")]
    tier: TierChoice,
    /// A policy file applied to every case that brings no policy of its own.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Also write the results as JSON to OUT.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// Run the same catalog under a peer sandbox and print both columns.
    #[arg(long, value_enum)]
    baseline: Option<BaselineChoice>,
    /// Print docs/seceval.md, generated from the catalog, and exit.
    #[arg(long)]
    markdown: bool,
    /// Only cases whose id starts with PREFIX (repeatable).
    #[arg(long = "only", value_name = "PREFIX")]
    only: Vec<String>,
    /// Create the daemon's sandboxes (where the control-plane cases run) from this template;
    /// `desktop` also brings up their displays and browsers first, and adds a column: the
    /// chosen filesystem, process and network cases from inside one, and the desktop's cases.
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// The airlock-probe binary (default: beside this one, or $AIRLOCK_PROBE_BIN).
    #[arg(long, value_name = "PATH")]
    probe: Option<PathBuf>,
}

/// Runs the evaluation `args` asks for and prints its scorecard; fails on any case allowed or
/// stopped by the wrong layer.
pub fn seceval(args: SecevalArgs) -> anyhow::Result<ExitCode> {
    let catalog = Catalog::shipped()?;
    if args.markdown {
        print!("{}", report::markdown(&catalog));
        return Ok(ExitCode::SUCCESS);
    }
    let cases: Vec<&catalog::Case> = catalog
        .cases
        .iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|p| c.id.starts_with(p.as_str())))
        .collect();
    if cases.is_empty() {
        bail!("no case id starts with {:?}", args.only);
    }
    if args.tier == TierChoice::Wasm {
        return Ok(if wasm::run(cases.len())? {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let tiers: Vec<airlock_api::Tier> = match args.tier {
        TierChoice::Wasm => Vec::new(),
        TierChoice::Process => vec![airlock_api::Tier::Process],
        TierChoice::Container => vec![airlock_api::Tier::Container],
        TierChoice::Microvm => vec![airlock_api::Tier::Microvm],
        TierChoice::All => vec![
            airlock_api::Tier::Process,
            airlock_api::Tier::Container,
            airlock_api::Tier::Microvm,
        ],
    };
    let runtime = Runtime::new()?;
    let mut all = Vec::new();
    for tier in tiers {
        let unavailable = runtime
            .backends()
            .into_iter()
            .find(|b| b.tier == tier)
            .and_then(|b| b.unavailable);
        let tier_cases: Vec<catalog::Case> = cases.iter().map(|c| c.on_tier(tier)).collect();
        let tier_cases: Vec<&catalog::Case> = tier_cases.iter().collect();
        let (results, desktop) = match unavailable {
            Some(reason) => (report::all_not_applicable(&tier_cases, &reason), None),
            None if tier == airlock_api::Tier::Microvm => (
                microvm::column(&cases, &find_probe(args.probe.as_deref())?)?,
                None,
            ),
            None => run_tier(&catalog, &tier_cases, &args, tier)?,
        };
        all.push(TierResults {
            tier: tier.as_str().to_owned(),
            cases: results,
        });
        all.extend(desktop);
    }
    let mut stdout = std::io::stdout().lock();
    report::scorecard(&mut stdout, &catalog, &all, args.baseline.is_some())?;
    stdout.flush()?;
    if let Some(path) = &args.json {
        let json = serde_json::to_vec_pretty(&report::json(&all))?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut failed = all.iter().flat_map(|t| &t.cases).any(|c| c.airlock.fails());
    if args.tier == TierChoice::All {
        failed |= !wasm::run(cases.len())?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn find_probe(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(std::path::absolute(path)?);
    }
    if let Some(path) = std::env::var_os("AIRLOCK_PROBE_BIN") {
        return Ok(std::path::absolute(PathBuf::from(path))?);
    }
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .context("the airlock binary has no directory")?;
    for candidate in [dir.join("airlock-probe"), dir.join("../airlock-probe")] {
        if candidate.is_file() {
            return Ok(candidate.canonicalize()?);
        }
    }
    bail!(
        "cannot find airlock-probe beside {} (build it with `cargo build -p airlock-probe`, or pass --probe)",
        exe.display()
    )
}

/// The tier's results, and with `--template desktop` on the process tier, the desktop column.
fn run_tier(
    catalog: &Catalog,
    cases: &[&catalog::Case],
    args: &SecevalArgs,
    tier: airlock_api::Tier,
) -> anyhow::Result<(Vec<CaseResult>, Option<TierResults>)> {
    // The effective uid, from /proc (the CLI makes no syscalls itself): the suite needs root
    // for cgroups, network namespaces and its fixtures under /home and /run.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0");
    if !root {
        bail!(
            "airlock seceval needs root (cgroups, network namespaces, fixtures under /home and /run)"
        );
    }
    if args.baseline.is_some() && !Path::new("/usr/bin/bwrap").exists() && which("bwrap").is_none()
    {
        bail!("--baseline bwrap: bwrap is not installed (apt-get install bubblewrap)");
    }
    let probe = find_probe(args.probe.as_deref())?;
    let airlock = std::env::current_exe()?;
    let desktop = args.template.as_deref() == Some(airlock_server::lifecycle::DESKTOP_TEMPLATE)
        && tier == airlock_api::Tier::Process;
    let mut needs: BTreeSet<Need> = cases.iter().flat_map(|c| c.needs.iter().copied()).collect();
    if desktop {
        needs.insert(Need::Daemon);
    }
    let mut env = Env {
        fixtures: fixtures::Fixtures::new(&probe)?,
        airlock,
        probe,
        fakenet: None,
        daemon: None,
        policies: BTreeMap::new(),
        user_policy: args
            .policy
            .as_deref()
            .map(std::path::absolute)
            .transpose()?,
        unavailable: BTreeMap::new(),
        tier,
    };
    if tier == airlock_api::Tier::Container {
        env.fixtures
            .build_image(&env.probe)
            .context("building the container tier's test image")?;
    }
    let policy_dir = env.fixtures.scratch.join("policies");
    std::fs::create_dir_all(&policy_dir)?;
    for (name, text) in &catalog.policies {
        let path = policy_dir.join(format!("{name}.yaml"));
        std::fs::write(&path, text)?;
        env.policies.insert(name.clone(), path);
    }
    for need in needs {
        let result = match need {
            Need::Home => env.fixtures.plant_home(),
            Need::Sinks => env.fixtures.start_sinks(),
            Need::Upstream => env.fixtures.start_upstream(),
            Need::Lan => env.fixtures.start_lan_sink(),
            Need::Setuid => env.fixtures.plant_setuid(&env.probe),
            Need::Fakenet => fakenet::FakeNet::start(&env.probe, &env.fixtures.scratch)
                .map(|f| env.fakenet = Some(f)),
            Need::Daemon => daemon::Daemon::start(
                &env.airlock,
                env.fixtures.image_layer_dir(),
                args.template.as_deref(),
            )
            .map(|d| env.daemon = Some(d)),
        };
        if let Err(err) = result {
            let reason = format!("setup failed: {}", crate::one_line(&err));
            eprintln!("airlock seceval: {reason}");
            env.unavailable.insert(need, reason);
        }
    }
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress_tier = tier.as_str();
    let mut results = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        if progress {
            eprint!(
                "\rairlock seceval: {progress_tier} {}/{} {:<60}",
                index + 1,
                cases.len(),
                case.id
            );
        }
        let (airlock, notes) = match runner::evaluate(&env, case) {
            Ok(result) => result,
            Err(err) => (
                Verdict::WrongLayer {
                    detail: format!("could not run: {}", crate::one_line(&err)),
                },
                Vec::new(),
            ),
        };
        // The baseline is the process tier's comparison; it would only repeat itself here.
        let baseline = args.baseline.filter(|_| tier == airlock_api::Tier::Process);
        let bwrap = baseline.map(|_| {
            runner::baseline(&env, case).unwrap_or_else(|err| Verdict::NotApplicable {
                reason: format!("could not run: {}", crate::one_line(&err)),
            })
        });
        results.push(CaseResult::new(case, airlock, bwrap, notes));
    }
    if progress {
        eprint!("\r{:<80}\r", "");
    }
    let column = if desktop {
        Some(desktop::column(&env, cases).unwrap_or_else(|err| {
            let reason = format!("setup failed: {}", crate::one_line(&err));
            TierResults {
                tier: desktop::COLUMN.to_owned(),
                cases: results
                    .iter()
                    .map(|r| CaseResult {
                        airlock: runner::Verdict::WrongLayer {
                            detail: reason.clone(),
                        },
                        bwrap: None,
                        ..r.clone()
                    })
                    .collect(),
            }
        }))
    } else {
        None
    };
    Ok((results, column))
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// `err: cause: cause`, on one line.
fn one_line(err: &anyhow::Error) -> String {
    err.chain()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
