//! Host, method and path rules, the hard block (SSRF encodings, DNS rebinding, a redirect to
//! the metadata address) and domain fronting, through real sockets against loopback upstreams.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::net::IpAddr;

use airlock_egress::{Placeholders, Secrets, TestAnswer};
use common::*;
use tokio::io::AsyncReadExt as _;

const ROOT_NONE: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_allowed_hosts_work_over_http_and_https_passthrough() {
    let plan = plan(vec![
        rule("plain", "api.test", &[80], vec![]),
        rule("tls", "pass.test", &[443], vec![]),
    ]);
    let h = harness(
        &plan,
        &Secrets::new(),
        &Placeholders::new(),
        &["api.test"],
        &["pass.test"],
    )
    .await;

    let answer = forward(&h.socket, "GET", "http://api.test/hello?x=1", &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, "hello from http /hello?x=1");

    // Pass-through: the TLS session is the client's own with the upstream (the test CA).
    let answer = https(
        &h.socket,
        "pass.test",
        443,
        &h.pki.ca_pem,
        request("GET", "/hi", "pass.test", &[]),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, "hello from https /hi");

    let allowed = h.audit_matching(&[("kind", "egress"), ("outcome", "allowed")]);
    assert!(
        allowed
            .iter()
            .any(|l| l["rule"] == "plain" && l["host"] == "api.test" && l["path"] == "/hello")
    );
    assert!(
        allowed.iter().any(|l| l["rule"] == "tls"
            && l["method"] == "CONNECT"
            && l["tunnel"] == "passthrough")
    );
    // The query string never reaches an audit line.
    assert!(
        h.audit_lines()
            .iter()
            .all(|l| !l.to_string().contains("x=1"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_denied_hosts_are_blocked_with_a_clear_error() {
    let plan = plan(vec![rule("plain", "api.test", &[80], vec![])]);
    // denied.test resolves to the upstream too: only the rule stands in the way.
    let h = harness(
        &plan,
        &Secrets::new(),
        &Placeholders::new(),
        &["api.test", "denied.test"],
        &["denied.test"],
    )
    .await;

    let answer = forward(&h.socket, "GET", "http://denied.test/", &[]).await;
    assert_eq!(answer.status, 403);
    assert_eq!(answer.error_code(), Some("egress_denied"));
    assert!(
        answer.body.contains("no rule allows GET / on denied.test"),
        "{}",
        answer.body
    );

    let refused = connect(&h.socket, "denied.test:443").await.unwrap_err();
    assert_eq!(refused.status, 403);
    assert_eq!(refused.error_code(), Some("egress_denied"));
    assert!(
        refused.body.contains("no rule allows denied.test:443"),
        "{}",
        refused.body
    );

    // The right host on a port the rule does not list.
    let answer = forward(&h.socket, "GET", "http://api.test:8080/", &[]).await;
    assert_eq!(answer.error_code(), Some("egress_denied"));

    // Not a proxy request at all.
    let answer = forward(&h.socket, "GET", "https://api.test/", &[]).await;
    assert_eq!(answer.error_code(), Some("use_connect"));

    assert!(h.seen().is_empty(), "{:?}", h.seen());
    let denied = h.audit_matching(&[
        ("kind", "egress"),
        ("outcome", "denied"),
        ("code", "egress_denied"),
    ]);
    assert_eq!(denied.len(), 3, "{denied:?}");
    assert!(
        denied
            .iter()
            .all(|l| l["sandbox_id"] == "sbx-test" && l["time_unix_ms"].as_u64().unwrap() > 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_method_and_path_rules_are_enforced_on_http_and_intercepted_https() {
    let l7 = vec![
        http_rule(&["GET"], &["/repos/acme/**"]),
        http_rule(&["POST"], &["/repos/acme/*/pulls"]),
    ];
    let plan = plan(vec![
        rule("gh-plain", "api.test", &[80], l7.clone()),
        rule("gh", "gh.test", &[443], l7),
    ]);
    let h = harness(
        &plan,
        &Secrets::new(),
        &Placeholders::new(),
        &["api.test"],
        &["gh.test"],
    )
    .await;
    let ca = h.proxy.ca_certificate_pem().to_owned();

    for (method, path, status, code) in [
        ("GET", "/repos/acme/widget", 200, None),
        ("GET", "/repos/%61cme/widget", 200, None),
        ("POST", "/repos/acme/widget/pulls", 200, None),
        ("POST", "/repos/acme/widget", 403, Some("http_rule_denied")),
        (
            "DELETE",
            "/repos/acme/widget",
            403,
            Some("http_rule_denied"),
        ),
        ("GET", "/repos/other/widget", 403, Some("http_rule_denied")),
        ("GET", "/repos/acme/..%2Fother", 400, Some("invalid_path")),
        ("GET", "/repos/acme/../other", 400, Some("invalid_path")),
    ] {
        let answer = forward(&h.socket, method, &format!("http://api.test{path}"), &[]).await;
        assert_eq!(
            (answer.status, answer.error_code()),
            (status, code),
            "http {method} {path}"
        );
        // Intercepted: the client trusts only the sandbox CA, and still reaches the upstream.
        let answer = https(
            &h.socket,
            "gh.test",
            443,
            &ca,
            request(method, path, "gh.test", &[]),
        )
        .await
        .unwrap();
        assert_eq!(
            (answer.status, answer.error_code()),
            (status, code),
            "https {method} {path}"
        );
        if status == 200 {
            assert_eq!(answer.headers["x-upstream"], "https");
        }
    }
    let seen = h.seen();
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(seen.iter().all(|s| s.target.starts_with("/repos/acme/") || s.target.starts_with("/repos/%61cme/")));
    assert!(
        !h.audit_matching(&[("tunnel", "inspect"), ("rule", "gh")])
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_domain_fronting_is_refused() {
    let plan = plan(vec![
        rule("pass", "pass.test", &[443], vec![]),
        rule(
            "inspected",
            "gh.test",
            &[443],
            vec![http_rule(&["GET"], &[])],
        ),
    ]);
    let h = harness(
        &plan,
        &Secrets::new(),
        &Placeholders::new(),
        &[],
        &["pass.test", "gh.test", "evil.test"],
    )
    .await;

    // Pass-through tunnel to pass.test carrying a ClientHello for evil.test: closed unforwarded.
    let tunnel = connect(&h.socket, "pass.test:443").await.unwrap();
    assert!(tls(tunnel, "evil.test", &h.pki.ca_pem).await.is_err());
    // The same on an intercepted destination.
    let tunnel = connect(&h.socket, "gh.test:443").await.unwrap();
    assert!(
        tls(tunnel, "evil.test", h.proxy.ca_certificate_pem())
            .await
            .is_err()
    );
    // A matching SNI but a Host header for another site, inside an intercepted tunnel.
    let answer = https(
        &h.socket,
        "gh.test",
        443,
        h.proxy.ca_certificate_pem(),
        request("GET", "/", "evil.test", &[]),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 403);
    assert_eq!(answer.error_code(), Some("host_mismatch"));
    // Port 443 without TLS.
    let mut tunnel = connect(&h.socket, "pass.test:443").await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tunnel, b"GET / HTTP/1.1\r\nHost: pass.test\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tunnel.read_to_end(&mut rest).await;
    assert!(rest.is_empty());

    assert!(h.seen().is_empty(), "{:?}", h.seen());
    assert_eq!(h.audit_matching(&[("code", "sni_mismatch")]).len(), 2);
    assert_eq!(h.audit_matching(&[("code", "host_mismatch")]).len(), 1);
    assert_eq!(h.audit_matching(&[("code", "tls_required")]).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_internal_addresses_are_blocked_in_every_spelling() {
    let plan = plan(vec![
        rule("meta-name", "meta.test", &[80, 443], vec![]),
        rule("metadata-literal", "169.254.169.254", &[80, 443], vec![]),
    ]);
    let h = harness(&plan, &Secrets::new(), &Placeholders::new(), &[], ROOT_NONE).await;
    h.resolver.dns(
        "meta.test",
        vec!["169.254.169.254".parse::<IpAddr>().unwrap()],
    );

    for host in [
        "169.254.169.254",
        "2852039166",
        "0xa9fea9fe",
        "0251.0376.0251.0376",
        "0xa9.0xfe.0xa9.0xfe",
        "169.254.43518",
        "169.16689662",
        "127.1",
        "0x7f.1",
        "0",
        "10.0.0.1",
        "192.168.1.1",
        "100.100.100.200",
        "224.0.0.1",
        "[::1]",
        "[::]",
        "[::ffff:169.254.169.254]",
        "[::ffff:a9fe:a9fe]",
        "[::169.254.169.254]",
        "[64:ff9b::a9fe:a9fe]",
        "[2002:a9fe:a9fe::]",
        "[fd00:ec2::254]",
        "[fe80::1]",
        "meta.test",
    ] {
        let answer = forward(
            &h.socket,
            "GET",
            &format!("http://{host}/latest/meta-data/"),
            &[],
        )
        .await;
        assert_eq!(answer.status, 403, "{host}: {answer:?}");
        assert_eq!(
            answer.error_code(),
            Some("destination_blocked"),
            "{host}: {}",
            answer.body
        );
        let refused = connect(&h.socket, &format!("{host}:443"))
            .await
            .unwrap_err();
        assert_eq!(
            refused.error_code(),
            Some("destination_blocked"),
            "CONNECT {host}"
        );
    }
    let answer = forward(&h.socket, "GET", "http://meta.test/", &[]).await;
    assert!(
        answer
            .body
            .contains("resolves to 169.254.169.254, a link-local address"),
        "{}",
        answer.body
    );
    // A hard-blocked address is never put to a person either.
    assert!(h.proxy.approvals().list().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_dns_rebinding_cannot_reach_loopback() {
    let plan = plan(vec![rule("rebind", "rebind.test", &[80], vec![])]);
    let h = harness(&plan, &Secrets::new(), &Placeholders::new(), &[], ROOT_NONE).await;
    // First answer: the (stand-in) public upstream; second: loopback, where a host service
    // listens (the HTTP upstream itself stands in for it).
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    h.resolver.sequence(
        "rebind.test",
        vec![
            TestAnswer::Upstream(h.http),
            TestAnswer::Dns(vec![loopback]),
        ],
    );
    let first = forward(&h.socket, "GET", "http://rebind.test/", &[]).await;
    assert_eq!(first.status, 200);
    let second = forward(&h.socket, "GET", "http://rebind.test/", &[]).await;
    assert_eq!(second.status, 403);
    assert_eq!(second.error_code(), Some("destination_blocked"));
    assert!(second.body.contains("127.0.0.1"), "{}", second.body);
    assert_eq!(h.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_redirect_to_the_metadata_address_is_blocked() {
    let plan = plan(vec![
        rule("api", "api.test", &[80], vec![]),
        rule("metadata", "169.254.169.254", &[80], vec![]),
    ]);
    let h = harness(
        &plan,
        &Secrets::new(),
        &Placeholders::new(),
        &["api.test"],
        ROOT_NONE,
    )
    .await;
    let answer = forward(&h.socket, "GET", "http://api.test/redirect-metadata", &[]).await;
    assert_eq!(answer.status, 302);
    let location = answer.headers["location"].clone();
    assert_eq!(location, "http://169.254.169.254/latest/meta-data/");
    // The client follows the redirect through the proxy, as every HTTP library does.
    let followed = forward(&h.socket, "GET", &location, &[]).await;
    assert_eq!(followed.status, 403);
    assert_eq!(followed.error_code(), Some("destination_blocked"));
    assert_eq!(h.seen().len(), 1);
}
