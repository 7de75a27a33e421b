//! `airlock template build|ls|get|rm`: templates of a running daemon. `build` parses a
//! Dockerfile subset (`dockerfile`), uploads each `COPY`'s files once (`build_context`; the
//! daemon answers which it already has), starts the build and follows its log; it exits 1
//! naming the failed step when the build fails.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_api::v1::{BuildState, BuildStep, BuildTemplateRequest, Resources, StepKind};
use airlock_api::{parse_duration_ms, parse_size_bytes};
use airlock_server::client::{Client, ClientError};
use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};

use crate::build_context::Context;
use crate::dockerfile::{self, Instruction};
use crate::sandbox_cmds::block_on;

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build NAME[:TAG] from a Dockerfile and a build context; follows the build's log.
    Build(Box<BuildArgs>),
    /// List the daemon's templates.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a template (NAME[:TAG]) as JSON.
    Get { name: String },
    /// Delete templates: NAME:TAG, or every tag of NAME.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// NAME[:TAG] (the tag is `latest` without one).
    name: String,
    /// The build context: the directory COPY sources are relative to.
    #[arg(default_value = ".")]
    context: PathBuf,
    /// The Dockerfile [default: CONTEXT/Dockerfile].
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// A policy file for every RUN (its network section: default none; `network: {mode:
    /// proxy}` with egress rules lets RUN reach, for example, package mirrors).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The policy the template's sandboxes get by default.
    #[arg(long = "sandbox-policy", value_name = "FILE")]
    sandbox_policy: Option<PathBuf>,
    /// Set an ARG (repeatable).
    #[arg(long = "build-arg", value_name = "K=V")]
    build_args: Vec<String>,
    /// Ignore the build cache.
    #[arg(long)]
    no_cache: bool,
    /// Another tag for the same build (repeatable).
    #[arg(long = "tag", short = 't', value_name = "TAG")]
    tags: Vec<String>,
    /// The start command, instead of the Dockerfile's CMD/ENTRYPOINT.
    #[arg(long = "start-cmd", value_name = "CMD")]
    start_cmd: Option<String>,
    /// A command every create runs until it exits 0 before the sandbox is handed out.
    #[arg(long = "ready-cmd", value_name = "CMD")]
    ready_cmd: Option<String>,
    /// How long create waits for the ready check (default 60s).
    #[arg(long = "ready-timeout", value_name = "DURATION", value_parser = |s: &str| parse_duration_ms(s).map_err(|e| e.to_string()))]
    ready_timeout: Option<u64>,
    /// Default memory of the template's sandboxes (and of each RUN).
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size_bytes(s).map_err(|e| e.to_string()))]
    memory: Option<u64>,
    /// Default disk of the template's sandboxes (and of each RUN).
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| parse_size_bytes(s).map_err(|e| e.to_string()))]
    disk: Option<u64>,
    /// Print only the final result, not the build's log.
    #[arg(long, short = 'q')]
    quiet: bool,
}

pub fn template(client: &Client, command: TemplateCommand) -> anyhow::Result<ExitCode> {
    match command {
        TemplateCommand::Build(args) => block_on(build(client, *args)),
        TemplateCommand::Ls { json } => block_on(async {
            let templates = client.templates().await?.templates;
            if json {
                println!("{}", serde_json::to_string_pretty(&templates)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<32} {:<20} {:<28} START", "NAME", "IMAGE", "BUILD");
            for t in templates {
                let image = t.image.as_deref().map_or("(host root)".to_owned(), |d| {
                    d.strip_prefix("sha256:")
                        .unwrap_or(d)
                        .chars()
                        .take(12)
                        .collect()
                });
                println!(
                    "{:<32} {:<20} {:<28} {}",
                    t.name,
                    image,
                    t.build_id.as_deref().unwrap_or("-"),
                    t.start_cmd.as_deref().unwrap_or("-")
                );
            }
            Ok(ExitCode::SUCCESS)
        }),
        TemplateCommand::Get { name } => block_on(async {
            let template = client.template(&name).await?;
            println!("{}", serde_json::to_string_pretty(&template)?);
            Ok(ExitCode::SUCCESS)
        }),
        TemplateCommand::Rm { names } => block_on(async {
            for name in names {
                client.delete_template(&name).await?;
                println!("{name}");
            }
            Ok(ExitCode::SUCCESS)
        }),
    }
}

fn pairs(items: &[String], flag: &str) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => bail!("{flag} {item:?} is not K=V"),
        })
        .collect()
}

fn policy(path: Option<&Path>) -> anyhow::Result<Option<Box<airlock_api::policy::PolicyDocument>>> {
    path.map(|p| Ok(Box::new(crate::policy_cmds::load(p)?.document().clone())))
        .transpose()
}

/// The build's steps, with each COPY's files packed into `scratch` and uploaded.
async fn steps(
    client: &Client,
    parsed: &dockerfile::Dockerfile,
    context: &Context,
    scratch: &Path,
) -> anyhow::Result<Vec<BuildStep>> {
    let mut steps = Vec::new();
    for (index, (line, instruction)) in parsed.steps.iter().enumerate() {
        let step = |kind, args: Vec<String>| BuildStep {
            kind,
            args,
            force: false,
            files_hash: None,
        };
        steps.push(match instruction {
            Instruction::Run(command) => step(StepKind::Run, vec![command.clone()]),
            Instruction::Env(pairs) => step(
                StepKind::Env,
                pairs
                    .iter()
                    .flat_map(|(k, v)| [k.clone(), v.clone()])
                    .collect(),
            ),
            Instruction::Workdir(dir) => step(StepKind::Workdir, vec![dir.clone()]),
            Instruction::User(user) => step(StepKind::User, vec![user.clone()]),
            Instruction::Copy {
                source,
                destination,
                chown,
                chmod,
            } => {
                let tar = scratch.join(format!("copy-{index}.tar"));
                let hash = context
                    .copy_files(source, destination, &tar)
                    .with_context(|| format!("line {line}"))?;
                if client.template_files(&hash).await?.is_none() {
                    client.put_template_files(&hash, &tar).await?;
                }
                // Docker's COPY makes root the owner unless --chown says otherwise.
                let owner = chown.clone().unwrap_or_else(|| "0:0".to_owned());
                BuildStep {
                    kind: StepKind::Copy,
                    args: vec![
                        source.clone(),
                        destination.clone(),
                        owner,
                        chmod.clone().unwrap_or_default(),
                    ],
                    force: false,
                    files_hash: Some(hash),
                }
            }
        });
    }
    Ok(steps)
}

async fn build(client: &Client, args: BuildArgs) -> anyhow::Result<ExitCode> {
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| args.context.join("Dockerfile"));
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let parsed = dockerfile::parse(&text, &pairs(&args.build_args, "--build-arg")?)
        .map_err(|e| anyhow::anyhow!("{}:{}: {}", file.display(), e.line, e.message))?;
    let context = Context::walk(&args.context)
        .with_context(|| format!("the build context {}", args.context.display()))?;
    let scratch =
        std::env::temp_dir().join(format!("airlock-template-build-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let steps = steps(client, &parsed, &context, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    let mut request = BuildTemplateRequest {
        name: args.name.clone(),
        tags: args.tags.clone(),
        from_image: parsed.from.clone(),
        from_template: None,
        steps: steps?,
        start_cmd: args.start_cmd.clone().or(parsed.start_cmd.clone()),
        ready_cmd: args.ready_cmd.clone(),
        ready_timeout_ms: args.ready_timeout,
        force: args.no_cache,
        resources: Resources {
            memory_bytes: args.memory,
            disk_bytes: args.disk,
            ..Resources::default()
        },
        build_policy: policy(args.policy.as_deref())?,
        policy: policy(args.sandbox_policy.as_deref())?,
        description: parsed
            .labels
            .get("org.opencontainers.image.description")
            .cloned(),
    };
    if let Some(from) = &parsed.from {
        // A template of the daemon shadows a registry name, as a local image does in Docker.
        match client.template(from).await {
            Ok(_) => {
                request.from_template = request.from_image.take();
            }
            // No such template, or a name that cannot be one (a registry reference).
            Err(ClientError::Api {
                status: 400 | 404 | 422,
                ..
            }) => {}
            Err(err) => return Err(err.into()),
        }
    }
    let build = client.build_template(&request).await?;
    if !args.quiet {
        eprintln!("build {} of {}", build.id, build.template);
    }
    let mut lines = client.build_logs(&build.id, 0, true).await?;
    let mut stdout = std::io::stdout().lock();
    while let Some(entry) = lines.next().await? {
        if !args.quiet {
            let _ = writeln!(stdout, "{}", entry.message);
        }
    }
    let finished = client.build(&build.id).await?;
    match finished.state {
        BuildState::Ready => {
            eprintln!(
                "template {} is ready: {} ({} of {} steps cached)",
                finished.template,
                finished.image.as_deref().unwrap_or(""),
                finished.steps_cached,
                finished.steps_total
            );
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            let reason = finished.reason.unwrap_or(airlock_api::v1::BuildFailure {
                message: format!("the build ended {}", finished.state.as_str()),
                step: None,
            });
            // Name the Dockerfile line of a failed step.
            let at = reason
                .step
                .as_deref()
                .and_then(|s| s.parse::<usize>().ok())
                .and_then(|n| parsed.steps.get(n.wrapping_sub(1)))
                .map(|(line, _)| format!(" ({}:{line})", file.display()))
                .unwrap_or_default();
            eprintln!(
                "airlock: build {} failed at step {}{at}: {}",
                finished.id,
                reason.step.as_deref().unwrap_or("?"),
                reason.message
            );
            Ok(ExitCode::from(1))
        }
    }
}
