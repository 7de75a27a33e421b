//! The host's repository cache: one bare mirror per URL under a private (0700) root,
//! `<sha256(url)[..32]>.git`, each used under an exclusive lock (`<key>.lock`, `flock`).
//!
//! A cold mirror is `git clone --bare`; a warm one is fetched (`+refs/heads/*` and
//! `+refs/tags/*`, pruned), so a second sandbox of a repository downloads only what changed.
//! Every network operation goes through a [`Transport`]: the sandbox's egress proxy, reached
//! over a loopback [`super::ProxyBridge`]. The host's `git` runs with no system or global
//! configuration, no prompts, only the http(s) transports, `transfer.fsckObjects` (the
//! repository is untrusted data) and low-speed limits, and it never checks anything out:
//! working trees are made by the sandbox's own git, inside it, from copies of the packs.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{RepoUrl, check_ref};

/// Past this many packs, a fetch is followed by `git repack -a -d` (one pack to copy).
const MAX_PACKS: usize = 16;
/// A transfer slower than 1 KB/s for this long is abandoned.
const LOW_SPEED_SECONDS: &str = "60";

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot prepare the repository cache {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot lock the mirror of {url}")]
    Lock {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run git (is it installed on the host?)")]
    Spawn(#[source] std::io::Error),
    #[error("git {operation} of {url} failed: {stderr}")]
    Git {
        operation: &'static str,
        url: String,
        stderr: String,
    },
    #[error("{url} has no branch, tag or commit {reference:?}")]
    RefNotFound { url: String, reference: String },
    #[error("{url} has no default branch (an empty repository?); name a ref")]
    NoHead { url: String },
    #[error("cannot list the mirror's packs")]
    Packs(#[source] std::io::Error),
    #[error(transparent)]
    Ref(#[from] super::GitError),
}

/// How the host's git reaches the repository: an HTTP proxy (the sandbox's egress proxy),
/// the CA that proxy's interception presents, and the `Authorization` header that carries the
/// credential's placeholder (the proxy swaps it for the token).
#[derive(Debug, Clone, Default)]
pub struct Transport {
    pub proxy_url: String,
    pub ca_file: Option<PathBuf>,
    pub auth_header: Option<String>,
}

/// What a ref resolved to in the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The commit id to check out.
    pub commit: String,
    /// The branch the ref names (the repository's default branch when no ref was given),
    /// the base of a pull request; `None` for a tag or a commit.
    pub branch: Option<String>,
    /// The repository's default branch, when the mirror knows it.
    pub default_branch: Option<String>,
}

/// What a sandbox gets: copies of these files and this `packed-refs` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// `(path in the mirror, name under objects/pack/)`: each pack with its index.
    pub files: Vec<(PathBuf, String)>,
    /// The mirror's branches as `refs/remotes/origin/*`, and its tags.
    pub packed_refs: String,
    pub bytes: u64,
}

/// The cache under one root directory.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
}

fn directory(path: &Path) -> Result<(), CacheError> {
    let err = |source| CacheError::Directory {
        path: path.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(err)
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl RepoCache {
    /// Opens (and makes, 0700) the cache at `root`.
    pub fn open(root: &Path) -> Result<RepoCache, CacheError> {
        directory(root)?;
        Ok(RepoCache {
            root: root.to_owned(),
        })
    }

    /// `/var/lib/airlock/git-cache` for root, else `$XDG_CACHE_HOME/airlock/git` or
    /// `~/.cache/airlock/git` (for `airlock run`; the daemon keeps its own in its state).
    pub fn default_root() -> PathBuf {
        use std::os::unix::fs::MetadataExt as _;
        if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
            return PathBuf::from("/var/lib/airlock/git-cache");
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("airlock/git")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The mirror of `repo`, locked for this caller until the lock is dropped.
    pub fn lock(&self, repo: &RepoUrl) -> Result<MirrorLock, CacheError> {
        let key = &sha256_hex(&repo.url)[..32];
        let lock_path = self.root.join(format!("{key}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| CacheError::Lock {
                url: repo.url.clone(),
                source,
            })?;
        file.lock().map_err(|source| CacheError::Lock {
            url: repo.url.clone(),
            source,
        })?;
        Ok(MirrorLock {
            _file: file,
            mirror: self.root.join(format!("{key}.git")),
            staging: self.root.join(format!("{key}.partial")),
            repo: repo.clone(),
        })
    }
}

/// One repository's mirror, held exclusively.
#[derive(Debug)]
pub struct MirrorLock {
    _file: File,
    mirror: PathBuf,
    staging: PathBuf,
    repo: RepoUrl,
}

/// The host's git, configured for untrusted repositories (see the module docs).
fn git(transport: Option<&Transport>) -> Command {
    let mut command = Command::new("git");
    command
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "/bin/false")
        .env("GIT_ALLOW_PROTOCOL", "http:https")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    let mut config: Vec<(&str, String)> = vec![
        ("transfer.fsckObjects", "true".into()),
        ("fetch.unpackLimit", "1".into()),
        ("transfer.unpackLimit", "1".into()),
        ("gc.auto", "0".into()),
        ("core.hooksPath", "/dev/null".into()),
        ("http.lowSpeedLimit", "1000".into()),
        ("http.lowSpeedTime", LOW_SPEED_SECONDS.into()),
    ];
    if let Some(transport) = transport {
        config.push(("http.proxy", transport.proxy_url.clone()));
        if let Some(ca) = &transport.ca_file {
            config.push(("http.sslCAInfo", ca.display().to_string()));
        }
        if let Some(header) = &transport.auth_header {
            config.push(("http.extraHeader", format!("Authorization: {header}")));
        }
    }
    // In the environment, not argv: other host users can read a process's argv.
    command.env("GIT_CONFIG_COUNT", config.len().to_string());
    for (i, (key, value)) in config.iter().enumerate() {
        command
            .env(format!("GIT_CONFIG_KEY_{i}"), key)
            .env(format!("GIT_CONFIG_VALUE_{i}"), value);
    }
    command
}

/// The last lines of git's error output, for a message.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(4);
    lines[start..].join(" / ")
}

impl MirrorLock {
    fn run(
        &self,
        operation: &'static str,
        mut command: Command,
    ) -> Result<std::process::Output, CacheError> {
        let output = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(CacheError::Spawn)?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(CacheError::Git {
                operation,
                url: self.repo.url.clone(),
                stderr: tail(&output.stderr),
            })
        }
    }

    fn in_mirror(&self, transport: Option<&Transport>) -> Command {
        let mut command = git(transport);
        command.arg("-C").arg(&self.mirror);
        command
    }

    fn text(&self, operation: &'static str, args: &[&str]) -> Result<String, CacheError> {
        let mut command = self.in_mirror(None);
        command.args(args);
        let output = self.run(operation, command)?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Whether the mirror already exists (the next [`MirrorLock::update`] is a fetch).
    pub fn is_warm(&self) -> bool {
        self.mirror.join("HEAD").is_file()
    }

    /// Brings the mirror up to date through `transport`: a bare clone when there is none,
    /// else a fetch. Returns whether it was cold.
    pub fn update(&self, transport: &Transport) -> Result<bool, CacheError> {
        if self.is_warm() {
            let mut fetch = self.in_mirror(Some(transport));
            fetch.args(["fetch", "--quiet", "--prune", "origin"]);
            self.run("fetch", fetch)?;
            let packs = std::fs::read_dir(self.mirror.join("objects/pack"))
                .map_err(CacheError::Packs)?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                .count();
            if packs > MAX_PACKS {
                let mut repack = self.in_mirror(None);
                repack.args(["repack", "-a", "-d", "-q"]);
                self.run("repack", repack)?;
            }
            return Ok(false);
        }
        let _ = std::fs::remove_dir_all(&self.staging);
        let mut clone = git(Some(transport));
        clone
            .args(["clone", "--bare", "--quiet", "--", &self.repo.url])
            .arg(&self.staging);
        self.run("clone", clone)?;
        for refspec in ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"] {
            let mut config = git(None);
            config.arg("-C").arg(&self.staging).args([
                "config",
                "--add",
                "remote.origin.fetch",
                refspec,
            ]);
            self.run("config", config)?;
        }
        std::fs::rename(&self.staging, &self.mirror).map_err(|source| CacheError::Directory {
            path: self.mirror.clone(),
            source,
        })?;
        Ok(true)
    }

    fn commit_of(&self, name: &str) -> Option<String> {
        let spec = format!("{name}^{{commit}}");
        self.text(
            "rev-parse",
            &["rev-parse", "--verify", "-q", "--end-of-options", &spec],
        )
        .ok()
        .filter(|oid| !oid.is_empty())
    }

    /// The repository's default branch, as the mirror's `HEAD` names it.
    pub fn default_branch(&self) -> Option<String> {
        self.text("symbolic-ref", &["symbolic-ref", "-q", "HEAD"])
            .ok()
            .and_then(|r| r.strip_prefix("refs/heads/").map(str::to_owned))
    }

    /// Whether the mirror has branch `name`.
    pub fn has_branch(&self, name: &str) -> bool {
        check_ref(name).is_ok() && self.commit_of(&format!("refs/heads/{name}")).is_some()
    }

    /// Resolves `reference` (a branch, a tag or a commit id; the default branch when `None`)
    /// in the mirror. A commit id that no branch or tag reaches is fetched by id first.
    pub fn resolve(
        &self,
        reference: Option<&str>,
        transport: &Transport,
    ) -> Result<Resolved, CacheError> {
        let default_branch = self.default_branch();
        let Some(reference) = reference else {
            let url = self.repo.url.clone();
            let branch = default_branch.clone().ok_or(CacheError::NoHead { url })?;
            let commit = self
                .commit_of(&format!("refs/heads/{branch}"))
                .ok_or_else(|| CacheError::NoHead {
                    url: self.repo.url.clone(),
                })?;
            return Ok(Resolved {
                commit,
                branch: Some(branch),
                default_branch,
            });
        };
        check_ref(reference)?;
        if let Some(commit) = self.commit_of(&format!("refs/heads/{reference}")) {
            return Ok(Resolved {
                commit,
                branch: Some(reference.to_owned()),
                default_branch,
            });
        }
        let commit = self
            .commit_of(&format!("refs/tags/{reference}"))
            .or_else(|| {
                let hex = reference.len() >= 7 && reference.bytes().all(|b| b.is_ascii_hexdigit());
                hex.then(|| self.commit_of(reference)).flatten()
            })
            .or_else(|| {
                let full = (reference.len() == 40 || reference.len() == 64)
                    && reference.bytes().all(|b| b.is_ascii_hexdigit());
                if !full {
                    return None;
                }
                let mut fetch = self.in_mirror(Some(transport));
                let keep = format!("+{reference}:refs/airlock/{reference}");
                fetch.args(["fetch", "--quiet", "origin", &keep]);
                self.run("fetch", fetch).ok()?;
                self.commit_of(reference)
            });
        match commit {
            Some(commit) => Ok(Resolved {
                commit,
                branch: None,
                default_branch,
            }),
            None => Err(CacheError::RefNotFound {
                url: self.repo.url.clone(),
                reference: reference.to_owned(),
            }),
        }
    }

    /// The mirror's packs (loose objects packed first) and refs, for a sandbox to copy.
    pub fn export(&self) -> Result<Export, CacheError> {
        let counted = self.text("count-objects", &["count-objects", "-v"])?;
        let loose = counted
            .lines()
            .find_map(|l| l.strip_prefix("count: "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if loose > 0 {
            let mut repack = self.in_mirror(None);
            repack.args(["repack", "-d", "-q"]);
            self.run("repack", repack)?;
        }
        let pack_dir = self.mirror.join("objects/pack");
        let mut files = Vec::new();
        let mut bytes = 0;
        let mut names: Vec<String> = std::fs::read_dir(&pack_dir)
            .map_err(CacheError::Packs)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pack-") && n.ends_with(".pack"))
            .collect();
        names.sort();
        for pack in names {
            let index = format!("{}.idx", pack.trim_end_matches(".pack"));
            if !pack_dir.join(&index).is_file() {
                continue; // a pack still being written by no one: never complete, skip it
            }
            for name in [pack, index] {
                let path = pack_dir.join(&name);
                bytes += std::fs::metadata(&path).map_err(CacheError::Packs)?.len();
                files.push((path, name));
            }
        }
        let listed = self.text(
            "for-each-ref",
            &[
                "for-each-ref",
                "--format=%(objectname) %(refname)",
                "refs/heads",
                "refs/tags",
            ],
        )?;
        let mut packed_refs = String::new();
        for line in listed.lines() {
            let Some((oid, name)) = line.split_once(' ') else {
                continue;
            };
            let name = match name.strip_prefix("refs/heads/") {
                Some(branch) => format!("refs/remotes/origin/{branch}"),
                None => name.to_owned(),
            };
            packed_refs.push_str(&format!("{oid} {name}\n"));
        }
        Ok(Export {
            files,
            packed_refs,
            bytes,
        })
    }
}
