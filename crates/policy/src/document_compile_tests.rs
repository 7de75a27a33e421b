use std::path::PathBuf;

use airlock_api::{SandboxConfig, Tier, WorkspaceSource};

use super::*;
use crate::compile::{HostFacts, compile};
use crate::egress::{ApprovalMode, CredentialSource, Injection, NetworkMode};
use crate::explain::explain;

fn host() -> HostFacts {
    HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec!["/var/lib/airlock".into()],
    }
}

fn policy(yaml: &str) -> Policy {
    Policy::from_yaml("p.yaml", yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn config_with(yaml: &str) -> SandboxConfig {
    let mut config = SandboxConfig::new(vec!["/bin/true".into()]);
    config.policy = Some(Box::new(policy(yaml).document().clone()));
    config
}

fn plan(yaml: &str) -> Plan {
    compile(&config_with(yaml), &host()).unwrap_or_else(|e| panic!("{e}"))
}

fn refusal(config: &SandboxConfig) -> String {
    match compile(config, &host()) {
        Err(err @ CompileError::PolicyUnsupported { .. }) => err.to_string(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn test_deny_masks_the_path_and_withholds_landlock_reads() {
    let plan = plan(
        "version: 1\nfilesystem:\n  rules:\n    /etc/ssl/private: deny\n    /srv/*/secrets: deny\n",
    );
    for path in ["/etc/ssl/private", "/srv/*/secrets"] {
        assert!(
            plan.view
                .masks
                .iter()
                .any(|m| m.path == path && m.kind == MaskKind::Secret),
            "{path} not masked"
        );
        assert!(plan.landlock.read_except.iter().any(|p| p == path));
    }
}

#[test]
fn test_git_metadata_is_protected_by_default_and_can_be_opted_out() {
    let protected = plan("version: 1\n").view.read_only_paths;
    assert_eq!(
        protected,
        [
            PathBuf::from("/workspace/.git/config"),
            PathBuf::from("/workspace/.git/hooks")
        ]
    );
    let extra = plan("version: 1\nfilesystem:\n  protected: [\":workspace/.agents\"]\n");
    assert_eq!(
        extra.view.read_only_paths[0],
        PathBuf::from("/workspace/.agents")
    );
    assert!(
        plan("version: 1\nfilesystem:\n  protect_git: false\n")
            .view
            .read_only_paths
            .is_empty()
    );
    let without_policy = compile(&SandboxConfig::new(vec!["/bin/true".into()]), &host()).unwrap();
    assert!(without_policy.view.read_only_paths.is_empty());
}

#[test]
fn test_read_only_workspace_loses_its_landlock_write_right() {
    let plan = plan("version: 1\nextends: [read-only]\n");
    assert_eq!(plan.view.read_only_paths, [PathBuf::from("/workspace")]);
    assert!(
        !plan
            .landlock
            .write_trees
            .contains(&PathBuf::from("/workspace"))
    );
    assert!(plan.landlock.write_trees.contains(&PathBuf::from("/tmp")));
}

#[test]
fn test_syscall_extras_change_the_seccomp_rules() {
    let plan = plan(
        "version: 1\nprocess:\n  syscalls:\n    deny_extra: [kcmp, keyctl]\n    allow_extra: [io_uring_setup]\n",
    );
    let count = |name: &str| plan.seccomp.iter().filter(|r| r.syscall == name).count();
    assert_eq!(count("kcmp"), 1);
    assert_eq!(count("keyctl"), 1, "already denied: no second rule");
    assert_eq!(count("io_uring_setup"), 0);
    assert_eq!(count("io_uring_enter"), 1);
    let kcmp = plan.seccomp.iter().find(|r| r.syscall == "kcmp").unwrap();
    assert_eq!(kcmp.action, SyscallAction::Eperm);
    assert!(kcmp.checks.is_empty());
}

#[test]
fn test_rules_the_process_tier_cannot_enforce_are_refused() {
    let mut host_ws =
        config_with("version: 1\nfilesystem:\n  rules:\n    \":workspace/.env\": deny\n");
    assert!(
        compile(&host_ws, &host()).is_ok(),
        "a fresh workspace starts empty"
    );
    host_ws.workspace = WorkspaceSource::Host {
        path: "/src".into(),
    };
    assert!(refusal(&host_ws).contains("inside a host workspace"));
    let masked = config_with("version: 1\nfilesystem:\n  rules:\n    /root/.ssh/config: ro\n");
    assert!(refusal(&masked).contains("built-in mask"));
    let mut home = config_with("version: 1\nfilesystem:\n  rules:\n    \"~/.cache\": rw\n");
    assert!(
        compile(&home, &host()).is_ok(),
        "HOME is /tmp: writable already"
    );
    home.env.push(("HOME".into(), "/home/agent".into()));
    assert!(refusal(&home).contains("read-only on the process tier"));
    let nested = config_with(
        "version: 1\nfilesystem:\n  rules:\n    \":workspace\": ro\n    \":workspace/out\": rw\n",
    );
    assert!(refusal(&nested).contains("inside a read-only root"));
    let full = config_with("version: 1\nnetwork:\n  mode: full\n");
    assert!(refusal(&full).contains("not supported yet"));
    let tier = config_with("version: 1\ntier: microvm\n");
    assert_eq!(
        compile(&tier, &host()),
        Err(CompileError::PolicyTier {
            required: "microvm",
            requested: "process"
        })
    );
}

#[test]
fn test_an_invalid_document_in_the_config_is_refused() {
    let mut config = config_with("version: 1\n");
    if let Some(doc) = config.policy.as_mut() {
        doc.process.syscalls.allow_extra.push("setns".into());
    }
    let err = compile(&config, &host()).unwrap_err();
    assert!(matches!(err, CompileError::InvalidPolicy(_)));
}

#[test]
fn test_a_plan_with_a_policy_round_trips_through_json() {
    let plan = plan("version: 1\nfilesystem:\n  rules:\n    /opt/secret: deny\n");
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan);
}

const NETWORKED: &str = "version: 1
network:
  mode: proxy
  egress:
    - name: gh
      host: api.github.com
      ports: [443]
      access: read-only
    - host: \"*.example.com\"
    - name: upload
      host: up.example.org
      methods: [PUT]
      paths: [\"/files/**\"]
credentials:
  - name: token
    source: {env: GH_TOKEN}
    env: GITHUB_TOKEN
    inject: bearer
    endpoints:
      - host: api.github.com
        methods: [GET]
        paths: [\"/repos/**\"]
  - name: key
    source: {file: /etc/airlock/key}
    env: KEY
    inject: {basic: {username: bot}}
    endpoints: [{host: a.example.com, port: 80}]
approvals:
  unmatched: ask
  timeout: 90s
";

#[test]
fn test_egress_plan_carries_rules_credentials_and_approvals() {
    let plan = egress_plan(&policy(NETWORKED));
    assert_eq!(plan.mode, NetworkMode::Proxy);
    assert_eq!(plan.rules.len(), 3);
    assert_eq!(plan.rules[0].name, "gh");
    assert_eq!(plan.rules[0].http[0].methods, ["GET", "HEAD", "OPTIONS"]);
    assert_eq!(plan.rules[1].name, "*.example.com");
    assert_eq!(plan.rules[1].ports, [443, 80]);
    assert!(plan.rules[1].http.is_empty(), "no L7 rule: any request");
    assert_eq!(plan.rules[2].http[0].paths, ["/files/**"]);
    let token = &plan.credentials[0];
    assert_eq!(
        token.source,
        CredentialSource::Env {
            var: "GH_TOKEN".into()
        }
    );
    assert_eq!(token.env, "GITHUB_TOKEN");
    assert_eq!(token.inject, Injection::Bearer);
    assert_eq!(token.endpoints[0].port, 443);
    assert_eq!(token.endpoints[0].http.paths, ["/repos/**"]);
    assert_eq!(
        plan.credentials[1].inject,
        Injection::Basic {
            username: "bot".into()
        }
    );
    assert_eq!(plan.approvals, ApprovalMode::Ask { timeout_ms: 90_000 });
    assert_eq!(egress_plan(&policy("version: 1\n")), EgressPlan::default());
}

#[test]
fn test_explain_names_mechanisms_and_gaps_per_tier() {
    let policy = policy(&format!(
        "{NETWORKED}filesystem:\n  rules:\n    /etc/ssl/private: deny\n    /etc/hosts: ro\n"
    ));
    let config = SandboxConfig::new(vec!["x".into()]);
    let text = explain(&policy, Tier::Process, &config, &host());
    for says in [
        "/etc/ssl/private deny -> /etc/ssl/private",
        "a mode-000 mount over it",
        ":workspace/.git/hooks ro -> /workspace/.git/hooks",
        "NOT ENFORCED: only if it exists when the sandbox starts",
        "already readable",
        "egress gh: api.github.com:443 read-only methods",
        "TLS passes through uninspected",
        "token: $GITHUB_TOKEN -> api.github.com:443 GET /repos/**",
        "holds each one",
    ] {
        assert!(text.contains(says), "missing `{says}` in:\n{text}");
    }
    assert!(!text.contains("tier container"));
    let container = explain(&policy, Tier::Container, &config, &host());
    assert!(container.contains("tier container"), "{container}");
    assert!(
        container.contains("nothing of the host is visible"),
        "{container}"
    );
    // The microvm tier says what holds in a guest and what does not, rule by rule.
    let microvm = explain(&policy, Tier::Microvm, &config, &host());
    for says in [
        "tier microvm: a Linux guest",
        "nothing of the host is visible",
        "NOT ENFORCED: the guest applies no path rules yet",
        "NOT ENFORCED: inside the guest, commands keep",
    ] {
        assert!(microvm.contains(says), "missing `{says}` in:\n{microvm}");
    }
    assert!(!microvm.contains("Landlock grants"), "{microvm}");
    let guest_rules = crate::document::Policy::from_yaml(
        "g",
        "version: 1\nprocess:\n  syscalls:\n    deny_extra: [ptrace]\nresources:\n  pids: 64\n  memory: 256MiB\nnetwork:\n  mode: proxy\n",
    )
    .unwrap();
    let text = explain(&guest_rules, Tier::Microvm, &config, &host());
    for says in [
        "syscall rule ptrace\n      REFUSED at create",
        "pids 64\n      the VMM's cgroup: pids.max\n      NOT ENFORCED: it counts the VMM's threads",
        "memory 256MiB\n      the guest's memory size",
        "mode proxy\n      the guest has no network device: its only way out is Airlock's egress proxy",
    ] {
        assert!(text.contains(says), "missing `{says}` in:\n{text}");
    }
    let full =
        crate::document::Policy::from_yaml("f", "version: 1\nnetwork:\n  mode: full\n").unwrap();
    assert!(
        explain(&full, Tier::Microvm, &config, &host())
            .contains("mode full\n      REFUSED at create")
    );
    assert!(
        explain(&full, Tier::Process, &config, &host())
            .contains("not supported yet on the process tier")
    );
}
