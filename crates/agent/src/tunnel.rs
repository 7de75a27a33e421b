//! `GET /airlock/tcp?port=N` with `Connection: Upgrade` and `Upgrade: airlock-tcp`: a byte
//! tunnel from the daemon to a TCP port on the sandbox's own loopback.
//!
//! The daemon cannot enter a sandbox's network namespace from its async runtime, but the agent
//! lives in it. So the agent connects to `127.0.0.1:N` (then `[::1]:N`), answers
//! `101 Switching Protocols` once that connection exists, and splices bytes both ways until
//! either side closes. A refused connection is answered `502` with a Connect error
//! (`unavailable`), before any upgrade, so the caller can tell "port not open" from a broken
//! tunnel. The endpoint exists only on the agent's private Unix socket, which only the daemon
//! can reach; the sandbox's own programs can already connect to their loopback, so it grants
//! them nothing.

use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue, UPGRADE};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::connect::{Code, HttpResponse, ResponseBody, RpcError, unary_error};

/// The path of the tunnel endpoint.
pub const PATH: &str = "/airlock/tcp";
/// The protocol named in `Upgrade`.
pub const PROTOCOL: &str = "airlock-tcp";

/// Whether `name` lists `token` (comma-separated, case-insensitive), as `Connection` does.
fn lists(headers: &HeaderMap, name: hyper::header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| item.trim().eq_ignore_ascii_case(token))
}

/// The `port` query parameter: 1 to 65535.
fn port(query: Option<&str>) -> Result<u16, String> {
    let value = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("port="))
        .ok_or("missing query parameter port")?;
    match value.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(format!("port must be 1 to 65535, got {value:?}")),
    }
}

/// Connects to the port on loopback, IPv4 first.
async fn connect(port: u16) -> std::io::Result<TcpStream> {
    match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(stream) => Ok(stream),
        Err(v4) => TcpStream::connect(("::1", port)).await.map_err(|_| v4),
    }
}

fn refuse(code: Code, message: String) -> HttpResponse {
    let mut response = unary_error(&RpcError::new(code, message));
    if code == Code::Unavailable {
        *response.status_mut() = StatusCode::BAD_GATEWAY;
    }
    response
}

/// Serves one tunnel request. The request must still carry its upgrade handle.
pub async fn open(mut request: Request<Incoming>) -> HttpResponse {
    let headers = request.headers();
    if !lists(headers, CONNECTION, "upgrade") || !lists(headers, UPGRADE, PROTOCOL) {
        return refuse(
            Code::InvalidArgument,
            format!("{PATH} needs Connection: Upgrade and Upgrade: {PROTOCOL}"),
        );
    }
    let port = match port(request.uri().query()) {
        Ok(port) => port,
        Err(message) => return refuse(Code::InvalidArgument, message),
    };
    let stream = match connect(port).await {
        Ok(stream) => stream,
        Err(e) => {
            return refuse(
                Code::Unavailable,
                format!("port {port} is not open in the sandbox ({e})"),
            );
        }
    };
    let _ = stream.set_nodelay(true);
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let mut upgraded = TokioIo::new(upgraded);
        let mut stream = stream;
        // Ends when both directions have seen end-of-file, or on the first error.
        let _ = tokio::io::copy_bidirectional(&mut upgraded, &mut stream).await;
    });
    let mut response = Response::new(ResponseBody::Full(None));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    response
        .headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(PROTOCOL));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_must_be_a_real_port() {
        assert_eq!(port(Some("port=8080")), Ok(8080));
        assert_eq!(port(Some("x=1&port=1")), Ok(1));
        assert!(port(Some("port=0")).is_err());
        assert!(port(Some("port=65536")).is_err());
        assert!(port(Some("port=")).is_err());
        assert!(port(None).is_err());
    }
}
