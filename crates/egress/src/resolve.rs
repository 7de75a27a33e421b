//! Name resolution and the connection to a vetted address. The proxy resolves each destination
//! itself, checks every address against the hard block, and connects to those very addresses,
//! so a second DNS answer (rebinding) never reaches a socket.
//!
//! Tests stand in for the internet with [`TestResolver`], a constructor option
//! ([`crate::ProxyOptions::test_resolver`]) that the runtime never sets. Its
//! [`TestAnswer::Upstream`] addresses are the only ones that skip the hard block; its
//! [`TestAnswer::Dns`] answers are vetted like real ones, and a name it does not know fails
//! instead of falling back to real DNS.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::address::{Host, blocked_reason};

/// How long one connection attempt to an upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One answer of the [`TestResolver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestAnswer {
    /// A test upstream at this exact socket address, whatever port the client asked for. The
    /// hard block is skipped for this address only.
    Upstream(SocketAddr),
    /// What a DNS server would answer: vetted like any real answer.
    Dns(Vec<IpAddr>),
}

/// A resolver for tests: names map to answers, and nothing reaches real DNS.
#[derive(Debug, Default)]
pub struct TestResolver {
    entries: Mutex<HashMap<String, VecDeque<TestAnswer>>>,
}

impl TestResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// `name` is served by a test upstream at `addr`.
    pub fn upstream(&self, name: &str, addr: SocketAddr) {
        self.sequence(name, vec![TestAnswer::Upstream(addr)]);
    }

    /// `name` resolves as if DNS answered `ips`.
    pub fn dns(&self, name: &str, ips: Vec<IpAddr>) {
        self.sequence(name, vec![TestAnswer::Dns(ips)]);
    }

    /// Successive lookups of `name` get these answers in order; the last one then repeats.
    pub fn sequence(&self, name: &str, answers: Vec<TestAnswer>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(name.to_ascii_lowercase(), answers.into());
    }

    fn answer(&self, name: &str) -> Option<TestAnswer> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let queue = entries.get_mut(name)?;
        if queue.len() > 1 {
            queue.pop_front()
        } else {
            queue.front().cloned()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{host} resolves to {ip}, a {why} address, which sandboxes may not reach")]
    Blocked {
        host: String,
        ip: IpAddr,
        why: &'static str,
    },
    #[error("{host} is a {why} address, which sandboxes may not reach")]
    BlockedLiteral { host: String, why: &'static str },
    #[error("{0} does not resolve")]
    NotFound(String),
    #[error("resolving {host} failed")]
    Lookup {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("no address of {host} accepted a connection")]
    Connect {
        host: String,
        #[source]
        source: io::Error,
    },
}

impl ResolveError {
    /// The error code the client and the audit line see.
    pub fn code(&self) -> &'static str {
        match self {
            ResolveError::Blocked { .. } | ResolveError::BlockedLiteral { .. } => {
                "destination_blocked"
            }
            ResolveError::NotFound(_) | ResolveError::Lookup { .. } => "dns_failed",
            ResolveError::Connect { .. } => "upstream_unreachable",
        }
    }
}

/// The proxy's resolver: the system's, or a [`TestResolver`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Resolver {
    test: Option<Arc<TestResolver>>,
}

impl Resolver {
    pub(crate) fn new(test: Option<Arc<TestResolver>>) -> Self {
        Self { test }
    }

    /// The hard block on an address literal, before any rule or question is asked.
    pub(crate) fn check_literal(host: &Host) -> Result<(), ResolveError> {
        if let Host::Ip(ip) = host
            && let Some(why) = blocked_reason(*ip)
        {
            return Err(ResolveError::BlockedLiteral {
                host: host.canonical(),
                why,
            });
        }
        Ok(())
    }

    /// The addresses to connect to for `host:port`, each one vetted. One blocked address in an
    /// answer refuses the whole answer: a mix of public and internal addresses is a trick.
    pub(crate) async fn vetted(
        &self,
        host: &Host,
        port: u16,
    ) -> Result<Vec<SocketAddr>, ResolveError> {
        Self::check_literal(host)?;
        let name = match host {
            Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, port)]),
            Host::Name(name) => name,
        };
        let addresses: Vec<SocketAddr> = match &self.test {
            Some(test) => match test.answer(name) {
                Some(TestAnswer::Upstream(addr)) => return Ok(vec![addr]),
                Some(TestAnswer::Dns(ips)) => {
                    ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect()
                }
                None => return Err(ResolveError::NotFound(name.clone())),
            },
            None => tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|source| ResolveError::Lookup {
                    host: name.clone(),
                    source,
                })?
                .collect(),
        };
        if addresses.is_empty() {
            return Err(ResolveError::NotFound(name.clone()));
        }
        for address in &addresses {
            if let Some(why) = blocked_reason(address.ip()) {
                return Err(ResolveError::Blocked {
                    host: name.clone(),
                    ip: address.ip(),
                    why,
                });
            }
        }
        Ok(addresses)
    }

    /// Resolves, vets and connects to the first vetted address that answers.
    pub(crate) async fn connect(&self, host: &Host, port: u16) -> Result<TcpStream, ResolveError> {
        let addresses = self.vetted(host, port).await?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for address in addresses {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => {
                    // Small requests must not wait for Nagle's algorithm.
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(error)) => last = error,
                Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
            }
        }
        Err(ResolveError::Connect {
            host: host.canonical(),
            source: last,
        })
    }
}
