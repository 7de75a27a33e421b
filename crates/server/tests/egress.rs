//! `network: proxy` through a real daemon, proven from inside its sandboxes with curl: policy
//! hot reload, approvals (answered by the API, a reviewer webhook, or nobody), the audit
//! lines of the events API, and a daemon restart that keeps a sandbox's egress. The
//! upstreams run in this process on loopback; the daemon's proxies reach them through the
//! hidden `--test-egress-resolve` flag, and nothing leaves the machine.
//!
//! Needs root and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{
    ApprovalDecision, AuditRecord, CreateSandboxRequest, ErrorCode, ExecRequest,
};
use airlock_server::client::Client;
use common::TestDaemon;
use upstream::SeenLog;

const SECRET: &str = "real-secret-5d1e77";

/// The fake internet and the files the daemon reads.
struct Fake {
    seen: SeenLog,
    dir: PathBuf,
    flags: Vec<String>,
}

impl Fake {
    async fn start(tag: &str) -> Fake {
        let seen = SeenLog::default();
        let pki = upstream::test_pki();
        let http = upstream::start_http_upstream(seen.clone()).await;
        let https = upstream::start_https_upstream(seen.clone(), &pki).await;
        let dir = common::scratch_dir(&format!("egress-{tag}"));
        std::fs::write(dir.join("ca.pem"), &pki.ca_pem).unwrap();
        std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
        let resolve =
            format!("allowed.test={http},other.test={http},ask.test={http},api.test={https}");
        let flags = vec![
            "--test-egress-resolve".to_owned(),
            resolve,
            "--test-egress-roots".to_owned(),
            dir.join("ca.pem").display().to_string(),
        ];
        Fake { seen, dir, flags }
    }

    fn daemon(&self, tag: &str, more: &[&str]) -> TestDaemon {
        let mut flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        flags.extend_from_slice(more);
        TestDaemon::start(tag, &flags)
    }

    /// The upstream requests whose target is `target`.
    fn seen(&self, target: &str) -> Vec<upstream::Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.target == target)
            .cloned()
            .collect()
    }

    /// A policy: proxy mode, `allowed.test` (GET), `api.test` with the credential bound to
    /// `paths`, plus `extra` YAML lines under `network.egress` and after the document.
    fn policy(&self, credential_paths: &[&str], extra_rules: &str, tail: &str) -> PolicyDocument {
        let paths: Vec<String> = credential_paths.iter().map(|p| format!("{p:?}")).collect();
        let yaml = format!(
            r#"version: 1
network:
  mode: proxy
  egress:
    - name: plain
      host: allowed.test
      ports: [80]
      methods: [GET]
    - name: api
      host: api.test
      ports: [443]
{extra_rules}
credentials:
  - name: api
    source: {{file: {}}}
    env: API_TOKEN
    inject: bearer
    endpoints: [{{host: api.test, port: 443, methods: [GET], paths: [{}]}}]
{tail}"#,
            self.dir.join("secret").display(),
            paths.join(", ")
        );
        airlock_policy::Policy::from_yaml("test.yaml", &yaml)
            .unwrap()
            .document()
            .clone()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Shell helpers defined before each command: `code URL` prints the status, `refusal ...`
/// the proxy's `x-airlock-error` code.
const HELPERS: &str = r#"
code() { curl -sS -o /dev/null -w '%{http_code}' "$@" 2>/dev/null; }
refusal() { curl -sS -D - -o /dev/null "$@" 2>/dev/null | tr -d '\r' | sed -n 's/^x-airlock-error: //p'; }
"#;

async fn sh(client: &Client, id: &str, command: &str) -> String {
    let request = ExecRequest {
        shell: Some(format!("{HELPERS}\n{command}")),
        timeout_ms: Some(120_000),
        ..ExecRequest::default()
    };
    let output = client.exec_collect(id, &request).await.unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

async fn create(client: &Client, policy: PolicyDocument) -> String {
    let request = CreateSandboxRequest {
        policy: Some(Box::new(policy)),
        ..CreateSandboxRequest::default()
    };
    client.create(&request).await.unwrap().sandbox.id
}

fn has(events: &[AuditRecord], kind: &str, outcome: &str) -> bool {
    events
        .iter()
        .any(|e| e.kind == kind && e.outcome == outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_hot_reload_takes_effect_inside_and_audit_redacts() {
    common::require_binaries();
    let fake = Fake::start("reload").await;
    let daemon = fake.daemon("egress-reload", &[]);
    let client = daemon.client();
    let id = create(&client, fake.policy(&["/secure"], "", "")).await;

    // Before: the allowed host answers, another is denied, the credential works where bound.
    assert_eq!(
        sh(&client, &id, "curl -sS http://allowed.test/hello").await,
        "hello from http /hello"
    );
    assert_eq!(
        sh(&client, &id, "refusal http://other.test/x").await,
        "egress_denied"
    );
    let bearer = r#"-H "Authorization: Bearer $API_TOKEN""#;
    let secure = sh(
        &client,
        &id,
        &format!("curl -sS {bearer} https://api.test/secure"),
    )
    .await;
    assert_eq!(secure, "hello from https /secure");
    let elsewhere = format!("refusal {bearer} https://api.test/elsewhere");
    assert_eq!(
        sh(&client, &id, &elsewhere).await,
        "credential_endpoint_mismatch"
    );
    let placeholder = sh(&client, &id, r#"printf %s "$API_TOKEN""#).await;
    assert!(
        placeholder.len() >= 16 && !placeholder.contains(SECRET),
        "{placeholder}"
    );
    assert_eq!(
        fake.seen("/secure")[0]
            .headers
            .get("authorization")
            .map(String::as_str),
        Some(format!("Bearer {SECRET}").as_str()),
        "the upstream got the real secret"
    );

    // A new destination without a credential: no finding needs review, applied at once.
    let other = "    - {name: other, host: other.test, ports: [80]}";
    let applied = client
        .apply_policy(&id, &fake.policy(&["/secure"], other, ""), false)
        .await
        .unwrap();
    assert!(applied.generation >= 2, "{applied:?}");
    assert!(
        applied.findings.iter().all(|f| !f.needs_review),
        "{applied:?}"
    );
    assert!(
        applied.findings.iter().any(|f| f.kind == "egress"),
        "{applied:?}"
    );
    assert_eq!(
        sh(&client, &id, "curl -sS http://other.test/x").await,
        "hello from http /x"
    );

    // The credential may now go to another path: that needs review.
    let widened = fake.policy(&["/secure", "/elsewhere"], other, "");
    let err = client.apply_policy(&id, &widened, false).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    assert!(err.to_string().contains("credential-reach"), "{err}");
    assert_eq!(
        sh(&client, &id, &elsewhere).await,
        "credential_endpoint_mismatch",
        "unchanged"
    );
    let applied = client.apply_policy(&id, &widened, true).await.unwrap();
    assert!(
        applied.findings.iter().any(|f| f.needs_review),
        "{applied:?}"
    );
    let answer = sh(
        &client,
        &id,
        &format!("curl -sS {bearer} https://api.test/elsewhere"),
    )
    .await;
    assert_eq!(answer, "hello from https /elsewhere");
    assert_eq!(
        fake.seen("/elsewhere")[0]
            .headers
            .get("authorization")
            .map(String::as_str),
        Some(format!("Bearer {SECRET}").as_str())
    );

    // Refusals leave the plan in force: an invalid document, a static section, full network.
    let mut invalid = widened.clone();
    invalid.network.egress[0].methods = vec!["g et".into()];
    let err = client.apply_policy(&id, &invalid, true).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unprocessable), "{err}");
    let mut filesystem = widened.clone();
    filesystem
        .filesystem
        .rules
        .insert("/etc".into(), airlock_api::policy::PathAccess::Deny);
    let err = client
        .apply_policy(&id, &filesystem, true)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unprocessable), "{err}");
    assert!(err.to_string().contains("filesystem"), "{err}");
    let mut full = widened.clone();
    full.network.mode = Some(airlock_api::policy::NetworkMode::Full);
    let err = client.apply_policy(&id, &full, true).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unprocessable), "{err}");
    assert_eq!(
        sh(&client, &id, "curl -sS http://other.test/y").await,
        "hello from http /y"
    );
    assert_eq!(
        sh(&client, &id, "refusal -X POST http://allowed.test/z").await,
        "http_rule_denied"
    );

    // A narrowing applies too: other.test is gone again.
    client
        .apply_policy(&id, &fake.policy(&["/secure"], "", ""), false)
        .await
        .unwrap();
    assert_eq!(
        sh(&client, &id, "refusal http://other.test/x").await,
        "egress_denied"
    );

    // A sandbox created without proxy mode cannot gain network.
    let plain = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let err = client
        .apply_policy(&plain, &widened, true)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    assert!(
        err.to_string().contains("without `network: proxy`"),
        "{err}"
    );

    // The events API: every kind of line, and neither the secret nor the placeholder.
    let events = client.events(&id, None, None).await.unwrap().events;
    for (kind, outcome) in [
        ("lifecycle", "create"),
        ("lifecycle", "ready"),
        ("egress", "allowed"),
        ("egress", "denied"),
        ("credential", "injected"),
        ("credential", "mismatched"),
        ("policy", "changed"),
        ("lifecycle", "policy_changed"),
        ("lifecycle", "policy_rejected"),
    ] {
        assert!(
            has(&events, kind, outcome),
            "no {kind} {outcome} in {events:#?}"
        );
    }
    let times: Vec<u64> = events.iter().map(|e| e.time_unix_ms).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "ordered by time");
    let page = client.events(&id, None, Some(3)).await.unwrap();
    assert_eq!(page.events.len(), 3);
    let next = page.next_since_ms.expect("more events follow");
    let rest = client.events(&id, Some(next), None).await.unwrap();
    assert!(rest.events.iter().all(|e| e.time_unix_ms >= next));
    let text = serde_json::to_string(&events).unwrap();
    assert!(!text.contains(SECRET), "secret in events");
    assert!(!text.contains(&placeholder), "placeholder in events");
    let state = &daemon.state_dir;
    for log in [
        state.join("audit.jsonl"),
        state.join("sandboxes").join(&id).join("audit.jsonl"),
    ] {
        let lines = std::fs::read_to_string(&log).unwrap();
        assert!(
            lines.contains("\"outcome\":\"injected\""),
            "{}",
            log.display()
        );
        assert!(
            !lines.contains(SECRET) && !lines.contains(&placeholder),
            "{}",
            log.display()
        );
        for line in lines.lines() {
            serde_json::from_str::<AuditRecord>(line).unwrap();
        }
    }

    // The sandbox's end removes its proxy and log; its lifecycle stays in the API.
    client.delete(&id).await.unwrap();
    // A list waits for the delete's teardown.
    client.list(&[], &Default::default()).await.unwrap();
    assert!(!state.join("sandboxes").join(&id).exists());
    let after = client.events(&id, None, None).await.unwrap().events;
    assert!(has(&after, "lifecycle", "delete"), "{after:#?}");
    let daemon_log = std::fs::read_to_string(state.join("audit.jsonl")).unwrap();
    assert!(daemon_log.contains(r#""kind":"lifecycle","outcome":"delete""#));
}

/// Waits (bounded) for a held request of sandbox `id`.
async fn held(client: &Client, id: &str) -> airlock_api::v1::Approval {
    for _ in 0..600 {
        if let Some(approval) = client.approvals(Some(id)).await.unwrap().into_iter().next() {
            return approval;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no request of {id} was held for approval");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_asks_are_approved_denied_or_time_out() {
    common::require_binaries();
    let fake = Fake::start("ask").await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let reviewer = upstream::start_reviewer("once", asked.clone()).await;
    let daemon = fake.daemon("egress-ask", &[]);
    let client = daemon.client();
    let ask = |timeout: &str| format!("approvals:\n  unmatched: ask\n  timeout: {timeout}\n");
    let id = create(&client, fake.policy(&["/secure"], "", &ask("60s"))).await;

    // Approved once through the API: the held curl then completes.
    let background = {
        let (client, id) = (client.clone(), id.clone());
        tokio::spawn(async move { sh(&client, &id, "curl -sS http://ask.test/thing").await })
    };
    let approval = held(&client, &id).await;
    assert_eq!(
        (
            approval.host.as_str(),
            approval.method.as_str(),
            approval.path.as_deref()
        ),
        ("ask.test", "GET", Some("/thing"))
    );
    assert!(approval.id.starts_with(&format!("{id}-")), "{approval:?}");
    assert_eq!(
        client.approvals(None).await.unwrap(),
        vec![approval.clone()]
    );
    client
        .decide_approval(&approval.id, ApprovalDecision::Once)
        .await
        .unwrap();
    assert_eq!(background.await.unwrap(), "hello from http /thing");
    let err = client
        .decide_approval(&approval.id, ApprovalDecision::Once)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(ErrorCode::NotFound),
        "answered already: {err}"
    );

    // Denied.
    let background = {
        let (client, id) = (client.clone(), id.clone());
        tokio::spawn(async move { sh(&client, &id, "refusal http://ask.test/no").await })
    };
    let approval = held(&client, &id).await;
    client
        .decide_approval(&approval.id, ApprovalDecision::Deny)
        .await
        .unwrap();
    assert_eq!(background.await.unwrap(), "approval_denied");
    assert!(
        fake.seen("/no").is_empty(),
        "a denied request never reaches the upstream"
    );

    // Nobody answers within a (hot-reloaded) one-second timeout.
    client
        .apply_policy(&id, &fake.policy(&["/secure"], "", &ask("1s")), false)
        .await
        .unwrap();
    assert_eq!(
        sh(&client, &id, "refusal http://ask.test/late").await,
        "approval_timed_out"
    );
    assert!(client.approvals(Some(&id)).await.unwrap().is_empty());
    assert!(fake.seen("/late").is_empty());

    let events = client.events(&id, None, None).await.unwrap().events;
    for outcome in ["asked", "approved_once", "denied", "timed_out"] {
        assert!(
            has(&events, "approval", outcome),
            "no approval {outcome}: {events:#?}"
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e.approval_id.as_deref() == Some(approval.id.as_str())),
        "audit lines name approvals as the API does: {events:#?}"
    );
    let unknown = client
        .decide_approval(&format!("{id}-apr-0"), ApprovalDecision::Deny)
        .await;
    assert_eq!(unknown.unwrap_err().code(), Some(ErrorCode::NotFound));
    drop(daemon);

    // A reviewer webhook (an automated reviewer) answers instead of a person.
    let hook = format!("http://{reviewer}/review");
    let daemon = fake.daemon("egress-hook", &["--reviewer-webhook", &hook]);
    let client = daemon.client();
    let id = create(&client, fake.policy(&["/secure"], "", &ask("60s"))).await;
    assert_eq!(
        sh(&client, &id, "curl -sS http://ask.test/hooked").await,
        "hello from http /hooked"
    );
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0].contains("ask.test") && asked[0].contains(&id),
        "{asked:?}"
    );
    let events = client.events(&id, None, None).await.unwrap().events;
    assert!(
        events
            .iter()
            .any(|e| e.outcome == "approved_once" && e.detail.as_deref() == Some("by webhook")),
        "{events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_restarted_daemon_keeps_a_sandboxs_egress_and_placeholder() {
    common::require_binaries();
    let fake = Fake::start("restart").await;
    let mut daemon = fake.daemon("egress-restart", &[]);
    let client = daemon.client();
    let id = create(&client, fake.policy(&["/secure"], "", "")).await;
    let bearer = r#"curl -sS -H "Authorization: Bearer $API_TOKEN" https://api.test/secure"#;
    assert_eq!(sh(&client, &id, bearer).await, "hello from https /secure");
    let placeholder = sh(&client, &id, r#"printf %s "$API_TOKEN""#).await;

    daemon.keep_state = true;
    let _cleanup = common::CleanupOnPanic {
        state_dir: daemon.state_dir.clone(),
    };
    assert!(daemon.terminate(), "the daemon stops cleanly");
    let flags: Vec<&str> = fake.flags.iter().map(String::as_str).collect();
    let daemon = TestDaemon::start_in(&daemon.state_dir.clone(), &daemon.key.clone(), &flags);
    let client = daemon.client();
    assert_eq!(client.get(&id).await.unwrap().id, id, "re-adopted");
    assert_eq!(
        sh(&client, &id, r#"printf %s "$API_TOKEN""#).await,
        placeholder
    );
    assert_eq!(sh(&client, &id, bearer).await, "hello from https /secure");
    assert_eq!(
        sh(&client, &id, "refusal http://other.test/").await,
        "egress_denied"
    );
    let secure = fake.seen("/secure");
    assert_eq!(secure.len(), 2, "{secure:?}");
    assert!(
        secure
            .iter()
            .all(|s| s.headers.get("authorization") == Some(&format!("Bearer {SECRET}"))),
        "the new proxy injects the secret for the old placeholder"
    );
    let events = client.events(&id, None, None).await.unwrap().events;
    assert!(has(&events, "lifecycle", "adopted"), "{events:#?}");
    assert!(!has(&events, "lifecycle", "egress_failed"), "{events:#?}");
    // Hot reload works on the re-adopted sandbox too.
    let other = "    - {name: other, host: other.test, ports: [80]}";
    client
        .apply_policy(&id, &fake.policy(&["/secure"], other, ""), false)
        .await
        .unwrap();
    assert_eq!(
        sh(&client, &id, "curl -sS http://other.test/again").await,
        "hello from http /again"
    );
}
