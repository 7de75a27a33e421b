//! The daemon's options (shared by `airlockd` and `airlock serve`) and its state directory.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// File name of the store inside the state directory.
pub const STORE_FILE: &str = "airlock.db";
/// Per-sandbox directories live here, one `<id>` each (mode 0700).
pub const SANDBOXES_DIR: &str = "sandboxes";
/// Held with an exclusive lock while a daemon runs, so two cannot share a state directory.
pub const LOCK_FILE: &str = "airlockd.lock";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot create the state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no state directory: neither $XDG_STATE_HOME nor $HOME is set; pass --state-dir")]
    NoStateDir,
    #[error("--insecure-no-auth is refused on {0}: it is allowed only on a loopback address")]
    NoAuthNotLoopback(SocketAddr),
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("--workspace-root {0} must be an existing directory other than /")]
    WorkspaceRoot(PathBuf),
}

/// Options of the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// Where the store and the per-sandbox directories live
    /// [default: /var/lib/airlock as root, else $XDG_STATE_HOME/airlock or ~/.local/state/airlock].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Accept requests without an API key. Only allowed on a loopback address.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// The most sandboxes that may exist at once; past it creates get 503.
    #[arg(long, default_value_t = 1024)]
    pub max_sandboxes: usize,
    /// The largest JSON request body; past it requests get 413.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub max_body_bytes: u64,
    /// The largest file upload; past it uploads get 413. Uploads are streamed, never buffered.
    #[arg(long, default_value = "10GiB", value_parser = parse_size)]
    pub max_upload_bytes: u64,
    /// Lifetime of a sandbox whose create request gives no timeout_ms (e.g. 30s, 5m, 2h).
    #[arg(long = "default-timeout", value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub default_timeout_ms: u64,
    /// The longest lifetime a sandbox may ask for (create or set-timeout); longer is 422.
    #[arg(long = "max-timeout", value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub max_timeout_ms: u64,
    /// Host directories under this one may be bound as a sandbox's /workspace (API
    /// `workspace: {type: host}`). Without it, host workspaces are refused: an API key would
    /// otherwise be a key to every directory on the host.
    #[arg(long, value_name = "DIR")]
    pub workspace_root: Option<PathBuf>,
}

fn parse_size(value: &str) -> Result<u64, String> {
    airlock_api::parse_size_bytes(value).map_err(|e| e.to_string())
}

fn parse_duration(value: &str) -> Result<u64, String> {
    airlock_api::parse_duration_ms(value).map_err(|e| e.to_string())
}

/// The checked configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    pub no_auth: bool,
    pub max_sandboxes: usize,
    pub max_body_bytes: u64,
    pub max_upload_bytes: u64,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    /// Canonical; host workspaces must lie beneath it.
    pub workspace_root: Option<PathBuf>,
}

impl Config {
    pub fn from_args(args: &ServeArgs) -> Result<Config, ConfigError> {
        if args.insecure_no_auth && !args.listen.ip().is_loopback() {
            return Err(ConfigError::NoAuthNotLoopback(args.listen));
        }
        for (name, value) in [
            ("--max-sandboxes", args.max_sandboxes as u64),
            ("--max-body-bytes", args.max_body_bytes),
            ("--max-upload-bytes", args.max_upload_bytes),
            ("--default-timeout", args.default_timeout_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        let state_dir = match &args.state_dir {
            Some(dir) => dir.clone(),
            None => default_state_dir()?,
        };
        let workspace_root = args
            .workspace_root
            .as_ref()
            .map(|dir| match std::fs::canonicalize(dir) {
                Ok(dir) if dir.is_dir() && dir != Path::new("/") => Ok(dir),
                _ => Err(ConfigError::WorkspaceRoot(dir.clone())),
            })
            .transpose()?;
        Ok(Config {
            listen: args.listen,
            state_dir,
            no_auth: args.insecure_no_auth,
            max_sandboxes: args.max_sandboxes,
            max_body_bytes: args.max_body_bytes,
            max_upload_bytes: args.max_upload_bytes,
            default_timeout_ms: args.default_timeout_ms,
            max_timeout_ms: args.max_timeout_ms.max(args.default_timeout_ms),
            workspace_root,
        })
    }

    pub fn sandboxes_dir(&self) -> PathBuf {
        self.state_dir.join(SANDBOXES_DIR)
    }

    pub fn store_path(&self) -> PathBuf {
        self.state_dir.join(STORE_FILE)
    }
}

/// `/var/lib/airlock` for root, else `$XDG_STATE_HOME/airlock` or `~/.local/state/airlock`.
pub fn default_state_dir() -> Result<PathBuf, ConfigError> {
    // /proc/self belongs to the process's effective uid; no unsafe geteuid needed.
    let is_root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if is_root {
        return Ok(PathBuf::from("/var/lib/airlock"));
    }
    if let Some(xdg) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(xdg).join("airlock"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/state/airlock")),
        None => Err(ConfigError::NoStateDir),
    }
}

/// Creates the state directory and its `sandboxes/` (both 0700) if missing.
pub fn prepare_state_dir(state_dir: &Path) -> Result<(), ConfigError> {
    for dir in [state_dir.to_owned(), state_dir.join(SANDBOXES_DIR)] {
        let err = |source| ConfigError::StateDir {
            path: dir.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(err)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    Ok(())
}
