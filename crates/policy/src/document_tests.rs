use airlock_api::policy::{NetworkMode, PathAccess};

use super::*;

fn problems(yaml: &str) -> Vec<Problem> {
    match Policy::from_yaml("p.yaml", yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(err) => err.problems().to_vec(),
    }
}

/// The one problem of `yaml`, which must mention `says`.
fn one_problem(yaml: &str, says: &str) -> Problem {
    let found = problems(yaml);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].message.contains(says),
        "expected `{says}` in: {}",
        found[0]
    );
    found.into_iter().next().unwrap()
}

const PROXY: &str = "version: 1\nnetwork:\n  mode: proxy\n  egress:\n";

#[test]
fn test_syntax_and_type_errors_give_line_and_column() {
    let p = one_problem(
        "version: 1\nfilesystem:\n  rulez: {}\n",
        "unknown field `rulez`",
    );
    assert_eq!((p.line, p.column), (Some(3), Some(3)));
    let p = one_problem(
        "version: 1\nfilesystem:\n  rules:\n    /etc: writable\n",
        "unknown variant `writable`",
    );
    assert_eq!((p.line, p.column), (Some(4), Some(11)));
    let p = one_problem("version: 1\nnetwork: [1\n", "");
    assert_eq!(p.line, Some(2));
    let p = one_problem("", "empty document");
    assert_eq!(
        p.to_string(),
        "p.yaml:1:1: empty document; a policy starts with `version: 1`"
    );
    one_problem("filesystem: {}\n", "missing field `version`");
    one_problem("version: 1\nversion: 1\n", "duplicate");
}

#[test]
fn test_validation_problems_point_at_the_value() {
    let yaml = format!("{PROXY}    - name: everything\n      host: \"*\"\n");
    let p = one_problem(&yaml, "matches every host");
    assert_eq!((p.line, p.column), (Some(6), Some(13)));
    assert_eq!(p.field, "network.egress[0].host");
    assert!(
        p.to_string()
            .starts_with("p.yaml:6:13: network.egress[0].host: `*` matches every host"),
        "{p}"
    );
    let p = one_problem(
        "version: 1\nfilesystem:\n  rules:\n    \"/\": rw\n",
        "`/` cannot be writable",
    );
    assert_eq!(
        (p.line, p.column, p.field.as_str()),
        (Some(4), Some(10), "filesystem.rules[\"/\"]")
    );
}

#[test]
fn test_every_problem_is_reported_not_only_the_first() {
    let yaml = format!(
        "{PROXY}    - host: \"*.com\"\n      ports: [0]\nprocess:\n  syscalls:\n    deny_extra: [frobnicate]\nresources:\n  memory: lots\n"
    );
    let found = problems(&yaml);
    let lines: Vec<Option<u64>> = found.iter().map(|p| p.line).collect();
    assert_eq!(
        lines,
        vec![Some(5), Some(6), Some(9), Some(11)],
        "{found:#?}"
    );
}

#[test]
fn test_each_validation_rule_names_the_problem() {
    let cred = |endpoint: &str| {
        format!(
            "{PROXY}    - host: api.example.com\n      ports: [443]\ncredentials:\n  - name: key\n    source: {{env: KEY}}\n    env: KEY\n    inject: bearer\n    endpoints:\n{endpoint}"
        )
    };
    let cases: Vec<(String, &str)> = vec![
        ("version: 2\n".into(), "unsupported version 2"),
        (
            "version: 1\nextends: [paranoid]\n".into(),
            "unknown profile `paranoid`",
        ),
        (format!("{PROXY}    - host: \"*\"\n"), "matches every host"),
        (
            format!("{PROXY}    - host: \"*.com\"\n"),
            "whole top-level domain",
        ),
        (
            format!("{PROXY}    - host: a.com\n      ports: [0]\n"),
            "port 0",
        ),
        (
            format!("{PROXY}    - host: 169.254.169.254\n"),
            "link-local address",
        ),
        (
            format!("{PROXY}    - host: \"[::ffff:127.0.0.1]\"\n"),
            "loopback address",
        ),
        (format!("{PROXY}    - host: 0x7f.1\n"), "non-standard form"),
        (
            format!("{PROXY}    - host: a.com\n      access: read-only\n      methods: [GET]\n"),
            "not both",
        ),
        (
            format!("{PROXY}    - host: a.com\n      methods: [get]\n"),
            "unknown method `get`",
        ),
        (
            format!("{PROXY}    - host: a.com\n      paths: [\"/a**\"]\n"),
            "whole segment",
        ),
        (
            format!("{PROXY}    - host: a.com\n      allowed_ips: [8.8.8.0/24]\n"),
            "public addresses",
        ),
        (
            format!("{PROXY}    - host: a.com\n      allowed_ips: [127.0.0.0/8]\n"),
            "never be allowed",
        ),
        (
            format!("{PROXY}    - host: a.com\n    - host: a.com\n"),
            "a second egress rule named `a.com`",
        ),
        (
            format!("{PROXY}    - host: a.com\n      git_push_refs: [main]\n"),
            "must be a full ref name",
        ),
        (
            format!("{PROXY}    - host: a.com\n      git_push_refs: [\"refs/heads/a..b\"]\n"),
            "has `..`",
        ),
        (
            "version: 1\nnetwork:\n  egress:\n    - host: a.com\n".into(),
            "need `network.mode: proxy`",
        ),
        (
            "version: 1\nfilesystem:\n  rules:\n    \"/\": rw\n".into(),
            "`/` cannot be writable",
        ),
        (
            "version: 1\nfilesystem:\n  rules:\n    \"~\": rw\n".into(),
            "`~` cannot be writable",
        ),
        (
            "version: 1\nfilesystem:\n  rules:\n    /etc: rw\n".into(),
            "host's read-only view",
        ),
        (
            "version: 1\nfilesystem:\n  rules:\n    /proc/1: deny\n".into(),
            "Airlock provides",
        ),
        (
            "version: 1\nfilesystem:\n  rules:\n    /etc/*: ro\n".into(),
            "`deny` rules only",
        ),
        (
            "version: 1\nfilesystem:\n  rules:\n    :home: ro\n".into(),
            "unknown path token",
        ),
        (
            "version: 1\nfilesystem:\n  protected: [/etc/passwd]\n".into(),
            "protected paths lie below",
        ),
        (
            "version: 1\nprocess:\n  user: alice\n".into(),
            "not UID or UID:GID",
        ),
        (
            "version: 1\nprocess:\n  syscalls:\n    deny_extra: [frobnicate]\n".into(),
            "unknown syscall `frobnicate`",
        ),
        (
            "version: 1\nprocess:\n  syscalls:\n    deny_extra: [wait4]\n".into(),
            "init runs under the same filter",
        ),
        (
            "version: 1\nprocess:\n  syscalls:\n    deny_extra: [keyctl, keyctl]\n".into(),
            "listed twice",
        ),
        (
            "version: 1\nprocess:\n  syscalls:\n    allow_extra: [read]\n".into(),
            "nothing to allow",
        ),
        (
            "version: 1\nprocess:\n  syscalls:\n    allow_extra: [mount]\n".into(),
            "guard the sandbox boundary",
        ),
        ("version: 1\nresources:\n  memory: lots\n".into(), "`lots`"),
        (
            "version: 1\nresources:\n  pids: 0\n".into(),
            "between 1 and",
        ),
        (
            "version: 1\nresources:\n  timeout: 3 days\n".into(),
            "unknown unit",
        ),
        (
            "version: 1\napprovals:\n  timeout: 10s\n".into(),
            "only with `unmatched: ask`",
        ),
        (
            cred("      - host: other.example.com\n"),
            "not covered by any egress rule",
        ),
        (
            cred("      - host: api.example.com\n        port: 8443\n"),
            "not covered by any egress rule",
        ),
        (cred("      []\n"), "at least one endpoint"),
    ];
    for (yaml, says) in cases {
        let found = problems(&yaml);
        assert!(
            found.iter().any(|p| p.message.contains(says)),
            "expected `{says}` for:\n{yaml}\ngot {found:#?}"
        );
        assert!(found.iter().all(|p| p.line.is_some()), "{found:#?}");
    }
}

#[test]
fn test_duplicate_credentials_and_placeholder_variables_are_refused() {
    let yaml = format!(
        "{PROXY}    - host: a.example.com\ncredentials:\n  - {{name: k, source: {{env: A}}, env: K, inject: bearer, endpoints: [{{host: a.example.com}}]}}\n  - {{name: k, source: {{file: relative}}, env: K, inject: {{header: Host}}, endpoints: [{{host: a.example.com}}]}}\n"
    );
    let messages: Vec<String> = problems(&yaml).into_iter().map(|p| p.message).collect();
    for says in [
        "a second credential named `k`",
        "already holds another credential",
        "absolute host path",
        "managed by the proxy",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(says)),
            "{says}: {messages:#?}"
        );
    }
}

#[test]
fn test_credentials_need_proxy_mode() {
    let yaml = "version: 1\ncredentials:\n  - {name: k, source: {env: A}, env: K, inject: bearer, endpoints: [{host: a.example.com}]}\n";
    let found = problems(yaml);
    assert!(
        found
            .iter()
            .any(|p| p.message.contains("credentials need `network.mode: proxy`"))
    );
}

#[test]
fn test_extends_merges_in_order_later_wins() {
    let yaml = "version: 1\nextends: [networked-dev]\nfilesystem:\n  rules:\n    \":workspace\": ro\n    /etc/ssl/private: deny\nnetwork:\n  egress:\n    - name: pypi\n      host: pypi.org\n      access: read-write\n    - host: api.example.com\n";
    let policy = Policy::from_yaml("p.yaml", yaml).unwrap();
    assert_eq!(policy.profiles(), ["workspace", "networked-dev"]);
    let doc = policy.document();
    assert!(doc.extends.is_empty());
    assert_eq!(doc.filesystem.rules[":workspace"], PathAccess::Ro);
    assert_eq!(doc.filesystem.rules[":tmp"], PathAccess::Rw);
    assert_eq!(doc.filesystem.rules["/etc/ssl/private"], PathAccess::Deny);
    assert_eq!(doc.network.mode, Some(NetworkMode::Proxy));
    let pypi: Vec<_> = doc
        .network
        .egress
        .iter()
        .filter(|r| r.name.as_deref() == Some("pypi"))
        .collect();
    assert_eq!(
        pypi.len(),
        1,
        "a rule of the same name replaces the profile's"
    );
    assert_eq!(
        pypi[0].access,
        Some(airlock_api::policy::AccessPreset::ReadWrite)
    );
    assert_eq!(doc.network.egress.last().unwrap().host, "api.example.com");
}

#[test]
fn test_lists_append_without_duplicates_and_scalars_override() {
    let mut base = parse_yaml("a", "version: 1\nfilesystem:\n  protected: [\":workspace/.env\"]\nprocess:\n  user: \"1\"\n  syscalls:\n    deny_extra: [keyctl]\n").unwrap().document;
    let later = parse_yaml("b", "version: 1\nfilesystem:\n  protected: [\":workspace/.env\", \":workspace/.agents\"]\nprocess:\n  user: \"2\"\n  syscalls:\n    deny_extra: [acct]\n").unwrap().document;
    profiles::merge(&mut base, &later);
    assert_eq!(
        base.filesystem.protected,
        [":workspace/.env", ":workspace/.agents"]
    );
    assert_eq!(base.process.syscalls.deny_extra, ["keyctl", "acct"]);
    assert_eq!(base.process.user.as_deref(), Some("2"));
}

#[test]
fn test_builtin_profiles_are_valid_policies() {
    for name in profiles::names() {
        let text = profiles::text(name).unwrap();
        let policy = Policy::from_yaml(name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(policy.document().version, 1);
        Policy::from_yaml("x", &format!("version: 1\nextends: [{name}]\n")).unwrap();
    }
}

#[test]
fn test_documents_from_the_api_name_fields_without_positions() {
    let mut doc = parse_yaml("x", "version: 1\n").unwrap().document;
    doc.process.user = Some("root".into());
    let err = Policy::from_document(&doc).unwrap_err();
    let p = &err.problems()[0];
    assert_eq!((p.line, p.column), (None, None));
    assert!(p.to_string().starts_with("policy: process.user: "), "{p}");
}

#[test]
fn test_settings_use_the_command_line_units() {
    let policy = Policy::from_yaml(
        "p",
        "version: 1\ntier: container\nprocess:\n  user: \"1000:100\"\nresources:\n  memory: 512MiB\n  pids: max\n  cpus: 1.5\n  disk: 2G\n  timeout: 2m\n",
    )
    .unwrap();
    let s = policy.settings();
    assert_eq!(s.tier, Some(airlock_api::Tier::Container));
    assert_eq!(
        s.user,
        Some(airlock_api::UserSpec {
            uid: 1000,
            gid: 100
        })
    );
    assert_eq!(s.memory, Some(crate::Limit::Value(512 << 20)));
    assert_eq!(s.pids, Some(crate::Limit::Max));
    assert_eq!(s.cpu_milli, Some(1500));
    assert_eq!(s.disk_bytes, Some(2 << 30));
    assert_eq!(s.timeout_ms, Some(120_000));
    let mut config = airlock_api::SandboxConfig::new(vec!["x".into()]);
    s.apply(&mut config);
    assert_eq!(config.resources.pids_max, None);
    assert_eq!(config.tier, airlock_api::Tier::Container);
}

#[test]
fn test_span_index_follows_block_and_flow_collections() {
    let text = "a:\n  b: [x, {c: 1}]\n  \"d e\":\n    - f: 2\n";
    let index = SpanIndex::build(text);
    let root = FieldPath::root();
    assert_eq!(
        index.position(&root.key("a").key("b").index(0)),
        Some((2, 7))
    );
    assert_eq!(
        index.position(&root.key("a").key("b").index(1).key("c")),
        Some((2, 14))
    );
    assert_eq!(
        index.position(&root.key("a").key("d e").index(0).key("f")),
        Some((4, 10))
    );
    assert_eq!(index.position(&root.key("a").key("missing")), Some((2, 3)));
    assert_eq!(
        root.key("a").key("d e").index(0).to_string(),
        "a[\"d e\"][0]"
    );
}

#[test]
fn test_oversized_documents_are_refused_before_parsing() {
    let text = format!("version: 1\n#{}\n", "x".repeat(MAX_POLICY_BYTES));
    let p = one_problem(&text, "larger than");
    assert_eq!(p.line, None);
}

#[test]
fn test_problems_stay_on_one_line_whatever_the_document_holds() {
    // Found by cargo-fuzz: carriage returns inside a name, and a document of `%` and CRs.
    let yaml = format!("{PROXY}    - {{name: \"a\\rb\", host: a.com}}\n");
    let p = one_problem(&yaml, "is not a name");
    assert!(p.to_string().contains("`a\\rb`"), "{p}");
    for input in ["%`\r\r", "version: 1\r\nnetwork: [\r\n"] {
        let found = Policy::from_yaml("p", input).unwrap_err();
        for p in found.problems() {
            assert!(!p.to_string().contains(['\n', '\r']), "{p:?}");
        }
    }
}
