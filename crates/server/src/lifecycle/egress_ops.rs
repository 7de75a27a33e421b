//! The daemon's operations on `proxy`-mode sandboxes: starting the egress proxy (at create and
//! for a re-adopted sandbox), hot reload of the policy, approvals, and the events API.

use std::path::Path;
use std::sync::Arc;

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{
    Approval, ApprovalDecision, ErrorCode, PolicyApplied, PolicyFinding, SandboxEvents,
};
use airlock_egress::Decision;
use airlock_policy::Policy;
use airlock_runtime::egress::EgressSetupError;
use airlock_runtime::{LiveSpec, Pending, RuntimeError};

use super::{Daemon, SlotState};
use crate::egress::{ApplyError, SandboxEgress, StoredEgress, chain, proxy_plan};
use crate::error::ApiError;
use crate::store::SandboxRow;

/// Lifecycle events are few per sandbox; this bounds a pathological one.
const MAX_LIFECYCLE_EVENTS: u32 = 100_000;

fn runtime_handle() -> Result<tokio::runtime::Handle, ApiError> {
    tokio::runtime::Handle::try_current()
        .map_err(|e| ApiError::internal(format!("no async runtime for the egress proxy: {e}")))
}

fn setup_error(err: &EgressSetupError) -> ApiError {
    let code = match err {
        EgressSetupError::MissingEnv { .. }
        | EgressSetupError::UnreadableFile { .. }
        | EgressSetupError::Proxy(airlock_egress::EgressError::InvalidPlan(_)) => {
            ErrorCode::Unprocessable
        }
        _ => ErrorCode::Internal,
    };
    ApiError::new(code, chain(err))
}

impl Daemon {
    /// Starts a new sandbox's egress proxy and stores its placeholders. Blocking context.
    pub(super) fn start_egress(
        &self,
        id: &str,
        dir: &Path,
        policy: Policy,
    ) -> Result<Arc<SandboxEgress>, ApiError> {
        let egress = self.launch_egress(id, dir, policy)?;
        if !self.store.set_egress(id, &egress.stored().to_json())? {
            egress.end();
            return Err(ApiError::internal("the sandbox's row vanished"));
        }
        Ok(egress)
    }

    /// [`Daemon::start_egress`] without storing it (a warm pool's member has no row yet).
    pub(super) fn launch_egress(
        &self,
        id: &str,
        dir: &Path,
        policy: Policy,
    ) -> Result<Arc<SandboxEgress>, ApiError> {
        let handle = runtime_handle()?;
        let (egress, _) = SandboxEgress::start(
            &self.config.egress,
            &self.audit,
            id,
            dir,
            policy,
            None,
            handle,
        )
        .map_err(|err| setup_error(&err))?;
        Ok(Arc::new(egress))
    }

    /// `Runtime::create_live`, pointed at the egress proxy when there is one.
    pub(super) fn create_live(
        &self,
        spec: &LiveSpec,
        egress: Option<&SandboxEgress>,
    ) -> Result<Pending, RuntimeError> {
        match egress {
            Some(egress) => {
                egress.with_session(|session| self.runtime.create_live_with(spec, session))
            }
            None => self.runtime.create_live(spec),
        }
    }

    /// The egress proxy of a re-adopted sandbox, with its stored placeholders. Whatever fails
    /// is an event; the sandbox keeps running (without credentials, or without egress).
    pub(super) fn restart_egress(&self, row: &SandboxRow) -> Option<Arc<SandboxEgress>> {
        let id = &row.id;
        let document = row.request.policy.as_deref()?;
        let policy = match Policy::from_document(document) {
            Ok(policy) => policy,
            Err(err) => {
                let message = format!("its stored policy is no longer valid, no egress: {err}");
                self.event(Some(id), "egress_failed", &message);
                return None;
            }
        };
        proxy_plan(&policy)?;
        let stored: StoredEgress = row
            .egress
            .as_deref()
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default();
        let dir = self.config.sandboxes_dir().join(id);
        let started = runtime_handle().map_err(|e| e.message).and_then(|handle| {
            SandboxEgress::start(
                &self.config.egress,
                &self.audit,
                id,
                &dir,
                policy.clone(),
                Some(stored.clone()),
                handle,
            )
            .map_err(|err| chain(&err))
        });
        match started {
            Ok((egress, warning)) => {
                if let Some(warning) = warning {
                    self.event(Some(id), "egress_degraded", &warning);
                }
                Some(Arc::new(egress))
            }
            Err(message) => {
                let message = format!("the egress proxy could not be restarted: {message}");
                self.event(Some(id), "egress_failed", &message);
                Some(Arc::new(SandboxEgress::failed(policy, stored)))
            }
        }
    }

    /// `PUT /v1/sandboxes/{id}/policy`: replaces the running sandbox's `network`,
    /// `credentials` and `approvals` (see `crate::egress`). Refusals are events too.
    pub async fn apply_policy(
        self: &Arc<Self>,
        id: &str,
        document: PolicyDocument,
        approve: bool,
    ) -> Result<PolicyApplied, ApiError> {
        let live = self.running(id)?;
        let document = self.keep_repository_access(id, document)?;
        let new = Policy::from_document(&document)
            .map_err(|e| ApiError::unprocessable(format!("invalid policy: {e}")))?;
        let Some(egress) = live.egress.clone() else {
            let err = ApplyError::NotProxy;
            self.event(Some(id), "policy_rejected", &err.to_string());
            return Err(ApiError::new(ErrorCode::Conflict, err.to_string()));
        };
        let daemon = self.clone();
        let id = id.to_owned();
        tokio::task::spawn_blocking(move || {
            daemon.apply_blocking(&id, &egress, document, new, approve)
        })
        .await
        .map_err(|e| ApiError::internal(format!("the policy task failed: {e}")))?
    }

    fn apply_blocking(
        &self,
        id: &str,
        egress: &SandboxEgress,
        document: PolicyDocument,
        new: Policy,
        approve: bool,
    ) -> Result<PolicyApplied, ApiError> {
        let applied = match egress.apply(new, approve) {
            Ok(applied) => applied,
            Err(err) => {
                let message = chain(&err);
                self.event(Some(id), "policy_rejected", &message);
                let code = match err {
                    ApplyError::NotProxy | ApplyError::NoProxy | ApplyError::NeedsReview(_) => {
                        ErrorCode::Conflict
                    }
                    _ => ErrorCode::Unprocessable,
                };
                return Err(ApiError::new(code, message));
            }
        };
        let review = applied
            .findings
            .iter()
            .filter(|f| f.kind.needs_review())
            .count();
        let message = format!(
            "egress plan generation {}; {} widening finding(s), {review} approved after review",
            applied.generation,
            applied.findings.len()
        );
        // The proxy already enforces the new plan; the row makes a restarted daemon agree.
        let mut request = self
            .store
            .get_sandbox(id)?
            .ok_or_else(|| ApiError::no_sandbox(id))?
            .request;
        request.policy = Some(Box::new(document));
        let stored = applied.stored.to_json();
        if !self
            .store
            .set_policy_noting(id, &request, &stored, ("policy_changed", &message))?
        {
            return Err(ApiError::no_sandbox(id));
        }
        self.audit.lifecycle(Some(id), "policy_changed", &message);
        Ok(PolicyApplied {
            generation: applied.generation,
            findings: applied
                .findings
                .iter()
                .map(|f| PolicyFinding {
                    kind: f.kind.as_str().to_owned(),
                    needs_review: f.kind.needs_review(),
                    message: f.message.clone(),
                    witness: f.witness.clone(),
                })
                .collect(),
        })
    }

    fn egresses(&self) -> Vec<(String, Arc<SandboxEgress>)> {
        self.slots()
            .iter()
            .filter_map(|(id, slot)| match &slot.state {
                SlotState::Running(live) => live.egress.clone().map(|e| (id.clone(), e)),
                _ => None,
            })
            .collect()
    }

    /// `GET /v1/approvals`: the held requests of every sandbox (or of one), oldest first. Ids
    /// are `<sandbox id>-<proxy's id>`, unique across sandboxes.
    pub fn approvals(&self, sandbox: Option<&str>) -> Result<Vec<Approval>, ApiError> {
        if let Some(id) = sandbox
            && self.token_hash(id).is_none()
        {
            return Err(ApiError::no_sandbox(id));
        }
        let mut approvals: Vec<Approval> = self
            .egresses()
            .into_iter()
            .filter(|(id, _)| sandbox.is_none_or(|wanted| wanted == id))
            .flat_map(|(id, egress)| {
                egress.pending().into_iter().map(move |p| Approval {
                    id: format!("{id}-{}", p.id),
                    sandbox_id: id.clone(),
                    host: p.host,
                    port: p.port,
                    method: p.method,
                    path: p.path,
                    requested_at_ms: p.requested_at_unix_ms,
                    expires_at_ms: p.expires_at_unix_ms,
                })
            })
            .collect();
        approvals.sort_by(|a, b| (a.requested_at_ms, &a.id).cmp(&(b.requested_at_ms, &b.id)));
        Ok(approvals)
    }

    /// `POST /v1/approvals/{id}`: answers a held request.
    pub fn decide_approval(&self, id: &str, decision: ApprovalDecision) -> Result<(), ApiError> {
        let not_found = || {
            ApiError::new(
                ErrorCode::NotFound,
                format!("no pending approval {id:?} (it may have been answered or timed out)"),
            )
        };
        let (sandbox, local) = id.split_once('-').ok_or_else(not_found)?;
        let egress = self
            .running(sandbox)
            .ok()
            .and_then(|live| live.egress.clone())
            .ok_or_else(not_found)?;
        let decision = match decision {
            ApprovalDecision::Once => Decision::Once,
            ApprovalDecision::Always => Decision::Always,
            ApprovalDecision::Deny => Decision::Deny,
        };
        egress.decide(local, decision).map_err(|_| not_found())
    }

    /// `GET /v1/sandboxes/{id}/events`: its audit lines and lifecycle events, merged by time.
    /// Lifecycle events outlive the sandbox; its audit lines live in its directory.
    pub fn events(&self, id: &str, since_ms: u64, limit: usize) -> Result<SandboxEvents, ApiError> {
        let lifecycle = self.store.events(Some(id), MAX_LIFECYCLE_EVENTS)?;
        if lifecycle.is_empty() && self.token_hash(id).is_none() {
            return Err(ApiError::no_sandbox(id));
        }
        Ok(self.audit.events(id, lifecycle, since_ms, limit))
    }
}
