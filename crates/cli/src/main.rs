//! `airlock`: run commands in sandboxes.

mod approvals_cmds;
mod build_context;
mod daemon_cmds;
mod dockerfile;
mod git_cmds;
mod image_cmds;
mod image_source;
mod persist_cmds;
mod policy_cmds;
mod run;
mod run_git;
mod sandbox_cmds;
mod seceval_run;
mod template_cmds;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for Airlock's own errors, as `docker run` and `env` use.
const AIRLOCK_ERROR: u8 = 125;

#[derive(Debug, Parser)]
#[command(
    name = "airlock",
    version,
    about = "Run untrusted code in disposable, hardened sandboxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one command in a fresh sandbox and remove the sandbox when it ends.
    Run(run::RunArgs),
    /// Measure sandbox start-up against peers.
    Bench {
        #[command(subcommand)]
        which: airlock_bench::BenchCommand,
    },
    /// Report which tiers and confinement layers this host supports.
    Probe,
    /// Run the daemon (airlockd) in the foreground.
    Serve(airlock_server::ServeArgs),
    /// Manage the daemon's API keys (works without a running daemon).
    Keys(airlock_server::KeysArgs),
    /// Manage long-lived sandboxes of a running daemon.
    Sandbox {
        #[command(flatten)]
        daemon: sandbox_cmds::DaemonArgs,
        #[command(subcommand)]
        which: sandbox_cmds::SandboxCommand,
    },
    /// List and answer egress requests held for approval in a daemon's sandboxes.
    Approvals {
        #[command(flatten)]
        daemon: sandbox_cmds::DaemonArgs,
        #[command(subcommand)]
        which: approvals_cmds::ApprovalsCommand,
    },
    /// Pull, import, list, inspect and remove container images in the local store.
    Image {
        #[command(flatten)]
        store: image_cmds::StoreArgs,
        #[command(subcommand)]
        which: image_cmds::ImageCommand,
    },
    /// Build, list and delete a daemon's templates (`template build NAME -f Dockerfile .`).
    Template {
        #[command(flatten)]
        daemon: sandbox_cmds::DaemonArgs,
        #[command(subcommand)]
        which: template_cmds::TemplateCommand,
    },
    /// Check, explain and compare policy documents.
    Policy {
        #[command(subcommand)]
        which: policy_cmds::PolicyCommand,
    },
    /// Run the security evaluation: a catalog of attacks from inside sandboxes, each with the
    /// layer that must stop it (docs/seceval.md).
    Seceval(airlock_seceval::SecevalArgs),
    /// `airlock run` with layers taken away: the proof runs of `airlock seceval` only.
    #[command(name = "__seceval-run", hide = true)]
    SecevalRun(seceval_run::EvalRunArgs),
    /// Serve MCP over stdin/stdout: tools for a daemon's sandboxes (for desktop agents).
    Mcp {
        #[command(flatten)]
        daemon: sandbox_cmds::DaemonArgs,
        /// Only these tools (comma-separated; clients cap how many they take). Names:
        /// sandbox_create, sandbox_list, sandbox_info, sandbox_kill, sandbox_pause,
        /// sandbox_resume, sandbox_set_timeout, run_code, run_command, process_output,
        /// process_kill, file_read, file_write, file_edit, file_list, file_stat, file_mkdir,
        /// file_move, file_remove, file_search, sandbox_url.
        #[arg(long, value_delimiter = ',', value_name = "NAMES")]
        tools: Vec<String>,
    },
    /// Run a command in a daemon's sandbox (`airlock sandbox exec`).
    Exec {
        #[command(flatten)]
        daemon: sandbox_cmds::DaemonArgs,
        #[command(flatten)]
        args: sandbox_cmds::ExecArgs,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("airlock: {}", clap_error_line(&err));
            return ExitCode::from(AIRLOCK_ERROR);
        }
    };
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Bench { which } => airlock_bench::bench(which, &image_source::resolve),
        Command::Probe => probe(),
        Command::Serve(args) => daemon_cmds::serve(&args),
        Command::Keys(args) => daemon_cmds::keys(&args),
        Command::Sandbox { daemon, which } => sandbox_cmds::sandbox(&daemon, which),
        Command::Exec { daemon, args } => sandbox_cmds::exec(&daemon, args),
        Command::Mcp { daemon, tools } => sandbox_cmds::mcp(&daemon, &tools),
        Command::Image { store, which } => image_cmds::image(&store, which),
        Command::Template { daemon, which } => daemon
            .client()
            .and_then(|client| template_cmds::template(&client, which)),
        Command::Policy { which } => policy_cmds::policy(which),
        Command::Approvals { daemon, which } => approvals_cmds::approvals(&daemon, which),
        Command::Seceval(args) => airlock_seceval::seceval(args),
        Command::SecevalRun(args) => seceval_run::eval_run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("airlock: error: {}", one_line(&err));
            ExitCode::from(AIRLOCK_ERROR)
        }
    }
}

/// clap's message up to its first blank line (before the usage and tips), on one line.
fn clap_error_line(err: &clap::Error) -> String {
    err.to_string()
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `err: cause: cause`, on one line.
fn one_line(err: &anyhow::Error) -> String {
    err.chain()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

fn probe() -> anyhow::Result<ExitCode> {
    let runtime = airlock_runtime::Runtime::new()?;
    let support = runtime.support();
    println!(
        "landlock abi:     {}",
        support
            .landlock_abi
            .map_or("unavailable".into(), |v| v.to_string())
    );
    println!(
        "user namespaces:  {}",
        if support.user_namespaces { "yes" } else { "no" }
    );
    println!(
        "seccomp filter:   {}",
        if support.seccomp_filter { "yes" } else { "no" }
    );
    println!("cgroups:          {}", support.cgroups.describe());
    println!(
        "caller:           uid {}{}",
        support.caller_uid,
        if support.caller_is_root {
            " (root)"
        } else {
            ""
        }
    );
    println!(
        "kvm:              {}",
        airlock_vmm::host::detect().describe()
    );
    for backend in runtime.backends() {
        let state = match &backend.unavailable {
            None if backend.degraded.is_empty() => "available".to_owned(),
            None => format!("available, degraded: {}", backend.degraded.join("; ")),
            Some(reason) => format!("unavailable: {reason}"),
        };
        println!("tier {:<10} {state}", backend.tier.as_str());
    }
    Ok(ExitCode::SUCCESS)
}
