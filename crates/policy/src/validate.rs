//! Every check a document must pass, each problem reported at its field. `check` runs on each
//! document that went into a policy (the file, and each profile it extends), with the merged
//! result as context for the checks that span sections.

use std::collections::HashSet;

use airlock_api::policy::{
    CredentialEndpoint, CredentialPolicy, CredentialSourceSpec, EgressPolicy, InjectSpec,
    NetworkMode, POLICY_VERSION, PathAccess, PolicyDocument, Unmatched,
};

use crate::document::{FieldPath, Problem, SourceDoc};
use crate::net::{self, HostKind};
use crate::paths::{self, Root};
use crate::profiles::{self, egress_name};
use crate::seccomp::default_rules;
use crate::settings;
use crate::syscalls::x86_64_number;

/// Default-denied syscalls a policy may never allow: they guard the boundary itself (the mount
/// view, the namespaces, set-id files in a host workspace, the host's terminal).
const NEVER_ALLOWED: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "mount_setattr",
    "chroot",
    "setns",
    "unshare",
    "clone",
    "clone3",
    "open_by_handle_at",
    "name_to_handle_at",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "ioctl",
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "creat",
    "mknod",
    "mknodat",
    "open",
    "openat",
    "openat2",
];

/// Syscalls Airlock's init makes under the same filter, after it is installed; denying one
/// would leave the sandbox unable to start or end.
const INIT_NEEDS: &[&str] = &[
    "read",
    "write",
    "close",
    "close_range",
    "exit",
    "exit_group",
    "execve",
    "wait4",
    "waitid",
    "clone",
    "fork",
    "vfork",
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "kill",
    "poll",
    "ppoll",
    "signalfd4",
    "sendto",
    "sendmsg",
    "brk",
    "mmap",
    "munmap",
    "mprotect",
    "futex",
    "getpid",
    "chdir",
];

/// Header names the proxy owns.
const RESERVED_HEADERS: &[&str] = &["host", "content-length", "transfer-encoding", "connection"];

struct Checker<'a> {
    doc: &'a SourceDoc,
    merged: &'a PolicyDocument,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn report(&mut self, field: &FieldPath, message: impl Into<String>) {
        self.problems.push(self.doc.problem(field, message));
    }
}

/// The problems of `doc`, judged with `merged` (the whole policy) as context.
pub(crate) fn check(doc: &SourceDoc, merged: &PolicyDocument) -> Vec<Problem> {
    let mut c = Checker {
        doc,
        merged,
        problems: Vec::new(),
    };
    let root = FieldPath::root();
    let d = &doc.document;
    if d.version != POLICY_VERSION {
        c.report(
            &root.key("version"),
            format!(
                "unsupported version {}; this build reads version {POLICY_VERSION}",
                d.version
            ),
        );
    }
    for (i, name) in d.extends.iter().enumerate() {
        if profiles::text(name).is_none() {
            // Reported once, when extends is resolved; here only duplicates.
            continue;
        }
        if d.extends[..i].contains(name) {
            c.report(
                &root.key("extends").index(i),
                format!("`{name}` is listed twice"),
            );
        }
    }
    check_filesystem(&mut c);
    check_process(&mut c);
    check_resources(&mut c);
    check_network(&mut c);
    check_credentials(&mut c);
    check_approvals(&mut c);
    c.problems
}

fn check_filesystem(c: &mut Checker<'_>) {
    let fs = &c.doc.document.filesystem;
    let base = FieldPath::root().key("filesystem");
    for (text, access) in &fs.rules {
        let field = base.key("rules").key(text);
        let path = match paths::parse(text) {
            Ok(path) => path,
            Err(message) => {
                c.report(&field, message);
                continue;
            }
        };
        // On the container tier `/` is the image's own writable overlay.
        let writable_root = c.doc.document.tier == Some(airlock_api::Tier::Container);
        let problem = match (access, path.root) {
            (PathAccess::Rw, Root::Absolute) if writable_root && !path.is_provided() => None,
            _ if path.is_provided() => Some(format!(
                "`{text}` is below a filesystem Airlock provides itself (/proc, /sys, /dev, /run); rules cannot change it"
            )),
            (PathAccess::Rw, Root::Absolute) if path.is_root() => {
                Some("`/` cannot be writable".to_owned())
            }
            (PathAccess::Rw, Root::Home) if path.is_root() => {
                Some("`~` cannot be writable as a whole; name the directories below it".to_owned())
            }
            (PathAccess::Rw, Root::Absolute) => Some(format!(
                "`{text}` is on the host's read-only view; only :workspace, :tmp and paths below ~ can be writable"
            )),
            (PathAccess::Deny, _) if path.is_root() => Some(format!(
                "`{text}` cannot be denied as a whole; use `ro` for a root, or name what to hide below it"
            )),
            (PathAccess::Ro | PathAccess::Rw, _) if path.has_star() => {
                Some("`*` is allowed in `deny` rules only".to_owned())
            }
            _ => None,
        };
        if let Some(problem) = problem {
            c.report(&field, problem);
        }
    }
    for (i, text) in fs.protected.iter().enumerate() {
        let field = base.key("protected").index(i);
        match paths::parse(text) {
            Err(message) => c.report(&field, message),
            Ok(path) if path.has_star() => c.report(&field, "`*` is not allowed here"),
            Ok(path) if path.root == Root::Absolute || path.is_root() => c.report(
                &field,
                format!(
                    "`{text}`: protected paths lie below :workspace, :tmp or ~ (the host view is read-only already)"
                ),
            ),
            Ok(_) => {}
        }
    }
}

fn check_process(c: &mut Checker<'_>) {
    let p = &c.doc.document.process;
    let base = FieldPath::root().key("process");
    if let Some(user) = &p.user
        && let Err(message) = settings::parse_user(user)
    {
        c.report(&base.key("user"), message);
    }
    let default_denied: HashSet<String> = default_rules().into_iter().map(|r| r.syscall).collect();
    let syscalls = base.key("syscalls");
    let merged = &c.merged.process.syscalls;
    for (list, names) in [
        ("deny_extra", &p.syscalls.deny_extra),
        ("allow_extra", &p.syscalls.allow_extra),
    ] {
        for (i, name) in names.iter().enumerate() {
            let field = syscalls.key(list).index(i);
            let problem = if x86_64_number(name).is_none() {
                Some(format!(
                    "unknown syscall `{name}` (x86_64 kernel names, as in `man 2 syscalls`)"
                ))
            } else if names[..i].contains(name) {
                Some(format!("`{name}` is listed twice"))
            } else if list == "deny_extra" && INIT_NEEDS.contains(&name.as_str()) {
                Some(format!(
                    "`{name}` cannot be denied: Airlock's init runs under the same filter and needs it"
                ))
            } else if list == "allow_extra" && !default_denied.contains(name) {
                Some(format!(
                    "`{name}` is not denied by the built-in profile; there is nothing to allow"
                ))
            } else if list == "allow_extra" && NEVER_ALLOWED.contains(&name.as_str()) {
                Some(format!(
                    "`{name}` cannot be allowed: its rules guard the sandbox boundary itself"
                ))
            } else if list == "allow_extra" && merged.deny_extra.contains(name) {
                Some(format!("`{name}` is in both deny_extra and allow_extra"))
            } else {
                None
            };
            if let Some(problem) = problem {
                c.report(&field, problem);
            }
        }
    }
}

fn check_resources(c: &mut Checker<'_>) {
    let r = &c.doc.document.resources;
    let base = FieldPath::root().key("resources");
    let results = [
        (
            "memory",
            r.memory
                .as_ref()
                .map(|v| settings::parse_memory(v).map(drop)),
        ),
        (
            "pids",
            r.pids.as_ref().map(|v| settings::parse_pids(v).map(drop)),
        ),
        (
            "cpus",
            r.cpus.as_ref().map(|v| settings::parse_cpus(v).map(drop)),
        ),
        (
            "disk",
            r.disk.as_ref().map(|v| settings::parse_size(v).map(drop)),
        ),
        (
            "timeout",
            r.timeout
                .as_ref()
                .map(|v| settings::parse_duration(v).map(drop)),
        ),
    ];
    for (name, result) in results {
        if let Some(Err(message)) = result {
            c.report(&base.key(name), message);
        }
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'))
    {
        return Err(format!(
            "`{name}` is not a name (1 to 64 of a-z, A-Z, 0-9, `-`, `_`, `.`)"
        ));
    }
    Ok(())
}

fn check_methods(c: &mut Checker<'_>, field: &FieldPath, methods: &[String]) {
    for (i, method) in methods.iter().enumerate() {
        let problem = if !net::METHODS.contains(&method.as_str()) {
            Some(format!(
                "unknown method `{method}` (one of {})",
                net::METHODS.join(", ")
            ))
        } else if methods[..i].contains(method) {
            Some(format!("`{method}` is listed twice"))
        } else {
            None
        };
        if let Some(problem) = problem {
            c.report(&field.index(i), problem);
        }
    }
}

fn check_paths(c: &mut Checker<'_>, field: &FieldPath, globs: &[String]) {
    for (i, glob) in globs.iter().enumerate() {
        if let Err(problem) = net::check_http_path(glob) {
            c.report(&field.index(i), problem);
        }
    }
}

/// Checks a host; an address in a blocked range is refused unless `allowed` covers it.
fn check_host(c: &mut Checker<'_>, field: &FieldPath, host: &str, allowed: &[String]) {
    match net::check_host(host) {
        Err(problem) => c.report(field, problem),
        Ok(HostKind::Ip(ip)) => {
            if let Some(range) = net::blocked_range(ip) {
                let excepted = allowed
                    .iter()
                    .filter_map(|a| net::Cidr::parse(a).ok())
                    .any(|cidr| cidr.contains(ip));
                if !excepted {
                    c.report(
                        field,
                        format!("{ip} is a {range} address, which the proxy always blocks"),
                    );
                }
            }
        }
        Ok(_) => {}
    }
}

fn check_network(c: &mut Checker<'_>) {
    let n = &c.doc.document.network;
    let base = FieldPath::root().key("network");
    let mode = c.merged.network.mode.unwrap_or(NetworkMode::None);
    if !n.egress.is_empty() && mode == NetworkMode::None {
        c.report(
            &base.key("egress"),
            "egress rules need `network.mode: proxy` (the mode is none)",
        );
    }
    let mut names = HashSet::new();
    for (i, rule) in n.egress.iter().enumerate() {
        let field = base.key("egress").index(i);
        check_egress(c, &field, rule);
        if !names.insert(egress_name(rule)) {
            c.report(
                &field,
                format!(
                    "a second egress rule named `{}`; give each rule a distinct `name`",
                    egress_name(rule)
                ),
            );
        }
    }
}

fn check_egress(c: &mut Checker<'_>, field: &FieldPath, rule: &EgressPolicy) {
    if let Some(name) = &rule.name
        && let Err(problem) = check_name(name)
    {
        c.report(&field.key("name"), problem);
    }
    check_host(c, &field.key("host"), &rule.host, &rule.allowed_ips);
    for (i, port) in rule.ports.iter().enumerate() {
        if *port == 0 {
            c.report(&field.key("ports").index(i), "port 0 is not a port");
        } else if rule.ports[..i].contains(port) {
            c.report(
                &field.key("ports").index(i),
                format!("port {port} is listed twice"),
            );
        }
    }
    if rule.access.is_some() && !rule.methods.is_empty() {
        c.report(
            &field.key("methods"),
            "give either `access` (a preset) or `methods`, not both",
        );
    }
    check_methods(c, &field.key("methods"), &rule.methods);
    check_paths(c, &field.key("paths"), &rule.paths);
    for (i, range) in rule.allowed_ips.iter().enumerate() {
        let result = net::Cidr::parse(range).and_then(|cidr| cidr.exception_class().map(drop));
        if let Err(problem) = result {
            c.report(&field.key("allowed_ips").index(i), problem);
        }
    }
    for (i, glob) in rule.git_push_refs.iter().flatten().enumerate() {
        if let Err(problem) = net::check_git_ref_glob(glob) {
            c.report(&field.key("git_push_refs").index(i), problem);
        }
    }
}

fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn check_credentials(c: &mut Checker<'_>) {
    let doc = &c.doc.document;
    let base = FieldPath::root().key("credentials");
    let mode = c.merged.network.mode.unwrap_or(NetworkMode::None);
    let mut names = HashSet::new();
    let mut envs = HashSet::new();
    for (i, credential) in doc.credentials.iter().enumerate() {
        let field = base.index(i);
        if mode != NetworkMode::Proxy {
            c.report(
                &field,
                "credentials need `network.mode: proxy`: only the proxy can put them into requests",
            );
        }
        if let Err(problem) = check_name(&credential.name) {
            c.report(&field.key("name"), problem);
        } else if !names.insert(credential.name.as_str()) {
            c.report(
                &field.key("name"),
                format!("a second credential named `{}`", credential.name),
            );
        }
        if !valid_env_name(&credential.env) {
            c.report(
                &field.key("env"),
                format!("`{}` is not an environment variable name", credential.env),
            );
        } else if !envs.insert(credential.env.as_str()) {
            c.report(
                &field.key("env"),
                format!("`{}` already holds another credential", credential.env),
            );
        }
        check_source_and_injection(c, &field, credential);
        if credential.endpoints.is_empty() {
            c.report(
                &field.key("endpoints"),
                "a credential needs at least one endpoint it is bound to",
            );
        }
        for (j, endpoint) in credential.endpoints.iter().enumerate() {
            check_endpoint(c, &field.key("endpoints").index(j), endpoint);
        }
    }
}

fn check_source_and_injection(
    c: &mut Checker<'_>,
    field: &FieldPath,
    credential: &CredentialPolicy,
) {
    match &credential.source {
        CredentialSourceSpec::Env(var) if !valid_env_name(var) => c.report(
            &field.key("source").key("env"),
            format!("`{var}` is not an environment variable name"),
        ),
        CredentialSourceSpec::File(path) if !path.starts_with('/') || path.contains('\0') => c
            .report(
                &field.key("source").key("file"),
                format!("`{path}` must be an absolute host path"),
            ),
        _ => {}
    }
    match &credential.inject {
        InjectSpec::Header(name) => {
            let token = !name.is_empty()
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(ch));
            if !token {
                c.report(
                    &field.key("inject").key("header"),
                    format!("`{name}` is not an HTTP header name"),
                );
            } else if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                c.report(
                    &field.key("inject").key("header"),
                    format!("`{name}` is managed by the proxy and cannot carry a credential"),
                );
            }
        }
        InjectSpec::Basic { username }
            if username.contains(':') || username.chars().any(char::is_control) =>
        {
            c.report(
                &field.key("inject").key("basic").key("username"),
                "a basic-auth username has no `:` and no control characters",
            );
        }
        _ => {}
    }
}

fn check_endpoint(c: &mut Checker<'_>, field: &FieldPath, endpoint: &CredentialEndpoint) {
    check_host(c, &field.key("host"), &endpoint.host, &[]);
    let port = endpoint.port.unwrap_or(443);
    if port == 0 {
        c.report(&field.key("port"), "port 0 is not a port");
    }
    check_methods(c, &field.key("methods"), &endpoint.methods);
    check_paths(c, &field.key("paths"), &endpoint.paths);
    let covered = c.merged.network.egress.iter().any(|rule| {
        net::host_covers(&rule.host, &endpoint.host) && egress_ports(rule).contains(&port)
    });
    if !covered && net::check_host(&endpoint.host).is_ok() && port != 0 {
        c.report(
            field,
            format!(
                "{}:{port} is not covered by any egress rule; a credential is only sent where egress is allowed",
                endpoint.host
            ),
        );
    }
}

/// The ports of an egress rule, with the default.
pub(crate) fn egress_ports(rule: &EgressPolicy) -> Vec<u16> {
    if rule.ports.is_empty() {
        vec![443, 80]
    } else {
        rule.ports.clone()
    }
}

fn check_approvals(c: &mut Checker<'_>) {
    let a = &c.doc.document.approvals;
    let field = FieldPath::root().key("approvals").key("timeout");
    if let Some(timeout) = &a.timeout {
        if let Err(problem) = settings::parse_duration(timeout) {
            c.report(&field, problem);
        } else if c.merged.approvals.unmatched != Some(Unmatched::Ask) {
            c.report(&field, "a timeout applies only with `unmatched: ask`");
        }
    }
}
