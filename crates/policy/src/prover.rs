//! The prover: which changes between two policies widen what a sandbox can do, and whether a
//! policy stays within an operator's ceiling.
//!
//! Each policy is reduced to what it grants: egress grants (host, port, method, path), the
//! credential endpoints, private ranges reachable, writable and hidden paths, the syscalls left
//! allowed, the tier and the limits. A grant of the new policy that no grant of the old one
//! covers is a [`Finding`], with a concrete example (a witness). Coverage is decided
//! conservatively (see `net`): the prover may report a change that is in fact covered, never
//! the other way round.

use std::fmt;

use airlock_api::Tier;
use airlock_api::policy::{NetworkMode, PathAccess, PolicyDocument, Unmatched};

use crate::document::Policy;
use crate::document_compile::{FsOutcome, egress_plan, filesystem_effects};
use crate::egress::EgressPlan;
use crate::net::{self, Cidr};
use crate::paths::{self, Area};
use crate::settings::Limit;
use crate::validate::egress_ports;

/// The kinds of widening. The first eight need review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FindingKind {
    /// A credential can be sent to a new host, port or path.
    CredentialReach,
    /// A new HTTP method on a destination that has a credential.
    CredentialMethod,
    /// New reach to link-local or private addresses.
    PrivateReach,
    /// A new writable path.
    WritablePath,
    /// A syscall the old policy denied.
    Syscall,
    /// A weaker minimum tier.
    TierDowngrade,
    /// `network.mode: full`.
    FullNetwork,
    /// Git pushes may change refs they could not before.
    GitPush,
    /// A hidden path became readable.
    ReadablePath,
    /// A new destination, method or path without a credential.
    Egress,
    /// A resource limit raised or lifted.
    Limit,
    /// Unmatched requests are asked about instead of denied.
    Approvals,
}

impl FindingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::CredentialReach => "credential-reach",
            FindingKind::CredentialMethod => "credential-method",
            FindingKind::PrivateReach => "private-reach",
            FindingKind::WritablePath => "writable-path",
            FindingKind::Syscall => "syscall",
            FindingKind::TierDowngrade => "tier-downgrade",
            FindingKind::FullNetwork => "full-network",
            FindingKind::GitPush => "git-push",
            FindingKind::ReadablePath => "readable-path",
            FindingKind::Egress => "egress",
            FindingKind::Limit => "limit",
            FindingKind::Approvals => "approvals",
        }
    }

    /// Whether a person must approve a change with this finding. Hidden paths becoming
    /// readable count too: a `deny` usually guards a secret.
    pub fn needs_review(self) -> bool {
        !matches!(
            self,
            FindingKind::Egress | FindingKind::Limit | FindingKind::Approvals
        )
    }
}

/// One widening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: FindingKind,
    pub message: String,
    /// A concrete thing the new policy allows and the old one does not.
    pub witness: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}{}] {} (e.g. {})",
            self.kind.as_str(),
            if self.kind.needs_review() {
                ", review"
            } else {
                ""
            },
            self.message,
            self.witness
        )
    }
}

/// Why a policy is not within a ceiling: the first thing it allows that the ceiling does not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outside the ceiling: {0}")]
pub struct Counterexample(pub Finding);

/// Every change from `old` to `new` that widens what a sandbox can do.
pub fn diff(old: &Policy, new: &Policy) -> Vec<Finding> {
    let mut findings = Vec::new();
    let (o, n) = (old.document(), new.document());
    tier(o, n, &mut findings);
    network(old, new, &mut findings);
    filesystem(o, n, &mut findings);
    syscalls(o, n, &mut findings);
    limits(old, new, &mut findings);
    if o.approvals.unmatched != Some(Unmatched::Ask)
        && n.approvals.unmatched == Some(Unmatched::Ask)
    {
        findings.push(Finding {
            kind: FindingKind::Approvals,
            message: "requests no rule allows are now asked about instead of denied".into(),
            witness: "an approved request to any host".into(),
        });
    }
    findings.sort_by_key(|f| f.kind);
    findings
}

/// Whether everything `policy` allows, `ceiling` allows too.
pub fn within(policy: &Policy, ceiling: &Policy) -> Result<(), Counterexample> {
    match diff(ceiling, policy).into_iter().next() {
        Some(finding) => Err(Counterexample(finding)),
        None => Ok(()),
    }
}

fn tier(o: &PolicyDocument, n: &PolicyDocument, findings: &mut Vec<Finding>) {
    let (old, new) = (
        o.tier.unwrap_or(Tier::Process),
        n.tier.unwrap_or(Tier::Process),
    );
    if new.strength() < old.strength() {
        findings.push(Finding {
            kind: FindingKind::TierDowngrade,
            message: format!(
                "the minimum tier drops from {} to {}",
                old.as_str(),
                new.as_str()
            ),
            witness: format!("a sandbox on the {} tier", new.as_str()),
        });
    }
}

/// One thing the proxy lets through: `None` method or path means any.
#[derive(Debug, Clone)]
struct Grant {
    host: String,
    port: u16,
    method: Option<String>,
    path: Option<String>,
}

impl Grant {
    fn witness(&self) -> String {
        format!(
            "{} {}:{}{}",
            self.method.as_deref().unwrap_or("ANY"),
            net::host_example(&self.host),
            self.port,
            self.path
                .as_deref()
                .map_or_else(|| "/".to_owned(), net::glob_example)
        )
    }
}

fn covers(outer: &Grant, inner: &Grant) -> bool {
    net::host_covers(&outer.host, &inner.host)
        && outer.port == inner.port
        && (outer.method.is_none() || outer.method == inner.method)
        && match (&outer.path, &inner.path) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(o), Some(i)) => net::glob_covers(o, i),
        }
}

/// Splits methods × paths into single grants.
fn grants(host: &str, port: u16, methods: &[String], globs: &[String]) -> Vec<Grant> {
    let methods: Vec<Option<String>> = if methods.is_empty() {
        vec![None]
    } else {
        methods.iter().cloned().map(Some).collect()
    };
    let globs: Vec<Option<String>> = if globs.is_empty() {
        vec![None]
    } else {
        globs.iter().cloned().map(Some).collect()
    };
    let mut out = Vec::new();
    for method in &methods {
        for path in &globs {
            out.push(Grant {
                host: host.to_owned(),
                port,
                method: method.clone(),
                path: path.clone(),
            });
        }
    }
    out
}

fn egress_grants(plan: &EgressPlan) -> Vec<Grant> {
    if plan.mode != crate::egress::NetworkMode::Proxy {
        return Vec::new();
    }
    let mut out = Vec::new();
    for rule in &plan.rules {
        for port in &rule.ports {
            if rule.http.is_empty() {
                out.extend(grants(&rule.host.0, *port, &[], &[]));
            }
            for http in &rule.http {
                out.extend(grants(&rule.host.0, *port, &http.methods, &http.paths));
            }
        }
    }
    out
}

/// Credential name → its grants (empty unless the policy's mode is proxy).
fn credential_grants(plan: &EgressPlan, name: &str) -> Vec<Grant> {
    if plan.mode != crate::egress::NetworkMode::Proxy {
        return Vec::new();
    }
    plan.credentials
        .iter()
        .filter(|c| c.name == name)
        .flat_map(|c| &c.endpoints)
        .flat_map(|e| grants(&e.host.0, e.port, &e.http.methods, &e.http.paths))
        .collect()
}

fn network(old: &Policy, new: &Policy, findings: &mut Vec<Finding>) {
    let (o, n) = (old.document(), new.document());
    let (old_plan, new_plan) = (egress_plan(old), egress_plan(new));
    let old_full = o.network.mode == Some(NetworkMode::Full);
    if n.network.mode == Some(NetworkMode::Full) {
        if !old_full {
            findings.push(Finding {
                kind: FindingKind::FullNetwork,
                message: "the network becomes unfiltered (mode full)".into(),
                witness: "a connection to any address and port".into(),
            });
            findings.push(Finding {
                kind: FindingKind::PrivateReach,
                message: "mode full reaches loopback-adjacent, private and link-local addresses"
                    .into(),
                witness: "a connection to 169.254.169.254:80".into(),
            });
        }
        return;
    }
    if old_full {
        return; // everything was reachable before
    }
    let old_grants = egress_grants(&old_plan);
    // Uncovered grants, grouped into one finding per kind, credential and destination.
    let mut groups: Vec<(FindingKind, String, Vec<Grant>)> = Vec::new();
    let mut add = |kind: FindingKind, subject: String, grant: Grant| match groups.iter_mut().find(
        |(k, s, g)| {
            *k == kind && *s == subject && g[0].host == grant.host && g[0].port == grant.port
        },
    ) {
        Some((_, _, list)) => list.push(grant),
        None => groups.push((kind, subject, vec![grant])),
    };
    for credential in &new_plan.credentials {
        let before = credential_grants(&old_plan, &credential.name);
        for grant in credential_grants(&new_plan, &credential.name) {
            if before.iter().any(|b| covers(b, &grant)) {
                continue;
            }
            let any_method = |b: &Grant| Grant {
                method: None,
                ..b.clone()
            };
            let kind = if before.iter().any(|b| covers(&any_method(b), &grant)) {
                FindingKind::CredentialMethod
            } else {
                FindingKind::CredentialReach
            };
            add(kind, credential.name.clone(), grant);
        }
    }
    let credentialed = |grant: &Grant| {
        new_plan
            .credentials
            .iter()
            .flat_map(|c| &c.endpoints)
            .any(|e| {
                e.port == grant.port
                    && (net::host_covers(&e.host.0, &grant.host)
                        || net::host_covers(&grant.host, &e.host.0))
            })
    };
    for grant in egress_grants(&new_plan) {
        if old_grants.iter().any(|o| covers(o, &grant)) {
            continue;
        }
        let kind = if credentialed(&grant) {
            FindingKind::CredentialMethod
        } else {
            FindingKind::Egress
        };
        add(kind, String::new(), grant);
    }
    for (kind, subject, grants) in groups {
        let g = &grants[0];
        let mut requests: Vec<String> = Vec::new();
        for grant in &grants {
            let text = format!(
                "{} {}",
                grant.method.as_deref().unwrap_or("any method"),
                grant.path.as_deref().unwrap_or("any path")
            );
            if !requests.contains(&text) {
                requests.push(text);
            }
        }
        let destination = format!("{}:{}", g.host, g.port);
        let message = match kind {
            FindingKind::CredentialReach => {
                format!(
                    "credential `{subject}` can be sent to {destination} ({})",
                    requests.join(", ")
                )
            }
            FindingKind::CredentialMethod if !subject.is_empty() => format!(
                "credential `{subject}` can be sent with new methods to {destination} ({})",
                requests.join(", ")
            ),
            FindingKind::CredentialMethod => format!(
                "new requests to {destination}, which has a credential ({})",
                requests.join(", ")
            ),
            _ => format!("new egress to {destination} ({})", requests.join(", ")),
        };
        findings.push(Finding {
            kind,
            message,
            witness: g.witness(),
        });
    }
    private_ranges(o, n, findings);
    git_pushes(&old_plan, &new_plan, findings);
}

/// The ref globs pushes to `host:port` may change under `plan`: `None` when no rule there
/// restricts pushes (any ref, as far as the proxy is concerned).
fn push_refs(plan: &EgressPlan, host: &str, port: u16) -> Option<Vec<String>> {
    let rules: Vec<_> = plan
        .rules
        .iter()
        .filter(|r| r.ports.contains(&port) && net::host_covers(&r.host.0, host))
        .collect();
    if rules.iter().all(|r| r.git_push_refs.is_none()) {
        return None;
    }
    Some(
        rules
            .iter()
            .flat_map(|r| r.git_push_refs.iter().flatten().cloned())
            .collect(),
    )
}

/// Pushes that may change new refs: a destination whose pushes were restricted is no longer,
/// or lists a ref glob the old policy's did not cover.
fn git_pushes(old: &EgressPlan, new: &EgressPlan, findings: &mut Vec<Finding>) {
    if old.mode != crate::egress::NetworkMode::Proxy
        || new.mode != crate::egress::NetworkMode::Proxy
    {
        return;
    }
    let mut seen: Vec<(String, u16)> = Vec::new();
    for rule in &old.rules {
        if rule.git_push_refs.is_none() {
            continue;
        }
        for port in &rule.ports {
            let key = (rule.host.0.clone(), *port);
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let Some(before) = push_refs(old, &rule.host.0, *port) else {
                continue;
            };
            let destination = format!("{}:{port}", rule.host.0);
            match push_refs(new, &rule.host.0, *port) {
                None => findings.push(Finding {
                    kind: FindingKind::GitPush,
                    message: format!("git pushes to {destination} are no longer limited to refs"),
                    witness: format!(
                        "POST {}:{port}/x/git-receive-pack updating refs/heads/x",
                        net::host_example(&rule.host.0)
                    ),
                }),
                Some(after) => {
                    let wider: Vec<&String> = after
                        .iter()
                        .filter(|glob| {
                            !before.iter().any(|b| {
                                net::glob_covers(&format!("/{b}"), &format!("/{glob}"))
                                    || (!glob.contains('*') && net::glob_matches(b, glob))
                            })
                        })
                        .collect();
                    if let Some(first) = wider.first() {
                        findings.push(Finding {
                            kind: FindingKind::GitPush,
                            message: format!(
                                "git pushes to {destination} may change {}",
                                wider
                                    .iter()
                                    .map(|g| g.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                            witness: format!("a push updating {}", net::glob_example(first)),
                        });
                    }
                }
            }
        }
    }
}

fn private_ranges(o: &PolicyDocument, n: &PolicyDocument, findings: &mut Vec<Finding>) {
    if n.network.mode != Some(NetworkMode::Proxy) {
        return;
    }
    let old_proxy = o.network.mode == Some(NetworkMode::Proxy);
    for rule in &n.network.egress {
        for range in rule.allowed_ips.iter().filter_map(|r| Cidr::parse(r).ok()) {
            let covered = old_proxy
                && o.network.egress.iter().any(|old| {
                    net::host_covers(&old.host, &rule.host)
                        && old
                            .allowed_ips
                            .iter()
                            .filter_map(|r| Cidr::parse(r).ok())
                            .any(|c| c.covers(&range))
                });
            if !covered {
                let class = range.exception_class().unwrap_or("private");
                findings.push(Finding {
                    kind: FindingKind::PrivateReach,
                    message: format!("{} may now resolve to the {class} range {range}", rule.host),
                    witness: format!(
                        "{} resolving to {} on port {}",
                        net::host_example(&rule.host),
                        range.addr,
                        egress_ports(rule)[0]
                    ),
                });
            }
        }
    }
}

/// Writable roots and protected paths, and hidden paths, of a document with a fresh workspace.
struct FsView {
    writable_roots: Vec<String>,
    protected: Vec<String>,
    hidden: Vec<String>,
}

fn fs_view(doc: &PolicyDocument) -> FsView {
    let mut view = FsView {
        writable_roots: vec![paths::WORKSPACE.to_owned(), paths::TMP.to_owned()],
        protected: Vec::new(),
        hidden: Vec::new(),
    };
    for effect in filesystem_effects(doc, paths::TMP, false, &[]) {
        match effect.outcome {
            FsOutcome::ReadOnlyRoot => view.writable_roots.retain(|r| *r != effect.path),
            FsOutcome::Protected => view.protected.push(effect.path),
            FsOutcome::Masked | FsOutcome::StartsEmpty if effect.access == PathAccess::Deny => {
                view.hidden.push(effect.path);
            }
            _ => {}
        }
    }
    view
}

fn filesystem(o: &PolicyDocument, n: &PolicyDocument, findings: &mut Vec<Finding>) {
    let (old, new) = (fs_view(o), fs_view(n));
    for root in &new.writable_roots {
        if !old.writable_roots.contains(root) {
            findings.push(Finding {
                kind: FindingKind::WritablePath,
                message: format!("{root} becomes writable"),
                witness: format!("writing {root}/new-file"),
            });
        }
    }
    for path in &old.protected {
        let (area, _) = paths::area(path);
        let root = if area == Area::Workspace {
            paths::WORKSPACE
        } else {
            paths::TMP
        };
        let still_read_only = new.protected.iter().any(|p| paths::pattern_covers(p, path))
            || !new.writable_roots.iter().any(|r| r == root);
        if !still_read_only {
            findings.push(Finding {
                kind: FindingKind::WritablePath,
                message: format!("{path} is no longer protected"),
                witness: format!("writing {path}"),
            });
        }
    }
    for path in &old.hidden {
        if !new.hidden.iter().any(|p| paths::pattern_covers(p, path)) {
            findings.push(Finding {
                kind: FindingKind::ReadablePath,
                message: format!("{path} is no longer hidden"),
                witness: format!("reading {}", path.replace('*', "x")),
            });
        }
    }
}

fn syscalls(o: &PolicyDocument, n: &PolicyDocument, findings: &mut Vec<Finding>) {
    let (old, new) = (&o.process.syscalls, &n.process.syscalls);
    for name in &new.allow_extra {
        if !old.allow_extra.contains(name) {
            findings.push(Finding {
                kind: FindingKind::Syscall,
                message: format!("{name} is removed from the built-in deny-list"),
                witness: format!("calling {name}"),
            });
        }
    }
    for name in &old.deny_extra {
        if !new.deny_extra.contains(name) {
            findings.push(Finding {
                kind: FindingKind::Syscall,
                message: format!("{name} is no longer denied"),
                witness: format!("calling {name}"),
            });
        }
    }
}

fn limits(old: &Policy, new: &Policy, findings: &mut Vec<Finding>) {
    let (o, n) = (old.settings(), new.settings());
    let defaults = airlock_api::ResourceLimits::default();
    let effective = |limit: Option<Limit>, default: Option<u64>| match limit {
        Some(limit) => limit.as_option(),
        None => default,
    };
    let pairs = [
        (
            "memory (bytes)",
            effective(o.memory, defaults.memory_bytes),
            effective(n.memory, defaults.memory_bytes),
        ),
        (
            "pids",
            effective(o.pids, defaults.pids_max),
            effective(n.pids, defaults.pids_max),
        ),
        (
            "cpus (thousandths)",
            o.cpu_milli.map(u64::from),
            n.cpu_milli.map(u64::from),
        ),
        (
            "disk (bytes)",
            Some(o.disk_bytes.unwrap_or(defaults.disk_bytes)),
            Some(n.disk_bytes.unwrap_or(defaults.disk_bytes)),
        ),
        ("timeout (ms)", o.timeout_ms, n.timeout_ms),
    ];
    for (name, before, after) in pairs {
        let wider = match (before, after) {
            (Some(before), Some(after)) => after > before,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if wider {
            let shown =
                |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string());
            findings.push(Finding {
                kind: FindingKind::Limit,
                message: format!("{name} rises from {} to {}", shown(before), shown(after)),
                witness: format!("{name} = {}", shown(after)),
            });
        }
    }
}

#[cfg(test)]
#[path = "prover_tests.rs"]
mod tests;
