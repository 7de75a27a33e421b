//! `airlock sandbox ...` and `airlock exec`: clients of a running `airlockd`.
//!
//! The daemon is found through `--url` or `AIRLOCK_URL` (default `http://127.0.0.1:3000`); the
//! API key comes from `AIRLOCK_API_KEY` only, so that it never shows in a process listing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use airlock_api::v1::{
    CreateSandboxRequest, ExecEvent, ExecRequest, Lifecycle, OnTimeout, Resources, Sandbox,
    SandboxState, Workspace,
};
use airlock_api::{Tier, parse_cpus_milli, parse_duration_ms, parse_size_bytes};
use airlock_server::client::Client;
use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use clap::{Args, Subcommand};

use crate::run::TierArg;

const DEFAULT_URL: &str = "http://127.0.0.1:3000";

/// Where the daemon is.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The daemon's base URL [env: AIRLOCK_URL; default http://127.0.0.1:3000]. The API key is
    /// read from AIRLOCK_API_KEY.
    #[arg(long, value_name = "URL", global = true)]
    url: Option<String>,
}

impl DaemonArgs {
    pub(crate) fn client(&self) -> anyhow::Result<Client> {
        let url = self
            .url
            .clone()
            .or_else(|| std::env::var("AIRLOCK_URL").ok())
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        let key = std::env::var("AIRLOCK_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        Ok(Client::new(&url, key)?)
    }
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a long-lived sandbox; prints its id (and, with --json, its access token).
    Create(CreateArgs),
    /// List sandboxes.
    Ls {
        /// Only sandboxes in this state (creating, running).
        #[arg(long, value_name = "STATE")]
        state: Vec<String>,
        /// Only sandboxes with this metadata label.
        #[arg(long = "meta", value_name = "K=V")]
        metadata: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one sandbox as JSON.
    Get { id: String },
    /// Run a command in a sandbox, streaming its output; exits with its code.
    Exec(ExecArgs),
    /// Copy a file into or out of a sandbox: `cp FILE ID:/path` or `cp ID:/path FILE` (`-` is
    /// stdin or stdout).
    Cp { source: String, destination: String },
    /// Destroy sandboxes.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Show a sandbox's events and its agent's log.
    Logs { id: String },
    /// Show a template's (or a microvm snapshot's) warm pool as JSON; with --size, set its
    /// size first (0 removes it). A microvm snapshot's members are pre-created VM shells.
    Pool {
        template: String,
        #[arg(long, value_name = "N")]
        size: Option<u32>,
    },
    /// Set how long from now a sandbox lives.
    Timeout {
        id: String,
        #[arg(value_parser = |s: &str| parse_duration_ms(s).map_err(|e| e.to_string()))]
        duration: u64,
    },
    #[command(flatten)]
    Persist(crate::persist_cmds::PersistCommand),
    #[command(flatten)]
    Git(crate::git_cmds::GitCommand),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[arg(long, value_enum, default_value = "process")]
    tier: TierArg,
    /// Template: NAME[:TAG] or a snapshot (default: base, the host's / read-only).
    #[arg(long)]
    template: Option<String>,
    /// An image of the daemon's store (a name or a digest): the container tier, the image as
    /// the whole filesystem.
    #[arg(long, value_name = "REF", conflicts_with = "template")]
    image: Option<String>,
    /// Memory limit (e.g. 512MiB).
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size_bytes(s).map_err(|e| e.to_string()))]
    memory: Option<u64>,
    /// Most processes and threads alive at once.
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// CPU bandwidth in CPUs (e.g. 1.5).
    #[arg(long, value_name = "N", value_parser = |s: &str| parse_cpus_milli(s).map_err(|e| e.to_string()))]
    cpus: Option<u32>,
    /// Size of /tmp and of a fresh /workspace.
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size_bytes(s).map_err(|e| e.to_string()))]
    disk: Option<u64>,
    /// Lifetime (e.g. 10m); the daemon's default when absent.
    #[arg(long, value_name = "DURATION", value_parser = |s: &str| parse_duration_ms(s).map_err(|e| e.to_string()))]
    timeout: Option<u64>,
    /// Environment of every command run in the sandbox.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// A metadata label.
    #[arg(long = "meta", value_name = "K=V")]
    metadata: Vec<String>,
    /// Host directory mounted read-write at /workspace (default: a fresh one).
    #[arg(long, value_name = "DIR", conflicts_with = "git")]
    workspace: Option<PathBuf>,
    /// Clone this repository (https:// smart HTTP) into /workspace through the sandbox's
    /// egress proxy, at REF (a branch, tag or commit; default: its default branch).
    #[arg(long, value_name = "URL[@REF]")]
    git: Option<String>,
    /// The sandbox's own branch, made from REF; the only one it may push to
    /// [default: airlock/<sandbox id>].
    #[arg(long, value_name = "NAME", requires = "git")]
    branch: Option<String>,
    /// A policy file, checked here and sent with its profiles merged in.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// At the timeout: `kill` the sandbox (the default) or `pause` it.
    #[arg(long, value_enum, default_value = "kill")]
    on_timeout: OnTimeoutArg,
    /// How a pause at the timeout pauses: keep `memory` (freeze) or only `files`.
    #[arg(long, value_enum, default_value = "memory")]
    timeout_keep: crate::persist_cmds::KeepArg,
    /// A request to the paused sandbox (exec, files, any port) resumes it.
    #[arg(long)]
    auto_resume: bool,
    /// Print the whole answer, access token included, as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum OnTimeoutArg {
    Kill,
    Pause,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    id: String,
    /// Set K to V for this command.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// User name inside the sandbox.
    #[arg(long)]
    user: Option<String>,
    /// Kill the command after this long.
    #[arg(long, value_name = "DURATION", value_parser = |s: &str| parse_duration_ms(s).map_err(|e| e.to_string()))]
    timeout: Option<u64>,
    /// Send this process's stdin to the command.
    #[arg(long, short = 'i')]
    interactive: bool,
    /// The command and its arguments (run directly, without a shell).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

fn pairs(items: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => bail!("{what} `{item}` is not K=V"),
        })
        .collect()
}

pub(crate) fn block_on<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the I/O runtime")?
        .block_on(future)
}

pub fn sandbox(daemon: &DaemonArgs, command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let client = daemon.client()?;
    match command {
        SandboxCommand::Create(args) => block_on(create(&client, args)),
        SandboxCommand::Ls {
            state,
            metadata,
            json,
        } => block_on(list(&client, state, metadata, json)),
        SandboxCommand::Get { id } => block_on(async {
            let sandbox = client.get(&id).await?;
            println!("{}", serde_json::to_string_pretty(&sandbox)?);
            Ok(ExitCode::SUCCESS)
        }),
        SandboxCommand::Exec(args) => exec(daemon, args),
        SandboxCommand::Cp {
            source,
            destination,
        } => block_on(copy(&client, source, destination)),
        SandboxCommand::Rm { ids } => block_on(async {
            for id in ids {
                client
                    .delete(&id)
                    .await
                    .with_context(|| format!("removing {id}"))?;
            }
            Ok(ExitCode::SUCCESS)
        }),
        SandboxCommand::Pool { template, size } => block_on(async {
            let status = match size {
                Some(size) => client.set_pool(&template, size).await?,
                None => client.pool(&template).await?,
            };
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(ExitCode::SUCCESS)
        }),
        SandboxCommand::Logs { id } => block_on(async {
            let logs = client.logs(&id).await?;
            for event in logs.events {
                println!("{} {:<16} {}", event.at_ms, event.kind, event.message);
            }
            if !logs.agent_log.is_empty() {
                println!("--- agent log ---");
                print!("{}", logs.agent_log);
            }
            Ok(ExitCode::SUCCESS)
        }),
        SandboxCommand::Timeout { id, duration } => block_on(async {
            let sandbox = client.set_timeout(&id, duration).await?;
            println!("{} expires at {} ms", sandbox.id, sandbox.expires_at_ms);
            Ok(ExitCode::SUCCESS)
        }),
        SandboxCommand::Persist(command) => block_on(crate::persist_cmds::run(&client, command)),
        SandboxCommand::Git(command) => block_on(crate::git_cmds::run(&client, command)),
    }
}

async fn create(client: &Client, args: CreateArgs) -> anyhow::Result<ExitCode> {
    let workspace = match (args.workspace, &args.git) {
        (_, Some(git)) => crate::git_cmds::workspace(git, args.branch.clone()),
        (None, None) => Workspace::Fresh,
        (Some(dir), None) => {
            let dir = std::fs::canonicalize(&dir)
                .with_context(|| format!("workspace {}", dir.display()))?;
            Workspace::Host {
                path: dir.to_string_lossy().into_owned(),
            }
        }
    };
    let request = CreateSandboxRequest {
        tier: match args.tier {
            TierArg::Process => Tier::Process,
            TierArg::Container => Tier::Container,
            TierArg::Microvm => Tier::Microvm,
        },
        template: args.template,
        image: args.image,
        resources: Resources {
            memory_bytes: args.memory,
            pids_max: args.pids,
            cpu_millis: args.cpus,
            disk_bytes: args.disk,
        },
        timeout_ms: args.timeout,
        env: pairs(&args.env, "--env")?,
        metadata: pairs(&args.metadata, "--meta")?,
        workspace,
        policy: match &args.policy {
            Some(path) => Some(Box::new(crate::policy_cmds::load(path)?.document().clone())),
            None => None,
        },
        lifecycle: Lifecycle {
            on_timeout: match args.on_timeout {
                OnTimeoutArg::Kill => OnTimeout::Kill,
                OnTimeoutArg::Pause => OnTimeout::Pause,
            },
            pause_mode: args.timeout_keep.mode(),
            auto_resume: args.auto_resume,
        },
        tools: Vec::new(),
    };
    let created = client.create(&request).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&created)?);
    } else {
        println!("{}", created.sandbox.id);
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(
    client: &Client,
    states: Vec<String>,
    metadata: Vec<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let states = states
        .iter()
        .flat_map(|s| s.split(','))
        .map(|s| match s {
            "creating" => Ok(SandboxState::Creating),
            "running" => Ok(SandboxState::Running),
            other => bail!("unknown state `{other}` (creating, running)"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sandboxes = client.list(&states, &pairs(&metadata, "--meta")?).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&sandboxes)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<26} {:<9} {:<8} {:<10} EXPIRES(ms)",
        "ID", "STATE", "TIER", "TEMPLATE"
    );
    for Sandbox {
        id,
        state,
        tier,
        template,
        expires_at_ms,
        ..
    } in sandboxes
    {
        println!(
            "{id:<26} {:<9} {:<8} {template:<10} {expires_at_ms}",
            state.as_str(),
            tier.as_str()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the command and exits like `airlock run`: its code, or 128+N for signal N.
pub fn exec(daemon: &DaemonArgs, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let client = daemon.client()?;
    let stdin = if args.interactive {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).context("reading stdin")?;
        Some(BASE64.encode(bytes))
    } else {
        None
    };
    let request = ExecRequest {
        argv: Some(args.command),
        shell: None,
        env: pairs(&args.env, "--env")?,
        cwd: args.cwd,
        user: args.user,
        timeout_ms: args.timeout,
        stdin_base64: stdin,
    };
    block_on(async move {
        let mut stream = client.exec(&args.id, &request).await?;
        let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
        while let Some(event) = stream.next_event().await? {
            match event {
                ExecEvent::Start { .. } => {}
                ExecEvent::Stdout { data_base64 } => {
                    out.write_all(&BASE64.decode(data_base64)?)?;
                    out.flush()?;
                }
                ExecEvent::Stderr { data_base64 } => {
                    err.write_all(&BASE64.decode(data_base64)?)?;
                    err.flush()?;
                }
                ExecEvent::Exit {
                    exit_code,
                    exited,
                    status,
                    oom_killed,
                } => {
                    if oom_killed {
                        eprintln!(
                            "airlock: the out-of-memory killer ended a process of this command (the sandbox's memory limit); the sandbox keeps running"
                        );
                    }
                    return Ok(ExitCode::from(exit_status(exit_code, exited, &status)));
                }
                ExecEvent::Error { code, message } => {
                    bail!("the command's stream broke: {}: {message}", code.as_str())
                }
            }
        }
        bail!("the exec stream ended without an exit event")
    })
}

/// The shell's convention: the exit code, or 128+N when signal N ended the command.
fn exit_status(exit_code: i32, exited: bool, status: &str) -> u8 {
    if exited {
        return u8::try_from(exit_code.rem_euclid(256)).unwrap_or(1);
    }
    let signal = match status.trim_start_matches("signal: ") {
        "killed" => 9,
        "terminated" => 15,
        "interrupt" => 2,
        "hangup" => 1,
        "aborted" => 6,
        "segmentation fault" => 11,
        _ => 9,
    };
    128 + signal
}

/// `ID:/path` → `(ID, /path)`; a local path otherwise.
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (id, path) = spec.split_once(':')?;
    let is_id = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric());
    (is_id && path.starts_with('/')).then_some((id, path))
}

async fn copy(client: &Client, source: String, destination: String) -> anyhow::Result<ExitCode> {
    match (remote(&source), remote(&destination)) {
        (None, Some((id, path))) => {
            let entry = if source == "-" {
                client.upload(id, path, tokio::io::stdin(), None).await?
            } else {
                let file = tokio::fs::File::open(&source)
                    .await
                    .with_context(|| format!("opening {source}"))?;
                let length = file.metadata().await.ok().map(|m| m.len());
                client.upload(id, path, file, length).await?
            };
            eprintln!("{} bytes -> {id}:{}", entry.size_bytes, entry.path);
        }
        (Some((id, path)), None) => {
            let mut download = client.download(id, path).await?;
            let copied = if destination == "-" {
                download.copy_to(&mut tokio::io::stdout()).await?
            } else {
                // Written beside the target and renamed, so that a failed copy loses no data.
                let partial = format!("{destination}.airlock-partial");
                let mut file = tokio::fs::File::create(&partial)
                    .await
                    .with_context(|| format!("creating {partial}"))?;
                let copied = match download.copy_to(&mut file).await {
                    Ok(n) => n,
                    Err(err) => {
                        let _ = tokio::fs::remove_file(&partial).await;
                        return Err(err.into());
                    }
                };
                tokio::io::AsyncWriteExt::flush(&mut file).await?;
                tokio::fs::rename(&partial, &destination)
                    .await
                    .with_context(|| format!("renaming {partial} to {destination}"))?;
                copied
            };
            eprintln!("{id}:{path} -> {copied} bytes");
        }
        (Some(_), Some(_)) => {
            bail!("copy between two sandboxes is not supported; go through a file")
        }
        (None, None) => bail!("one side of cp must be ID:/absolute/path"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `airlock mcp`: MCP over stdio until the client closes it (nothing else on stdout).
pub fn mcp(daemon: &DaemonArgs, tools: &[String]) -> anyhow::Result<ExitCode> {
    let client = daemon.client()?;
    block_on(async {
        airlock_server::mcp::serve_stdio(client, tools).await?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_remote_paths_need_an_id_and_an_absolute_path() {
        assert_eq!(remote("abc123:/tmp/x"), Some(("abc123", "/tmp/x")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("abc:relative"), None);
        assert_eq!(remote("/tmp/file"), None);
    }

    #[test]
    fn test_exit_status_follows_the_shell() {
        assert_eq!(exit_status(3, true, "exit status 3"), 3);
        assert_eq!(exit_status(-1, false, "signal: killed"), 137);
        assert_eq!(exit_status(-1, false, "signal: terminated"), 143);
    }

    #[test]
    fn test_pairs_reject_missing_equals() {
        assert!(pairs(&["a=b".into()], "--env").is_ok());
        let err = pairs(&["novalue".into()], "--env").unwrap_err();
        assert!(err.to_string().contains("is not K=V"));
    }
}
