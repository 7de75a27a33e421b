//! `proxy` network mode end to end: a real process-tier sandbox whose only way out is the
//! egress proxy, driven from inside with real clients (curl, Python), against HTTP and HTTPS
//! upstreams on the host's loopback that the proxy's test resolver points names at. Nothing
//! leaves the machine. Needs root and `cargo build --workspace` (the jail helper).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use airlock_api::{SandboxConfig, WorkspaceSource};
use airlock_egress::TestResolver;
use airlock_runtime::{EgressOptions, Runtime};

const SECRET: &str = "real-secret-7f3a9c";

fn helper() -> PathBuf {
    // tests/… → target/<triple>/debug/deps/… → target/<triple>/debug/airlock-jail
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("airlock-jail")
}

fn policy(secret_file: &Path) -> SandboxConfig {
    let yaml = format!(
        r#"
version: 1
network:
  mode: proxy
  egress:
    - name: plain
      host: allowed.test
      ports: [80]
      methods: [GET]
      paths: ["/hello", "/other", "/redirect-metadata"]
    - name: rebind
      host: rebind.test
      ports: [80]
    - name: api
      host: api.test
      ports: [443]
    # git's smart HTTP: the ref advertisement (GET) and the fetch (POST), intercepted.
    - name: git
      host: git.test
      ports: [443]
      methods: [GET, POST]
      paths: ["/repo.git/info/refs", "/repo.git/git-upload-pack"]
credentials:
  - name: api
    source: {{file: {}}}
    env: API_TOKEN
    inject: bearer
    endpoints: [{{host: api.test, port: 443, methods: [GET], paths: ["/secure"]}}]
"#,
        secret_file.display()
    );
    let policy = airlock_policy::Policy::from_yaml("test.yaml", &yaml).unwrap();
    let mut config = SandboxConfig::new(vec!["/bin/sh".into(), "/workspace/script.sh".into()]);
    config.policy = Some(Box::new(policy.document().clone()));
    config
}

/// What the workload does: each line of `out` is one probe's verdict.
const SCRIPT: &str = r#"
out=/workspace/out
code() { curl -sS -o /dev/null -w '%{http_code}' "$@" 2>/dev/null; }
header() { curl -sS -D - -o /dev/null "$@" 2>/dev/null | tr -d '\r' | sed -n 's/^x-airlock-error: //p'; }
{
echo "allowed $(curl -sS http://allowed.test/hello)"
echo "denied_host $(header http://denied.test/)"
echo "denied_method $(header -X POST http://allowed.test/hello)"
echo "denied_path $(header http://allowed.test/secret)"
echo "https_secret $(curl -sS -H "Authorization: Bearer $API_TOKEN" https://api.test/secure)"
echo "mismatch $(header -H "Authorization: Bearer $API_TOKEN" http://allowed.test/other)"
echo "mismatch_path $(header -H "Authorization: Bearer $API_TOKEN" https://api.test/elsewhere)"
echo "metadata $(header http://169.254.169.254/latest/meta-data/)"
echo "metadata_decimal $(header http://2852039166/latest/meta-data/)"
echo "metadata_hex $(header http://0xa9fea9fe/latest/meta-data/)"
echo "metadata_octal $(header http://0251.0376.0251.0376/latest/meta-data/)"
echo "metadata_ipv6 $(header 'http://[::ffff:169.254.169.254]/latest/meta-data/')"
echo "redirect $(curl -sS -L -D - -o /dev/null http://allowed.test/redirect-metadata 2>/dev/null | tr -d '\r' | sed -n 's/^x-airlock-error: //p')"
echo "rebind_first $(curl -sS http://rebind.test/hello)"
echo "rebind_second $(header http://rebind.test/hello)"
echo "fronting_control $(echo | openssl s_client -proxy 127.0.0.1:3128 -connect api.test:443 -servername api.test 2>&1 | grep -c 'BEGIN CERTIFICATE')"
echo "fronting $(echo | openssl s_client -proxy 127.0.0.1:3128 -connect api.test:443 -servername evil.test 2>&1 | grep -c 'BEGIN CERTIFICATE')"
echo "direct $(code --noproxy '*' --max-time 3 http://127.0.0.1:$UPSTREAM_PORT/hello || echo failed)"
echo "dns $(getent hosts example.com >/dev/null 2>&1 && echo resolved || echo failed)"
echo "requests $(/usr/bin/python3 -c 'import requests; print(requests.get("https://api.test/req").text)' 2>&1 | tail -n1)"
echo "python $(/usr/bin/python3 -c 'import urllib.request; print(urllib.request.urlopen("https://api.test/py").read().decode())' 2>&1 | tail -n1)"
echo "secret_in_env $(env | grep -c real-secret)"
echo "git_clone $(git clone -q https://git.test/repo.git /tmp/clone 2>&1 | tail -n1; cat /tmp/clone/README 2>/dev/null)"
echo "git_push $(cd /tmp/clone && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m x && (git push -q origin HEAD >/dev/null 2>&1 && echo pushed || echo refused))"
} > $out 2>&1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_proxy_mode_from_inside_a_sandbox() {
    let seen = common::SeenLog::default();
    let pki = common::test_pki();
    let http = common::start_http_upstream(seen.clone()).await;
    let https = common::start_https_upstream(seen.clone(), &pki).await;

    let scratch = PathBuf::from(format!(
        "/var/tmp/airlock-egress-test-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("workspace")).unwrap();
    let _scratch = RemoveOnDrop(scratch.clone());
    let secret_file = scratch.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    std::fs::write(scratch.join("workspace/script.sh"), SCRIPT).unwrap();
    let audit = scratch.join("audit.jsonl");

    let mut config = policy(&secret_file);
    config.workspace = WorkspaceSource::Host {
        path: scratch.join("workspace"),
    };
    config
        .env
        .push(("UPSTREAM_PORT".into(), http.port().to_string()));
    let resolver = TestResolver::new();
    resolver.upstream("allowed.test", http);
    resolver.upstream("denied.test", http);
    resolver.upstream("api.test", https);
    // Rebinding: the first lookup answers the (allowed) test upstream, every later one the
    // metadata address.
    resolver.sequence(
        "rebind.test",
        vec![
            airlock_egress::TestAnswer::Upstream(http),
            airlock_egress::TestAnswer::Dns(vec!["169.254.169.254".parse().unwrap()]),
        ],
    );
    resolver.upstream("git.test", start_git_upstream(&pki, &scratch).await);
    let options = EgressOptions {
        test_resolver: Some(Arc::new(resolver)),
        extra_upstream_roots_pem: vec![pki.ca_pem.clone()],
        reviewer_webhook: None,
        audit_log: Some(audit.clone()),
        audit_sink: None,
        placeholders: None,
    };
    let runtime = Runtime::with_helper(helper());
    let outcome = tokio::task::spawn_blocking(move || {
        runtime.run_with(&config, options, None, |w| eprintln!("warning: {w}"))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(outcome.exit_code(), 0, "{outcome:?}");

    let out = std::fs::read_to_string(scratch.join("workspace/out")).unwrap();
    let verdicts: std::collections::HashMap<&str, &str> = out
        .lines()
        .filter_map(|line| line.split_once(' '))
        .collect();
    let verdict = |name: &str| verdicts.get(name).copied().unwrap_or("<missing>");
    assert_eq!(verdict("allowed"), "hello from http /hello", "{out}");
    assert_eq!(verdict("denied_host"), "egress_denied", "{out}");
    assert_eq!(verdict("denied_method"), "http_rule_denied", "{out}");
    assert_eq!(verdict("denied_path"), "http_rule_denied", "{out}");
    assert_eq!(verdict("https_secret"), "hello from https /secure", "{out}");
    assert_eq!(verdict("mismatch"), "credential_endpoint_mismatch", "{out}");
    assert_eq!(
        verdict("mismatch_path"),
        "credential_endpoint_mismatch",
        "{out}"
    );
    assert_eq!(verdict("metadata"), "destination_blocked", "{out}");
    assert_eq!(verdict("metadata_decimal"), "destination_blocked", "{out}");
    assert_eq!(verdict("metadata_hex"), "destination_blocked", "{out}");
    assert_eq!(verdict("metadata_octal"), "destination_blocked", "{out}");
    assert_eq!(verdict("metadata_ipv6"), "destination_blocked", "{out}");
    // curl follows the upstream's redirect to the metadata address; the proxy refuses that hop.
    assert_eq!(verdict("redirect"), "destination_blocked", "{out}");
    assert_eq!(verdict("rebind_first"), "hello from http /hello", "{out}");
    assert_eq!(verdict("rebind_second"), "destination_blocked", "{out}");
    // CONNECT api.test with the SNI of another host: the proxy refuses before any certificate.
    assert_eq!(
        verdict("fronting_control"),
        "1",
        "the same handshake with a matching SNI: {out}"
    );
    assert_eq!(verdict("fronting"), "0", "{out}");
    assert_eq!(verdict("direct"), "000failed", "raw TCP to the host: {out}");
    assert_eq!(verdict("dns"), "failed", "{out}");
    assert_eq!(verdict("python"), "hello from https /py", "{out}");
    assert_eq!(verdict("requests"), "hello from https /req", "{out}");
    assert_eq!(verdict("secret_in_env"), "0", "{out}");
    assert_eq!(
        verdict("git_clone"),
        "served by git over smart HTTP",
        "{out}"
    );
    // The server would take the push (http.receivepack is on); the proxy's path rule refuses it.
    assert_eq!(verdict("git_push"), "refused", "{out}");
    let commits = Command::new("git")
        .args([
            "-C",
            scratch.join("git-root/repo.git").to_str().unwrap(),
            "rev-list",
            "--count",
            "HEAD",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&commits.stdout).trim(),
        "1",
        "nothing was pushed"
    );

    // The upstream saw the real secret, at the bound endpoint only.
    let secure: Vec<_> = seen
        .lock()
        .unwrap()
        .clone()
        .into_iter()
        .filter(|s| s.target == "/secure")
        .collect();
    assert_eq!(secure.len(), 1, "{secure:?}");
    assert_eq!(
        secure[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert!(
        seen.lock().unwrap().iter().all(|s| s.target != "/other"),
        "a mismatched request never reaches the upstream"
    );

    // Audit: every decision, and no secret or placeholder in any line.
    let lines = std::fs::read_to_string(&audit).unwrap();
    assert!(lines.lines().count() >= 8, "{lines}");
    assert!(!lines.contains(SECRET), "{lines}");
    assert!(!lines.contains("airlock-cred-"), "{lines}");
    assert!(
        lines.contains("credential_endpoint_mismatch") || lines.contains("mismatch"),
        "{lines}"
    );

    drop(_scratch);
    assert!(!scratch.exists());
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("airlock-run{}x", std::process::id())))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the egress directory is removed: {leftovers:?}"
    );
}

/// Removes a scratch directory however the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A bare repository with one commit, served over HTTPS by `git http-backend` (CGI).
async fn start_git_upstream(pki: &common::TestPki, scratch: &Path) -> std::net::SocketAddr {
    let work = scratch.join("git-work");
    let git = |args: &[&str], dir: &Path| {
        let status = Command::new("git")
            .args([
                "-c",
                "user.name=test",
                "-c",
                "user.email=test@test",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    std::fs::create_dir_all(&work).unwrap();
    git(&["init", "-q"], &work);
    std::fs::write(work.join("README"), "served by git over smart HTTP").unwrap();
    git(&["add", "README"], &work);
    git(&["commit", "-q", "-m", "first"], &work);
    let root = scratch.join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    git(
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            root.join("repo.git").to_str().unwrap(),
        ],
        scratch,
    );
    // Accept pushes, so that only the proxy can be what refuses one.
    git(
        &["config", "http.receivepack", "true"],
        &root.join("repo.git"),
    );

    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(pki.key_der.clone().into());
    let config = rustls::ServerConfig::builder_with_provider(common::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.chain.clone(), key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, root) = (acceptor.clone(), root.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |r| cgi(root.clone(), r));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    address
}

/// One request through `git http-backend`, the CGI way.
async fn cgi(
    root: PathBuf,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (content_type, protocol) = (header("content-type"), header("git-protocol"));
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let output = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("git")
            .arg("http-backend")
            .env("GIT_PROJECT_ROOT", &root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REQUEST_METHOD", method)
            .env("PATH_INFO", path)
            .env("QUERY_STRING", query)
            .env("CONTENT_TYPE", content_type)
            .env("CONTENT_LENGTH", body.len().to_string())
            .env("GIT_PROTOCOL", protocol)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &body).unwrap();
        child.wait_with_output().unwrap().stdout
    })
    .await
    .unwrap();
    let split = output
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| output.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)))
        .unwrap_or((output.len(), 0));
    let head = String::from_utf8_lossy(&output[..split.0]).into_owned();
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(
        &output[split.0 + split.1..],
    )));
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
            *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
        } else if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    Ok(response)
}
