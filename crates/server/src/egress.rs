//! `network: proxy` in the daemon: one egress proxy per sandbox, on the daemon's tokio
//! runtime, with hot reload, approvals and audit.
//!
//! - **Start.** [`SandboxEgress::start`] runs the runtime's `EgressSession` with its directory
//!   in the sandbox's private directory (`<state>/sandboxes/<id>/egress`, bound into the
//!   sandbox) and its audit lines going to [`Audit::sink`]. The credential placeholders (never
//!   the secrets) are stored in the sandbox's row, so that a restarted daemon starts the proxy
//!   again with the very placeholders the sandbox's environment holds; the secrets are read
//!   again from their sources, and if that fails the proxy runs without credentials.
//! - **Hot reload.** [`SandboxEgress::apply`] replaces the `network`, `credentials` and
//!   `approvals` sections in one atomic swap (`Proxy::replace_plan`). Every other section is
//!   fixed at create (they shaped the mount view, seccomp and cgroups). A change with prover
//!   findings that need review is refused unless approved.
//! - **The directory outlives the daemon.** It is bound into the running sandbox, and removing
//!   it would take the mount away inside. So only the sandbox's end removes it
//!   ([`SandboxEgress::end`]); a daemon that stops just closes the proxy, and the next daemon
//!   binds a new socket in the same directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use airlock_egress::{ApprovalError, Decision, PendingApproval, Placeholders};
use airlock_policy::egress::{EgressPlan, NetworkMode};
use airlock_policy::{Finding, Policy};
use airlock_runtime::egress::{EgressSetupError, read_secrets};
use airlock_runtime::{EgressOptions, EgressSession};
use serde::{Deserialize, Serialize};

use crate::audit::Audit;
use crate::config::EgressConfig;

/// What the store keeps of a sandbox's egress (the row's `egress` column).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredEgress {
    /// Credential name → placeholder, every one the sandbox was ever given (a credential that
    /// comes back keeps its placeholder).
    pub placeholders: BTreeMap<String, String>,
}

impl StoredEgress {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{\"placeholders\":{}}".to_owned())
    }
}

/// Why a hot reload was refused; the old plan stays in force.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(
        "the sandbox was created without `network: proxy`; its network cannot be changed (create a new sandbox)"
    )]
    NotProxy,
    #[error(
        "the sandbox's egress proxy is not running (see its events); the policy cannot be changed"
    )]
    NoProxy,
    #[error(
        "only the network, credentials and approvals sections can change in a running sandbox; this policy changes {}",
        .0.join(", ")
    )]
    StaticSections(Vec<&'static str>),
    #[error("network.mode `{0}` is not possible in a running sandbox created with `proxy`")]
    Mode(&'static str),
    #[error("the change needs review; apply it with approve=true (--approve) if intended: {}", list(.0))]
    NeedsReview(Vec<Finding>),
    #[error("the credentials cannot be read")]
    Secrets(#[source] EgressSetupError),
    #[error("cannot generate a credential placeholder")]
    Placeholder(#[source] airlock_egress::CredentialError),
    #[error("the egress proxy refused the new plan")]
    Plan(#[source] airlock_egress::EgressError),
}

/// An error and its causes on one line.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn list(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A hot reload that took effect.
#[derive(Debug)]
pub struct Applied {
    pub generation: u64,
    pub findings: Vec<Finding>,
    pub stored: StoredEgress,
}

#[derive(Debug)]
struct State {
    /// `None` once the sandbox has ended, or when a restarted daemon could not start it.
    session: Option<EgressSession>,
    policy: Policy,
    plan: EgressPlan,
    stored: StoredEgress,
}

/// One sandbox's egress proxy, as the daemon holds it.
#[derive(Debug)]
pub struct SandboxEgress {
    state: Mutex<State>,
}

/// The egress plan of a `proxy`-mode policy; `None` for any other mode.
pub fn proxy_plan(policy: &Policy) -> Option<EgressPlan> {
    let plan = airlock_policy::egress_plan(policy);
    (plan.mode == NetworkMode::Proxy).then_some(plan)
}

fn options(
    config: &EgressConfig,
    audit: &Audit,
    id: &str,
    placeholders: Option<Placeholders>,
) -> EgressOptions {
    EgressOptions {
        test_resolver: config.test_resolver.clone(),
        extra_upstream_roots_pem: config.test_roots_pem.clone(),
        reviewer_webhook: config.reviewer_webhook.clone(),
        audit_log: None,
        audit_sink: Some(audit.sink(id)),
        placeholders,
    }
}

impl SandboxEgress {
    /// Starts the proxy of sandbox `id` (whose private directory is `dir`) for a `proxy`-mode
    /// policy. With `stored` (a restart), the placeholders are kept, and credentials whose
    /// secrets cannot be read are dropped instead of failing: the second value says so.
    pub fn start(
        config: &EgressConfig,
        audit: &Audit,
        id: &str,
        dir: &Path,
        policy: Policy,
        stored: Option<StoredEgress>,
        runtime: tokio::runtime::Handle,
    ) -> Result<(SandboxEgress, Option<String>), EgressSetupError> {
        // The caller starts proxies for `proxy`-mode policies only.
        let mut plan = proxy_plan(&policy).unwrap_or_default();
        let restart = stored.is_some();
        let mut stored = stored.unwrap_or_default();
        let known = || Some(stored.placeholders.clone().into_iter().collect());
        let mut warning = None;
        let start = |plan: &EgressPlan, known| {
            EgressSession::start(
                id,
                plan,
                dir,
                options(config, audit, id, known),
                Some(runtime.clone()),
            )
        };
        let session = match start(&plan, known()) {
            Ok(session) => session,
            Err(
                err @ (EgressSetupError::MissingEnv { .. }
                | EgressSetupError::UnreadableFile { .. }),
            ) if restart => {
                warning = Some(format!(
                    "the egress proxy runs without credentials after the restart: {}",
                    chain(&err)
                ));
                plan.credentials.clear();
                start(&plan, known())?
            }
            Err(err) => return Err(err),
        };
        for (name, placeholder) in session.placeholders() {
            stored
                .placeholders
                .insert(name.clone(), placeholder.clone());
        }
        let egress = SandboxEgress {
            state: Mutex::new(State {
                session: Some(session),
                policy,
                plan,
                stored,
            }),
        };
        Ok((egress, warning))
    }

    /// A restarted daemon's stand-in for a proxy it could not start: no egress, and no hot
    /// reload, but the sandbox keeps running.
    pub fn failed(policy: Policy, stored: StoredEgress) -> SandboxEgress {
        let plan = proxy_plan(&policy).unwrap_or_default();
        SandboxEgress {
            state: Mutex::new(State {
                session: None,
                policy,
                plan,
                stored,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` with the proxy's session (`None` if it is not running).
    pub fn with_session<R>(&self, f: impl FnOnce(Option<&EgressSession>) -> R) -> R {
        let state = self.state();
        f(state.session.as_ref())
    }

    /// What the store keeps.
    pub fn stored(&self) -> StoredEgress {
        self.state().stored.clone()
    }

    /// Each current credential's placeholder under its variable name: commands get these, so
    /// that a credential added by a hot reload reaches commands started after it.
    pub fn environment(&self) -> Vec<(String, String)> {
        let state = self.state();
        state
            .plan
            .credentials
            .iter()
            .filter_map(|credential| {
                let placeholder = state.stored.placeholders.get(&credential.name)?;
                Some((credential.env.clone(), placeholder.clone()))
            })
            .collect()
    }

    /// Replaces the policy's `network`, `credentials` and `approvals` (see the module docs).
    /// Holds the state for the whole change, so that concurrent reloads apply one by one.
    pub fn apply(&self, new: Policy, approve: bool) -> Result<Applied, ApplyError> {
        let mut state = self.state();
        let changed = static_changes(&state.policy, &new);
        if !changed.is_empty() {
            return Err(ApplyError::StaticSections(changed));
        }
        let plan = airlock_policy::egress_plan(&new);
        match plan.mode {
            NetworkMode::Proxy | NetworkMode::None => {}
            NetworkMode::Full => return Err(ApplyError::Mode("full")),
        }
        let findings = airlock_policy::diff(&state.policy, &new);
        let review: Vec<Finding> = findings
            .iter()
            .filter(|f| f.kind.needs_review())
            .cloned()
            .collect();
        if !review.is_empty() && !approve {
            return Err(ApplyError::NeedsReview(review));
        }
        let Some(session) = &state.session else {
            return Err(ApplyError::NoProxy);
        };
        let secrets = read_secrets(&plan).map_err(ApplyError::Secrets)?;
        let mut stored = state.stored.clone();
        for credential in &plan.credentials {
            if !stored.placeholders.contains_key(&credential.name) {
                let placeholder = airlock_egress::generate_placeholder(&credential.name)
                    .map_err(ApplyError::Placeholder)?;
                stored
                    .placeholders
                    .insert(credential.name.clone(), placeholder);
            }
        }
        let placeholders: Placeholders = stored.placeholders.clone().into_iter().collect();
        let generation = session
            .proxy()
            .replace_plan(&plan, &secrets, &placeholders)
            .map_err(ApplyError::Plan)?;
        if plan.approvals == airlock_policy::egress::ApprovalMode::Deny {
            // "Always" answers belong to the `ask` regime; a policy that now denies means it.
            session.proxy().approvals().clear_grants();
        }
        state.policy = new;
        state.plan = plan;
        state.stored = stored.clone();
        Ok(Applied {
            generation,
            findings,
            stored,
        })
    }

    /// The approval queue and how long a held call waits under the plan in force (60 s unless
    /// the policy says `approvals.timeout`), for calls the daemon makes on the sandbox's
    /// behalf; `None` while the proxy is not running.
    pub fn approvals(&self) -> Option<(airlock_egress::Approvals, std::time::Duration)> {
        let state = self.state();
        let session = state.session.as_ref()?;
        let timeout_ms = match state.plan.approvals {
            airlock_policy::egress::ApprovalMode::Ask { timeout_ms } => timeout_ms,
            airlock_policy::egress::ApprovalMode::Deny => 60_000,
        };
        Some((
            session.proxy().approvals().clone(),
            std::time::Duration::from_millis(timeout_ms),
        ))
    }

    /// The requests held for approval.
    pub fn pending(&self) -> Vec<PendingApproval> {
        self.state()
            .session
            .as_ref()
            .map(|session| session.proxy().approvals().list())
            .unwrap_or_default()
    }

    /// Answers a held request (`local_id` is the proxy's own id).
    pub fn decide(&self, local_id: &str, decision: Decision) -> Result<(), ApprovalError> {
        match &self.state().session {
            Some(session) => session.proxy().approvals().decide(local_id, decision),
            None => Err(ApprovalError::NotFound(local_id.to_owned())),
        }
    }

    /// The sandbox has ended: stop the proxy and remove its directory.
    pub fn end(&self) {
        let session = self.state().session.take();
        drop(session);
    }
}

impl Drop for SandboxEgress {
    /// Without [`SandboxEgress::end`] the sandbox still runs (the daemon is stopping): close
    /// the proxy but keep its directory, which is bound into the sandbox, for the next daemon.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(session) = state.session.take() {
            session.proxy().close();
            std::mem::forget(session);
        }
    }
}

/// The sections a running sandbox cannot change, that `new` changes.
fn static_changes(old: &Policy, new: &Policy) -> Vec<&'static str> {
    let (o, n) = (old.document(), new.document());
    let mut changed = Vec::new();
    if o.tier != n.tier {
        changed.push("tier");
    }
    if o.filesystem != n.filesystem {
        changed.push("filesystem");
    }
    if o.process != n.process {
        changed.push("process");
    }
    if o.resources != n.resources {
        changed.push("resources");
    }
    if o.audit != n.audit {
        changed.push("audit");
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(yaml: &str) -> Policy {
        Policy::from_yaml("test.yaml", yaml).unwrap()
    }

    #[test]
    fn test_only_dynamic_sections_may_change() {
        let old = policy(
            "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - host: a.test\nresources:\n  pids: 100\n",
        );
        let network = policy(
            "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - host: b.test\nresources:\n  pids: 100\napprovals:\n  unmatched: ask\n",
        );
        assert_eq!(static_changes(&old, &network), Vec::<&str>::new());
        let widened = policy(
            "version: 1\ntier: process\nnetwork:\n  mode: proxy\nresources:\n  pids: 200\nfilesystem:\n  rules:\n    /etc: deny\n",
        );
        assert_eq!(
            static_changes(&old, &widened),
            ["tier", "filesystem", "resources"]
        );
    }

    #[test]
    fn test_stored_egress_round_trips_and_is_strict() {
        let mut stored = StoredEgress::default();
        stored
            .placeholders
            .insert("api".into(), "airlock-cred-api-0123456789abcdef".into());
        let json = stored.to_json();
        assert_eq!(serde_json::from_str::<StoredEgress>(&json).unwrap(), stored);
        assert!(
            serde_json::from_str::<StoredEgress>(r#"{"placeholders":{},"secrets":{}}"#).is_err()
        );
    }
}
