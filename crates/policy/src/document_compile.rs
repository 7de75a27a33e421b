//! A policy's effect on the process tier's plan, and its [`EgressPlan`]. Pure functions:
//! [`filesystem_effects`] decides what each filesystem rule does, and both the compiler and
//! `explain` read that one list, so they cannot disagree.

use airlock_api::SandboxConfig;
use airlock_api::policy::{
    AccessPreset, CredentialSourceSpec, InjectSpec, NetworkMode as DocMode, PathAccess,
    PolicyDocument, Unmatched,
};

use crate::compile::CompileError;
use crate::document::Policy;
use crate::egress::{
    ApprovalMode, CredentialPlan, CredentialSource, EgressPlan, EgressRule, Endpoint, HostPattern,
    HttpRule, Injection, NetworkMode,
};
use crate::net::{METHODS, READ_ONLY_METHODS};
use crate::paths::{self, Area};
use crate::plan::{Mask, MaskKind, Plan};
use crate::seccomp::{SeccompRule, SyscallAction};
use crate::settings::parse_duration;
use crate::validate::egress_ports;

/// Protected inside the workspace unless `protect_git: false`.
pub const GIT_PROTECTED: &[&str] = &[":workspace/.git/hooks", ":workspace/.git/config"];
/// How long an `ask` waits by default.
pub const DEFAULT_ASK_TIMEOUT_MS: u64 = 60_000;

/// What a filesystem rule does on the process tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsOutcome {
    /// What the base view already gives: a readable host path, a writable root.
    Default,
    /// Hidden: a mode-000 mount over it, and no Landlock read right.
    Masked,
    /// A writable root made read-only: a read-only bind over it and no Landlock write right.
    ReadOnlyRoot,
    /// A read-only bind over it, if it exists when the sandbox starts.
    Protected,
    /// Inside a filesystem that starts empty, so there is nothing to hide.
    StartsEmpty,
    /// Not possible on this tier.
    Refused(String),
}

/// One filesystem rule, as written and as it lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEffect {
    /// As written (`~/.ssh`), or `protected: X`.
    pub rule: String,
    pub access: PathAccess,
    /// The path in the sandbox.
    pub path: String,
    pub outcome: FsOutcome,
}

/// The rules of `doc` with their outcome. `home` is the workload's `HOME`, `host_workspace`
/// whether `/workspace` is a host directory, `masks` the built-in mask patterns.
pub fn filesystem_effects(
    doc: &PolicyDocument,
    home: &str,
    host_workspace: bool,
    masks: &[String],
) -> Vec<FsEffect> {
    let fs = &doc.filesystem;
    let mut rules: Vec<(String, PathAccess)> = fs
        .rules
        .iter()
        .map(|(path, access)| (path.clone(), *access))
        .collect();
    if fs.protect_git != Some(false) {
        rules.extend(
            GIT_PROTECTED
                .iter()
                .map(|p| ((*p).to_owned(), PathAccess::Ro)),
        );
    }
    rules.extend(fs.protected.iter().map(|p| (p.clone(), PathAccess::Ro)));
    let resolved: Vec<(String, PathAccess, Result<String, String>)> = rules
        .into_iter()
        .map(|(rule, access)| {
            let path = paths::parse(&rule).map(|p| p.resolve(home));
            (rule, access, path)
        })
        .collect();
    let root_read_only = |root: Area| {
        resolved.iter().any(|(_, access, path)| {
            *access == PathAccess::Ro && path.as_ref().is_ok_and(|p| paths::area(p) == (root, true))
        })
    };
    let workspace_ro = root_read_only(Area::Workspace);
    let tmp_ro = root_read_only(Area::Tmp);
    let mut effects = Vec::new();
    for (rule, access, path) in resolved {
        let (path, outcome) = match path {
            Err(problem) => (rule.clone(), FsOutcome::Refused(problem)),
            Ok(path) => {
                let outcome = outcome(&path, access, workspace_ro, tmp_ro, host_workspace, masks);
                (path, outcome)
            }
        };
        effects.push(FsEffect {
            rule,
            access,
            path,
            outcome,
        });
    }
    effects
}

fn outcome(
    path: &str,
    access: PathAccess,
    workspace_ro: bool,
    tmp_ro: bool,
    host_workspace: bool,
    masks: &[String],
) -> FsOutcome {
    let refused = |why: &str| FsOutcome::Refused(why.to_owned());
    let (area, is_root) = paths::area(path);
    match (area, is_root, access) {
        (Area::Provided, ..) => refused("Airlock provides this filesystem itself"),
        (Area::Workspace | Area::Tmp, true, PathAccess::Ro) => FsOutcome::ReadOnlyRoot,
        (Area::Workspace | Area::Tmp, true, PathAccess::Rw) => FsOutcome::Default,
        (Area::Workspace | Area::Tmp, true, PathAccess::Deny) => {
            refused("a writable root cannot be hidden; make it `ro`")
        }
        (Area::Workspace | Area::Tmp, false, access) => {
            let root_ro = if area == Area::Workspace {
                workspace_ro
            } else {
                tmp_ro
            };
            match access {
                PathAccess::Ro if root_ro => FsOutcome::Default,
                PathAccess::Ro => FsOutcome::Protected,
                PathAccess::Rw if root_ro => refused(
                    "it lies inside a read-only root; a writable path inside one is not supported",
                ),
                PathAccess::Rw => FsOutcome::Default,
                PathAccess::Deny if area == Area::Workspace && host_workspace => refused(
                    "hiding a path inside a host workspace is not supported on the process tier (masks are placed before the workspace is mounted)",
                ),
                PathAccess::Deny => FsOutcome::StartsEmpty,
            }
        }
        (Area::Host, true, PathAccess::Ro) => FsOutcome::Default,
        (Area::Host, true, _) => refused("`/` cannot be writable or hidden"),
        (Area::Host, false, PathAccess::Ro) => {
            if masks.iter().any(|mask| paths::pattern_covers(mask, path)) {
                refused("a built-in mask hides it; a policy cannot lift built-in masks")
            } else {
                FsOutcome::Default
            }
        }
        (Area::Host, false, PathAccess::Rw) => refused(
            "the host's view is read-only on the process tier; only :workspace, :tmp and paths below them can be writable",
        ),
        (Area::Host, false, PathAccess::Deny) => FsOutcome::Masked,
    }
}

/// The workload's `HOME` in a compiled plan (`~`).
pub fn plan_home(plan: &Plan) -> String {
    plan.process
        .env
        .iter()
        .rev()
        .find(|(name, _)| name == "HOME")
        .map_or_else(|| "/tmp".to_owned(), |(_, value)| value.clone())
}

/// Applies a policy's filesystem, syscall and network sections to the process tier's plan.
pub fn apply(policy: &Policy, config: &SandboxConfig, plan: &mut Plan) -> Result<(), CompileError> {
    let doc = policy.document();
    if let Some(required) = doc.tier
        && required.strength() > config.tier.strength()
    {
        return Err(CompileError::PolicyTier {
            required: required.as_str(),
            requested: config.tier.as_str(),
        });
    }
    let home = plan_home(plan);
    if !home.starts_with('/') {
        return Err(CompileError::RelativePath {
            what: "HOME (which `~` stands for)",
            path: home,
        });
    }
    let host_workspace = matches!(config.workspace, airlock_api::WorkspaceSource::Host { .. });
    let masks: Vec<String> = plan.view.masks.iter().map(|m| m.path.clone()).collect();
    let container = config.tier == airlock_api::Tier::Container;
    for mut effect in filesystem_effects(doc, &home, host_workspace, &masks) {
        if container {
            let home_known = plan.process.env.iter().any(|(name, _)| name == "HOME");
            effect.outcome = container_outcome(&effect, home_known);
        }
        match effect.outcome {
            FsOutcome::Refused(reason) => {
                return Err(CompileError::PolicyUnsupported {
                    rule: format!("{}: {}", effect.rule, effect.access.as_str()),
                    reason,
                });
            }
            FsOutcome::Masked => {
                plan.view.masks.push(Mask {
                    path: effect.path.clone(),
                    kind: MaskKind::Secret,
                });
                plan.landlock.read_except.push(effect.path);
            }
            FsOutcome::ReadOnlyRoot => {
                plan.landlock
                    .write_trees
                    .retain(|tree| tree.as_os_str() != effect.path.as_str());
                plan.view.read_only_paths.push(effect.path.into());
            }
            FsOutcome::Protected => plan.view.read_only_paths.push(effect.path.into()),
            FsOutcome::Default | FsOutcome::StartsEmpty => {}
        }
    }
    plan.view
        .read_only_paths
        .sort_by_key(|p| (p.components().count(), p.clone()));
    plan.view.read_only_paths.dedup();
    apply_syscalls(doc, &mut plan.seccomp);
    if doc.network.mode == Some(DocMode::Full) {
        return Err(CompileError::PolicyUnsupported {
            rule: "network.mode: full".into(),
            reason: "not supported yet on the process tier; use `proxy` with egress rules".into(),
        });
    }
    Ok(())
}

/// What a rule does on the container tier, where `/` is the image's writable overlay rather
/// than the host's read-only view: `ro` becomes a read-only bind, `rw` is the default, `deny`
/// a mask. `~` stands for a home directory known only once the image's user is looked up.
pub fn container_outcome(effect: &FsEffect, home_known: bool) -> FsOutcome {
    if effect
        .rule
        .trim_start_matches("protected: ")
        .starts_with('~')
        && !home_known
    {
        return FsOutcome::Refused(
            "`~` is the image user's home, known only when the sandbox starts; name the path or set HOME".into(),
        );
    }
    let (area, is_root) = paths::area(&effect.path);
    match (&effect.outcome, area, is_root, effect.access) {
        (_, Area::Host, true, PathAccess::Rw) => FsOutcome::Default,
        (_, Area::Host, true, _) => FsOutcome::Refused(
            "`/` is the image's writable root on the container tier; it cannot be read-only or hidden".into(),
        ),
        (_, Area::Host, false, PathAccess::Ro) => FsOutcome::Protected,
        (_, Area::Host, false, PathAccess::Rw) => FsOutcome::Default,
        (outcome, ..) => outcome.clone(),
    }
}

fn apply_syscalls(doc: &PolicyDocument, rules: &mut Vec<SeccompRule>) {
    let syscalls = &doc.process.syscalls;
    rules.retain(|rule| !syscalls.allow_extra.contains(&rule.syscall));
    for name in &syscalls.deny_extra {
        let already = rules
            .iter()
            .any(|rule| rule.syscall == *name && rule.checks.is_empty());
        if !already {
            rules.push(SeccompRule {
                syscall: name.clone(),
                checks: Vec::new(),
                action: SyscallAction::Eperm,
                why: "denied by the policy (process.syscalls.deny_extra)".into(),
            });
        }
    }
}

fn http_rules(access: Option<AccessPreset>, methods: &[String], paths: &[String]) -> Vec<HttpRule> {
    let methods: Vec<String> = match access {
        Some(AccessPreset::ReadOnly) => READ_ONLY_METHODS.iter().map(|m| (*m).to_owned()).collect(),
        Some(AccessPreset::ReadWrite) => METHODS.iter().map(|m| (*m).to_owned()).collect(),
        None => methods.to_vec(),
    };
    if methods.is_empty() && paths.is_empty() {
        return Vec::new();
    }
    vec![HttpRule {
        methods,
        paths: paths.to_vec(),
    }]
}

/// What the egress proxy enforces for a sandbox with this policy.
pub fn egress_plan(policy: &Policy) -> EgressPlan {
    let doc = policy.document();
    let mode = match doc.network.mode {
        None | Some(DocMode::None) => NetworkMode::None,
        Some(DocMode::Proxy) => NetworkMode::Proxy,
        Some(DocMode::Full) => NetworkMode::Full,
    };
    let rules = doc
        .network
        .egress
        .iter()
        .map(|rule| EgressRule {
            name: crate::profiles::egress_name(rule).to_owned(),
            host: HostPattern(rule.host.clone()),
            ports: egress_ports(rule),
            http: http_rules(rule.access, &rule.methods, &rule.paths),
            git_push_refs: rule.git_push_refs.clone(),
        })
        .collect();
    let credentials = doc
        .credentials
        .iter()
        .map(|credential| CredentialPlan {
            name: credential.name.clone(),
            source: match &credential.source {
                CredentialSourceSpec::Env(var) => CredentialSource::Env { var: var.clone() },
                CredentialSourceSpec::File(path) => CredentialSource::File { path: path.into() },
            },
            env: credential.env.clone(),
            inject: match &credential.inject {
                InjectSpec::Bearer => Injection::Bearer,
                InjectSpec::Header(name) => Injection::Header { name: name.clone() },
                InjectSpec::Basic { username } => Injection::Basic {
                    username: username.clone(),
                },
            },
            endpoints: credential
                .endpoints
                .iter()
                .map(|endpoint| Endpoint {
                    host: HostPattern(endpoint.host.clone()),
                    port: endpoint.port.unwrap_or(443),
                    http: HttpRule {
                        methods: endpoint.methods.clone(),
                        paths: endpoint.paths.clone(),
                    },
                })
                .collect(),
        })
        .collect();
    let approvals = match doc.approvals.unmatched {
        Some(Unmatched::Ask) => ApprovalMode::Ask {
            timeout_ms: doc
                .approvals
                .timeout
                .as_ref()
                .and_then(|t| parse_duration(t).ok())
                .unwrap_or(DEFAULT_ASK_TIMEOUT_MS),
        },
        None | Some(Unmatched::Deny) => ApprovalMode::Deny,
    };
    EgressPlan {
        mode,
        rules,
        credentials,
        approvals,
    }
}

#[cfg(test)]
#[path = "document_compile_tests.rs"]
mod tests;
