//! Workspaces from git repositories: a sandbox's `/workspace` starts as a clone of a repository
//! on a branch of its own, and the sandbox reaches the repository only through its egress
//! proxy, with a credential it never sees.
//!
//! - **Access** ([`grant_repository`]): the sandbox's policy gains an egress rule for the
//!   repository's smart-HTTP endpoints alone (`info/refs`, `git-upload-pack`,
//!   `git-receive-pack` under its path) whose `git_push_refs` is the sandbox's branch, and,
//!   when the host holds a token for the repository's host, a credential bound to the same
//!   endpoints, injected as `Authorization: Basic` (username `x-access-token` by default).
//!   The sandbox's `.git/config` carries the placeholder in an `http.<url>.extraHeader`.
//! - **Cache** ([`cache`]): bare mirrors on the host, one per URL, updated through the
//!   sandbox's own proxy (so the clone obeys the sandbox's policy and is audited as its
//!   traffic) by a host `git` that reaches the proxy through a loopback [`ProxyBridge`].
//! - **Hand-over** ([`Export`], [`CHECKOUT_SCRIPT`]): a sandbox never shares a file with the
//!   mirror. It gets copies of the mirror's pack files and a `packed-refs` file, and its own
//!   git builds the working tree inside the sandbox.

pub mod bridge;
pub mod cache;

use airlock_api::policy::{
    CredentialEndpoint, CredentialPolicy, CredentialSourceSpec, EgressPolicy, InjectSpec,
    NetworkMode, PolicyDocument,
};
use base64::Engine as _;

pub use bridge::{BridgeError, ProxyBridge};
pub use cache::{CacheError, Export, MirrorLock, RepoCache, Resolved, Transport};

/// The name of the egress rule and of the credential that [`grant_repository`] adds.
pub const ACCESS_NAME: &str = "airlock-git";
/// The sandbox's variable that holds the repository credential's placeholder.
pub const PLACEHOLDER_ENV: &str = "AIRLOCK_GIT_TOKEN";
/// The Basic username GitHub (and Gitea, GitLab) take with a token as the password.
pub const DEFAULT_USERNAME: &str = "x-access-token";
/// Where the repository is checked out inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GitError {
    #[error("repository URL {url:?} {why}")]
    BadUrl { url: String, why: &'static str },
    #[error(
        "branch {0:?} is not a branch name git accepts (letters, digits, `-`, `_`, `.`, `/`; no `..`, no leading `-`)"
    )]
    BadBranch(String),
    #[error(
        "ref {0:?} is not a branch, tag or commit name git accepts (no spaces, `..`, `:`, `^`, `~`, `?`, `*`, `[`, `\\`, no leading `-`)"
    )]
    BadRef(String),
    #[error(
        "the policy's network.mode is `full`; a repository workspace needs `proxy` (or no mode), whose proxy enforces the branch"
    )]
    FullNetwork,
    #[error(
        "the policy already has an egress rule or a credential named `{ACCESS_NAME}`, which Airlock reserves for the repository"
    )]
    NameTaken,
}

/// A repository's smart-HTTP URL, checked and normalized (`scheme://host[:port]/path`, no
/// credentials, query or fragment, no trailing `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoUrl {
    pub url: String,
    pub tls: bool,
    /// Lower case; an IPv6 address without brackets.
    pub host: String,
    pub port: u16,
    /// Starts with `/`; only letters, digits and `-._~+` between slashes.
    pub path: String,
}

impl RepoUrl {
    pub fn parse(raw: &str) -> Result<RepoUrl, GitError> {
        let bad = |why| GitError::BadUrl {
            url: raw.to_owned(),
            why,
        };
        let (tls, rest) = if let Some(rest) = raw.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = raw.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad(
                "must start with https:// or http:// (git's smart HTTP)",
            ));
        };
        let (authority, path) = rest.split_at(rest.find('/').ok_or_else(|| bad("has no path"))?);
        if authority.contains('@') {
            return Err(bad(
                "carries credentials; give the token to the daemon (--forge-token-env) instead",
            ));
        }
        let (host_text, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("has a bad port"))?;
                (host, port)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        let host = airlock_egress::parse_host(host_text)
            .map_err(|_| bad("has a bad host"))?
            .canonical();
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        let path = path.trim_end_matches('/');
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let plain = |s: &&str| {
            !s.is_empty()
                && *s != "."
                && *s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~+".contains(&b))
        };
        if segments.is_empty() || !segments.iter().all(plain) {
            return Err(bad(
                "needs a path of plain segments (letters, digits, `-._~+`), without `.`, `..`, a query or a fragment",
            ));
        }
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let default_port = if tls { 443 } else { 80 };
        let authority = if port == default_port {
            bracketed
        } else {
            format!("{bracketed}:{port}")
        };
        let scheme = if tls { "https" } else { "http" };
        Ok(RepoUrl {
            url: format!("{scheme}://{authority}{path}"),
            tls,
            host,
            port,
            path: path.to_owned(),
        })
    }

    /// The smart-HTTP endpoints under the repository's path.
    pub fn endpoints(&self) -> Vec<String> {
        ["info/refs", "git-upload-pack", "git-receive-pack"]
            .iter()
            .map(|tail| format!("{}/{tail}", self.path))
            .collect()
    }

    /// `owner` and `repo` of a GitHub-style path (`/owner/repo[.git]`), if it is one.
    pub fn owner_repo(&self) -> Option<(String, String)> {
        let mut segments = self.path.trim_start_matches('/').split('/');
        let (Some(owner), Some(repo), None) = (segments.next(), segments.next(), segments.next())
        else {
            return None;
        };
        let repo = repo.strip_suffix(".git").unwrap_or(repo);
        (!repo.is_empty()).then(|| (owner.to_owned(), repo.to_owned()))
    }
}

/// `URL@REF` as the command line takes it: the last `@` after the URL's host starts the ref.
pub fn split_url_ref(text: &str) -> (&str, Option<&str>) {
    let host_start = text.find("://").map_or(0, |i| i + 3);
    let path_start = text[host_start..]
        .find('/')
        .map_or(text.len(), |i| host_start + i);
    match text[path_start..].rfind('@') {
        Some(at) => (&text[..path_start + at], Some(&text[path_start + at + 1..])),
        None => (text, None),
    }
}

fn ref_text_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('-')
        && !name.starts_with('/')
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("@{")
        && name != "@"
        && !name.split('/').any(|s| s.starts_with('.'))
        && !name.chars().any(|c| {
            c.is_control()
                || c.is_whitespace()
                || matches!(c, '~' | '^' | ':' | '?' | '*' | '[' | '\\')
        })
}

/// Checks a branch name (without `refs/heads/`).
pub fn check_branch(name: &str) -> Result<(), GitError> {
    if ref_text_ok(name) && name != "HEAD" {
        Ok(())
    } else {
        Err(GitError::BadBranch(name.to_owned()))
    }
}

/// Checks what `ref` may name: a branch, a tag or a commit id.
pub fn check_ref(name: &str) -> Result<(), GitError> {
    if ref_text_ok(name) {
        Ok(())
    } else {
        Err(GitError::BadRef(name.to_owned()))
    }
}

/// A token the host holds for the repository's host, and the Basic username it goes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitCredential {
    pub source: CredentialSourceSpec,
    pub username: String,
}

/// Adds to `doc` the repository's egress rule (its smart-HTTP endpoints, pushes only to
/// `refs/heads/<branch>`) and, with `credential`, the credential bound to those endpoints;
/// `network.mode` becomes `proxy`.
pub fn grant_repository(
    doc: &mut PolicyDocument,
    repo: &RepoUrl,
    branch: &str,
    credential: Option<&GitCredential>,
) -> Result<(), GitError> {
    check_branch(branch)?;
    match doc.network.mode {
        Some(NetworkMode::Full) => return Err(GitError::FullNetwork),
        None | Some(NetworkMode::None) | Some(NetworkMode::Proxy) => {}
    }
    let taken = doc
        .network
        .egress
        .iter()
        .any(|r| r.name.as_deref() == Some(ACCESS_NAME) || r.host == ACCESS_NAME)
        || doc.credentials.iter().any(|c| c.name == ACCESS_NAME);
    if taken {
        return Err(GitError::NameTaken);
    }
    doc.network.mode = Some(NetworkMode::Proxy);
    let methods = vec!["GET".to_owned(), "POST".to_owned()];
    doc.network.egress.push(EgressPolicy {
        name: Some(ACCESS_NAME.to_owned()),
        host: repo.host.clone(),
        ports: vec![repo.port],
        access: None,
        methods: methods.clone(),
        paths: repo.endpoints(),
        allowed_ips: Vec::new(),
        git_push_refs: Some(vec![format!("refs/heads/{branch}")]),
    });
    if let Some(credential) = credential {
        doc.credentials.push(CredentialPolicy {
            name: ACCESS_NAME.to_owned(),
            source: credential.source.clone(),
            env: PLACEHOLDER_ENV.to_owned(),
            inject: InjectSpec::Basic {
                username: credential.username.clone(),
            },
            endpoints: vec![CredentialEndpoint {
                host: repo.host.clone(),
                port: Some(repo.port),
                methods,
                paths: repo.endpoints(),
            }],
        });
    }
    Ok(())
}

/// The `Authorization` header git sends with the placeholder in place of the token.
pub fn basic_header(username: &str, placeholder: &str) -> String {
    let pair = format!("{username}:{placeholder}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// What the sandbox's own git does once the packs and `packed-refs` are in place: make the
/// repository, point `origin` at the URL (with the placeholder's header, when there is one),
/// and check the commit out on the sandbox's branch, whose upstream is the same branch on
/// `origin`. Its values come from the environment ([`checkout_env`]), never from the text.
pub const CHECKOUT_SCRIPT: &str = r#"set -eu
cd "$AIRLOCK_GIT_DIR"
git init -q -b "$AIRLOCK_GIT_BRANCH" .
git config remote.origin.url "$AIRLOCK_GIT_URL"
git config remote.origin.fetch '+refs/heads/*:refs/remotes/origin/*'
if [ -n "${AIRLOCK_GIT_HEADER:-}" ]; then
    git config "http.$AIRLOCK_GIT_URL.extraHeader" "$AIRLOCK_GIT_HEADER"
fi
if [ -n "${AIRLOCK_GIT_DEFAULT:-}" ]; then
    git symbolic-ref refs/remotes/origin/HEAD "refs/remotes/origin/$AIRLOCK_GIT_DEFAULT"
fi
git checkout -q --no-track -B "$AIRLOCK_GIT_BRANCH" "$AIRLOCK_GIT_COMMIT"
git config "branch.$AIRLOCK_GIT_BRANCH.remote" origin
git config "branch.$AIRLOCK_GIT_BRANCH.merge" "refs/heads/$AIRLOCK_GIT_BRANCH"
"#;

/// The script's variables; `header` is the `Authorization` value ([`basic_header`]).
pub fn checkout_env(
    dir: &str,
    repo: &RepoUrl,
    branch: &str,
    resolved: &Resolved,
    header: Option<&str>,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("AIRLOCK_GIT_DIR", dir.to_owned()),
        ("AIRLOCK_GIT_URL", repo.url.clone()),
        ("AIRLOCK_GIT_BRANCH", branch.to_owned()),
        ("AIRLOCK_GIT_COMMIT", resolved.commit.clone()),
        (
            "AIRLOCK_GIT_DEFAULT",
            resolved.default_branch.clone().unwrap_or_default(),
        ),
    ];
    if let Some(header) = header {
        env.push(("AIRLOCK_GIT_HEADER", format!("Authorization: {header}")));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[cfg(test)]
mod tests;
