use super::*;

fn policy(yaml: &str) -> Policy {
    Policy::from_yaml("p.yaml", yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn kinds(old: &str, new: &str) -> Vec<FindingKind> {
    diff(&policy(old), &policy(new))
        .into_iter()
        .map(|f| f.kind)
        .collect()
}

/// The findings of a change, which must be exactly `expected`.
fn assert_findings(old: &str, new: &str, expected: &[FindingKind]) -> Vec<Finding> {
    let findings = diff(&policy(old), &policy(new));
    let got: Vec<FindingKind> = findings.iter().map(|f| f.kind).collect();
    assert_eq!(got, expected, "{findings:#?}");
    findings
}

/// A proxy policy with one credentialed API and `extra` appended to its egress list.
fn api(endpoint: &str, egress_extra: &str) -> String {
    format!(
        "version: 1
network:
  mode: proxy
  egress:
    - name: api
      host: api.example.com
      ports: [443]
      methods: [GET]
    - name: any-example
      host: \"*.example.com\"
      ports: [443]
{egress_extra}credentials:
  - name: token
    source: {{env: TOKEN}}
    env: TOKEN
    inject: bearer
    endpoints:
{endpoint}"
    )
}

const BASE_ENDPOINT: &str =
    "      - {host: api.example.com, methods: [GET], paths: [\"/v1/**\"]}\n";

#[test]
fn test_identical_and_narrower_policies_have_no_findings() {
    let base = api(BASE_ENDPOINT, "");
    assert!(kinds(&base, &base).is_empty());
    let narrower = api(
        "      - {host: api.example.com, methods: [GET], paths: [\"/v1/repos/**\"]}\n",
        "",
    );
    assert!(kinds(&base, &narrower).is_empty());
    assert!(
        kinds(
            "version: 1\nextends: [networked-dev]\n",
            "version: 1\nextends: [workspace]\n"
        )
        .is_empty()
    );
    assert!(kinds("version: 1\n", "version: 1\nextends: [read-only]\n").is_empty());
}

#[test]
fn test_credential_usable_at_a_new_host_port_or_path() {
    for endpoint in [
        "      - {host: other.example.com, methods: [GET], paths: [\"/v1/**\"]}\n",
        "      - {host: api.example.com, methods: [GET], paths: [\"/admin/**\"]}\n",
        "      - {host: api.example.com, methods: [GET]}\n",
    ] {
        let findings = assert_findings(
            &api(BASE_ENDPOINT, ""),
            &api(endpoint, ""),
            &[FindingKind::CredentialReach],
        );
        assert!(
            findings[0].message.contains("credential `token`"),
            "{}",
            findings[0]
        );
    }
    let new_port = api(
        "      - {host: api.example.com, port: 8443, methods: [GET]}\n",
        "    - {name: alt, host: api.example.com, ports: [8443], methods: [GET]}\n",
    );
    let got = kinds(&api(BASE_ENDPOINT, ""), &new_port);
    assert!(got.contains(&FindingKind::CredentialReach), "{got:?}");
}

#[test]
fn test_new_method_on_a_credentialed_host() {
    let findings = assert_findings(
        &api(BASE_ENDPOINT, ""),
        &api(
            "      - {host: api.example.com, methods: [GET, DELETE], paths: [\"/v1/**\"]}\n",
            "",
        ),
        &[FindingKind::CredentialMethod],
    );
    assert_eq!(findings[0].witness, "DELETE api.example.com:443/v1/x");
    // Without the wildcard rule, which lets any method through to api.example.com already.
    let old = api(BASE_ENDPOINT, "").replace("\"*.example.com\"", "\"*.example.org\"");
    let wider_rule = old.replace(
        "methods: [GET]\n    - name: any",
        "methods: [GET, POST]\n    - name: any",
    );
    assert_ne!(old, wider_rule);
    let findings = assert_findings(&old, &wider_rule, &[FindingKind::CredentialMethod]);
    assert!(
        findings[0].witness.starts_with("POST api.example.com:443"),
        "{}",
        findings[0]
    );
}

#[test]
fn test_new_reach_to_private_or_link_local_ranges() {
    let rule = |ips: &str| {
        format!(
            "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - host: db.internal.example.com\n      allowed_ips: [{ips}]\n"
        )
    };
    let findings = assert_findings(
        &rule("10.20.0.0/16"),
        &rule("10.20.0.0/16, 169.254.169.254"),
        &[FindingKind::PrivateReach],
    );
    assert!(
        findings[0].message.contains("link-local"),
        "{}",
        findings[0]
    );
    assert!(kinds(&rule("10.0.0.0/8"), &rule("10.20.0.0/16")).is_empty());
    let got = kinds(&rule("10.20.0.0/16"), &rule("10.0.0.0/8"));
    assert_eq!(got, [FindingKind::PrivateReach]);
}

#[test]
fn test_new_writable_paths() {
    let findings = assert_findings(
        "version: 1\nextends: [read-only]\n",
        "version: 1\nextends: [workspace]\n",
        &[FindingKind::WritablePath],
    );
    assert!(findings[0].message.contains("/workspace becomes writable"));
    let findings = assert_findings(
        "version: 1\n",
        "version: 1\nfilesystem:\n  protect_git: false\n",
        &[FindingKind::WritablePath, FindingKind::WritablePath],
    );
    assert!(
        findings
            .iter()
            .any(|f| f.witness == "writing /workspace/.git/hooks")
    );
    assert!(
        kinds(
            "version: 1\nfilesystem:\n  protected: [\":workspace/.agents/x\"]\n",
            "version: 1\nfilesystem:\n  protected: [\":workspace/.agents\"]\n"
        )
        .is_empty()
    );
}

#[test]
fn test_new_syscalls() {
    let findings = assert_findings(
        "version: 1\nprocess:\n  syscalls:\n    deny_extra: [kcmp]\n",
        "version: 1\nprocess:\n  syscalls:\n    allow_extra: [io_uring_setup]\n",
        &[FindingKind::Syscall, FindingKind::Syscall],
    );
    assert!(
        findings
            .iter()
            .any(|f| f.witness == "calling io_uring_setup")
    );
    assert!(
        findings
            .iter()
            .any(|f| f.message.contains("kcmp is no longer denied"))
    );
}

#[test]
fn test_tier_downgrade_and_full_network() {
    assert_findings(
        "version: 1\ntier: microvm\n",
        "version: 1\ntier: container\n",
        &[FindingKind::TierDowngrade],
    );
    assert!(kinds("version: 1\n", "version: 1\ntier: microvm\n").is_empty());
    assert_findings(
        "version: 1\n",
        "version: 1\nnetwork:\n  mode: full\n",
        &[FindingKind::PrivateReach, FindingKind::FullNetwork],
    );
    assert!(kinds("version: 1\nnetwork:\n  mode: full\n", "version: 1\n").is_empty());
}

#[test]
fn test_informational_findings_do_not_need_review() {
    let findings = assert_findings(
        "version: 1\nfilesystem:\n  rules:\n    /opt/secret: deny\nresources:\n  memory: 1GiB\n",
        "version: 1\nextends: [networked-dev]\nresources:\n  memory: max\napprovals:\n  unmatched: ask\n",
        &[
            FindingKind::ReadablePath,
            // One per destination: github.com's two rules (GET and the fetch POST) are one.
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Egress,
            FindingKind::Limit,
            FindingKind::Approvals,
        ],
    );
    assert!(
        findings[0].kind.needs_review(),
        "a lifted deny needs review"
    );
    assert!(findings[1..].iter().all(|f| !f.kind.needs_review()));
    assert!(
        findings
            .iter()
            .any(|f| f.message == "memory (bytes) rises from 1073741824 to unlimited")
    );
    let github = findings
        .iter()
        .find(|f| f.message.contains("github.com:443"))
        .unwrap();
    assert!(
        github.message.contains("POST /*/*/git-upload-pack"),
        "{github}"
    );
}

#[test]
fn test_within_a_ceiling_or_a_counterexample() {
    let ceiling = policy(
        "version: 1\nextends: [networked-dev]\nresources:\n  memory: 4GiB\nprocess:\n  syscalls:\n    allow_extra: [io_uring_setup, io_uring_enter]\n",
    );
    let inside = policy(
        "version: 1\nextends: [workspace]\nnetwork:\n  mode: proxy\n  egress:\n    - {name: pypi, host: pypi.org, ports: [443], methods: [GET]}\nprocess:\n  syscalls:\n    allow_extra: [io_uring_setup]\n",
    );
    assert_eq!(within(&inside, &ceiling), Ok(()));
    let outside = policy(
        "version: 1\nextends: [workspace]\nnetwork:\n  mode: proxy\n  egress:\n    - {name: pypi, host: pypi.org, ports: [443], methods: [POST], paths: [\"/legacy/\"]}\n",
    );
    let Counterexample(finding) = within(&outside, &ceiling).unwrap_err();
    assert_eq!(finding.kind, FindingKind::Egress);
    assert_eq!(finding.witness, "POST pypi.org:443/legacy/");
    let err = within(
        &policy("version: 1\nextends: [read-only]\nresources:\n  memory: 8GiB\n"),
        &ceiling,
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("outside the ceiling: [limit]"),
        "{err}"
    );
}

/// A proxy policy with one repository rule whose pushes may change `refs` (`None`: no
/// `git_push_refs` at all).
fn repository(refs: Option<&str>) -> String {
    let refs = refs.map_or_else(String::new, |r| format!("      git_push_refs: [{r}]\n"));
    format!(
        "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - name: repo\n      host: git.example.com\n      ports: [443]\n      methods: [GET, POST]\n      paths: [\"/acme/app.git/**\"]\n{refs}"
    )
}

#[test]
fn test_git_push_refs_widening_needs_review() {
    let agent = repository(Some("refs/heads/agent-1"));
    assert!(kinds(&agent, &agent).is_empty());
    assert!(kinds(&agent, &repository(Some("\"refs/heads/agent-1\""))).is_empty());
    // Narrower: all agents' branches to one.
    assert!(kinds(&repository(Some("\"refs/heads/agent-*\"")), &agent).is_empty());
    let findings = assert_findings(
        &agent,
        &repository(Some("refs/heads/main")),
        &[FindingKind::GitPush],
    );
    assert!(
        findings[0].message.contains("refs/heads/main"),
        "{findings:?}"
    );
    assert!(FindingKind::GitPush.needs_review());
    let findings = assert_findings(&agent, &repository(None), &[FindingKind::GitPush]);
    assert!(
        findings[0].message.contains("no longer limited"),
        "{findings:?}"
    );
    // Restricting pushes that were free is a narrowing.
    assert!(kinds(&repository(None), &agent).is_empty());
}
