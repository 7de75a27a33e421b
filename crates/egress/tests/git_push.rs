//! `git_push_refs`: the proxy reads the ref update commands of `git-receive-pack` requests
//! and lets a push through only when every ref it names is allowed, with the body forwarded
//! unchanged; pushes to another ref or another repository of the host are refused and audited,
//! and a guarded host is always intercepted. Real sockets against loopback upstreams; the
//! end-to-end test with real git is `crates/server/tests/git.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use airlock_egress::{Placeholders, Secrets};
use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::Request;

const ZERO: &str = "0000000000000000000000000000000000000000";
const ONE: &str = "1111111111111111111111111111111111111111";

fn pkt(payload: &str) -> String {
    format!("{:04x}{payload}", payload.len() + 4)
}

/// A receive-pack body: one command per ref, the flush packet, then `pack` as the pack.
fn push_body(refs: &[&str], pack: &str) -> String {
    let mut body = String::new();
    for (i, refname) in refs.iter().enumerate() {
        let caps = if i == 0 { "\0report-status" } else { "" };
        body.push_str(&pkt(&format!("{ZERO} {ONE} {refname}{caps}\n")));
    }
    body.push_str("0000");
    body.push_str(pack);
    body
}

fn post(uri: &str, host: &str, body: String, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method("POST")
        .uri(uri)
        .header("host", host)
        .header("content-type", "application/x-git-receive-pack-request");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

fn guarded_rule(
    host: &str,
    port: u16,
    paths: &[&str],
    refs: &[&str],
) -> airlock_policy::egress::EgressRule {
    let mut rule = rule(
        "repo",
        host,
        &[port],
        vec![http_rule(&["GET", "POST"], paths)],
    );
    rule.git_push_refs = Some(refs.iter().map(|r| (*r).to_owned()).collect());
    rule
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_git_push_refs_allow_only_the_named_refs_and_repository() {
    // The repository's rule, and a wide rule for the rest of the host that says nothing about
    // pushes: the host is guarded, so pushes through the wide rule are refused.
    let mut wide = rule("host", "git.test", &[80], vec![http_rule(&[], &["/**"])]);
    wide.git_push_refs = None;
    let plan = plan(vec![
        guarded_rule(
            "git.test",
            80,
            &[
                "/echo/repo.git/info/refs",
                "/echo/repo.git/git-receive-pack",
            ],
            &["refs/heads/agent-1"],
        ),
        wide,
    ]);
    let h = harness(
        &plan,
        &Secrets::new(),
        &Placeholders::new(),
        &["git.test"],
        &[],
    )
    .await;
    let send = |request| {
        let socket = h.socket.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            send_on(stream, request).await.unwrap()
        }
    };
    let url = "http://git.test/echo/repo.git/git-receive-pack";

    // The allowed ref: forwarded, the body byte for byte (a pack larger than one read).
    let pack = format!("PACK{}", "x".repeat(300_000));
    let body = push_body(&["refs/heads/agent-1"], &pack);
    let answer = send(post(url, "git.test", body.clone(), &[])).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let echoed: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        echoed["body"].as_str().unwrap(),
        body,
        "the body reaches the upstream unchanged"
    );

    // Another branch, or an allowed one beside a denied one: refused before the upstream.
    let before = h.seen().len();
    for refs in [
        &["refs/heads/main"][..],
        &["refs/heads/agent-1", "refs/tags/v1"],
    ] {
        let answer = send(post(url, "git.test", push_body(refs, "PACK"), &[])).await;
        assert_eq!(answer.status, 403, "{refs:?}: {answer:?}");
        assert_eq!(answer.error_code(), Some("git_push_denied"));
    }
    // Another repository of the host, allowed by the wide rule but not for pushes.
    let other = "http://git.test/echo/other.git/git-receive-pack";
    let answer = send(post(
        other,
        "git.test",
        push_body(&["refs/heads/agent-1"], ""),
        &[],
    ))
    .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.error_code(), Some("git_push_denied"));
    // What cannot be read is not let through: a compressed body, a signed push, a body that
    // ends inside the commands.
    let answer = send(post(
        url,
        "git.test",
        push_body(&["refs/heads/agent-1"], ""),
        &[("content-encoding", "gzip")],
    ))
    .await;
    assert_eq!(
        answer.error_code(),
        Some("git_push_unreadable"),
        "{answer:?}"
    );
    let signed = format!("{}0000", pkt("push-cert\0report-status\n"));
    let answer = send(post(url, "git.test", signed, &[])).await;
    assert_eq!(answer.error_code(), Some("git_push_denied"), "{answer:?}");
    let cut = pkt(&format!("{ZERO} {ONE} refs/heads/agent-1\n"));
    let answer = send(post(url, "git.test", cut, &[])).await;
    assert_eq!(
        answer.error_code(),
        Some("git_push_unreadable"),
        "{answer:?}"
    );
    assert_eq!(
        h.seen().len(),
        before,
        "no refused push reached the upstream"
    );

    // A fetch-side request of the same host is unaffected.
    let answer = forward(
        &h.socket,
        "GET",
        "http://git.test/echo/repo.git/info/refs",
        &[],
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");

    let denied = h.audit_matching(&[("kind", "egress"), ("code", "git_push_denied")]);
    assert_eq!(denied.len(), 4, "{denied:?}");
    assert!(
        denied
            .iter()
            .any(|l| l["detail"].as_str().unwrap().contains("refs/heads/main")),
        "{denied:?}"
    );
    let allowed = h.audit_matching(&[("kind", "egress"), ("outcome", "allowed")]);
    assert!(
        allowed
            .iter()
            .any(|l| l["detail"] == "git push of refs/heads/agent-1"),
        "{allowed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_git_push_refs_force_interception_of_an_unrestricted_host() {
    // No L7 rules and no credential: without the guard this host's TLS would pass through,
    // where no push could be read.
    let mut open = rule("git", "git.test", &[443], vec![]);
    open.git_push_refs = Some(vec!["refs/heads/agent-*".to_owned()]);
    let h = harness(
        &plan(vec![open]),
        &Secrets::new(),
        &Placeholders::new(),
        &[],
        &["git.test"],
    )
    .await;
    let ca = h.proxy.ca_certificate_pem().to_owned();
    let allowed = https(
        &h.socket,
        "git.test",
        443,
        &ca,
        post(
            "/echo/r.git/git-receive-pack",
            "git.test",
            push_body(&["refs/heads/agent-7"], "PACK"),
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(allowed.status, 200, "{allowed:?}");
    let denied = https(
        &h.socket,
        "git.test",
        443,
        &ca,
        post(
            "/echo/r.git/git-receive-pack",
            "git.test",
            push_body(&["refs/heads/main"], "PACK"),
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(denied.status, 403, "{denied:?}");
    let tunnels = h.audit_matching(&[("method", "CONNECT"), ("outcome", "allowed")]);
    assert!(
        tunnels.iter().all(|l| l["tunnel"] == "inspect"),
        "{tunnels:?}"
    );
}

#[test]
fn test_git_push_refs_must_be_full_ref_globs() {
    let mut bad = rule("git", "git.test", &[443], vec![]);
    bad.git_push_refs = Some(vec!["main".to_owned()]);
    let error = airlock_egress::Proxy::new(
        "sbx",
        &plan(vec![bad]),
        &Secrets::new(),
        &Placeholders::new(),
        airlock_egress::AuditSink::discard(),
        airlock_egress::ProxyOptions::default(),
    )
    .unwrap_err();
    assert!(
        error_chain(&error).contains("not a full ref glob"),
        "{error}"
    );
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
