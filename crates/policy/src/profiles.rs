//! The built-in profiles (`extends`) and the merge rules.
//!
//! Profiles are YAML files compiled into the binary and read by the same parser as any policy.
//! Merging applies documents in order, each over the result so far:
//!
//! - a scalar set later wins (`tier`, `network.mode`, `process.user`, each resource);
//! - maps override by key (`filesystem.rules`: a later rule for the same path replaces it);
//! - lists append without duplicates (`filesystem.protected`, `process.syscalls.*`);
//! - named entries replace an earlier entry of the same name, or append (`network.egress` by
//!   `name`, else host; `credentials` by `name`).

use airlock_api::policy::{EgressPolicy, PolicyDocument};

use crate::document::{SourceDoc, parse_yaml};

/// Name and text of each built-in profile.
const PROFILES: &[(&str, &str)] = &[
    ("read-only", include_str!("../profiles/read-only.yaml")),
    ("workspace", include_str!("../profiles/workspace.yaml")),
    (
        "networked-dev",
        include_str!("../profiles/networked-dev.yaml"),
    ),
];

/// How deep profiles may extend each other.
const MAX_DEPTH: usize = 8;

/// The names of the built-in profiles.
pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|(name, _)| *name).collect()
}

/// The YAML text of a built-in profile.
pub fn text(name: &str) -> Option<&'static str> {
    PROFILES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, text)| *text)
}

/// A profile and, before it, every profile it extends (base first). `stack` holds the names
/// being loaded, to refuse cycles.
pub(crate) fn load(name: &str, stack: &mut Vec<String>) -> Result<Vec<SourceDoc>, String> {
    let Some(text) = text(name) else {
        return Err(format!(
            "unknown profile `{name}` (built-in profiles: {})",
            names().join(", ")
        ));
    };
    if stack.iter().any(|seen| seen == name) || stack.len() >= MAX_DEPTH {
        return Err(format!("profile `{name}` extends itself"));
    }
    let source = format!("builtin:{name}");
    let doc = parse_yaml(&source, text).map_err(|e| e.to_string())?;
    stack.push(name.to_owned());
    let mut layers = Vec::new();
    for base in &doc.document.extends {
        layers.extend(load(base, stack)?);
    }
    stack.pop();
    layers.push(doc);
    Ok(layers)
}

fn set<T: Clone>(slot: &mut Option<T>, later: &Option<T>) {
    if later.is_some() {
        slot.clone_from(later);
    }
}

fn append<T: Clone + PartialEq>(list: &mut Vec<T>, later: &[T]) {
    for item in later {
        if !list.contains(item) {
            list.push(item.clone());
        }
    }
}

/// The key egress rules merge by.
pub(crate) fn egress_name(rule: &EgressPolicy) -> &str {
    rule.name.as_deref().unwrap_or(&rule.host)
}

/// Merges `later` over `base`. `extends` is not merged: the caller resolves it.
pub fn merge(base: &mut PolicyDocument, later: &PolicyDocument) {
    set(&mut base.tier, &later.tier);
    let fs = &mut base.filesystem;
    for (path, access) in &later.filesystem.rules {
        fs.rules.insert(path.clone(), *access);
    }
    append(&mut fs.protected, &later.filesystem.protected);
    set(&mut fs.protect_git, &later.filesystem.protect_git);
    set(&mut base.process.user, &later.process.user);
    let syscalls = &mut base.process.syscalls;
    append(&mut syscalls.deny_extra, &later.process.syscalls.deny_extra);
    append(
        &mut syscalls.allow_extra,
        &later.process.syscalls.allow_extra,
    );
    let r = &mut base.resources;
    let l = &later.resources;
    set(&mut r.memory, &l.memory);
    set(&mut r.pids, &l.pids);
    set(&mut r.cpus, &l.cpus);
    set(&mut r.disk, &l.disk);
    set(&mut r.timeout, &l.timeout);
    set(&mut base.network.mode, &later.network.mode);
    for rule in &later.network.egress {
        let name = egress_name(rule);
        match base
            .network
            .egress
            .iter_mut()
            .find(|existing| egress_name(existing) == name)
        {
            Some(existing) => existing.clone_from(rule),
            None => base.network.egress.push(rule.clone()),
        }
    }
    for credential in &later.credentials {
        match base
            .credentials
            .iter_mut()
            .find(|existing| existing.name == credential.name)
        {
            Some(existing) => existing.clone_from(credential),
            None => base.credentials.push(credential.clone()),
        }
    }
    set(&mut base.approvals.unmatched, &later.approvals.unmatched);
    set(&mut base.approvals.timeout, &later.approvals.timeout);
    set(&mut base.audit.egress, &later.audit.egress);
}
