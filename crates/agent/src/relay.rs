//! The egress relay: in `proxy` network mode, the sandbox's network namespace has only
//! loopback. The relay listens on a loopback port inside it (what `HTTP_PROXY` names) and
//! carries each connection, byte for byte, to the egress proxy's Unix socket, which Airlock
//! binds into the view. It decides nothing: the proxy outside enforces the policy.

use std::path::PathBuf;

use tokio::net::{TcpListener, UnixStream};

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
    loop {
        let (mut client, _) = match listener.accept().await {
            Ok(pair) => pair,
            Err(err) => {
                eprintln!("airlock-agent: relay accept failed: {err}");
                continue;
            }
        };
        let socket = spec.socket.clone();
        tokio::spawn(async move {
            match UnixStream::connect(&socket).await {
                Ok(mut proxy) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut proxy).await;
                }
                Err(err) => {
                    eprintln!(
                        "airlock-agent: the egress proxy at {} is unreachable: {err}",
                        socket.display()
                    );
                }
            }
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
