//! `airlock approvals ls|approve|deny`: requests that a `proxy`-mode sandbox's egress proxy
//! holds under `approvals: ask`, answered through a running daemon (`--url`/`AIRLOCK_URL`, the
//! API key from `AIRLOCK_API_KEY`).

use std::process::ExitCode;

use airlock_api::v1::ApprovalDecision;
use airlock_server::client::Client;
use clap::Subcommand;

use crate::sandbox_cmds::block_on;

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List the requests waiting for a decision, oldest first.
    Ls {
        /// Only this sandbox's.
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Let a held request through (with --always, also every identical later one).
    Approve {
        /// The approval id (from `airlock approvals ls`).
        id: String,
        #[arg(long)]
        always: bool,
    },
    /// Refuse a held request.
    Deny {
        /// The approval id (from `airlock approvals ls`).
        id: String,
    },
}

pub fn approvals(
    daemon: &crate::sandbox_cmds::DaemonArgs,
    command: ApprovalsCommand,
) -> anyhow::Result<ExitCode> {
    let client = daemon.client()?;
    match command {
        ApprovalsCommand::Ls { sandbox, json } => block_on(list(&client, sandbox, json)),
        ApprovalsCommand::Approve { id, always } => {
            let decision = if always {
                ApprovalDecision::Always
            } else {
                ApprovalDecision::Once
            };
            block_on(decide(&client, id, decision))
        }
        ApprovalsCommand::Deny { id } => block_on(decide(&client, id, ApprovalDecision::Deny)),
    }
}

async fn list(client: &Client, sandbox: Option<String>, json: bool) -> anyhow::Result<ExitCode> {
    let approvals = client.approvals(sandbox.as_deref()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&approvals)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<44} {:<8} {:<32} {:>6} {:>9}",
        "ID", "METHOD", "HOST", "PORT", "EXPIRES"
    );
    let now = airlock_server::store::now_ms();
    for approval in approvals {
        let target = match &approval.path {
            Some(path) => format!("{}{path}", approval.host),
            None => approval.host.clone(),
        };
        let left_s = approval.expires_at_ms.saturating_sub(now) / 1000;
        println!(
            "{:<44} {:<8} {:<32} {:>6} {:>8}s",
            approval.id, approval.method, target, approval.port, left_s
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn decide(
    client: &Client,
    id: String,
    decision: ApprovalDecision,
) -> anyhow::Result<ExitCode> {
    client.decide_approval(&id, decision).await?;
    let done = match decision {
        ApprovalDecision::Once => "approved once",
        ApprovalDecision::Always => "approved always",
        ApprovalDecision::Deny => "denied",
    };
    println!("{id}: {done}");
    Ok(ExitCode::SUCCESS)
}
