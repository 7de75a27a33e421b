//! `airlock sandbox push|pr|lsp`: a repository sandbox's branch, its pull request, and
//! language servers, through a daemon; and `--git URL[@REF]` of `sandbox create`.

use std::process::ExitCode;

use airlock_api::v1::{GitWorkspace, LspRequest, PullRequestRequest, Workspace};
use airlock_server::client::Client;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum GitCommand {
    /// Push a repository sandbox's branch (from inside it, through its egress proxy).
    Push {
        id: String,
        /// Replace the remote branch even if it moved (--force-with-lease).
        #[arg(long)]
        force: bool,
    },
    /// Push a repository sandbox's branch and open a pull request on the daemon's forge;
    /// prints its URL.
    Pr {
        id: String,
        #[arg(long)]
        title: String,
        #[arg(long)]
        body: Option<String>,
        /// The branch to merge into (default: the one the sandbox started from).
        #[arg(long)]
        base: Option<String>,
    },
    /// Start a language server in a sandbox; prints its WebSocket path (JSON with --json).
    Lsp {
        id: String,
        /// python, rust, typescript, javascript or go.
        #[arg(long, conflicts_with = "argv", required_unless_present = "argv")]
        language: Option<String>,
        /// The project's directory inside the sandbox (default /workspace).
        #[arg(long)]
        root: Option<String>,
        #[arg(long)]
        json: bool,
        /// A server's own command line instead of --language.
        #[arg(last = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
}

/// `--git URL[@REF]` and `--branch NAME` as a workspace.
pub fn workspace(git: &str, branch: Option<String>) -> Workspace {
    let (url, reference) = airlock_runtime::git::split_url_ref(git);
    Workspace::Git {
        git: GitWorkspace {
            url: url.to_owned(),
            reference: reference.map(str::to_owned),
            branch,
        },
    }
}

pub async fn run(client: &Client, command: GitCommand) -> anyhow::Result<ExitCode> {
    match command {
        GitCommand::Push { id, force } => {
            let pushed = client.git_push(&id, force).await?;
            println!("{} {} -> {}", pushed.branch, pushed.commit, pushed.url);
        }
        GitCommand::Pr {
            id,
            title,
            body,
            base,
        } => {
            let request = PullRequestRequest { title, body, base };
            println!("{}", client.pull_request(&id, &request).await?.url);
        }
        GitCommand::Lsp {
            id,
            language,
            root,
            json,
            argv,
        } => {
            let request = LspRequest {
                language,
                argv: (!argv.is_empty()).then_some(argv),
                root,
            };
            let server = client.start_lsp(&id, &request).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&server)?);
            } else {
                println!("{}", server.websocket_path);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
