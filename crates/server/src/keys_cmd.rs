//! `keys create|ls|revoke`: API key management on the store, without a running daemon.
//! `airlockd keys` and `airlock keys` are both thin wrappers over [`run`].

use std::io::Write;
use std::path::PathBuf;

use crate::auth::{self, AuthError};
use crate::config::{ConfigError, default_state_dir};

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("cannot write the output")]
    Output(#[source] std::io::Error),
}

#[derive(Debug, Clone, clap::Args)]
pub struct KeysArgs {
    /// The daemon's state directory (same default as the daemon's).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum KeysCommand {
    /// Create an API key and print it on stdout; it is shown only this once.
    Create {
        /// A name to recognise the key by.
        #[arg(default_value = "default")]
        name: String,
        /// Print the key as `e2b_<hex>`, the form the E2B SDKs require (E2B_API_KEY). Both
        /// spellings of a key work with both APIs.
        #[arg(long)]
        e2b: bool,
    },
    /// List keys (id, name, creation and revocation times); never the keys themselves.
    Ls,
    /// Revoke the active key(s) with this id or name.
    Revoke { id_or_name: String },
}

/// Runs a keys command; the key (create) or table (ls) goes to `out`, notes to `err`.
pub fn run(args: &KeysArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), KeysError> {
    let state_dir = match &args.state_dir {
        Some(dir) => dir.clone(),
        None => default_state_dir()?,
    };
    let store = auth::open_state_store(&state_dir)?;
    let write =
        |w: &mut dyn Write, text: String| w.write_all(text.as_bytes()).map_err(KeysError::Output);
    match &args.command {
        KeysCommand::Create { name, e2b } => {
            let key = auth::create_key(&store, name)?;
            let shown = if *e2b {
                auth::e2b_key(&key.key)
            } else {
                key.key.clone()
            };
            write(out, format!("{shown}\n"))?;
            write(
                err,
                format!(
                    "created API key {} ({}); it is shown only once\n",
                    key.id, key.name
                ),
            )?;
        }
        KeysCommand::Ls => {
            let mut table = format!(
                "{:<14} {:<24} {:<15} {}\n",
                "ID", "NAME", "CREATED_MS", "REVOKED_MS"
            );
            for key in auth::list_keys(&store)? {
                let revoked = key.revoked_ms.map_or("-".to_owned(), |ms| ms.to_string());
                table.push_str(&format!(
                    "{:<14} {:<24} {:<15} {revoked}\n",
                    key.id, key.name, key.created_ms
                ));
            }
            write(out, table)?;
        }
        KeysCommand::Revoke { id_or_name } => {
            let count = auth::revoke_key(&store, id_or_name)?;
            write(err, format!("revoked {count} key(s)\n"))?;
        }
    }
    Ok(())
}
