//! `callback_url`: after a submission finishes, Judge0 sends `PUT <url>` with its default
//! fields, base64-encoded, as JSON (3 tries, 5 s each). Judge0 sends it to any URL, which made
//! it an SSRF into the judge's own network (CVE-2024-29021). Here a URL is accepted only when
//! its host is on the operator's allow-list (`--judge0-callback-hosts`), and at delivery the
//! daemon resolves the name itself, refuses loopback, private, link-local and other internal
//! addresses (every spelling, as the egress proxy does) unless `--judge0-callback-internal`
//! allows them, connects to the address it vetted, and follows no redirect.

use std::net::SocketAddr;
use std::time::Duration;

use airlock_egress::{Host, blocked_reason, parse_host};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Judge0's `CALLBACKS_MAX_TRIES` and `CALLBACKS_TIMEOUT`.
pub const MAX_TRIES: u32 = 3;
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Where callbacks may go.
#[derive(Debug, Clone, Default)]
pub struct CallbackPolicy {
    /// Canonical host and, when the entry names one, the only port.
    hosts: Vec<(String, Option<u16>)>,
    internal: bool,
}

/// A checked `callback_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackUrl {
    pub https: bool,
    pub host: Host,
    pub port: u16,
    /// Path and query, at least `/`.
    pub target: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    #[error("cannot resolve {0}")]
    Resolve(String, #[source] std::io::Error),
    #[error(
        "{host} resolves only to internal addresses ({reason}); --judge0-callback-internal allows them"
    )]
    Internal { host: String, reason: &'static str },
    #[error("cannot connect to {0}")]
    Connect(SocketAddr, #[source] std::io::Error),
    #[error("the TLS handshake with {0} failed")]
    Tls(String, #[source] std::io::Error),
    #[error("the HTTP exchange with {0} failed")]
    Http(String, #[source] hyper::Error),
    #[error("no answer from {0} within 5 s")]
    Timeout(String),
    #[error("cannot use the host's TLS roots")]
    Roots(#[source] airlock_egress::TlsError),
}

impl CallbackPolicy {
    /// From `--judge0-callback-hosts` entries (`HOST` or `HOST:PORT`, `[V6]:PORT`).
    pub fn new(entries: &[String], internal: bool) -> Result<CallbackPolicy, String> {
        let mut hosts = Vec::new();
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if entry.contains("://") || entry.contains('/') || entry.contains('@') {
                return Err(format!("{entry:?} must be a host or HOST:PORT, not a URL"));
            }
            let (host, port) =
                split_host_port(entry).ok_or_else(|| format!("{entry:?} has an invalid port"))?;
            let host = parse_host(host).map_err(|e| format!("{entry:?}: {e}"))?;
            hosts.push((host.canonical(), port));
        }
        Ok(CallbackPolicy { hosts, internal })
    }

    /// Whether any callback may be set at all.
    pub fn enabled(&self) -> bool {
        !self.hosts.is_empty()
    }

    /// Checks a submission's `callback_url`; the error is the 422 message.
    pub fn check(&self, url: &str) -> Result<CallbackUrl, String> {
        if !self.enabled() {
            return Err("setting callback is not allowed".to_owned());
        }
        let parsed = parse_url(url)?;
        let host = parsed.host.canonical();
        let allowed = self
            .hosts
            .iter()
            .any(|(h, port)| *h == host && port.is_none_or(|p| p == parsed.port));
        if !allowed {
            return Err(format!(
                "the host {}:{} is not on this server's callback allow-list (--judge0-callback-hosts)",
                parsed.host, parsed.port
            ));
        }
        Ok(parsed)
    }

    /// Sends `body` as `PUT url` (JSON), up to [`MAX_TRIES`] times; any HTTP answer ends the
    /// tries, as in Judge0. Returns the last error if none got through.
    pub async fn deliver(&self, url: &CallbackUrl, body: Bytes) -> Result<u16, CallbackError> {
        let mut last = None;
        for _ in 0..MAX_TRIES {
            let attempt = tokio::time::timeout(TIMEOUT, self.put(url, body.clone())).await;
            match attempt {
                Ok(Ok(status)) => return Ok(status),
                Ok(Err(err)) => {
                    let retry = !matches!(err, CallbackError::Internal { .. });
                    last = Some(err);
                    if !retry {
                        break;
                    }
                }
                Err(_) => last = Some(CallbackError::Timeout(url.host.to_string())),
            }
        }
        Err(last.unwrap_or_else(|| CallbackError::Timeout(url.host.to_string())))
    }

    async fn put(&self, url: &CallbackUrl, body: Bytes) -> Result<u16, CallbackError> {
        let address = self.vetted_address(url).await?;
        let stream = TcpStream::connect(address)
            .await
            .map_err(|e| CallbackError::Connect(address, e))?;
        let _ = stream.set_nodelay(true);
        if !url.https {
            return exchange(TokioIo::new(stream), url, body).await;
        }
        // The host's trust bundle, read per delivery: callbacks are rare.
        let config = airlock_egress::client_config(
            std::path::Path::new(airlock_egress::SYSTEM_TRUST_BUNDLE),
            &[],
        )
        .map_err(CallbackError::Roots)?;
        let name = rustls::pki_types::ServerName::try_from(url.host.canonical())
            .map_err(|e| CallbackError::Tls(url.host.to_string(), std::io::Error::other(e)))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .map_err(|e| CallbackError::Tls(url.host.to_string(), e))?;
        exchange(TokioIo::new(tls), url, body).await
    }

    /// The first address of the host that this policy lets the daemon reach.
    async fn vetted_address(&self, url: &CallbackUrl) -> Result<SocketAddr, CallbackError> {
        let addresses: Vec<SocketAddr> = match &url.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, url.port)],
            Host::Name(name) => tokio::net::lookup_host((name.as_str(), url.port))
                .await
                .map_err(|e| CallbackError::Resolve(name.clone(), e))?
                .collect(),
        };
        let mut reason = "no address";
        for address in addresses {
            match blocked_reason(address.ip()) {
                Some(why) if !self.internal => reason = why,
                _ => return Ok(address),
            }
        }
        Err(CallbackError::Internal {
            host: url.host.to_string(),
            reason,
        })
    }
}

async fn exchange<S>(io: TokioIo<S>, url: &CallbackUrl, body: Bytes) -> Result<u16, CallbackError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |e| CallbackError::Http(url.host.to_string(), e);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http)?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    let default_port = if url.https { 443 } else { 80 };
    let authority = if url.port == default_port {
        url.host.to_string()
    } else {
        format!("{}:{}", url.host, url.port)
    };
    let request = Request::builder()
        .method(Method::PUT)
        .uri(url.target.as_str())
        .header(HOST, authority)
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, concat!("airlockd/", env!("CARGO_PKG_VERSION")))
        .body(Full::new(body))
        .map_err(|e| CallbackError::Tls(url.host.to_string(), std::io::Error::other(e)))?;
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status().as_u16();
    // At most 64 KiB of the answer is read; nobody looks at it.
    let _ = http_body_util::Limited::new(response.into_body(), 64 << 10)
        .collect()
        .await;
    task.abort();
    Ok(status)
}

/// `http[s]://HOST[:PORT][/PATH][?QUERY]`, no user info, no fragment.
fn parse_url(url: &str) -> Result<CallbackUrl, String> {
    let bad = |why: &str| format!("{why} ({url:?})");
    let (https, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else {
        return Err(bad("must be an http:// or https:// URL"));
    };
    if url.chars().any(|c| c.is_control() || c == ' ') || url.contains('#') {
        return Err(bad(
            "must not contain spaces, control characters or a fragment",
        ));
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(split);
    if authority.contains('@') {
        return Err(bad("must not carry user information"));
    }
    let (host, port) = split_host_port(authority).ok_or_else(|| bad("has an invalid port"))?;
    let host = parse_host(host).map_err(|e| bad(&e.to_string()))?;
    let target = match target {
        "" => "/".to_owned(),
        t if t.starts_with('?') => format!("/{t}"),
        t => t.to_owned(),
    };
    Ok(CallbackUrl {
        https,
        host,
        port: port.unwrap_or(if https { 443 } else { 80 }),
        target,
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for a bad port.
fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) if end + 1 == authority.len() => (authority, None),
            Some(end) => (
                &authority[..=end],
                Some(authority[end + 1..].strip_prefix(':')?),
            ),
            None => (authority, None),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => None,
        Some(port) => Some(port.parse::<u16>().ok().filter(|p| *p != 0)?),
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str]) -> CallbackPolicy {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        CallbackPolicy::new(&hosts, false).unwrap()
    }

    #[test]
    fn test_callbacks_are_refused_without_an_allow_list() {
        let none = policy(&[]);
        assert!(!none.enabled());
        assert_eq!(
            none.check("http://example.com/hook").unwrap_err(),
            "setting callback is not allowed"
        );
    }

    #[test]
    fn test_callback_url_must_name_an_allowed_host_and_port() {
        let allowed = policy(&["hooks.example.com", "10.1.2.3:8080", "[::1]:9000"]);
        let url = allowed
            .check("https://Hooks.Example.com./judge?x=1")
            .unwrap();
        assert_eq!(
            (
                url.https,
                url.host.canonical(),
                url.port,
                url.target.as_str()
            ),
            (true, "hooks.example.com".to_owned(), 443, "/judge?x=1")
        );
        assert_eq!(allowed.check("http://10.1.2.3:8080").unwrap().target, "/");
        assert!(allowed.check("http://[::1]:9000/x").is_ok());
        for (url, wanted) in [
            (
                "http://10.1.2.3:8081/",
                "not on this server's callback allow-list",
            ),
            // Another spelling of an allowed address is the same host; of a blocked one too.
            ("http://0x0a010203:8080/", ""),
            (
                "http://169.254.169.254/latest/meta-data",
                "not on this server's callback allow-list",
            ),
            (
                "http://2852039166/",
                "not on this server's callback allow-list",
            ),
            (
                "http://evil.com@hooks.example.com/",
                "must not carry user information",
            ),
            (
                "ftp://hooks.example.com/",
                "must be an http:// or https:// URL",
            ),
            ("http://hooks.example.com:99999/", "has an invalid port"),
            ("http://hooks.example.com/#x", "fragment"),
            ("http://hooks.example.com/a b", "spaces"),
        ] {
            match allowed.check(url) {
                Ok(_) if wanted.is_empty() => {}
                Ok(parsed) => panic!("{url} accepted as {parsed:?}"),
                Err(message) => assert!(
                    !wanted.is_empty() && message.contains(wanted),
                    "{url}: {message}"
                ),
            }
        }
    }

    #[test]
    fn test_allow_list_entries_are_hosts() {
        for bad in ["http://x", "x/y", "x:0", "x:port", "a..b"] {
            assert!(
                CallbackPolicy::new(&[bad.to_owned()], false).is_err(),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn test_delivery_refuses_internal_addresses_unless_allowed() {
        let strict = policy(&["127.0.0.1", "localhost"]);
        for url in ["http://127.0.0.1:9/", "http://localhost:9/"] {
            let url = strict.check(url).unwrap();
            let err = strict
                .deliver(&url, Bytes::from_static(b"{}"))
                .await
                .unwrap_err();
            assert!(matches!(err, CallbackError::Internal { .. }), "{err}");
        }
        // Allowed internal: the connection is attempted (and refused: nothing listens on 9).
        let open = CallbackPolicy::new(&["127.0.0.1".to_owned()], true).unwrap();
        let url = open.check("http://127.0.0.1:9/").unwrap();
        let err = open.deliver(&url, Bytes::new()).await.unwrap_err();
        assert!(matches!(err, CallbackError::Connect(..)), "{err}");
    }
}
