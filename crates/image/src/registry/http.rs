//! A minimal HTTP/1.1 client for registries, on the tree's hyper and rustls (ring): one
//! connection per request, absolute URLs, no cookies, no proxies.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

/// The host's trust store (Debian's ca-certificates).
const TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A server that does not answer a ClientHello in this time does not speak TLS.
const TLS_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a response's headers, or the next piece of its body, may take.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a request failed before a response arrived, or while its body was read.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("`{0}` is not an http(s) URL")]
    Url(String),
    #[error("cannot connect to {0}")]
    Connect(String, #[source] std::io::Error),
    #[error("TLS with {0} failed")]
    Tls(String, #[source] std::io::Error),
    #[error("HTTP exchange with {0} failed")]
    Exchange(String, #[source] hyper::Error),
    #[error("{0} did not answer within {1:?}")]
    Timeout(String, Duration),
    #[error("a response from {host} is larger than {max_bytes} bytes")]
    TooLarge { host: String, max_bytes: usize },
    #[error("the trust store `{TRUST_BUNDLE}` cannot be read")]
    TrustStore(#[source] std::io::Error),
    #[error("TLS configuration")]
    Config(#[from] rustls::Error),
}

impl HttpError {
    /// Whether plain HTTP is worth trying instead (the server did not speak TLS).
    pub(crate) fn is_tls_failure(&self) -> bool {
        matches!(self, HttpError::Tls(..))
    }
}

/// An absolute `http` or `https` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    pub https: bool,
    /// Host as written (brackets kept for IPv6).
    pub host: String,
    pub port: u16,
    /// Starts with `/`.
    pub path_and_query: String,
}

impl Url {
    pub fn parse(text: &str) -> Result<Url, HttpError> {
        let bad = || HttpError::Url(text.to_owned());
        let (https, rest) = if let Some(rest) = text.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad());
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(bad());
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (inner, after) = v6.split_once(']').ok_or_else(bad)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad())?,
                None if after.is_empty() => default_port,
                None => return Err(bad()),
            };
            (format!("[{inner}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), port.parse().map_err(|_| bad())?),
                None => (authority.to_owned(), default_port),
            }
        };
        if path.chars().any(|c| c.is_control() || c == ' ') {
            return Err(bad());
        }
        Ok(Url {
            https,
            host,
            port,
            path_and_query: path,
        })
    }

    /// `host[:port]`, the port omitted when it is the scheme's default.
    pub fn authority(&self) -> String {
        let default = if self.https { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// A `Location` header's target: absolute, or a path on this server.
    pub fn join(&self, location: &str) -> Result<Url, HttpError> {
        if location.starts_with("http://") || location.starts_with("https://") {
            return Url::parse(location);
        }
        if location.starts_with('/') && !location.starts_with("//") {
            return Ok(Url {
                path_and_query: location.to_owned(),
                ..self.clone()
            });
        }
        Err(HttpError::Url(location.to_owned()))
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority(), self.path_and_query)
    }
}

/// Percent-encodes a query value.
pub(crate) fn encode_query(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[derive(Clone)]
pub(crate) struct HttpClient {
    tls: Arc<ClientConfig>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpClient")
    }
}

impl HttpClient {
    pub fn new() -> Result<HttpClient, HttpError> {
        let mut roots = rustls::RootCertStore::empty();
        if std::path::Path::new(TRUST_BUNDLE).exists() {
            let certificates = CertificateDer::pem_file_iter(TRUST_BUNDLE)
                .map_err(|e| HttpError::TrustStore(std::io::Error::other(e.to_string())))?
                .filter_map(Result::ok);
            roots.add_parsable_certificates(certificates);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(HttpClient {
            tls: Arc::new(config),
        })
    }

    /// Sends a body-less request and returns the response with its body still streaming.
    pub async fn get(
        &self,
        method: Method,
        url: &Url,
        headers: &[(&str, String)],
    ) -> Result<Response<Incoming>, HttpError> {
        let host = url.authority();
        let bare_host = url
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let connect = TcpStream::connect((bare_host.as_str(), url.port));
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| HttpError::Timeout(host.clone(), CONNECT_TIMEOUT))?
            .map_err(|e| HttpError::Connect(host.clone(), e))?;
        let _ = tcp.set_nodelay(true);
        let mut request = Request::builder()
            .method(method)
            .uri(&url.path_and_query)
            .header("host", &host);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|_| HttpError::Url(url.to_string()))?;
        let exchange = async {
            if url.https {
                let name = ServerName::try_from(bare_host.clone())
                    .map_err(|_| HttpError::Url(url.to_string()))?;
                let handshake =
                    tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, tcp);
                let tls = tokio::time::timeout(TLS_TIMEOUT, handshake)
                    .await
                    .map_err(|_| {
                        HttpError::Tls(
                            host.clone(),
                            std::io::Error::from(std::io::ErrorKind::TimedOut),
                        )
                    })?
                    .map_err(|e| HttpError::Tls(host.clone(), e))?;
                send(tls, request, &host).await
            } else {
                send(tcp, request, &host).await
            }
        };
        tokio::time::timeout(IDLE_TIMEOUT, exchange)
            .await
            .map_err(|_| HttpError::Timeout(host.clone(), IDLE_TIMEOUT))?
    }
}

async fn send<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
    host: &str,
) -> Result<Response<Incoming>, HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| HttpError::Exchange(host.to_owned(), e))?;
    tokio::spawn(async move {
        // The connection ends with its response body (one request per connection).
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| HttpError::Exchange(host.to_owned(), e))
}

/// The next piece of a body, or `None` at its end.
pub(crate) async fn next_chunk(
    body: &mut Incoming,
    host: &str,
) -> Result<Option<Bytes>, HttpError> {
    loop {
        let frame = tokio::time::timeout(IDLE_TIMEOUT, body.frame())
            .await
            .map_err(|_| HttpError::Timeout(host.to_owned(), IDLE_TIMEOUT))?;
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(HttpError::Exchange(host.to_owned(), e)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A whole body, refused past `max_bytes`.
pub(crate) async fn read_body(
    mut body: Incoming,
    host: &str,
    max_bytes: usize,
) -> Result<Bytes, HttpError> {
    let mut out = BytesMut::new();
    while let Some(chunk) = next_chunk(&mut body, host).await? {
        if out.len() + chunk.len() > max_bytes {
            return Err(HttpError::TooLarge {
                host: host.to_owned(),
                max_bytes,
            });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_url_parse_ports_and_ipv6() {
        let url = Url::parse("http://127.0.0.1:5000/v2/").unwrap();
        assert_eq!(
            (
                url.https,
                url.host.as_str(),
                url.port,
                url.path_and_query.as_str()
            ),
            (false, "127.0.0.1", 5000, "/v2/")
        );
        let url = Url::parse("https://[::1]/token?x=1").unwrap();
        assert_eq!(
            (url.host.as_str(), url.port, url.authority()),
            ("[::1]", 443, "[::1]".to_owned())
        );
        assert_eq!(
            Url::parse("https://auth.example.com")
                .unwrap()
                .path_and_query,
            "/"
        );
        for bad in [
            "ftp://x/",
            "https://",
            "https://u@h/",
            "http://h:x/",
            "http://h/a b",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn test_url_join_relative_location() {
        let base = Url::parse("http://127.0.0.1:5000/v2/a/blobs/x").unwrap();
        assert_eq!(
            base.join("/b?sig=1").unwrap().to_string(),
            "http://127.0.0.1:5000/b?sig=1"
        );
        assert_eq!(
            base.join("https://cdn.example/x").unwrap().host,
            "cdn.example"
        );
        assert!(base.join("//evil/x").is_err());
    }

    #[test]
    fn test_encode_query_reserved_characters() {
        assert_eq!(
            encode_query("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
    }
}
