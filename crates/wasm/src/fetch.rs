//! The guest's only network: `fetch` of `http://` URLs through the sandbox's egress proxy
//! (`HTTP_PROXY`, set in `network: proxy` mode), so that host rules, credential placeholders,
//! approvals and audit stay in the proxy. Without a proxy there is no network at all.
//! A small HTTP/1.1 client over std: one request per connection, `Connection: close`.
//! `https://` goes through a `CONNECT` tunnel of the proxy (which applies its rules by host
//! and may intercept the TLS with the sandbox's CA, to put a credential in) and rustls,
//! verifying against the sandbox's trust bundle (`SSL_CERT_FILE`: the host's roots and the
//! sandbox CA), read once at the worker's start.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

/// The host's trust store when `SSL_CERT_FILE` names none.
const SYSTEM_TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The guest's network: the egress proxy, and the TLS roots for `https://` through it.
#[derive(Debug, Clone)]
pub struct Network {
    /// The proxy's `host:port`.
    pub proxy: String,
    /// `None` when no trust bundle could be read (then `https://` is refused).
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Network {
    pub fn new(proxy: String, tls: Option<Arc<rustls::ClientConfig>>) -> Network {
        Network { proxy, tls }
    }
}

/// A TLS client configuration trusting the certificates of the PEM bundle at `path`.
pub fn tls_config(path: &str) -> Option<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).ok()?.flatten() {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return None;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Some(Arc::new(config))
}

/// The most of a response read (status line, headers and body).
const MAX_RESPONSE_BYTES: u64 = 8 << 20;

/// One response, as the guest sees it.
#[derive(Debug)]
pub struct Fetched {
    pub status: u16,
    /// Lower-case names; a repeated header's values joined by `, `.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// The proxy's `host:port` from `HTTP_PROXY`, if the sandbox has one, and the trust bundle
/// of `SSL_CERT_FILE` (read now: the worker cannot read it once confined).
pub fn proxy_from_env() -> Option<Network> {
    let value = std::env::var("HTTP_PROXY")
        .or_else(|_| std::env::var("http_proxy"))
        .ok()?;
    let authority = value.strip_prefix("http://")?.trim_end_matches('/');
    if authority.is_empty() {
        return None;
    }
    let bundle = std::env::var("SSL_CERT_FILE").unwrap_or_else(|_| SYSTEM_TRUST_BUNDLE.to_owned());
    Some(Network::new(authority.to_owned(), tls_config(&bundle)))
}

/// Sends one request through `proxy` before `deadline`.
pub fn fetch(
    network: &Network,
    method: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    body: Option<&str>,
    deadline: Instant,
) -> Result<Fetched, String> {
    let proxy = network.proxy.as_str();
    let (secure, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) => (false, rest),
        (None, Some(rest)) => (true, rest),
        (None, None) => {
            return Err(format!(
                "fetch {url:?}: only http:// and https:// URLs (through the egress proxy) are available on the wasm tier"
            ));
        }
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err(format!("fetch {url:?}: no host"));
    }
    if !method.bytes().all(|b| b.is_ascii_alphabetic()) || method.is_empty() {
        return Err(format!("fetch: bad method {method:?}"));
    }
    let unsafe_text = |t: &str| t.contains(['\r', '\n', '\0']);
    if unsafe_text(url)
        || headers
            .iter()
            .any(|(k, v)| unsafe_text(k) || unsafe_text(v) || k.contains(':'))
    {
        return Err("fetch: a URL or header contains a line break".to_owned());
    }
    let remaining = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or("fetch: the evaluation's timeout passed")?;
    let address = proxy
        .to_socket_addrs()
        .map_err(|e| format!("fetch: the egress proxy {proxy}: {e}"))?
        .next()
        .ok_or_else(|| format!("fetch: the egress proxy {proxy} has no address"))?;
    let mut stream = TcpStream::connect_timeout(&address, remaining)
        .map_err(|e| format!("fetch: cannot reach the egress proxy: {e}"))?;
    stream
        .set_read_timeout(Some(remaining))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(remaining))
        .map_err(|e| e.to_string())?;
    // Through a tunnel the request is the origin's (origin-form); else the proxy's.
    let target = if secure {
        let path = &rest[authority.len()..];
        let path = path.split('#').next().unwrap_or_default();
        if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        }
    } else {
        url.to_owned()
    };
    let mut request =
        format!("{method} {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "host" | "connection" | "content-length" | "transfer-encoding"
        ) {
            continue;
        }
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() || !matches!(method, "GET" | "HEAD") {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    if !secure {
        return exchange(&mut stream, request.as_bytes());
    }
    let port_given = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()));
    let destination = if port_given {
        authority.to_owned()
    } else {
        format!("{authority}:443")
    };
    if let Some(refused) = connect(&mut stream, &destination)? {
        // The proxy's refusal (403 and its `x-airlock-error`) is the answer, as for http.
        return Ok(refused);
    }
    let Some(tls) = &network.tls else {
        return Err(
            "fetch: no trust bundle was readable at the worker's start; https:// is unavailable"
                .to_owned(),
        );
    };
    let host = destination
        .rsplit_once(':')
        .map_or(destination.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let name = ServerName::try_from(host).map_err(|e| format!("fetch: bad host name: {e}"))?;
    let connection = rustls::ClientConnection::new(tls.clone(), name)
        .map_err(|e| format!("fetch: cannot start TLS: {e}"))?;
    let mut secured = rustls::StreamOwned::new(connection, stream);
    exchange(&mut secured, request.as_bytes())
}

/// Sends `request` and reads the response to its end.
fn exchange<S: Read + Write>(stream: &mut S, request: &[u8]) -> Result<Fetched, String> {
    stream
        .write_all(request)
        .and_then(|()| stream.flush())
        .map_err(|e| format!("fetch: cannot send: {e}"))?;
    let mut raw = Vec::new();
    match Read::by_ref(stream)
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
    {
        Ok(_) => {}
        // A TLS peer that closes without close_notify, after a whole response.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(format!("fetch: cannot read the response: {e}")),
    }
    parse_response(&raw)
}

/// Asks the proxy for a tunnel to `destination`: `None` once it is open, else the proxy's
/// answer.
fn connect(stream: &mut TcpStream, destination: &str) -> Result<Option<Fetched>, String> {
    stream
        .write_all(
            format!("CONNECT {destination} HTTP/1.1\r\nHost: {destination}\r\n\r\n").as_bytes(),
        )
        .map_err(|e| format!("fetch: cannot ask for a tunnel: {e}"))?;
    // Read the answer's head byte by byte: what follows it is the tunnel's.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 {
            return Err("fetch: the proxy's answer to CONNECT is too long".to_owned());
        }
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => break,
            Err(e) => return Err(format!("fetch: the tunnel broke: {e}")),
        }
    }
    let answer = parse_response(&head)?;
    if (200..300).contains(&answer.status) {
        return Ok(None);
    }
    // A refusal may carry a body after its head.
    let mut rest = Vec::new();
    let _ = stream.take(MAX_RESPONSE_BYTES).read_to_end(&mut rest);
    head.extend_from_slice(&rest);
    parse_response(&head).map(Some)
}

fn parse_response(raw: &[u8]) -> Result<Fetched, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("fetch: the response has no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("fetch: bad status line {status_line:?}"))?;
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim().to_owned();
            headers
                .entry(name)
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
    }
    let mut body = raw[end + 4..].to_vec();
    if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        body = dechunk(&body)?;
    } else if let Some(length) = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.truncate(length);
    }
    Ok(Fetched {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("fetch: a chunk has no size line")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size_text = size_text
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let size = usize::from_str_radix(&size_text, 16)
            .map_err(|_| format!("fetch: bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = data.get(..size).ok_or("fetch: a chunk is cut short")?;
        out.extend_from_slice(chunk);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_response_reads_length_and_chunked_bodies() {
        let plain =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello!!")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((plain.status, plain.body.as_str()), (200, "hello"));
        assert_eq!(plain.headers.get("x-a").map(String::as_str), Some("1"));
        let chunked = parse_response(b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((chunked.status, chunked.body.as_str()), (403, "abcde"));
        assert!(parse_response(b"garbage").is_err());
    }
}
