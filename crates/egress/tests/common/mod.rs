//! The fake internet for the egress tests: HTTP and HTTPS upstreams on loopback (with their
//! own test CA), a proxy on a Unix socket whose test resolver points names at them, an audit
//! sink kept in memory, and small clients written with hyper and tokio-rustls.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the harness"
)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use airlock_egress::{AuditSink, Placeholders, Proxy, ProxyOptions, Secrets, TestResolver};
use airlock_policy::egress::{
    ApprovalMode, EgressPlan, EgressRule, HostPattern, HttpRule, NetworkMode,
};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, UnixListener, UnixStream};

/// One request an upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub upstream: &'static str,
    pub method: String,
    pub target: String,
    pub headers: BTreeMap<String, String>,
}

/// The upstreams' shared log.
pub type SeenLog = Arc<Mutex<Vec<Seen>>>;

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The names the HTTPS upstream's certificate covers (webpki refuses `*.test`).
pub const TLS_NAMES: &[&str] = &[
    "api.test",
    "pass.test",
    "gh.test",
    "evil.test",
    "creds.test",
    "other.test",
    "ask.test",
    "hook.test",
    "git.test",
];

/// The fake internet's CA and a certificate for [`TLS_NAMES`].
pub struct TestPki {
    pub ca_pem: String,
    pub chain: Vec<CertificateDer<'static>>,
    pub key_der: Vec<u8>,
}

pub fn test_pki() -> TestPki {
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(TLS_NAMES.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    TestPki {
        ca_pem: ca.pem(),
        chain: vec![leaf.der().clone(), ca.der().clone()],
        key_der: leaf_key.serialize_der(),
    }
}

async fn upstream_service(
    name: &'static str,
    seen: SeenLog,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let headers: BTreeMap<String, String> = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let target = request
        .uri()
        .path_and_query()
        .map_or("/".into(), |p| p.to_string());
    seen.lock().unwrap().push(Seen {
        upstream: name,
        method: request.method().to_string(),
        target: target.clone(),
        headers: headers.clone(),
    });
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await?.to_bytes();
    let mut response = match path.as_str() {
        "/redirect-metadata" => {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::FOUND;
            response.headers_mut().insert(
                "location",
                "http://169.254.169.254/latest/meta-data/".parse().unwrap(),
            );
            response
        }
        // Reflects every request header (Authorization included), as httpbin does.
        p if p.starts_with("/echo") => {
            let json =
                serde_json::json!({ "headers": headers, "body": String::from_utf8_lossy(&body) });
            let mut response = Response::new(Full::new(Bytes::from(json.to_string())));
            if let Some(auth) = headers.get("authorization") {
                response
                    .headers_mut()
                    .insert("x-seen-authorization", auth.parse().unwrap());
            }
            response
        }
        // Ignores `Accept-Encoding: identity`, as a misbehaving server might.
        p if p.starts_with("/gzip") => {
            let mut response = Response::new(Full::new(Bytes::from_static(b"\x1f\x8b not really")));
            response
                .headers_mut()
                .insert("content-encoding", "gzip".parse().unwrap());
            response
        }
        _ => Response::new(Full::new(Bytes::from(format!(
            "hello from {name} {target}"
        )))),
    };
    response
        .headers_mut()
        .insert("x-upstream", name.parse().unwrap());
    Ok(response)
}

pub async fn start_http_upstream(seen: SeenLog) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |r| upstream_service("http", seen.clone(), r));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}

pub async fn start_https_upstream(seen: SeenLog, pki: &TestPki) -> SocketAddr {
    let key = PrivateKeyDer::Pkcs8(pki.key_der.clone().into());
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.chain.clone(), key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |r| upstream_service("https", seen.clone(), r));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    address
}

/// A rule for `host` on `ports` with optional L7 rules.
pub fn rule(name: &str, host: &str, ports: &[u16], http: Vec<HttpRule>) -> EgressRule {
    EgressRule {
        name: name.into(),
        host: HostPattern(host.into()),
        ports: ports.to_vec(),
        http,
        git_push_refs: None,
    }
}

pub fn http_rule(methods: &[&str], paths: &[&str]) -> HttpRule {
    HttpRule {
        methods: methods.iter().map(|s| s.to_string()).collect(),
        paths: paths.iter().map(|s| s.to_string()).collect(),
    }
}

pub fn plan(rules: Vec<EgressRule>) -> EgressPlan {
    EgressPlan {
        mode: NetworkMode::Proxy,
        rules,
        credentials: vec![],
        approvals: ApprovalMode::Deny,
    }
}

/// A proxy on a Unix socket in front of the fake internet.
pub struct Harness {
    pub proxy: Proxy,
    pub socket: PathBuf,
    pub resolver: Arc<TestResolver>,
    pub seen: SeenLog,
    pub audit: Arc<Mutex<Vec<String>>>,
    pub pki: TestPki,
    pub http: SocketAddr,
    pub https: SocketAddr,
    directory: PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.proxy.close();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// Every name in `names_http` reaches the HTTP upstream, every one in `names_https` the HTTPS
/// upstream, whatever port the client asks for.
pub async fn harness(
    plan: &EgressPlan,
    secrets: &Secrets,
    placeholders: &Placeholders,
    names_http: &[&str],
    names_https: &[&str],
) -> Harness {
    harness_with(
        plan,
        secrets,
        placeholders,
        names_http,
        names_https,
        ProxyOptions::default(),
    )
    .await
}

pub async fn harness_with(
    plan: &EgressPlan,
    secrets: &Secrets,
    placeholders: &Placeholders,
    names_http: &[&str],
    names_https: &[&str],
    mut options: ProxyOptions,
) -> Harness {
    let seen: SeenLog = Arc::default();
    let pki = test_pki();
    let http = start_http_upstream(seen.clone()).await;
    let https = start_https_upstream(seen.clone(), &pki).await;
    let resolver = Arc::new(TestResolver::new());
    for name in names_http {
        resolver.upstream(name, http);
    }
    for name in names_https {
        resolver.upstream(name, https);
    }
    let audit: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = {
        let audit = audit.clone();
        AuditSink::callback(move |_, line| audit.lock().unwrap().push(line.to_owned()))
    };
    options.test_resolver = Some(resolver.clone());
    options.extra_upstream_roots_pem.push(pki.ca_pem.clone());
    // No system roots: nothing in these tests may verify against the real internet's CAs.
    options.trust_bundle = Some(PathBuf::from("/nonexistent/airlock-test-bundle.pem"));
    let proxy = Proxy::new("sbx-test", plan, secrets, placeholders, sink, options).unwrap();
    let directory = std::env::temp_dir().join(format!(
        "airlock-egress-test-{}-{}",
        std::process::id(),
        airlock_egress::generate_placeholder("dir").unwrap()
    ));
    std::fs::create_dir(&directory).unwrap();
    let socket = directory.join("proxy.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let serving = proxy.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    Harness {
        proxy,
        socket,
        resolver,
        seen,
        audit,
        pki,
        http,
        https,
        directory,
    }
}

impl Harness {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn audit_lines(&self) -> Vec<serde_json::Value> {
        self.audit
            .lock()
            .unwrap()
            .iter()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// The audit lines whose fields match all of `pairs`.
    pub fn audit_matching(&self, pairs: &[(&str, &str)]) -> Vec<serde_json::Value> {
        self.audit_lines()
            .into_iter()
            .filter(|line| pairs.iter().all(|(k, v)| line[*k].as_str() == Some(*v)))
            .collect()
    }
}

/// A response as a client saw it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Answer {
    pub fn error_code(&self) -> Option<&str> {
        self.headers.get("x-airlock-error").map(String::as_str)
    }
}

async fn exchange<S>(stream: S, request: Request<Full<Bytes>>) -> Result<Answer, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

pub fn request(
    method: &str,
    uri: &str,
    host: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", host);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// A plain-HTTP request through the proxy (absolute-form), on a new connection.
pub async fn forward(socket: &Path, method: &str, url: &str, headers: &[(&str, &str)]) -> Answer {
    let uri: hyper::Uri = url.parse().unwrap();
    let host = uri.authority().unwrap().as_str().to_owned();
    let stream = UnixStream::connect(socket).await.unwrap();
    exchange(stream, request(method, url, &host, headers))
        .await
        .unwrap()
}

/// Sends CONNECT; on 200 returns the tunnel, otherwise the refusal.
pub async fn connect(socket: &Path, target: &str) -> Result<UnixStream, Answer> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.unwrap());
    }
    let head = String::from_utf8(head).unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    if status == 200 {
        return Ok(stream);
    }
    let mut headers = BTreeMap::new();
    let mut length = 0;
    for line in head.lines().skip(1) {
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            if name == "content-length" {
                length = value.trim().parse().unwrap();
            }
            headers.insert(name, value.trim().to_owned());
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    Err(Answer {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    })
}

/// TLS over an open tunnel, trusting only `root_pem`, with `sni` as the server name.
pub async fn tls(
    stream: UnixStream,
    sni: &str,
    root_pem: &str,
) -> Result<tokio_rustls::client::TlsStream<UnixStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(root_pem.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    connector
        .connect(name, stream)
        .await
        .map_err(|e| e.to_string())
}

/// CONNECT `host:port`, TLS trusting `root_pem`, then one request.
pub async fn https(
    socket: &Path,
    host: &str,
    port: u16,
    root_pem: &str,
    request: Request<Full<Bytes>>,
) -> Result<Answer, String> {
    let tunnel = connect(socket, &format!("{host}:{port}"))
        .await
        .map_err(|answer| {
            format!(
                "CONNECT refused: {} {:?}",
                answer.status,
                answer.error_code()
            )
        })?;
    let stream = tls(tunnel, host, root_pem).await?;
    exchange(stream, request).await
}

/// Sends one request on an already established stream (for keep-alive and TLS tests).
pub async fn send_on<S>(stream: S, request: Request<Full<Bytes>>) -> Result<Answer, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    exchange(stream, request).await
}

/// A kept-alive HTTP/1.1 client on `stream`.
pub async fn client_on<S>(stream: S) -> hyper::client::conn::http1::SendRequest<Full<Bytes>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// One request on a kept-alive client.
pub async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<Answer, String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Waits (bounded, never asserting on time) until `condition` holds.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !condition() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "gave up waiting: {what}");
}
