//! The egress relay: in `proxy` network mode, the sandbox's network namespace has only
//! loopback. The relay listens on a loopback port inside it (what `HTTP_PROXY` names) and
//! carries each connection, byte for byte, to the egress proxy: its Unix socket, which Airlock
//! binds into the view, or in a microVM guest (which has no network device at all) a vsock
//! port of the host (CID 2), which the VMM forwards to that socket. It decides nothing: the
//! proxy outside enforces the policy.

use std::path::PathBuf;

use tokio::net::{TcpListener, UnixStream};

/// The host's vsock CID.
const HOST_CID: u32 = 2;

/// Where the relay carries its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// The egress proxy's socket in the view (the process and container tiers).
    Unix(PathBuf),
    /// A host vsock port the VMM forwards to the proxy's socket (the microvm tier).
    Vsock { port: u32 },
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Upstream::Unix(path) => write!(f, "{}", path.display()),
            Upstream::Vsock { port } => write!(f, "vsock {HOST_CID}:{port}"),
        }
    }
}

/// One connection to the proxy, whichever way it is reached.
enum ProxyStream {
    Unix(UnixStream),
    Vsock(tokio_vsock::VsockStream),
}

impl Upstream {
    async fn connect(&self) -> std::io::Result<ProxyStream> {
        match self {
            Upstream::Unix(path) => UnixStream::connect(path).await.map(ProxyStream::Unix),
            Upstream::Vsock { port } => {
                tokio_vsock::VsockStream::connect(tokio_vsock::VsockAddr::new(HOST_CID, *port))
                    .await
                    .map(ProxyStream::Vsock)
            }
        }
    }
}

/// Where the relay listens and where it forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySpec {
    pub port: u16,
    pub socket: PathBuf,
}

impl RelaySpec {
    /// Parses `PORT:SOCKET_PATH`.
    pub fn parse(text: &str) -> Result<RelaySpec, String> {
        let (port, socket) = text
            .split_once(':')
            .ok_or_else(|| format!("`{text}` is not PORT:SOCKET_PATH"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{port}` is not a port number"))?;
        if !socket.starts_with('/') {
            return Err(format!(
                "the relay's socket `{socket}` must be an absolute path"
            ));
        }
        Ok(RelaySpec {
            port,
            socket: socket.into(),
        })
    }
}

/// Relays until the process ends. Binding fails loudly (the port is the sandbox's proxy
/// address); a connection whose proxy cannot be reached is closed, and the proxy's absence is
/// logged once per connection.
pub async fn serve(spec: RelaySpec) -> std::io::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", spec.port)).await?;
    relay(listener, Upstream::Unix(spec.socket)).await
}

/// Relays each connection accepted on `listener` to `upstream`, until the process ends.
pub async fn relay(listener: TcpListener, upstream: Upstream) -> std::io::Result<()> {
    let upstream = std::sync::Arc::new(upstream);
    loop {
        let (mut client, _) = match listener.accept().await {
            Ok(pair) => pair,
            Err(err) => {
                crate::log_line!("airlock-agent: relay accept failed: {err}");
                continue;
            }
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let copied = match upstream.connect().await {
                Ok(ProxyStream::Unix(mut proxy)) => {
                    tokio::io::copy_bidirectional(&mut client, &mut proxy).await
                }
                Ok(ProxyStream::Vsock(mut proxy)) => {
                    tokio::io::copy_bidirectional(&mut client, &mut proxy).await
                }
                Err(err) => {
                    crate::log_line!(
                        "airlock-agent: the egress proxy at {upstream} is unreachable: {err}"
                    );
                    return;
                }
            };
            drop(copied);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_relay_spec_parses_port_and_absolute_socket() {
        assert_eq!(
            RelaySpec::parse("3128:/run/airlock/egress/proxy.sock"),
            Ok(RelaySpec {
                port: 3128,
                socket: "/run/airlock/egress/proxy.sock".into()
            })
        );
        assert!(RelaySpec::parse("0:/x").is_err());
        assert!(RelaySpec::parse("3128:relative").is_err());
        assert!(RelaySpec::parse("nope").is_err());
    }
}
