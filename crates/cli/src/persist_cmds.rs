//! `airlock sandbox pause|resume|snapshot|snapshots|snapshot-rm|fork`: persistence through a
//! daemon.

use std::process::ExitCode;

use airlock_api::parse_duration_ms;
use airlock_api::v1::{ForkRequest, PauseMode};
use airlock_server::client::Client;
use clap::Subcommand;

/// What a pause keeps (`--keep`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KeepArg {
    /// Freeze the processes: they keep their memory and go on where they stopped.
    Memory,
    /// End the processes, keep the files; resume starts the sandbox again on them.
    Files,
}

impl KeepArg {
    pub fn mode(self) -> PauseMode {
        match self {
            KeepArg::Memory => PauseMode::Frozen,
            KeepArg::Files => PauseMode::Filesystem,
        }
    }
}

fn duration(value: &str) -> Result<u64, String> {
    parse_duration_ms(value).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum PersistCommand {
    /// Pause a sandbox; its timeout clock stops until it resumes.
    Pause {
        id: String,
        #[arg(long, value_enum, default_value = "memory")]
        keep: KeepArg,
    },
    /// Resume a paused sandbox.
    Resume {
        id: String,
        /// Live at least this long from now (default: what it had left).
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        timeout: Option<u64>,
    },
    /// Snapshot a sandbox's files; `sandbox create --template ID` starts from it.
    Snapshot {
        id: String,
        #[arg(long)]
        name: Option<String>,
    },
    /// List snapshots.
    Snapshots,
    /// Delete a snapshot (sandboxes made from it keep their files).
    SnapshotRm { id: String },
    /// New sandboxes from a consistent copy of a sandbox's files; prints one id per line.
    Fork {
        id: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        timeout: Option<u64>,
    },
}

pub async fn run(client: &Client, command: PersistCommand) -> anyhow::Result<ExitCode> {
    match command {
        PersistCommand::Pause { id, keep } => {
            let sandbox = client.pause(&id, keep.mode()).await?;
            println!("{} paused ({})", sandbox.id, keep.mode().as_str());
        }
        PersistCommand::Resume { id, timeout } => {
            let sandbox = client.resume(&id, timeout).await?;
            println!(
                "{} running, expires at {} ms",
                sandbox.id, sandbox.expires_at_ms
            );
        }
        PersistCommand::Snapshot { id, name } => {
            let snapshot = client.snapshot(&id, name).await?;
            println!("{}", snapshot.id);
        }
        PersistCommand::Snapshots => {
            println!("{:<22} {:<24} {:<22} CREATED_MS", "ID", "NAME", "SOURCE");
            for snapshot in client.snapshots().await? {
                println!(
                    "{:<22} {:<24} {:<22} {}",
                    snapshot.id,
                    snapshot.name.as_deref().unwrap_or("-"),
                    snapshot.source_id,
                    snapshot.created_at_ms
                );
            }
        }
        PersistCommand::SnapshotRm { id } => client.delete_snapshot(&id).await?,
        PersistCommand::Fork { id, count, timeout } => {
            let request = ForkRequest {
                count,
                timeout_ms: timeout,
            };
            let mut failed = false;
            for fork in client.fork(&id, &request).await? {
                match (fork.sandbox, fork.error) {
                    (Some(sandbox), _) => println!("{}", sandbox.id),
                    (None, Some(error)) => {
                        failed = true;
                        eprintln!(
                            "airlock: a fork failed: {}: {}",
                            error.code.as_str(),
                            error.message
                        );
                    }
                    (None, None) => failed = true,
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
