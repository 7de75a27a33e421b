//! Repository workspaces in the daemon (`workspace: {type: git}`; the mechanism is
//! `airlock_runtime::git`):
//!
//! 1. **At create** ([`Daemon::prepare_git`], before the row): the URL, ref and branch are
//!    checked, the branch defaults to `airlock/<id>`, the policy gains the repository's rule
//!    and, for the forge's git host, the forge token as a credential; the metadata gets
//!    `airlock.git.url`, `airlock.git.branch` (and `airlock.git.ref`), so that the sandboxes of
//!    one repository can be listed with `?metadata.airlock.git.url=URL`.
//! 2. **Before the sandbox starts** ([`Daemon::fetch_repository`], after its egress proxy
//!    has): the mirror is locked, cloned or fetched through the proxy, the ref resolved, and
//!    its packs listed.
//! 3. **Once its agent serves** ([`Daemon::hand_over`], before the commit): copies of the packs
//!    and a `packed-refs` go into `/workspace/.git`, and the sandbox's own git makes the
//!    working tree on the branch. A failure at any step ends the create with nothing left.
//!
//! Pushes ([`Daemon::git_push`]) run `git push` inside the sandbox, through its proxy, so the
//! proxy's ref check applies to the daemon's pushes as to the workload's. Pull requests
//! ([`Daemon::pull_request`]) push, then call the forge from the host.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use airlock_api::SandboxConfig;
use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{
    CreateSandboxRequest, ErrorCode, GitPushRequest, GitPushResult, GitWorkspace,
    MAX_METADATA_ENTRIES, PullRequest, PullRequestRequest, Workspace,
};
use airlock_policy::EGRESS_TRUST_BUNDLE;
use airlock_runtime::VolumeSource;
use airlock_runtime::git::{
    ACCESS_NAME, CHECKOUT_SCRIPT, CacheError, Export, MirrorLock, ProxyBridge, RepoCache, RepoUrl,
    Resolved, Transport, WORKSPACE, basic_header, check_branch, check_ref, checkout_env,
    grant_repository,
};

use super::{Daemon, LifecycleError};
use crate::agent::Agent;
use crate::egress::SandboxEgress;
use crate::error::ApiError;
use crate::inside;

/// Metadata keys every repository sandbox carries (and that an E2B create may set to ask for
/// a repository: E2B's create body has no other place for it).
pub const META_URL: &str = "airlock.git.url";
pub const META_REF: &str = "airlock.git.ref";
pub const META_BRANCH: &str = "airlock.git.branch";
/// How long the sandbox's git may take to check the tree out, or to push.
const GIT_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// The repository cache of this daemon.
#[derive(Debug)]
pub struct GitState {
    cache: RepoCache,
}

impl GitState {
    pub(super) fn open(root: &Path) -> Result<GitState, LifecycleError> {
        RepoCache::open(root)
            .map(|cache| GitState { cache })
            .map_err(|e| LifecycleError::GitCache(airlock_runtime::error_chain(&e)))
    }
}

/// A create's repository, once checked.
#[derive(Debug, Clone)]
pub(super) struct GitPlan {
    repo: RepoUrl,
    branch: String,
    reference: Option<String>,
    username: Option<String>,
}

/// The locked mirror and what the sandbox gets from it.
#[derive(Debug)]
pub(super) struct Fetched {
    _lock: MirrorLock,
    resolved: Resolved,
    export: Export,
    cold: bool,
    started: Instant,
}

/// The repository workspace of a create whose E2B metadata asks for one.
pub fn workspace_from_metadata(metadata: &BTreeMap<String, String>) -> Option<Workspace> {
    let url = metadata.get(META_URL)?;
    Some(Workspace::Git {
        git: GitWorkspace {
            url: url.clone(),
            reference: metadata.get(META_REF).cloned(),
            branch: metadata.get(META_BRANCH).cloned(),
        },
    })
}

fn cache_error(repo: &RepoUrl, err: &CacheError) -> ApiError {
    let code = match err {
        CacheError::Git { .. } | CacheError::RefNotFound { .. } | CacheError::NoHead { .. } => {
            ErrorCode::Unprocessable
        }
        CacheError::Ref(_) => ErrorCode::InvalidRequest,
        _ => ErrorCode::Internal,
    };
    ApiError::new(
        code,
        format!(
            "cannot clone {} through the sandbox's egress proxy: {}",
            repo.url,
            airlock_runtime::error_chain(err)
        ),
    )
}

impl Daemon {
    /// Step 1 of the module docs. `None` for any other workspace, and for a sandbox from a
    /// snapshot (its files, repository included, are the snapshot's; its policy already
    /// grants the repository).
    pub(super) fn prepare_git(
        &self,
        id: &str,
        request: &mut CreateSandboxRequest,
        config: &mut SandboxConfig,
        volume: &VolumeSource,
    ) -> Result<Option<GitPlan>, ApiError> {
        let Workspace::Git { git } = request.workspace.clone() else {
            return Ok(None);
        };
        if matches!(volume, VolumeSource::Snapshot(_)) {
            return Ok(None);
        }
        let invalid = |e: &dyn std::error::Error| ApiError::invalid(e.to_string());
        let repo = RepoUrl::parse(&git.url).map_err(|e| invalid(&e))?;
        if let Some(reference) = &git.reference {
            check_ref(reference).map_err(|e| invalid(&e))?;
        }
        let branch = git
            .branch
            .clone()
            .unwrap_or_else(|| format!("airlock/{id}"));
        check_branch(&branch).map_err(|e| invalid(&e))?;
        let credential = self.config.forge.credential_for(&repo);
        let mut document = request.policy.take().map_or_else(
            || PolicyDocument {
                version: 1,
                ..PolicyDocument::default()
            },
            |doc| *doc,
        );
        grant_repository(&mut document, &repo, &branch, credential.as_ref())
            .map_err(|e| ApiError::unprocessable(e.to_string()))?;
        airlock_policy::Policy::from_document(&document).map_err(|e| {
            ApiError::unprocessable(format!("invalid policy with the repository's access: {e}"))
        })?;
        request.policy = Some(Box::new(document.clone()));
        config.policy = Some(Box::new(document));
        request.workspace = Workspace::Git {
            git: GitWorkspace {
                url: repo.url.clone(),
                reference: git.reference.clone(),
                branch: Some(branch.clone()),
            },
        };
        let metadata = &mut request.metadata;
        metadata.insert(META_URL.to_owned(), repo.url.clone());
        metadata.insert(META_BRANCH.to_owned(), branch.clone());
        match &git.reference {
            Some(reference) => metadata.insert(META_REF.to_owned(), reference.clone()),
            None => metadata.remove(META_REF),
        };
        if metadata.len() > MAX_METADATA_ENTRIES {
            return Err(ApiError::unprocessable(format!(
                "metadata has more than {MAX_METADATA_ENTRIES} entries with the repository's {META_URL} and {META_BRANCH}"
            )));
        }
        Ok(Some(GitPlan {
            repo,
            branch,
            reference: git.reference.clone(),
            username: credential.map(|c| c.username),
        }))
    }

    /// Step 2: the mirror, up to date through the sandbox's proxy (`dir` is the sandbox's
    /// private directory). Blocking.
    pub(super) fn fetch_repository(
        &self,
        dir: &Path,
        plan: &GitPlan,
        egress: Option<&SandboxEgress>,
    ) -> Result<(Fetched, Option<String>), ApiError> {
        let started = Instant::now();
        let session = egress.and_then(|egress| {
            egress.with_session(|session| {
                session.map(|s| {
                    (
                        s.proxy().clone(),
                        s.placeholders().get(ACCESS_NAME).cloned(),
                    )
                })
            })
        });
        let Some((proxy, placeholder)) = session else {
            return Err(ApiError::internal(
                "a repository sandbox has no egress proxy to clone through",
            ));
        };
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| ApiError::internal(format!("no async runtime for the git door: {e}")))?;
        let bridge = ProxyBridge::start(proxy, Some(handle))
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let header = match (&placeholder, &plan.username) {
            (Some(placeholder), Some(username)) => Some(basic_header(username, placeholder)),
            _ => None,
        };
        let transport = Transport {
            proxy_url: bridge.proxy_url(),
            ca_file: plan
                .repo
                .tls
                .then(|| dir.join("egress").join(EGRESS_TRUST_BUNDLE)),
            auth_header: header.clone(),
        };
        let repo = &plan.repo;
        let lock = self
            .git
            .cache
            .lock(repo)
            .map_err(|e| cache_error(repo, &e))?;
        let cold = lock.update(&transport).map_err(|e| cache_error(repo, &e))?;
        let resolved = lock
            .resolve(plan.reference.as_deref(), &transport)
            .map_err(|e| cache_error(repo, &e))?;
        let export = lock.export().map_err(|e| cache_error(repo, &e))?;
        drop(bridge);
        Ok((
            Fetched {
                _lock: lock,
                resolved,
                export,
                cold,
                started,
            },
            header,
        ))
    }

    /// Step 3, once the sandbox's agent behind `socket` serves. Blocking.
    pub(super) fn hand_over(
        &self,
        id: &str,
        plan: &GitPlan,
        fetched: Fetched,
        header: Option<String>,
        socket: &Path,
    ) -> Result<(), ApiError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| ApiError::internal(format!("no async runtime for the hand-over: {e}")))?;
        let agent = Agent::new(socket);
        let env: BTreeMap<String, String> = checkout_env(
            WORKSPACE,
            &plan.repo,
            &plan.branch,
            &fetched.resolved,
            header.as_deref(),
        )
        .into_iter()
        .collect();
        let ran = handle.block_on(async {
            for (source, name) in &fetched.export.files {
                let path = format!("{WORKSPACE}/.git/objects/pack/{name}");
                inside::copy_in(&agent, source, &path).await?;
            }
            let refs = fetched.export.packed_refs.clone().into_bytes();
            inside::write(&agent, &format!("{WORKSPACE}/.git/packed-refs"), refs).await?;
            let argv = ["/bin/sh", "-c", CHECKOUT_SCRIPT];
            inside::run(&agent, &argv, &env, "/", GIT_TIMEOUT_MS).await
        })?;
        if !ran.ok() {
            return Err(ApiError::unprocessable(format!(
                "the sandbox's git could not check out {} (is git installed in the sandbox?): {}",
                plan.repo.url,
                ran.tail()
            )));
        }
        let how = if fetched.cold {
            "a new mirror"
        } else {
            "the cache"
        };
        let message = format!(
            "{} at {} on branch {}: {} MiB from {how} in {} ms",
            plan.repo.url,
            fetched.resolved.commit,
            plan.branch,
            fetched.export.bytes >> 20,
            fetched.started.elapsed().as_millis()
        );
        self.event(Some(id), "git_cloned", &message);
        Ok(())
    }

    /// A new policy for a running sandbox keeps the repository's access (the rule and the
    /// credential are Airlock's, whatever the new document says about them).
    pub(super) fn keep_repository_access(
        &self,
        id: &str,
        mut document: PolicyDocument,
    ) -> Result<PolicyDocument, ApiError> {
        let Ok((repo, branch, _)) = self.git_workspace(id) else {
            return Ok(document);
        };
        document
            .network
            .egress
            .retain(|rule| rule.name.as_deref() != Some(ACCESS_NAME));
        document.credentials.retain(|c| c.name != ACCESS_NAME);
        let credential = self.config.forge.credential_for(&repo);
        grant_repository(&mut document, &repo, &branch, credential.as_ref())
            .map_err(|e| ApiError::unprocessable(e.to_string()))?;
        Ok(document)
    }

    /// The repository and branch of a sandbox created with one.
    fn git_workspace(&self, id: &str) -> Result<(RepoUrl, String, Option<String>), ApiError> {
        let row = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let Workspace::Git { git } = &row.request.workspace else {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("sandbox {id} was not created from a repository (workspace type git)"),
            ));
        };
        let repo = RepoUrl::parse(&git.url).map_err(|e| ApiError::internal(e.to_string()))?;
        let branch = git
            .branch
            .clone()
            .unwrap_or_else(|| format!("airlock/{id}"));
        Ok((repo, branch, git.reference.clone()))
    }

    /// Pushes the sandbox's branch from inside it, through its proxy.
    pub async fn git_push(
        self: &Arc<Self>,
        id: &str,
        request: &GitPushRequest,
    ) -> Result<GitPushResult, ApiError> {
        let (repo, branch, _) = self.git_workspace(id)?;
        let agent = self.agent(id).await?;
        let mut env = self.sandbox_env(id)?;
        env.insert("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned());
        let local = format!("refs/heads/{branch}");
        let rev = [
            "git",
            "-C",
            WORKSPACE,
            "rev-parse",
            "--verify",
            "-q",
            &local,
        ];
        let ran = inside::run(&agent, &rev, &env, WORKSPACE, GIT_TIMEOUT_MS).await?;
        if !ran.ok() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "the sandbox's {WORKSPACE} has no branch {branch} to push: {}",
                    ran.tail()
                ),
            ));
        }
        let commit = ran.stdout.trim().to_owned();
        let refspec = format!("{local}:{local}");
        let mut push = vec!["git", "-C", WORKSPACE, "push", "--porcelain"];
        if request.force {
            push.push("--force-with-lease");
        }
        push.extend(["origin", &refspec]);
        let ran = inside::run(&agent, &push, &env, WORKSPACE, GIT_TIMEOUT_MS).await?;
        if !ran.ok() {
            let text = format!("{}\n{}", ran.stdout, ran.stderr);
            let code = if text.contains("error: 403") {
                ErrorCode::PermissionDenied
            } else if [
                "[rejected]",
                "non-fast-forward",
                "fetch first",
                "stale info",
            ]
            .iter()
            .any(|m| text.contains(m))
            {
                ErrorCode::Conflict
            } else {
                ErrorCode::Unprocessable
            };
            let message = format!(
                "git push of {branch} to {} failed: {}",
                repo.url,
                ran.tail()
            );
            self.event(Some(id), "git_push_failed", &message);
            return Err(ApiError::new(code, message));
        }
        self.event(
            Some(id),
            "git_pushed",
            &format!("{branch} at {commit} to {}", repo.url),
        );
        Ok(GitPushResult {
            branch,
            commit,
            url: repo.url,
        })
    }

    /// Pushes the sandbox's branch, then opens a pull request from it on the forge.
    pub async fn pull_request(
        self: &Arc<Self>,
        id: &str,
        request: &PullRequestRequest,
    ) -> Result<PullRequest, ApiError> {
        let (repo, branch, reference) = self.git_workspace(id)?;
        let forge = &self.config.forge;
        if forge.api.is_none() {
            let err = crate::forge::ForgeError::NotConfigured;
            return Err(ApiError::new(err.code(), err.to_string()));
        }
        if !forge.serves(&repo) {
            let host = forge
                .git_host
                .as_ref()
                .map(|h| h.0.clone())
                .unwrap_or_default();
            let err = crate::forge::ForgeError::OtherHost(repo.url.clone(), host);
            return Err(ApiError::new(err.code(), err.to_string()));
        }
        if let Some(base) = &request.base {
            check_branch(base).map_err(|e| ApiError::invalid(e.to_string()))?;
        }
        let base = match &request.base {
            Some(base) => base.clone(),
            None => {
                let daemon = self.clone();
                let mirror_repo = repo.clone();
                tokio::task::spawn_blocking(move || {
                    daemon.base_branch(&mirror_repo, reference.as_deref())
                })
                .await
                .map_err(|e| ApiError::internal(format!("the base lookup failed: {e}")))??
            }
        };
        let push = self.git_push(id, &GitPushRequest::default()).await?;
        let (url, number) = forge
            .open_pull_request(
                &repo,
                &branch,
                &base,
                &request.title,
                request.body.as_deref(),
            )
            .await
            .map_err(|err| ApiError::new(err.code(), airlock_runtime::error_chain(&err)))?;
        self.event(
            Some(id),
            "pull_request",
            &format!("#{number} {branch} into {base}: {url}"),
        );
        Ok(PullRequest {
            url,
            number,
            head: branch,
            base,
            push,
        })
    }

    /// The branch a sandbox started from, else the repository's default branch, as the
    /// mirror knows them. Blocking.
    fn base_branch(&self, repo: &RepoUrl, reference: Option<&str>) -> Result<String, ApiError> {
        let lock = self
            .git
            .cache
            .lock(repo)
            .map_err(|e| cache_error(repo, &e))?;
        if let Some(reference) = reference
            && lock.has_branch(reference)
        {
            return Ok(reference.to_owned());
        }
        lock.default_branch().ok_or_else(|| {
            ApiError::unprocessable(format!(
                "{} has no default branch in the cache; give `base`",
                repo.url
            ))
        })
    }
}
