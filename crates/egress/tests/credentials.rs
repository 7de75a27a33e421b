//! Credential substitution: the upstream sees the real secret, the sandbox only the
//! placeholder; a placeholder anywhere its binding does not allow gets 403
//! `credential_endpoint_mismatch`; no audit line carries a secret or a placeholder.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::net::SocketAddr;

use airlock_egress::{
    ConnectionInfo, Placeholders, SandboxProxySetup, Secrets, generate_placeholder,
    sandbox_environment,
};
use airlock_policy::egress::{
    CredentialPlan, CredentialSource, EgressPlan, Endpoint, HostPattern, Injection,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::*;

const SECRET: &str = "ghp_REAL-secret-value-0123456789";
const API_KEY: &str = "key-REAL-9876543210";
const PASSWORD: &str = "pw-REAL-abcdef";

fn credential(name: &str, inject: Injection, paths: &[&str], methods: &[&str]) -> CredentialPlan {
    CredentialPlan {
        name: name.into(),
        source: CredentialSource::Env {
            var: "UNUSED".into(),
        },
        env: format!("{}_TOKEN", name.to_uppercase()),
        inject,
        endpoints: vec![Endpoint {
            host: HostPattern("creds.test".into()),
            port: 443,
            http: http_rule(methods, paths),
        }],
    }
}

fn credential_plan() -> (EgressPlan, Secrets, Placeholders) {
    let mut plan = plan(vec![
        rule("creds", "creds.test", &[443], vec![]),
        rule("api-plain", "api.test", &[80], vec![]),
    ]);
    plan.credentials = vec![
        credential("gh", Injection::Bearer, &["/echo/**"], &["GET"]),
        credential(
            "key",
            Injection::Header {
                name: "x-api-key".into(),
            },
            &["/echo/key"],
            &[],
        ),
        credential(
            "basic",
            Injection::Basic {
                username: "bot".into(),
            },
            &["/echo/basic"],
            &[],
        ),
    ];
    let mut secrets = Secrets::new();
    secrets.insert("gh", SECRET);
    secrets.insert("key", API_KEY);
    secrets.insert("basic", PASSWORD);
    let placeholders: Placeholders = ["gh", "key", "basic"]
        .iter()
        .map(|name| (name.to_string(), generate_placeholder(name).unwrap()))
        .collect();
    (plan, secrets, placeholders)
}

fn assert_no_secret_in_audit(h: &Harness, placeholders: &Placeholders) {
    let lines = h.audit.lock().unwrap().clone();
    assert!(!lines.is_empty());
    for line in &lines {
        for secret in [SECRET, API_KEY, PASSWORD] {
            assert!(!line.contains(secret), "secret in audit line {line}");
        }
        for placeholder in placeholders.values() {
            assert!(
                !line.contains(placeholder.as_str()),
                "placeholder in audit line {line}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_the_upstream_sees_the_secret_and_the_client_only_the_placeholder() {
    let (plan, secrets, placeholders) = credential_plan();
    let h = harness(
        &plan,
        &secrets,
        &placeholders,
        &["api.test"],
        &["creds.test"],
    )
    .await;
    let ca = h.proxy.ca_certificate_pem().to_owned();
    let gh = placeholders["gh"].clone();

    let bearer = format!("Bearer {gh}");
    let answer = https(
        &h.socket,
        "creds.test",
        443,
        &ca,
        request(
            "GET",
            "/echo/user",
            "creds.test",
            &[("authorization", &bearer)],
        ),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let seen = h.seen();
    assert_eq!(
        seen.last().unwrap().headers["authorization"],
        format!("Bearer {SECRET}")
    );
    // The upstream reflected the secret in a header and in the body; the client sees neither.
    assert_eq!(answer.headers["x-seen-authorization"], bearer);
    assert!(answer.body.contains(&bearer), "{}", answer.body);
    assert!(!answer.body.contains(SECRET) && !format!("{:?}", answer.headers).contains(SECRET));

    let key_value = format!("token {}", placeholders["key"]);
    let answer = https(
        &h.socket,
        "creds.test",
        443,
        &ca,
        request(
            "POST",
            "/echo/key",
            "creds.test",
            &[("x-api-key", &key_value)],
        ),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        h.seen().last().unwrap().headers["x-api-key"],
        format!("token {API_KEY}")
    );
    assert!(answer.body.contains(&key_value) && !answer.body.contains(API_KEY));

    let basic = format!(
        "Basic {}",
        BASE64.encode(format!("whoever:{}", placeholders["basic"]))
    );
    let answer = https(
        &h.socket,
        "creds.test",
        443,
        &ca,
        request(
            "GET",
            "/echo/basic",
            "creds.test",
            &[("authorization", &basic)],
        ),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let real_basic = format!("Basic {}", BASE64.encode(format!("bot:{PASSWORD}")));
    assert_eq!(
        h.seen().last().unwrap().headers["authorization"],
        real_basic
    );
    assert!(!answer.body.contains(&real_basic[6..]), "{}", answer.body);

    // A compressed answer from a bound destination cannot be checked for the secret.
    let answer = https(
        &h.socket,
        "creds.test",
        443,
        &ca,
        request("GET", "/gzip", "creds.test", &[]),
    )
    .await
    .unwrap();
    assert_eq!(answer.error_code(), Some("response_not_inspectable"));
    assert_eq!(
        h.seen().last().unwrap().headers["accept-encoding"],
        "identity"
    );

    let injected = h.audit_matching(&[("kind", "credential"), ("outcome", "injected")]);
    let names: Vec<&str> = injected
        .iter()
        .map(|l| l["credential"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gh", "key", "basic"]);
    assert_no_secret_in_audit(&h, &placeholders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_placeholder_outside_its_binding_gets_403() {
    let (plan, secrets, placeholders) = credential_plan();
    let h = harness(
        &plan,
        &secrets,
        &placeholders,
        &["api.test"],
        &["creds.test"],
    )
    .await;
    let ca = h.proxy.ca_certificate_pem().to_owned();
    let gh = placeholders["gh"].clone();
    let bearer = format!("Bearer {gh}");

    // An allowed host the credential is not bound to.
    let answer = forward(
        &h.socket,
        "GET",
        "http://api.test/steal",
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(
        (answer.status, answer.error_code()),
        (403, Some("credential_endpoint_mismatch"))
    );
    assert!(
        answer
            .body
            .contains("credential \\\"gh\\\" may not be used"),
        "{}",
        answer.body
    );

    for (method, path, headers) in [
        // The bound destination, a method the binding does not allow.
        (
            "POST",
            "/echo/user".to_owned(),
            vec![("authorization", bearer.clone())],
        ),
        // The right endpoint, but in the URL.
        ("GET", format!("/echo/user?token={gh}"), vec![]),
        ("GET", format!("/echo/{gh}"), vec![]),
        // The right endpoint, but another header.
        (
            "GET",
            "/echo/user".to_owned(),
            vec![("x-forwarded-token", gh.clone())],
        ),
        // Another credential's header form.
        (
            "GET",
            "/echo/user".to_owned(),
            vec![("x-api-key", gh.clone())],
        ),
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let answer = https(
            &h.socket,
            "creds.test",
            443,
            &ca,
            request(method, &path, "creds.test", &headers),
        )
        .await
        .unwrap();
        assert_eq!(
            (answer.status, answer.error_code()),
            (403, Some("credential_endpoint_mismatch")),
            "{method} {path}"
        );
    }
    // Nothing carrying the placeholder or the secret reached any upstream.
    for seen in h.seen() {
        let text = format!("{seen:?}");
        assert!(!text.contains(&gh) && !text.contains(SECRET), "{text}");
    }
    let mismatches = h.audit_matching(&[
        ("kind", "credential"),
        ("outcome", "mismatched"),
        ("credential", "gh"),
    ]);
    assert_eq!(mismatches.len(), 6, "{mismatches:?}");
    assert!(mismatches.iter().any(|l| l["path"] == "/echo/[REDACTED]"));
    assert_no_secret_in_audit(&h, &placeholders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_curl_through_the_proxy_gets_substitution() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("curl is required for this test");
    }
    let (plan, secrets, placeholders) = credential_plan();
    let h = harness(
        &plan,
        &secrets,
        &placeholders,
        &["api.test"],
        &["creds.test"],
    )
    .await;
    // curl needs a TCP proxy: accept on loopback and hand each connection to the proxy.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    let proxy = h.proxy.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let proxy = proxy.clone();
            tokio::spawn(async move {
                proxy
                    .serve_connection(stream, ConnectionInfo::default())
                    .await
            });
        }
    });
    let ca_file = std::env::temp_dir().join(format!(
        "airlock-egress-ca-{}.pem",
        generate_placeholder("ca").unwrap()
    ));
    std::fs::write(&ca_file, h.proxy.trust_bundle_pem().unwrap()).unwrap();
    let placeholder = placeholders["gh"].clone();
    let ca_path = ca_file.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--max-time", "30", "--noproxy", ""])
            .arg("--proxy")
            .arg(format!("http://{address}"))
            .arg("--cacert")
            .arg(&ca_path)
            .arg("-H")
            .arg(format!("Authorization: Bearer {placeholder}"))
            .arg("https://creds.test/echo/curl")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let _ = std::fs::remove_file(&ca_file);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&placeholders["gh"]) && !stdout.contains(SECRET),
        "{stdout}"
    );
    assert_eq!(
        h.seen().last().unwrap().headers["authorization"],
        format!("Bearer {SECRET}")
    );
}

#[test]
fn test_the_sandbox_environment_holds_placeholders_only() {
    let (plan, _secrets, placeholders) = credential_plan();
    let setup = SandboxProxySetup {
        proxy_port: 3128,
        trust_bundle_path: "/etc/ssl/certs/ca-certificates.crt",
        ca_certificate_path: "/etc/airlock/egress-ca.pem",
    };
    let env = sandbox_environment(&plan, &placeholders, &setup);
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(get("HTTPS_PROXY"), Some("http://127.0.0.1:3128"));
    assert_eq!(get("NO_PROXY"), Some("localhost,127.0.0.1,::1"));
    assert_eq!(
        get("SSL_CERT_FILE"),
        Some("/etc/ssl/certs/ca-certificates.crt")
    );
    assert_eq!(
        get("NODE_EXTRA_CA_CERTS"),
        Some("/etc/airlock/egress-ca.pem")
    );
    assert_eq!(get("GH_TOKEN"), Some(placeholders["gh"].as_str()));
    let all = format!("{env:?}");
    for secret in [SECRET, API_KEY, PASSWORD] {
        assert!(!all.contains(secret));
    }
}
