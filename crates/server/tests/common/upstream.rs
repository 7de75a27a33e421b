//! A fake internet on loopback for the egress tests (trimmed from
//! `crates/egress/tests/common`): an HTTP and an HTTPS upstream with their own test CA, each
//! answering `hello from <http|https> <target>` and logging what it saw. The daemon's proxies
//! reach them through `--test-egress-resolve`; nothing leaves the machine.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

/// One request an upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub target: String,
    pub headers: BTreeMap<String, String>,
}

pub type SeenLog = Arc<Mutex<Vec<Seen>>>;

/// The names the HTTPS upstream's certificate covers.
pub const TLS_NAMES: &[&str] = &["api.test", "other.test", "ask.test"];

/// The fake internet's CA and a certificate for [`TLS_NAMES`].
pub struct TestPki {
    pub ca_pem: String,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

pub fn test_pki() -> TestPki {
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = TLS_NAMES.iter().map(|n| n.to_string()).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    TestPki {
        ca_pem: ca.pem(),
        chain: vec![leaf.der().clone(), ca.der().clone()],
        key_der: leaf_key.serialize_der(),
    }
}

async fn service(
    name: &'static str,
    seen: SeenLog,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let headers = request
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
        target: target.clone(),
        headers,
    });
    request.into_body().collect().await?;
    Ok(Response::new(Full::new(Bytes::from(format!(
        "hello from {name} {target}"
    )))))
}

async fn serve<S>(stream: S, name: &'static str, seen: SeenLog)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |r| service(name, seen.clone(), r));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

pub async fn start_http_upstream(seen: SeenLog) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, "http", seen.clone()));
        }
    });
    address
}

pub async fn start_https_upstream(seen: SeenLog, pki: &TestPki) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = PrivateKeyDer::Pkcs8(pki.key_der.clone().into());
    let config = rustls::ServerConfig::builder_with_provider(provider)
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
                if let Ok(tls) = acceptor.accept(stream).await {
                    serve(tls, "https", seen).await;
                }
            });
        }
    });
    address
}

/// A reviewer webhook: records each approval it is asked about and answers `decision`.
pub async fn start_reviewer(decision: &'static str, asked: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let asked = asked.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let asked = asked.clone();
                async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    asked
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&body).into_owned());
                    let answer = format!(r#"{{"decision":"{decision}"}}"#);
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(answer))))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}
