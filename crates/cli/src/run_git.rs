//! `airlock run --git URL[@REF] [--branch NAME]`: the command runs in a clone of the
//! repository, on its own branch, with the same access rules as the daemon's repository
//! sandboxes (`airlock_runtime::git`): the policy gains the repository's rule (pushes to the
//! branch only) and, with `--git-token-env`/`--git-token-file`, the token as a placeholder
//! credential. The mirror (in `--git-cache`, default `RepoCache::default_root()`) is updated through an egress proxy
//! of the same plan, placeholders and audit log as the sandbox's own; the sandbox gets copies
//! of its packs in its workspace, and its own git checks the branch out before the command.
//! The workspace is `--workspace DIR` (empty or new, and kept), or a fresh directory under
//! /var/tmp that is removed after the run.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use airlock_api::SandboxConfig;
use airlock_api::WorkspaceSource;
use airlock_api::policy::{CredentialSourceSpec, PolicyDocument};
use airlock_egress::Placeholders;
use airlock_runtime::git::{
    ACCESS_NAME, CHECKOUT_SCRIPT, GitCredential, ProxyBridge, RepoCache, RepoUrl, Transport,
    WORKSPACE, basic_header, check_branch, checkout_env, grant_repository, split_url_ref,
};
use airlock_runtime::{EgressOptions, EgressSession, Runtime};
use anyhow::{Context, bail};
use clap::Args;

#[derive(Debug, Default, Args)]
pub struct GitArgs {
    /// Run in a clone of this repository (https:// or http:// smart HTTP) at REF (a branch,
    /// tag or commit; default: its default branch), fetched through the egress proxy.
    #[arg(long, value_name = "URL[@REF]")]
    pub git: Option<String>,
    /// The branch made from REF, the only one the sandbox may push to
    /// [default: airlock/run-<pid>].
    #[arg(long, value_name = "NAME", requires = "git")]
    pub branch: Option<String>,
    /// The host's environment variable that holds the repository host's token (the sandbox
    /// sees a placeholder in $AIRLOCK_GIT_TOKEN and in its git config).
    #[arg(
        long,
        value_name = "VAR",
        requires = "git",
        conflicts_with = "git_token_file"
    )]
    pub git_token_env: Option<String>,
    /// A file that holds the repository host's token.
    #[arg(long, value_name = "PATH", requires = "git")]
    pub git_token_file: Option<PathBuf>,
    /// The Basic username sent with the token.
    #[arg(long, value_name = "NAME", default_value = airlock_runtime::git::DEFAULT_USERNAME)]
    pub git_username: String,
    /// The repository cache [default: /var/lib/airlock/git-cache as root, else
    /// $XDG_CACHE_HOME/airlock/git].
    #[arg(long, value_name = "DIR", requires = "git")]
    pub git_cache: Option<PathBuf>,
}

/// What `prepare` made: the workspace to remove after the run, if it is a temporary one.
#[derive(Debug)]
pub struct Prepared {
    pub options: EgressOptions,
    temporary: Option<PathBuf>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some(dir) = self.temporary.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn workspace_dir(config: &SandboxConfig) -> anyhow::Result<(PathBuf, bool)> {
    if let WorkspaceSource::Host { path } = &config.workspace {
        if path.exists() {
            let empty = std::fs::read_dir(path)
                .with_context(|| format!("reading {}", path.display()))?
                .next()
                .is_none();
            if !empty {
                bail!(
                    "--git needs an empty or new --workspace; {} has files",
                    path.display()
                );
            }
        } else {
            std::fs::create_dir_all(path)
                .with_context(|| format!("creating {}", path.display()))?;
        }
        return Ok((path.clone(), false));
    }
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = PathBuf::from(format!("/var/tmp/airlock-git-{}-{n}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok((dir, true))
}

/// Lends `dir` and everything in it to uid:gid (a root caller's sandbox user other than 0).
fn chown_tree(dir: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() && !path.is_symlink() {
            chown_tree(&path, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

/// Grants the repository in `config`'s policy, fills the workspace from the cache, and wraps
/// the command in the checkout. `options` are the sandbox's egress options (test resolver,
/// audit log); the fetch gets the same.
pub fn prepare(
    runtime: &Runtime,
    config: &mut SandboxConfig,
    args: &GitArgs,
    options: impl Fn() -> anyhow::Result<EgressOptions>,
) -> anyhow::Result<Prepared> {
    let Some(git) = &args.git else {
        bail!("no --git");
    };
    let (url, reference) = split_url_ref(git);
    let repo = RepoUrl::parse(url)?;
    let branch = args
        .branch
        .clone()
        .unwrap_or_else(|| format!("airlock/run-{}", std::process::id()));
    check_branch(&branch)?;
    let credential = match (&args.git_token_env, &args.git_token_file) {
        (Some(var), _) => Some(CredentialSourceSpec::Env(var.clone())),
        (None, Some(path)) => Some(CredentialSourceSpec::File(
            std::path::absolute(path)?.display().to_string(),
        )),
        (None, None) => None,
    }
    .map(|source| GitCredential {
        source,
        username: args.git_username.clone(),
    });
    let mut document = config.policy.take().map_or_else(
        || PolicyDocument {
            version: 1,
            ..PolicyDocument::default()
        },
        |doc| *doc,
    );
    grant_repository(&mut document, &repo, &branch, credential.as_ref())?;
    airlock_policy::Policy::from_document(&document)
        .map_err(|e| anyhow::anyhow!("the policy with the repository's access: {e}"))?;
    config.policy = Some(Box::new(document));

    let plan = runtime
        .egress_plan(config)?
        .context("the repository's policy has no egress plan")?;
    let mut placeholders = Placeholders::new();
    if credential.is_some() {
        placeholders.insert(
            ACCESS_NAME.to_owned(),
            airlock_egress::generate_placeholder(ACCESS_NAME)?,
        );
    }
    // The fetch's proxy: the sandbox's plan, placeholders and audit log, in a private directory.
    let scratch = tempdir("airlock-git-proxy")?;
    let mut fetch_options = options()?;
    fetch_options.placeholders = Some(placeholders.clone());
    let session = EgressSession::start("git-fetch", &plan, &scratch.0, fetch_options, None)?;
    let bridge = ProxyBridge::start(session.proxy().clone(), None)?;
    let header = placeholders
        .get(ACCESS_NAME)
        .map(|p| basic_header(&args.git_username, p));
    let transport = Transport {
        proxy_url: bridge.proxy_url(),
        ca_file: repo.tls.then(|| {
            scratch
                .0
                .join("egress")
                .join(airlock_policy::EGRESS_TRUST_BUNDLE)
        }),
        auth_header: header.clone(),
    };
    let root = args
        .git_cache
        .clone()
        .unwrap_or_else(RepoCache::default_root);
    let cache = RepoCache::open(&root)?;
    let lock = cache.lock(&repo)?;
    lock.update(&transport)?;
    let resolved = lock.resolve(reference, &transport)?;
    let export = lock.export()?;
    drop(bridge);
    drop(session);

    let (dir, temporary) = workspace_dir(config)?;
    let mut prepared = Prepared {
        options: EgressOptions::default(),
        temporary: temporary.then(|| dir.clone()),
    };
    let pack_dir = dir.join(".git/objects/pack");
    std::fs::create_dir_all(&pack_dir)?;
    for (source, name) in &export.files {
        std::fs::copy(source, pack_dir.join(name))
            .with_context(|| format!("copying {}", source.display()))?;
    }
    std::fs::write(dir.join(".git/packed-refs"), &export.packed_refs)?;
    drop(lock);
    let root_caller = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if root_caller && config.user.uid != 0 {
        chown_tree(&dir, config.user.uid, config.user.gid)?;
    }
    config.workspace = WorkspaceSource::Host { path: dir };
    for (key, value) in checkout_env(WORKSPACE, &repo, &branch, &resolved, header.as_deref()) {
        config.env.push((key, value));
    }
    let script = format!(
        "( {CHECKOUT_SCRIPT} ) || exit 125\nunset AIRLOCK_GIT_DIR AIRLOCK_GIT_URL AIRLOCK_GIT_BRANCH AIRLOCK_GIT_COMMIT AIRLOCK_GIT_DEFAULT AIRLOCK_GIT_HEADER\nexec \"$@\""
    );
    let mut command = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script,
        "airlock-git".to_owned(),
    ];
    command.append(&mut config.command);
    config.command = command;
    prepared.options = options()?;
    prepared.options.placeholders = Some(placeholders);
    Ok(prepared)
}

/// A private (0700) directory removed on drop.
struct TempDir(PathBuf);

fn tempdir(prefix: &str) -> anyhow::Result<TempDir> {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok(TempDir(dir))
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
