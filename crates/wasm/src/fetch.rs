//! The guest's only network: `fetch` of `http://` URLs through the sandbox's egress proxy
//! (`HTTP_PROXY`, set in `network: proxy` mode), so that host rules, credential placeholders,
//! approvals and audit stay in the proxy. Without a proxy there is no network at all.
//! A small HTTP/1.1 client over std: one request per connection, `Connection: close`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Instant;

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

/// The proxy's `host:port` from `HTTP_PROXY`, if the sandbox has one.
pub fn proxy_from_env() -> Option<String> {
    let value = std::env::var("HTTP_PROXY")
        .or_else(|_| std::env::var("http_proxy"))
        .ok()?;
    let authority = value.strip_prefix("http://")?.trim_end_matches('/');
    (!authority.is_empty()).then(|| authority.to_owned())
}

/// Sends one request through `proxy` before `deadline`.
pub fn fetch(
    proxy: &str,
    method: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    body: Option<&str>,
    deadline: Instant,
) -> Result<Fetched, String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!(
            "fetch {url:?}: only http:// URLs (through the egress proxy) are available on the wasm tier"
        ));
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
    let mut request =
        format!("{method} {url} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
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
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("fetch: cannot send: {e}"))?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| format!("fetch: cannot read the response: {e}"))?;
    parse_response(&raw)
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
