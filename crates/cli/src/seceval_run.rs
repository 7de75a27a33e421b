//! `airlock __seceval-run`: `airlock run` with layers taken away, for the proof runs of
//! `airlock seceval` (crates/seceval) only. It stays in the binary because the evaluation
//! starts it as a separate process, like a user's `airlock run`.

use std::process::ExitCode;

use airlock_runtime::{Ablation, EgressOptions, Runtime, Signals};
use anyhow::Context;
use clap::{Args, ValueEnum};

/// `airlock __seceval-run`: `airlock run` with layers taken away, for the proof runs of
/// `airlock seceval` only. Hidden; the daemon has no way to reach it.
#[derive(Debug, Args)]
pub struct EvalRunArgs {
    /// A layer to take away (`seccomp-tag` marks the filter's answers instead).
    #[arg(long = "ablate", value_enum)]
    ablate: Vec<AblateArg>,
    /// The egress proxy resolves NAME to a test upstream at IP:PORT (`NAME=IP:PORT`).
    #[arg(long = "egress-upstream", value_name = "NAME=IP:PORT")]
    egress_upstream: Vec<String>,
    /// The egress proxy resolves NAME as if DNS answered IP (`NAME=IP`), vetted like DNS.
    #[arg(long = "egress-dns", value_name = "NAME=IP")]
    egress_dns: Vec<String>,
    #[command(flatten)]
    run: crate::run::RunArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AblateArg {
    Landlock,
    Seccomp,
    SeccompTag,
    Masks,
    Cgroup,
}

impl AblateArg {
    fn ablation(self) -> Ablation {
        match self {
            AblateArg::Landlock => Ablation::Landlock,
            AblateArg::Seccomp => Ablation::Seccomp,
            AblateArg::SeccompTag => Ablation::SeccompTag,
            AblateArg::Masks => Ablation::Masks,
            AblateArg::Cgroup => Ablation::Cgroup,
        }
    }
}

/// The egress proxy's resolver for an evaluation run: only the names the suite lists, so that
/// no lookup reaches real DNS (a name it does not list fails).
fn evaluation_egress(args: &EvalRunArgs) -> anyhow::Result<EgressOptions> {
    let resolver = airlock_egress::TestResolver::new();
    for entry in &args.egress_upstream {
        let (name, address) = entry
            .split_once('=')
            .with_context(|| format!("--egress-upstream `{entry}` is not NAME=IP:PORT"))?;
        let address = address
            .parse()
            .with_context(|| format!("--egress-upstream `{entry}`: `{address}` is not IP:PORT"))?;
        resolver.upstream(name, address);
    }
    for entry in &args.egress_dns {
        let (name, ip) = entry
            .split_once('=')
            .with_context(|| format!("--egress-dns `{entry}` is not NAME=IP"))?;
        let ip = ip
            .parse()
            .with_context(|| format!("--egress-dns `{entry}`: `{ip}` is not an IP address"))?;
        resolver.dns(name, vec![ip]);
    }
    Ok(EgressOptions {
        test_resolver: Some(std::sync::Arc::new(resolver)),
        ..EgressOptions::default()
    })
}

/// Runs one sandbox with the requested layers taken away; exits like `airlock run`.
pub fn eval_run(args: EvalRunArgs) -> anyhow::Result<ExitCode> {
    let ablations: Vec<Ablation> = args.ablate.iter().map(|a| a.ablation()).collect();
    let egress = evaluation_egress(&args)?;
    let config = crate::run::config(args.run)?;
    let signals = Signals::install()?;
    let runtime = Runtime::new()?;
    let outcome = runtime.run_for_evaluation(&config, &ablations, egress, Some(&signals), |w| {
        eprintln!("airlock: warning: {w}")
    })?;
    if let airlock_runtime::Ending::SetupFailed { message, .. } = &outcome.ending {
        eprintln!("airlock: {message}");
    }
    if outcome.oom_killed {
        eprintln!("airlock: the command was killed by the sandbox's memory limit");
    }
    Ok(ExitCode::from(
        u8::try_from(outcome.exit_code()).unwrap_or(u8::MAX),
    ))
}
