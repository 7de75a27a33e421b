//! `airlockd`: the Airlock daemon. `airlockd [OPTIONS]` serves; `airlockd openapi` prints the
//! API document; `airlockd keys ...` manages API keys.

use std::process::ExitCode;

use airlock_server::{KeysArgs, ServeArgs};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "airlockd",
    version,
    about = "The Airlock daemon: sandboxes behind an HTTP API"
)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the OpenAPI document of the /v1 API.
    Openapi,
    /// Manage API keys (works without a running daemon).
    Keys(KeysArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match &cli.command {
        None => airlock_server::serve(&cli.serve).map_err(Into::into),
        Some(Command::Openapi) => {
            print!("{}", airlock_server::openapi::document_json());
            Ok(())
        }
        Some(Command::Keys(args)) => {
            airlock_server::keys_cmd::run(args, &mut std::io::stdout(), &mut std::io::stderr())
                .map_err(Into::into)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let chain: Vec<String> = err.chain().map(ToString::to_string).collect();
            eprintln!("airlockd: error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}
