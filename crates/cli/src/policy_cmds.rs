//! `airlock policy check|explain|diff|schema|apply`: validate, explain and compare policy
//! documents, and replace a running sandbox's egress policy.
//!
//! Exit codes: 0 when the files are valid (`check`) or no change needs review and the policy
//! stays within the ceiling (`diff`), or the policy was applied (`apply`); 1 when a file is
//! invalid or a change needs review or leaves the ceiling (`apply`: the daemon refused it as a
//! conflict: it needs review, or the sandbox has no proxy);
//! 125 when the command itself fails (a missing file, bad arguments, a refusal).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_api::SandboxConfig;
use airlock_policy::{HostFacts, Policy, PolicyError};
use clap::Subcommand;

use crate::run::TierArg;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate policy files; each problem is printed as FILE:LINE:COLUMN: what is wrong.
    Check {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Show which mechanism enforces each rule on a tier, and what is not enforced there.
    Explain {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The tier to explain for.
        #[arg(long, value_enum, default_value = "process")]
        tier: TierArg,
    },
    /// List every change from OLD to NEW that widens what a sandbox can do; exit 1 if one
    /// needs review. With --boundary, also check that NEW (or the only FILE) stays within the
    /// ceiling, printing a counterexample when it does not.
    Diff {
        #[arg(required = true, num_args = 1..=2, value_name = "OLD NEW")]
        files: Vec<PathBuf>,
        /// An operator's ceiling policy.
        #[arg(long, value_name = "CEILING")]
        boundary: Option<PathBuf>,
    },
    /// Print the JSON Schema of the policy document (api/policy.schema.json).
    Schema,
    /// Replace a running proxy-mode sandbox's network, credentials and approvals with FILE's
    /// (hot reload, atomic). A change that needs review is refused (exit 1, with the
    /// findings) unless --approve.
    Apply {
        #[command(flatten)]
        daemon: crate::sandbox_cmds::DaemonArgs,
        /// The sandbox.
        id: String,
        /// The policy file (YAML); its profiles are merged in here.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Apply even if the change has findings that need review.
        #[arg(long)]
        approve: bool,
    },
}

pub fn policy(which: PolicyCommand) -> anyhow::Result<ExitCode> {
    match which {
        PolicyCommand::Check { files } => check(&files),
        PolicyCommand::Explain { file, tier } => explain(&file, tier),
        PolicyCommand::Diff { files, boundary } => diff(&files, boundary.as_deref()),
        PolicyCommand::Apply {
            daemon,
            id,
            file,
            approve,
        } => apply(&daemon, &id, &file, approve),
        PolicyCommand::Schema => {
            let schema = airlock_api::policy::schema();
            println!("{}", serde_json::to_string_pretty(&schema)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Reads a policy file: `Err` if it cannot be read, `Ok(Err)` if it is not a valid policy.
fn read(path: &Path) -> anyhow::Result<Result<Policy, PolicyError>> {
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let name = path.display().to_string();
    let Ok(text) = String::from_utf8(bytes) else {
        anyhow::bail!("{name} is not UTF-8 text");
    };
    Ok(Policy::from_yaml(&name, &text))
}

/// Reads a policy that must be valid (for `run`, `explain` and `diff`).
pub fn load(path: &Path) -> anyhow::Result<Policy> {
    read(path)?.map_err(|err| anyhow::anyhow!("invalid policy: {err}"))
}

/// Like [`load`], but prints each problem on its own line and exits 125.
fn load_or_report(path: &Path) -> anyhow::Result<Result<Policy, ExitCode>> {
    match read(path)? {
        Ok(policy) => Ok(Ok(policy)),
        Err(err) => {
            for problem in err.problems() {
                eprintln!("{problem}");
            }
            Ok(Err(ExitCode::from(crate::AIRLOCK_ERROR)))
        }
    }
}

fn check(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut invalid = false;
    for path in files {
        match read(path)? {
            Ok(_) => println!("{}: ok", path.display()),
            Err(err) => {
                invalid = true;
                for problem in err.problems() {
                    println!("{problem}");
                }
            }
        }
    }
    Ok(if invalid {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn explain(path: &Path, tier: TierArg) -> anyhow::Result<ExitCode> {
    let policy = match load_or_report(path)? {
        Ok(policy) => policy,
        Err(code) => return Ok(code),
    };
    let mut config = SandboxConfig::new(vec!["(command)".into()]);
    policy.settings().apply(&mut config);
    // The masks shown are the ones every sandbox gets; the caller's ids do not change them.
    let facts = HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec![PathBuf::from("/var/lib/airlock")],
    };
    print!(
        "{}",
        airlock_policy::explain(&policy, tier.tier(), &config, &facts)
    );
    Ok(ExitCode::SUCCESS)
}

fn diff(files: &[PathBuf], boundary: Option<&Path>) -> anyhow::Result<ExitCode> {
    if files.len() == 1 && boundary.is_none() {
        anyhow::bail!("policy diff needs OLD and NEW, or --boundary CEILING and one FILE");
    }
    let mut policies = Vec::new();
    for path in files.iter().map(PathBuf::as_path).chain(boundary) {
        match load_or_report(path)? {
            Ok(policy) => policies.push(policy),
            Err(code) => return Ok(code),
        }
    }
    let ceiling = boundary.and_then(|_| policies.pop());
    let mut review = false;
    if let [old, new] = policies.as_slice() {
        let findings = airlock_policy::diff(old, new);
        if findings.is_empty() {
            println!("no change widens what the sandbox can do");
        }
        for finding in &findings {
            review |= finding.kind.needs_review();
            println!("{finding}");
        }
    }
    if let (Some(ceiling), Some(policy)) = (ceiling, policies.last()) {
        match airlock_policy::within(policy, &ceiling) {
            Ok(()) => println!(
                "{}: within the ceiling {}",
                policy.source(),
                ceiling.source()
            ),
            Err(counterexample) => {
                review = true;
                println!("{}: {counterexample}", policy.source());
            }
        }
    }
    Ok(if review {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn apply(
    daemon: &crate::sandbox_cmds::DaemonArgs,
    id: &str,
    path: &Path,
    approve: bool,
) -> anyhow::Result<ExitCode> {
    let policy = match load_or_report(path)? {
        Ok(policy) => policy,
        Err(code) => return Ok(code),
    };
    let client = daemon.client()?;
    let document = policy.document().clone();
    let answer = crate::sandbox_cmds::block_on(async move {
        Ok(client.apply_policy(id, &document, approve).await)
    })?;
    match answer {
        Ok(applied) => {
            println!(
                "{id}: policy applied (egress plan generation {})",
                applied.generation
            );
            for finding in &applied.findings {
                let review = if finding.needs_review { ", review" } else { "" };
                println!(
                    "[{}{review}] {} (e.g. {})",
                    finding.kind, finding.message, finding.witness
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) if err.code() == Some(airlock_api::v1::ErrorCode::Conflict) => {
            eprintln!("airlock: {err}");
            Ok(ExitCode::FAILURE)
        }
        Err(err) => Err(err.into()),
    }
}
