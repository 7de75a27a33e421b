//! Hot reload (atomic, invalid plans rejected, tunnels it no longer allows closed) and
//! approvals (once, always, deny, timeout, reviewer webhook).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::sync::{Arc, Mutex};

use airlock_egress::{
    ApprovalError, AuditSink, Decision, EgressError, Placeholders, Proxy, ProxyOptions, Secrets,
    Webhook,
};
use airlock_policy::egress::{ApprovalMode, NetworkMode};
use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_hot_reload_takes_effect_and_invalid_plans_are_rejected() {
    let first = plan(vec![rule("api", "api.test", &[80], vec![])]);
    let h = harness(
        &first,
        &Secrets::new(),
        &Placeholders::new(),
        &["api.test", "other.test"],
        &[],
    )
    .await;
    let none = (Secrets::new(), Placeholders::new());
    assert_eq!(
        forward(&h.socket, "GET", "http://other.test/", &[])
            .await
            .error_code(),
        Some("egress_denied")
    );

    let second = plan(vec![
        rule("api", "api.test", &[80], vec![]),
        rule("other", "other.test", &[80], vec![]),
    ]);
    assert_eq!(h.proxy.replace_plan(&second, &none.0, &none.1).unwrap(), 2);
    assert_eq!(
        forward(&h.socket, "GET", "http://other.test/", &[])
            .await
            .status,
        200
    );

    let mut full = second.clone();
    full.mode = NetworkMode::Full;
    let error = h.proxy.replace_plan(&full, &none.0, &none.1).unwrap_err();
    assert!(matches!(error, EgressError::InvalidPlan(_)));
    let mut bad_rule = second.clone();
    bad_rule.rules[1].host.0 = "*.test".into();
    let error = h
        .proxy
        .replace_plan(&bad_rule, &none.0, &none.1)
        .unwrap_err();
    let EgressError::InvalidPlan(cause) = error else {
        panic!()
    };
    assert!(cause.to_string().contains("\"*.test\""), "{cause}");
    // The last valid plan is still in force.
    assert_eq!(h.proxy.generation(), 2);
    assert_eq!(
        forward(&h.socket, "GET", "http://other.test/", &[])
            .await
            .status,
        200
    );

    assert_eq!(
        h.audit_matching(&[("kind", "policy"), ("outcome", "changed")])
            .len(),
        2
    );
    let rejected = h.audit_matching(&[("kind", "policy"), ("outcome", "rejected")]);
    assert_eq!(rejected.len(), 2);
    assert!(rejected[0]["detail"].as_str().unwrap().contains("full"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_reload_closes_tunnels_and_applies_to_open_inspected_connections() {
    let first = plan(vec![
        rule("pass", "pass.test", &[443], vec![]),
        rule("gh", "gh.test", &[443], vec![http_rule(&["GET"], &["/**"])]),
    ]);
    let h = harness(
        &first,
        &Secrets::new(),
        &Placeholders::new(),
        &[],
        &["pass.test", "gh.test"],
    )
    .await;
    let none = (Secrets::new(), Placeholders::new());

    let tunnel = connect(&h.socket, "pass.test:443").await.unwrap();
    let mut passthrough = client_on(tls(tunnel, "pass.test", &h.pki.ca_pem).await.unwrap()).await;
    assert_eq!(
        send(&mut passthrough, request("GET", "/", "pass.test", &[]))
            .await
            .unwrap()
            .status,
        200
    );
    let tunnel = connect(&h.socket, "gh.test:443").await.unwrap();
    let mut inspected = client_on(
        tls(tunnel, "gh.test", h.proxy.ca_certificate_pem())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        send(&mut inspected, request("GET", "/private", "gh.test", &[]))
            .await
            .unwrap()
            .status,
        200
    );

    let second = plan(vec![rule(
        "gh",
        "gh.test",
        &[443],
        vec![http_rule(&["GET"], &["/public/**"])],
    )]);
    h.proxy.replace_plan(&second, &none.0, &none.1).unwrap();

    eventually("the pass-through tunnel closes", || passthrough.is_closed()).await;
    assert_eq!(
        h.audit_matching(&[("code", "policy_revoked"), ("host", "pass.test")])
            .len(),
        1
    );
    // The same inspected connection now gets the new rules.
    let answer = send(&mut inspected, request("GET", "/private", "gh.test", &[]))
        .await
        .unwrap();
    assert_eq!(answer.error_code(), Some("http_rule_denied"));
    let answer = send(&mut inspected, request("GET", "/public/x", "gh.test", &[]))
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
}

fn ask_plan(timeout_ms: u64) -> airlock_policy::egress::EgressPlan {
    let mut plan = plan(vec![rule("api", "api.test", &[80], vec![])]);
    plan.approvals = ApprovalMode::Ask { timeout_ms };
    plan
}

/// Starts `GET url` in the background and waits until it is listed as pending.
async fn held(
    h: &Harness,
    url: &str,
) -> (
    tokio::task::JoinHandle<Answer>,
    airlock_egress::PendingApproval,
) {
    let before = h.proxy.approvals().list().len();
    let socket = h.socket.clone();
    let url = url.to_owned();
    let task = tokio::spawn(async move { forward(&socket, "GET", &url, &[]).await });
    let approvals = h.proxy.approvals().clone();
    eventually("the request is held", || approvals.list().len() > before).await;
    let pending = h.proxy.approvals().list().pop().unwrap();
    (task, pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_an_ask_is_approved_once_always_or_denied() {
    let h = harness(
        &ask_plan(120_000),
        &Secrets::new(),
        &Placeholders::new(),
        &["api.test", "ask.test"],
        &["other.test"],
    )
    .await;
    let approvals = h.proxy.approvals().clone();

    let (task, pending) = held(&h, "http://ask.test/once?q=secretish").await;
    assert_eq!(
        (pending.host.as_str(), pending.port, pending.method.as_str()),
        ("ask.test", 80, "GET")
    );
    assert_eq!(pending.path.as_deref(), Some("/once"));
    assert_eq!(pending.sandbox_id, "sbx-test");
    assert!(pending.expires_at_unix_ms > pending.requested_at_unix_ms);
    assert!(
        h.seen().is_empty(),
        "a held request must not reach the upstream"
    );
    approvals.decide(&pending.id, Decision::Once).unwrap();
    assert_eq!(task.await.unwrap().status, 200);
    assert_eq!(
        approvals.decide(&pending.id, Decision::Once),
        Err(ApprovalError::NotFound(pending.id.clone()))
    );

    // Once means once.
    let (task, pending) = held(&h, "http://ask.test/once").await;
    approvals.decide(&pending.id, Decision::Deny).unwrap();
    let answer = task.await.unwrap();
    assert_eq!(
        (answer.status, answer.error_code()),
        (403, Some("approval_denied"))
    );

    // Always: later identical requests go straight through.
    let (task, pending) = held(&h, "http://ask.test/always").await;
    approvals.decide(&pending.id, Decision::Always).unwrap();
    assert_eq!(task.await.unwrap().status, 200);
    assert_eq!(
        forward(&h.socket, "GET", "http://ask.test/always", &[])
            .await
            .status,
        200
    );
    assert_eq!(approvals.grants().len(), 1);

    // A tunnel is asked for as a whole.
    let socket = h.socket.clone();
    let ca = h.pki.ca_pem.clone();
    let task = tokio::spawn(async move {
        https(
            &socket,
            "other.test",
            443,
            &ca,
            request("GET", "/t", "other.test", &[]),
        )
        .await
    });
    eventually("the tunnel is held", || !approvals.list().is_empty()).await;
    let pending = approvals.list().pop().unwrap();
    assert_eq!(
        (pending.method.as_str(), pending.path.clone()),
        ("CONNECT", None)
    );
    approvals.decide(&pending.id, Decision::Once).unwrap();
    assert_eq!(task.await.unwrap().unwrap().status, 200);

    let asked = h.audit_matching(&[("kind", "approval"), ("outcome", "asked")]);
    assert_eq!(asked.len(), 4, "{asked:?}");
    assert_eq!(
        h.audit_matching(&[("kind", "approval"), ("outcome", "approved_once")])
            .len(),
        2
    );
    assert_eq!(
        h.audit_matching(&[("kind", "approval"), ("outcome", "approved_always")])
            .len(),
        1
    );
    assert_eq!(
        h.audit_matching(&[("kind", "approval"), ("outcome", "denied")])
            .len(),
        1
    );
    assert!(
        h.audit_lines()
            .iter()
            .all(|l| !l.to_string().contains("secretish"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_an_unanswered_ask_times_out_to_deny() {
    let h = harness(
        &ask_plan(300),
        &Secrets::new(),
        &Placeholders::new(),
        &["ask.test"],
        &[],
    )
    .await;
    let answer = forward(&h.socket, "GET", "http://ask.test/slow", &[]).await;
    assert_eq!(
        (answer.status, answer.error_code()),
        (403, Some("approval_timed_out"))
    );
    assert!(h.proxy.approvals().list().is_empty());
    assert!(h.seen().is_empty());
    assert_eq!(
        h.audit_matching(&[("kind", "approval"), ("outcome", "asked")])
            .len(),
        1
    );
    assert_eq!(
        h.audit_matching(&[("kind", "approval"), ("outcome", "timed_out")])
            .len(),
        1
    );
}

/// A reviewer on loopback that answers every request with `answer` and keeps what it got.
async fn start_reviewer(answer: &'static str) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let received: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/review", listener.local_addr().unwrap());
    let log = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        async move {
                            let body = request.into_body().collect().await?.to_bytes();
                            log.lock()
                                .unwrap()
                                .push(serde_json::from_slice(&body).unwrap());
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(
                                Bytes::from_static(answer.as_bytes()),
                            )))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_reviewer_webhook_decides() {
    let (url, received) = start_reviewer(r#"{"decision": "once"}"#).await;
    let options = ProxyOptions {
        reviewer_webhook: Some(Webhook::new(&url).unwrap()),
        ..ProxyOptions::default()
    };
    let h = harness_with(
        &ask_plan(120_000),
        &Secrets::new(),
        &Placeholders::new(),
        &["ask.test"],
        &[],
        options,
    )
    .await;
    let answer = forward(&h.socket, "GET", "http://ask.test/hook", &[]).await;
    assert_eq!(answer.status, 200);
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0]["approval"]["host"], "ask.test");
    assert_eq!(received[0]["approval"]["path"], "/hook");
    let approved = h.audit_matching(&[("kind", "approval"), ("outcome", "approved_once")]);
    assert_eq!(approved[0]["detail"], "by webhook");
    assert!(Webhook::new("https://reviewer.example/").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_audit_file_lines_and_network_none() {
    let path = std::env::temp_dir().join(format!(
        "airlock-egress-audit-{}.jsonl",
        airlock_egress::generate_placeholder("a").unwrap()
    ));
    let mut off = plan(vec![rule("api", "api.test", &[80], vec![])]);
    off.mode = NetworkMode::None;
    let options = ProxyOptions {
        trust_bundle: Some("/nonexistent".into()),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::new(
        "sbx-file",
        &off,
        &Secrets::new(),
        &Placeholders::new(),
        AuditSink::file(&path).unwrap(),
        options,
    )
    .unwrap();
    let (client, server) = tokio::io::duplex(64 * 1024);
    let serving = proxy.clone();
    tokio::spawn(async move { serving.serve_connection(server, Default::default()).await });
    let answer = send_on(client, request("GET", "http://api.test/", "api.test", &[]))
        .await
        .unwrap();
    assert_eq!(answer.error_code(), Some("egress_denied"));
    proxy.close();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        (lines[0]["kind"].as_str(), lines[0]["outcome"].as_str()),
        (Some("policy"), Some("changed"))
    );
    assert_eq!(
        (lines[1]["kind"].as_str(), lines[1]["outcome"].as_str()),
        (Some("egress"), Some("denied"))
    );
    assert_eq!(lines[1]["sandbox_id"], "sbx-file");
    assert!(lines[1]["pid"].is_null() && lines[1]["exe"].is_null());
}
