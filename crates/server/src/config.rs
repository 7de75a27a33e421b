//! The daemon's options (shared by `airlockd` and `airlock serve`) and its state directory.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_egress::{TestResolver, Webhook};

use crate::store::StoreError;

/// File name of the store inside the state directory.
pub const STORE_FILE: &str = "airlock.db";
/// Per-sandbox directories live here, one `<id>` each (mode 0700).
pub const SANDBOXES_DIR: &str = "sandboxes";
/// Audit lines, one JSON object each: the daemon's in the state directory, and each sandbox's
/// in its directory.
pub const AUDIT_FILE: &str = "audit.jsonl";
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
    #[error("{name} must be at most 24h, the API's longest sandbox lifetime")]
    TooLong { name: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("--workspace-root {0} must be an existing directory other than /")]
    WorkspaceRoot(PathBuf),
    #[error("--reviewer-webhook")]
    Webhook(#[source] airlock_egress::WebhookError),
    #[error(
        "--test-egress-resolve and --test-egress-roots are test equipment, refused unless the daemon listens on loopback (not {0})"
    )]
    TestEgressNotLoopback(SocketAddr),
    #[error(
        "--test-egress-resolve: {0:?} is not NAME=IP:PORT with a loopback IP (test upstreams run on this host)"
    )]
    TestResolve(String),
    #[error("--test-egress-roots: cannot read {0}")]
    TestRoots(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Judge0(#[from] crate::judge0::Judge0ConfigError),
    #[error("{flag}: {why}")]
    Forge { flag: &'static str, why: String },
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
    /// The longest lifetime a sandbox may ask for (create or set-timeout); longer is 422. At
    /// most 24h, the API's own limit.
    #[arg(long = "max-timeout", value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub max_timeout_ms: u64,
    /// Host directories under this one may be bound as a sandbox's /workspace (API
    /// `workspace: {type: host}`). Without it, host workspaces are refused: an API key would
    /// otherwise be a key to every directory on the host.
    #[arg(long, value_name = "DIR")]
    pub workspace_root: Option<PathBuf>,
    /// Where requests held under a policy's `approvals: ask` are also sent for review: an
    /// `http://` URL that receives `{"approval": {...}}` and may answer
    /// `{"decision": "once"|"always"|"deny"}` (an automated reviewer).
    #[arg(long, value_name = "URL")]
    pub reviewer_webhook: Option<String>,
    /// The most bytes an audit log (`<state>/audit.jsonl`, each sandbox's `audit.jsonl`) holds
    /// before it is rotated to `.1` (one older file is kept).
    #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
    pub audit_max_bytes: u64,
    /// A sandbox frozen (paused with its memory) this long is turned into a filesystem-only
    /// pause, which frees its memory: its processes end, its files stay (an event says so).
    /// Off by default.
    #[arg(long = "pause-to-disk-after", value_name = "DURATION", value_parser = parse_duration)]
    pub pause_to_disk_after_ms: Option<u64>,
    /// A sandbox paused this long is deleted. Off by default: paused sandboxes are kept until
    /// deleted.
    #[arg(long = "paused-retention", value_name = "DURATION", value_parser = parse_duration)]
    pub paused_retention_ms: Option<u64>,
    /// Where each sandbox's scratch space (`/tmp` and a fresh `/workspace`, one budget of its
    /// `disk_bytes`) lives: `disk` (a btrfs image in the state directory, one volume with a
    /// quota per sandbox: files survive anything the processes do), `memory` (a tmpfs, whose
    /// size the sandbox's memory limit also holds), or `auto` (disk when this host can, else
    /// memory; the choice is logged at start).
    #[arg(long, value_enum, default_value = "auto")]
    pub scratch: ScratchMode,
    /// The size of the disk scratch image, reserved on the host's disk when it is first made
    /// [default: half the state directory's free space, at most 16GiB].
    #[arg(long = "storage-size", value_name = "SIZE", value_parser = parse_size)]
    pub storage_size_bytes: Option<u64>,
    /// How long lifecycle events (the store's, as in `GET .../logs`) are kept; older ones are
    /// deleted while the daemon runs (e.g. 30m, 24h).
    #[arg(long = "events-retention", value_name = "DURATION", default_value = "168h", value_parser = parse_duration)]
    pub events_retention_ms: u64,
    /// The most lifecycle events kept; past it the oldest are deleted while the daemon runs.
    #[arg(long, value_name = "ROWS", default_value_t = 100_000)]
    pub events_max: u64,
    /// Run the `base` template (a create that names no template or image) on the container
    /// tier over this image of the daemon's store (`<state>/images`) instead of the host's
    /// root. Checked at start: the image must be in the store.
    #[arg(long, value_name = "REF")]
    pub base_image: Option<String>,
    /// The longest one `RUN` of a template build may take; it is killed then and the build
    /// fails at that step.
    #[arg(long = "build-step-timeout", value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    pub build_step_timeout_ms: u64,
    /// Where the repository cache (bare mirrors of the repositories sandboxes are created
    /// from, one per URL) lives [default: <state>/git-cache].
    #[arg(long, value_name = "DIR")]
    pub git_cache: Option<PathBuf>,
    /// A GitHub-compatible forge API (e.g. https://api.github.com, https://HOST/api/v3 for
    /// GitHub Enterprise, https://HOST/api/v1 for Gitea) where `.../git/pull-request` opens
    /// pull requests with the forge token. Plain http:// only on a loopback address.
    #[arg(long, value_name = "URL")]
    pub forge_api: Option<String>,
    /// The git host (HOST or HOST:PORT) whose repositories get the forge token as their
    /// credential, injected by each sandbox's egress proxy [default: the API's host, without
    /// a leading `api.`].
    #[arg(long, value_name = "HOST[:PORT]")]
    pub forge_git_host: Option<String>,
    /// The environment variable of the daemon that holds the forge token (read on the host,
    /// never shown to a sandbox).
    #[arg(long, value_name = "VAR", conflicts_with = "forge_token_file")]
    pub forge_token_env: Option<String>,
    /// A file that holds the forge token (a trailing newline is trimmed).
    #[arg(long, value_name = "PATH")]
    pub forge_token_file: Option<PathBuf>,
    /// The Basic username git sends with the token as the password.
    #[arg(long, value_name = "NAME", default_value = "x-access-token")]
    pub forge_git_username: String,
    /// How the daemon's log lines on stderr look: `text` for people, `json` (one object per
    /// line, with the fields of each event) for log collectors.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// The least severe log lines written: error, warn, info or debug.
    #[arg(long, value_enum, default_value = "info")]
    pub log_level: LogLevel,
    /// Keep N sandboxes of TEMPLATE started and ready, so that creates for it only claim one
    /// (repeatable; stored, as `PUT /v1/templates/{name}/pool` is, until changed).
    #[arg(long = "warm-pool", value_name = "TEMPLATE=N", value_parser = parse_warm_pool)]
    pub warm_pools: Vec<(String, u32)>,
    /// How many warm-pool members are started at once (never while a cold create waits).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub pool_fill_concurrency: usize,
    /// TEST EQUIPMENT, like curl's --resolve: the egress proxies of `proxy`-mode sandboxes
    /// resolve NAME to the loopback upstream IP:PORT (comma-separated list) instead of DNS,
    /// and nothing else resolves. Refused unless --listen is loopback.
    #[arg(long, value_name = "NAME=IP:PORT,...", hide = true)]
    pub test_egress_resolve: Option<String>,
    /// TEST EQUIPMENT: a PEM file of extra roots the egress proxies trust for upstreams (the
    /// test upstreams' CA). Refused unless --listen is loopback.
    #[arg(long, value_name = "FILE", hide = true)]
    pub test_egress_roots: Option<PathBuf>,
    #[command(flatten)]
    pub judge0: crate::judge0::Judge0Args,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

/// `--scratch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScratchMode {
    Auto,
    Disk,
    Memory,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// What the daemon's egress proxies are started with.
#[derive(Debug, Clone, Default)]
pub struct EgressConfig {
    pub reviewer_webhook: Option<Webhook>,
    /// Test equipment only (`--test-egress-resolve`).
    pub test_resolver: Option<Arc<TestResolver>>,
    /// Test equipment only (`--test-egress-roots`).
    pub test_roots_pem: Vec<String>,
}

impl EgressConfig {
    fn from_args(args: &ServeArgs) -> Result<EgressConfig, ConfigError> {
        let reviewer_webhook = args
            .reviewer_webhook
            .as_deref()
            .map(Webhook::new)
            .transpose()
            .map_err(ConfigError::Webhook)?;
        let testing = args.test_egress_resolve.is_some() || args.test_egress_roots.is_some();
        if testing && !args.listen.ip().is_loopback() {
            return Err(ConfigError::TestEgressNotLoopback(args.listen));
        }
        let test_resolver = match &args.test_egress_resolve {
            None => None,
            Some(list) => {
                let resolver = TestResolver::new();
                for entry in list.split(',').filter(|e| !e.is_empty()) {
                    let bad = || ConfigError::TestResolve(entry.to_owned());
                    let (name, addr) = entry.split_once('=').ok_or_else(bad)?;
                    let addr: SocketAddr = addr.parse().map_err(|_| bad())?;
                    if name.is_empty() || !is_loopback(addr.ip()) {
                        return Err(bad());
                    }
                    resolver.upstream(name, addr);
                }
                Some(Arc::new(resolver))
            }
        };
        let test_roots_pem = match &args.test_egress_roots {
            None => Vec::new(),
            Some(path) => vec![
                std::fs::read_to_string(path)
                    .map_err(|e| ConfigError::TestRoots(path.clone(), e))?,
            ],
        };
        Ok(EgressConfig {
            reviewer_webhook,
            test_resolver,
            test_roots_pem,
        })
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

fn parse_size(value: &str) -> Result<u64, String> {
    airlock_api::parse_size_bytes(value).map_err(|e| e.to_string())
}

fn parse_warm_pool(value: &str) -> Result<(String, u32), String> {
    let (template, size) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not TEMPLATE=N"))?;
    if template.is_empty() {
        return Err(format!("{value:?} names no template"));
    }
    let size = size
        .parse::<u32>()
        .ok()
        .filter(|size| *size <= airlock_api::v1::MAX_POOL_SIZE)
        .ok_or_else(|| {
            format!(
                "{size:?} is not a pool size (0 to {})",
                airlock_api::v1::MAX_POOL_SIZE
            )
        })?;
    Ok((template.to_owned(), size))
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
    pub egress: EgressConfig,
    pub audit_max_bytes: u64,
    pub pause_to_disk_after_ms: Option<u64>,
    pub paused_retention_ms: Option<u64>,
    pub scratch: ScratchMode,
    pub storage_size_bytes: Option<u64>,
    pub events_retention_ms: u64,
    pub events_max: u64,
    pub base_image: Option<String>,
    pub build_step_timeout_ms: u64,
    /// The Judge0 API, when `--judge0-listen` is given.
    pub judge0: Option<crate::judge0::Judge0Config>,
    pub git_cache: Option<PathBuf>,
    pub forge: crate::forge::ForgeConfig,
    pub warm_pools: Vec<(String, u32)>,
    pub pool_fill_concurrency: usize,
    /// TLS for host-routed traffic on the same listener (`crate::tls`).
    pub tls: crate::tls::TlsSetting,
}

/// The daemon's image store, inside the state directory.
pub const IMAGES_DIR: &str = "images";
/// Template builds' scratch space and uploaded file contexts.
pub const BUILDS_DIR: &str = "builds";

impl Config {
    pub fn from_args(args: &ServeArgs) -> Result<Config, ConfigError> {
        if args.insecure_no_auth && !args.listen.ip().is_loopback() {
            return Err(ConfigError::NoAuthNotLoopback(args.listen));
        }
        if let Some(judge0) = args.judge0.listen
            && args.insecure_no_auth
            && !judge0.ip().is_loopback()
        {
            return Err(ConfigError::NoAuthNotLoopback(judge0));
        }
        for (name, value) in [
            ("--max-sandboxes", args.max_sandboxes as u64),
            ("--max-body-bytes", args.max_body_bytes),
            ("--max-upload-bytes", args.max_upload_bytes),
            ("--default-timeout", args.default_timeout_ms),
            ("--audit-max-bytes", args.audit_max_bytes),
            ("--events-max", args.events_max),
            ("--build-step-timeout", args.build_step_timeout_ms),
            ("--pool-fill-concurrency", args.pool_fill_concurrency as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        for (name, value) in [
            ("--default-timeout", args.default_timeout_ms),
            ("--max-timeout", args.max_timeout_ms),
        ] {
            if value > airlock_api::v1::MAX_TIMEOUT_MS {
                return Err(ConfigError::TooLong { name });
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
            egress: EgressConfig::from_args(args)?,
            audit_max_bytes: args.audit_max_bytes,
            pause_to_disk_after_ms: args.pause_to_disk_after_ms,
            paused_retention_ms: args.paused_retention_ms,
            scratch: args.scratch,
            storage_size_bytes: args.storage_size_bytes,
            events_retention_ms: args.events_retention_ms,
            events_max: args.events_max,
            base_image: args.base_image.clone(),
            build_step_timeout_ms: args.build_step_timeout_ms,
            judge0: crate::judge0::Judge0Config::from_args(&args.judge0)?,
            git_cache: args.git_cache.clone(),
            forge: crate::forge::ForgeConfig::from_args(args)?,
            warm_pools: args.warm_pools.clone(),
            pool_fill_concurrency: args.pool_fill_concurrency,
            tls: crate::tls::TlsSetting::from_args(&args.tls, args.listen.ip().is_loopback()),
        })
    }

    pub fn sandboxes_dir(&self) -> PathBuf {
        self.state_dir.join(SANDBOXES_DIR)
    }

    pub fn store_path(&self) -> PathBuf {
        self.state_dir.join(STORE_FILE)
    }

    pub fn images_dir(&self) -> PathBuf {
        self.state_dir.join(IMAGES_DIR)
    }

    pub fn builds_dir(&self) -> PathBuf {
        self.state_dir.join(BUILDS_DIR)
    }

    /// The repository cache's root.
    pub fn git_cache_dir(&self) -> PathBuf {
        self.git_cache
            .clone()
            .unwrap_or_else(|| self.state_dir.join("git-cache"))
    }

    /// The daemon-wide audit log.
    pub fn audit_path(&self) -> PathBuf {
        self.state_dir.join(AUDIT_FILE)
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
