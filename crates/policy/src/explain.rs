//! `airlock policy explain`: each rule of a policy, the mechanism that enforces it on a tier,
//! and what is not enforced there. It reads the same [`filesystem_effects`] the compiler
//! applies, so the text cannot promise more than the plan does.

use std::fmt::Write as _;

use airlock_api::policy::{
    AccessPreset, CredentialSourceSpec, InjectSpec, NetworkMode, PathAccess, Unmatched,
};
use airlock_api::{SandboxConfig, Tier};

use crate::compile::{HostFacts, compile};
use crate::document::Policy;
use crate::document_compile::{FsOutcome, egress_plan, filesystem_effects, plan_home};
use crate::egress::ApprovalMode;
use crate::validate::egress_ports;

/// One explained rule.
struct Line {
    rule: String,
    mechanism: String,
    /// `None` when fully enforced; otherwise what is missing.
    gap: Option<String>,
}

fn line(rule: impl Into<String>, mechanism: impl Into<String>) -> Line {
    Line {
        rule: rule.into(),
        mechanism: mechanism.into(),
        gap: None,
    }
}

fn gap(rule: impl Into<String>, mechanism: impl Into<String>, gap: impl Into<String>) -> Line {
    Line {
        rule: rule.into(),
        mechanism: mechanism.into(),
        gap: Some(gap.into()),
    }
}

/// The explanation of `policy` on `tier`, for a sandbox configured as `config` (its workspace
/// and environment decide what `~` and a `deny` inside the workspace mean).
pub fn explain(policy: &Policy, tier: Tier, config: &SandboxConfig, host: &HostFacts) -> String {
    let mut out = String::new();
    let _ = write!(out, "policy {}", policy.source());
    if !policy.profiles().is_empty() {
        let _ = write!(out, " (extends {})", policy.profiles().join(", "));
    }
    let _ = writeln!(out);
    if tier == Tier::Microvm {
        let _ = writeln!(
            out,
            "tier microvm: a Linux guest of Airlock's VMM, which runs in the process tier's jail; the guest sees nothing of the host, and the VM is the boundary. Inside the guest there is no Landlock, seccomp filter or capability drop yet: rules that need them are marked NOT ENFORCED, and syscall rules are refused at create. `airlock run` refuses the tier (daemon and runtime sandboxes only)."
        );
    } else {
        let _ = writeln!(out, "tier {}", tier.as_str());
    }
    let required = policy.document().tier.unwrap_or(Tier::Process);
    if required.strength() > tier.strength() {
        let _ = writeln!(
            out,
            "REFUSED: the policy needs at least the {} tier",
            required.as_str()
        );
    }
    let sections = [
        ("filesystem", filesystem(policy, tier, config, host)),
        ("process", process(policy, tier)),
        ("resources", resources(policy, tier)),
        ("network", network(policy, tier)),
        ("credentials", credentials(policy)),
        ("approvals and audit", approvals(policy)),
    ];
    for (title, lines) in sections {
        let _ = writeln!(out, "\n{title}");
        for l in lines {
            let _ = writeln!(out, "  {}\n      {}", l.rule, l.mechanism);
            if let Some(missing) = l.gap {
                let _ = writeln!(out, "      NOT ENFORCED: {missing}");
            }
        }
    }
    out
}

fn filesystem(policy: &Policy, tier: Tier, config: &SandboxConfig, host: &HostFacts) -> Vec<Line> {
    if tier == Tier::Microvm {
        return guest_filesystem(policy, config, host);
    }
    let mut base = config.clone();
    base.policy = None;
    base.tier = Tier::Process;
    let plan = compile(&base, host).ok();
    let home = plan.as_ref().map_or_else(|| "/tmp".to_owned(), plan_home);
    let masks: Vec<String> = plan
        .map(|p| p.view.masks.into_iter().map(|m| m.path).collect())
        .unwrap_or_default();
    let host_workspace = matches!(config.workspace, airlock_api::WorkspaceSource::Host { .. });
    let (view, landlock, bind) = match tier {
        Tier::Process => (
            "the mount view",
            "Landlock",
            "a read-only bind mount over it",
        ),
        Tier::Container => (
            "the image's overlay",
            "Landlock",
            "a read-only bind mount over it",
        ),
        _ => (
            "the guest's read-only root disk",
            "Landlock in the guest",
            "a read-only bind in the guest",
        ),
    };
    let container = tier == Tier::Container;
    let base_root = if container {
        line(
            "/ rw (base)",
            format!(
                "{view}: the image's layers under a fresh upper directory in the sandbox's scratch space, writable except /proc, /sys and /dev; nothing of the host is visible, so nothing needs a mask"
            ),
        )
    } else {
        line(
            "/ ro (base)",
            format!(
                "{view}: the host's root, read-only; {landlock} grants reads; {} built-in masks hide credentials and Airlock's state",
                masks.len()
            ),
        )
    };
    let mut lines = vec![
        base_root,
        line(
            ":workspace rw, :tmp rw (base)",
            format!(
                "{view}: a tmpfs or the host directory at /workspace, a tmpfs at /tmp; {landlock} grants writes; ~ is {home}"
            ),
        ),
    ];
    let home_known = config.env.iter().any(|(name, _)| name == "HOME");
    let masks = if container { Vec::new() } else { masks };
    for mut effect in filesystem_effects(policy.document(), &home, host_workspace, &masks) {
        if container {
            effect.outcome = crate::document_compile::container_outcome(&effect, home_known);
        }
        let rule = format!(
            "{} {} -> {}",
            effect.rule,
            effect.access.as_str(),
            effect.path
        );
        lines.push(match effect.outcome {
            FsOutcome::Default if effect.access == PathAccess::Ro => {
                line(rule, format!("already readable through {view}"))
            }
            FsOutcome::Default => line(rule, "already as asked by the base view"),
            FsOutcome::Masked => line(
                rule,
                format!("a mode-000 mount over it in {view}, and no {landlock} read right (also for files created there later)"),
            ),
            FsOutcome::ReadOnlyRoot => line(
                rule,
                format!("{bind}, and no {landlock} write right"),
            ),
            FsOutcome::Protected => gap(
                rule,
                format!("{bind}; its parent directories are pinned so they cannot be renamed away"),
                format!("only if it exists when the sandbox starts: a path created later is not protected ({landlock} cannot carve a read-only hole in a writable tree)"),
            ),
            FsOutcome::StartsEmpty => line(
                rule,
                "nothing to hide: this filesystem starts empty (with a host workspace this rule is refused)",
            ),
            FsOutcome::Refused(reason) => gap(rule, "REFUSED at start", reason),
        });
    }
    lines
}

/// The microvm tier's filesystem: the guest's own disks; the host is not in it, and the
/// guest applies no path rules yet.
fn guest_filesystem(policy: &Policy, config: &SandboxConfig, host: &HostFacts) -> Vec<Line> {
    let mut lines = vec![
        line(
            "/ (base)",
            "the guest's root: its image's disk, read-only to the VMM and shared, under the sandbox's own overlay disk, where every write lands; nothing of the host is visible, so nothing needs a mask",
        ),
        line(
            ":workspace rw, :tmp rw (base)",
            "directories of the guest's root (on the overlay disk)",
        ),
    ];
    let mut base = config.clone();
    base.policy = None;
    base.tier = Tier::Process;
    let home = compile(&base, host)
        .ok()
        .as_ref()
        .map_or_else(|| "/tmp".to_owned(), plan_home);
    for effect in filesystem_effects(policy.document(), &home, false, &[]) {
        lines.push(gap(
            format!(
                "{} {} -> {}",
                effect.rule,
                effect.access.as_str(),
                effect.path
            ),
            "the path inside the guest (the host's is not there)",
            "the guest applies no path rules yet (no Landlock or read-only binds inside it)",
        ));
    }
    lines
}

fn process(policy: &Policy, tier: Tier) -> Vec<Line> {
    if tier == Tier::Microvm {
        return guest_process(policy);
    }
    let doc = policy.document();
    let filter = "the seccomp filter";
    let enforced = if tier == Tier::Container {
        "bounding set emptied (an image root under a root caller keeps its file capabilities \
         in its own user namespace), ids switched, no_new_privs; the built-in seccomp deny-list"
    } else {
        "bounding set emptied, ids switched, no_new_privs; the built-in seccomp deny-list"
    };
    let mut lines = vec![line("capabilities, no_new_privs (base)", enforced)];
    if let Some(user) = &doc.process.user {
        lines.push(line(
            format!("user {user}"),
            "the user namespace's id map and setresuid/setresgid",
        ));
    }
    for name in &doc.process.syscalls.deny_extra {
        lines.push(line(format!("deny {name}"), format!("{filter}: EPERM")));
    }
    for name in &doc.process.syscalls.allow_extra {
        lines.push(line(
            format!("allow {name}"),
            format!("removed from {filter}'s deny-list (a widening the prover reports)"),
        ));
    }
    lines
}

/// The microvm tier's processes: the guest's kernel runs them, unconfined inside it.
fn guest_process(policy: &Policy) -> Vec<Line> {
    let doc = policy.document();
    let mut lines = vec![gap(
        "capabilities, no_new_privs (base)",
        "the VM: the guest's kernel is the sandbox's own; the VMM that runs it is confined by the process tier's jail and its own seccomp allow-list",
        "inside the guest, commands keep what the guest's kernel gives them (no capability drop or seccomp deny-list there yet)",
    )];
    if let Some(user) = &doc.process.user {
        lines.push(line(
            format!("user {user}"),
            "the VMM's jail runs as this user; the guest's agent starts commands as the user each request names",
        ));
    }
    for name in doc
        .process
        .syscalls
        .deny_extra
        .iter()
        .chain(&doc.process.syscalls.allow_extra)
    {
        lines.push(gap(
            format!("syscall rule {name}"),
            "REFUSED at create",
            "the guest has no seccomp filter to carry it yet",
        ));
    }
    lines
}

fn resources(policy: &Policy, tier: Tier) -> Vec<Line> {
    let r = &policy.document().resources;
    let guest = tier == Tier::Microvm;
    let mut lines = Vec::new();
    let entries: [(&str, _, Line); 5] = [
        (
            "memory",
            &r.memory,
            if guest {
                line(
                    "",
                    "the guest's memory size; the VMM's cgroup holds it and Airlock's reserve, no swap",
                )
            } else {
                line("", "the sandbox's cgroup: memory limit, no swap")
            },
        ),
        (
            "pids",
            &r.pids,
            if guest {
                gap(
                    "",
                    "the VMM's cgroup: pids.max",
                    "it counts the VMM's threads: the guest's processes have no limit yet",
                )
            } else {
                line("", "the sandbox's cgroup: pids.max")
            },
        ),
        (
            "cpus",
            &r.cpus,
            if guest {
                line("", "the VMM's cgroup: CPU bandwidth over its vCPU")
            } else {
                line("", "the sandbox's cgroup: CPU bandwidth")
            },
        ),
        (
            "disk",
            &r.disk,
            if guest {
                gap(
                    "",
                    "the guest's overlay disk",
                    "its size is Airlock's fixed 1 GiB (sparse), not this",
                )
            } else {
                line(
                    "",
                    "tmpfs sizes of /tmp and a fresh /workspace, and RLIMIT_FSIZE",
                )
            },
        ),
        (
            "timeout",
            &r.timeout,
            line("", "the supervisor's deadline: the whole sandbox is killed"),
        ),
    ];
    for (name, value, mut explained) in entries {
        if let Some(value) = value {
            explained.rule = format!("{name} {}", value.0);
            lines.push(explained);
        }
    }
    if lines.is_empty() {
        lines.push(line(
            "(Airlock's defaults)",
            "2 GiB memory, 1024 pids, 1 GiB disk, no CPU cap, no timeout",
        ));
    }
    lines
}

fn network(policy: &Policy, tier: Tier) -> Vec<Line> {
    let doc = policy.document();
    let mut lines = Vec::new();
    match doc.network.mode.unwrap_or(NetworkMode::None) {
        NetworkMode::None if tier == Tier::Microvm => lines.push(line(
            "mode none",
            "the guest has no network device: its one channel is the vsock to its agent",
        )),
        NetworkMode::None => {
            lines.push(line("mode none", "a network namespace with loopback only"))
        }
        NetworkMode::Full if tier == Tier::Microvm => lines.push(gap(
            "mode full",
            "REFUSED at create",
            "the guest has no network device to give the host's network to (use proxy)",
        )),
        NetworkMode::Full if tier == Tier::Process => lines.push(gap(
            "mode full",
            "REFUSED at start",
            "not supported yet on the process tier",
        )),
        NetworkMode::Full => lines.push(line("mode full", "the host's network, unfiltered")),
        NetworkMode::Proxy => {
            lines.push(line(
                "mode proxy",
                if tier == Tier::Microvm {
                    "the guest has no network device: its only way out is Airlock's egress proxy, outside the VM, reached over vsock (the agent relays 127.0.0.1:3128 to a host port the VMM forwards to the proxy; any other host port is reset)"
                } else {
                    "a network namespace whose only way out is Airlock's egress proxy, outside the sandbox (if the runtime starts no proxy, the sandbox keeps loopback only: fail-closed)"
                },
            ));
            lines.push(line(
                "hard block (base)",
                "the proxy refuses loopback, link-local (169.254.169.254 included), private and multicast addresses after DNS resolution, in every encoding",
            ));
        }
    }
    let plan = egress_plan(policy);
    for (rule, plan_rule) in doc.network.egress.iter().zip(&plan.rules) {
        let ports: Vec<String> = egress_ports(rule).iter().map(u16::to_string).collect();
        let methods = match (rule.access, plan_rule.http.first()) {
            (Some(AccessPreset::ReadOnly), _) => "read-only methods".to_owned(),
            (Some(AccessPreset::ReadWrite), _) => "read-write methods".to_owned(),
            (None, Some(http)) if !http.methods.is_empty() => http.methods.join(","),
            _ => "any method".to_owned(),
        };
        let paths = if rule.paths.is_empty() {
            "any path".to_owned()
        } else {
            rule.paths.join(" ")
        };
        let how = if plan_rule.http.is_empty() {
            "the proxy admits by host and port; TLS passes through uninspected"
        } else {
            "the proxy intercepts TLS and checks each request's method and path"
        };
        lines.push(line(
            format!(
                "egress {}: {}:{} {methods}, {paths}",
                plan_rule.name,
                rule.host,
                ports.join(",")
            ),
            how,
        ));
        if let Some(refs) = &rule.git_push_refs {
            let refs = if refs.is_empty() {
                "no refs".to_owned()
            } else {
                refs.join(" ")
            };
            lines.push(line(
                format!("egress {}: git pushes may change {refs}", plan_rule.name),
                "the proxy intercepts this host and reads the ref update commands of every git-receive-pack request to it; a push naming another ref, or to a repository no such rule allows, is refused",
            ));
        }
        if !rule.allowed_ips.is_empty() {
            lines.push(gap(
                format!("egress {}: allowed_ips {}", plan_rule.name, rule.allowed_ips.join(" ")),
                "an exception to the hard block for this destination",
                "the egress plan has no exceptions yet: the proxy still blocks these ranges (fail-closed)",
            ));
        }
    }
    lines
}

fn credentials(policy: &Policy) -> Vec<Line> {
    let mut lines = Vec::new();
    for credential in &policy.document().credentials {
        let source = match &credential.source {
            CredentialSourceSpec::Env(var) => format!("the host's ${var}"),
            CredentialSourceSpec::File(path) => format!("the host file {path}"),
        };
        let style = match &credential.inject {
            InjectSpec::Bearer => "an Authorization: Bearer header".to_owned(),
            InjectSpec::Header(name) => format!("the {name} header"),
            InjectSpec::Basic { username } => format!("basic auth as {username}"),
        };
        let endpoints: Vec<String> = credential
            .endpoints
            .iter()
            .map(|e| {
                let mut text = format!("{}:{}", e.host, e.port.unwrap_or(443));
                if !e.methods.is_empty() {
                    text.push_str(&format!(" {}", e.methods.join(",")));
                }
                if !e.paths.is_empty() {
                    text.push_str(&format!(" {}", e.paths.join(" ")));
                }
                text
            })
            .collect();
        lines.push(line(
            format!("{}: ${} -> {}", credential.name, credential.env, endpoints.join("; ")),
            format!("the sandbox sees an opaque placeholder; the proxy reads {source} and puts it into {style} only for these endpoints, and refuses the placeholder anywhere else"),
        ));
    }
    if lines.is_empty() {
        lines.push(line("(none)", "no secret is available to the sandbox"));
    }
    lines
}

fn approvals(policy: &Policy) -> Vec<Line> {
    let doc = policy.document();
    let unmatched = match egress_plan(policy).approvals {
        ApprovalMode::Deny => line("unmatched requests: deny", "the proxy refuses them"),
        ApprovalMode::Ask { timeout_ms } => line(
            "unmatched requests: ask",
            format!(
                "the proxy holds each one until someone approves or denies it, or for {timeout_ms} ms, then denies"
            ),
        ),
    };
    let mut lines = vec![unmatched];
    if doc.approvals.unmatched == Some(Unmatched::Ask)
        && doc.network.mode != Some(NetworkMode::Proxy)
    {
        lines.push(gap(
            "ask",
            "the proxy",
            "there is no proxy without `network.mode: proxy`",
        ));
    }
    if let Some(level) = doc.audit.egress {
        lines.push(gap(
            format!("audit egress {level:?}").to_lowercase(),
            "the proxy's decision log",
            "the egress plan carries no audit level yet; the proxy logs with its own default",
        ));
    }
    lines
}
