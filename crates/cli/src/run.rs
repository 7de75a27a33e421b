//! `airlock run`: one command, one fresh sandbox, no daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_api::{
    Compat, SandboxConfig, UserSpec, WorkspaceSource, parse_cpus_milli, parse_duration_ms,
    parse_size_bytes,
};
use airlock_runtime::{EgressOptions, Ending, Runtime, Signals};
use anyhow::Context;
use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompatArg {
    Strict,
    BestEffort,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TierArg {
    Process,
    Container,
    Microvm,
}

impl TierArg {
    pub fn tier(self) -> airlock_api::Tier {
        match self {
            TierArg::Process => airlock_api::Tier::Process,
            TierArg::Container => airlock_api::Tier::Container,
            TierArg::Microvm => airlock_api::Tier::Microvm,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Host directory mounted read-write at /workspace (default: a fresh, empty one).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Host directory shown read-only as / (default: the host's /).
    #[arg(long, value_name = "DIR", conflicts_with = "image")]
    rootfs: Option<PathBuf>,
    /// Run on the container tier with this image as /: its entrypoint, cmd (replaced by CMD
    /// when one is given), env, working directory and user apply. For now a plain rootfs
    /// directory or an image description (.json); see `image_source.rs`.
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// Memory limit, without swap (e.g. 512MiB, 2G), or `max`.
    #[arg(long, value_name = "SIZE", value_parser = parse_limit_size)]
    memory: Option<Limit>,
    /// Most processes and threads of the command alive at once, or `max`.
    #[arg(long, value_name = "N", value_parser = parse_limit_count)]
    pids: Option<Limit>,
    /// CPU bandwidth in CPUs (e.g. 1.5).
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_cpus_milli(s).map_err(|e| e.to_string()))]
    cpus: Option<u32>,
    /// Size of /tmp and of a fresh /workspace, and the largest file the command may write.
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size_bytes(s).map_err(|e| e.to_string()))]
    disk: Option<u64>,
    /// Wall-clock limit (e.g. 30s, 500ms, 2m); the whole sandbox is killed when it passes.
    #[arg(long, value_name = "DURATION", value_parser = |s: &str| parse_duration_ms(s).map_err(|e| e.to_string()))]
    timeout: Option<u64>,
    /// Set K to V inside; a bare K copies the host's value. Nothing else is inherited.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// Working directory inside the sandbox [default: /workspace, or the image's].
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// User (and group) inside the sandbox, numeric [default: 0, or the image's].
    #[arg(long, value_name = "UID[:GID]")]
    user: Option<UserSpec>,
    /// What to do when a confinement layer is unavailable.
    #[arg(long, value_enum, default_value = "strict")]
    compat: CompatArg,
    /// Isolation tier (default: process, or the policy's minimum; a weaker one is refused).
    #[arg(long, value_enum)]
    tier: Option<TierArg>,
    /// A policy file (see `airlock policy`). Flags given explicitly override its resources,
    /// user and timeout.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Append the egress proxy's audit lines (JSON, one per decision) to this file.
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    #[command(flatten)]
    git: crate::run_git::GitArgs,
    /// The command and its arguments (with --image: what replaces the image's cmd).
    #[arg(required_unless_present = "image", last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// A limit that may be lifted with `max`.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    Max,
    Value(u64),
}

fn parse_limit_size(value: &str) -> Result<Limit, String> {
    if value == "max" {
        return Ok(Limit::Max);
    }
    parse_size_bytes(value)
        .map(Limit::Value)
        .map_err(|e| e.to_string())
}

fn parse_limit_count(value: &str) -> Result<Limit, String> {
    if value == "max" {
        return Ok(Limit::Max);
    }
    match value.parse::<u64>() {
        Ok(0) => Err("must be greater than zero".into()),
        Ok(n) => Ok(Limit::Value(n)),
        Err(_) => Err(format!("`{value}` is not a whole number")),
    }
}

fn apply_limit(slot: &mut Option<u64>, limit: Option<Limit>) {
    match limit {
        Some(Limit::Max) => *slot = None,
        Some(Limit::Value(value)) => *slot = Some(value),
        None => {}
    }
}

/// Builds the sandbox configuration from the command line.
pub fn config(args: RunArgs) -> anyhow::Result<SandboxConfig> {
    let mut config = match &args.image {
        Some(reference) => {
            let image = crate::image_source::resolve(reference)?;
            SandboxConfig::for_image(image, &args.command)
        }
        None => SandboxConfig::new(args.command),
    };
    if let Some(path) = &args.policy {
        let policy = crate::policy_cmds::load(path)?;
        policy.settings().apply(&mut config);
        config.policy = Some(Box::new(policy.document().clone()));
    }
    if let Some(tier) = args.tier.map(TierArg::tier) {
        if tier.strength() < config.tier.strength() {
            anyhow::bail!(
                "--tier {} is weaker than the policy's minimum tier, {}",
                tier.as_str(),
                config.tier.as_str()
            );
        }
        config.tier = tier;
    }
    config.rootfs = args.rootfs;
    if let Some(path) = args.workspace {
        let path = std::path::absolute(&path)?;
        config.workspace = WorkspaceSource::Host { path };
    }
    apply_limit(&mut config.resources.memory_bytes, args.memory);
    apply_limit(&mut config.resources.pids_max, args.pids);
    if let Some(cpus) = args.cpus {
        config.resources.cpu_milli = Some(cpus);
    }
    if let Some(disk) = args.disk {
        config.resources.disk_bytes = disk;
    }
    if args.timeout.is_some() {
        config.timeout_ms = args.timeout;
    }
    if let Ok(term) = std::env::var("TERM") {
        config.env.push(("TERM".into(), term));
    }
    for item in args.env {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => {
                let value = std::env::var(&item).map_err(|_| {
                    anyhow::anyhow!("--env {item}: the host has no variable {item} to copy")
                })?;
                (item, value)
            }
        };
        config.env.push((name, value));
    }
    if let Some(cwd) = args.cwd {
        config.cwd = cwd;
    }
    if let Some(user) = args.user {
        config.set_user(user);
    }
    config.compat = match args.compat {
        CompatArg::Strict => Compat::Strict,
        CompatArg::BestEffort => Compat::BestEffort,
    };
    Ok(config)
}

const SIGKILL: i32 = 9;

/// Test equipment, like curl's `--resolve`: `AIRLOCK_TEST_EGRESS_RESOLVE=NAME=IP:PORT,...`
/// sends the egress proxy's connections for NAME to a local test upstream, and
/// `AIRLOCK_TEST_EGRESS_ROOTS=FILE` adds that upstream's CA. Only `airlock run` reads them,
/// from its caller's environment (the caller is trusted: it picks the whole policy); the
/// daemon never does.
fn test_egress_options() -> anyhow::Result<EgressOptions> {
    let mut options = EgressOptions::default();
    if let Ok(table) = std::env::var("AIRLOCK_TEST_EGRESS_RESOLVE") {
        let resolver = airlock_egress::TestResolver::new();
        for entry in table.split(',').filter(|e| !e.is_empty()) {
            let (name, addr) = entry.split_once('=').with_context(|| {
                format!("AIRLOCK_TEST_EGRESS_RESOLVE: `{entry}` is not NAME=IP:PORT")
            })?;
            let addr: std::net::SocketAddr = addr
                .parse()
                .with_context(|| format!("AIRLOCK_TEST_EGRESS_RESOLVE: `{addr}` is not IP:PORT"))?;
            resolver.upstream(name, addr);
        }
        options.test_resolver = Some(std::sync::Arc::new(resolver));
    }
    if let Ok(path) = std::env::var("AIRLOCK_TEST_EGRESS_ROOTS") {
        options.extra_upstream_roots_pem.push(
            std::fs::read_to_string(&path)
                .with_context(|| format!("AIRLOCK_TEST_EGRESS_ROOTS: reading {path}"))?,
        );
    }
    Ok(options)
}

pub fn run(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    let audit_log = args.audit_log.clone();
    let egress_options = || {
        let mut options = test_egress_options()?;
        options.audit_log = audit_log.clone();
        Ok(options)
    };
    let git = std::mem::take(&mut args.git);
    let mut config = config(args)?;
    let signals = Signals::install()?;
    let runtime = Runtime::new()?;
    // Kept until the run ends: it removes a temporary repository workspace.
    let mut prepared = None;
    let egress = if git.git.is_some() {
        let made = prepared.insert(crate::run_git::prepare(
            &runtime,
            &mut config,
            &git,
            egress_options,
        )?);
        std::mem::take(&mut made.options)
    } else {
        egress_options()?
    };
    let outcome = runtime.run_with(&config, egress, Some(&signals), |warning| {
        eprintln!("airlock: warning: {warning}")
    })?;
    match &outcome.ending {
        Ending::SetupFailed { message, .. } => eprintln!("airlock: {message}"),
        Ending::TimedOut => {
            let limit = config.timeout_ms.unwrap_or_default();
            eprintln!("airlock: timed out after {limit}ms; the sandbox was killed");
        }
        Ending::Signaled(signal) if outcome.oom_killed && *signal == SIGKILL => {
            eprintln!("airlock: the command was killed by the sandbox's memory limit");
        }
        _ => {}
    }
    Ok(ExitCode::from(
        u8::try_from(outcome.exit_code()).unwrap_or(u8::MAX),
    ))
}
