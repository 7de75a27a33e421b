//! TLS: the per-sandbox CA and the leaf certificates it signs for intercepted hosts, the
//! upstream client configuration (the host's trust store plus any roots the caller adds), and
//! reading a tunnel's ClientHello to learn its server name before anything is forwarded.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};

use crate::address::Host;

/// The host's trust store (Debian's bundle), used to verify upstreams.
pub const SYSTEM_TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// How many intercepted hosts keep a ready leaf certificate.
const LEAF_CACHE: usize = 256;
/// The most a ClientHello may take before the tunnel is refused.
const MAX_HELLO_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the sandbox CA or a leaf certificate failed")]
    Certificate(#[from] rcgen::Error),
    #[error("building a TLS configuration failed")]
    Config(#[from] rustls::Error),
    #[error("cannot read the trust store {path}")]
    TrustStore {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("an extra upstream root is not a PEM certificate")]
    ExtraRoot,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The per-sandbox CA. Its key lives only in this process's memory.
pub(crate) struct Authority {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    pub(crate) fn generate(sandbox_id: &str) -> Result<Self, TlsError> {
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(
            DnType::CommonName,
            format!("Airlock sandbox {sandbox_id} egress CA"),
        );
        name.push(DnType::OrganizationName, "Airlock");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let certificate = params.self_signed(&ca_key)?;
        Ok(Self {
            ca_pem: certificate.pem(),
            ca_der: certificate.der().clone(),
            issuer: Issuer::new(params, ca_key),
            leaf_key: KeyPair::generate()?,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A server configuration presenting a leaf for `host`, signed by the CA.
    pub(crate) fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, TlsError> {
        let key = host.canonical();
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(&key) {
            return Ok(config.clone());
        }
        let mut params = CertificateParams::new(vec![key.clone()])?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, key.clone());
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&self.leaf_key, &self.issuer)?;
        let chain = vec![leaf.der().clone(), self.ca_der.clone()];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, private)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= LEAF_CACHE {
            leaves.clear();
        }
        leaves.insert(key, config.clone());
        Ok(config)
    }
}

/// The configuration for TLS towards upstreams: roots from `bundle` (skipped when the file
/// does not exist) plus `extra_roots_pem`. Also airlockd's, for Judge0 callbacks.
pub fn client_config(
    bundle: &Path,
    extra_roots_pem: &[String],
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    if bundle.exists() {
        let certificates = CertificateDer::pem_file_iter(bundle)
            .map_err(|error| TlsError::TrustStore {
                path: bundle.display().to_string(),
                source: io::Error::other(error.to_string()),
            })?
            .filter_map(Result::ok);
        roots.add_parsable_certificates(certificates);
    }
    for pem in extra_roots_pem {
        let mut any = false;
        for certificate in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let certificate = certificate.map_err(|_| TlsError::ExtraRoot)?;
            roots.add(certificate).map_err(|_| TlsError::ExtraRoot)?;
            any = true;
        }
        if !any {
            return Err(TlsError::ExtraRoot);
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// How a tunnel's client opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Greeting {
    /// A TLS ClientHello, with its server name if it sent one.
    Tls { server_name: Option<String> },
    /// Anything else (e.g. plain HTTP through a CONNECT to port 80).
    Plain,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SniffError {
    #[error("the tunnel closed before the client sent anything")]
    Closed,
    #[error("the client's TLS ClientHello is malformed")]
    BadHello,
    #[error("the client's TLS ClientHello is larger than {MAX_HELLO_BYTES} bytes")]
    TooLarge,
    #[error("reading from the client failed")]
    Io(#[from] io::Error),
}

/// Reads the client's first bytes into `buffer` (they are still to be forwarded) and, when they
/// start a TLS handshake, reads on to the end of the ClientHello.
pub(crate) async fn sniff<S: AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
) -> Result<Greeting, SniffError> {
    let mut chunk = vec![0u8; 16 * 1024];
    let read = stream.read(&mut chunk).await?;
    if read == 0 {
        return Err(SniffError::Closed);
    }
    buffer.extend_from_slice(&chunk[..read]);
    if buffer[0] != 0x16 {
        return Ok(Greeting::Plain);
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut fed = 0;
    loop {
        while fed < buffer.len() {
            let mut rest = &buffer[fed..];
            match acceptor.read_tls(&mut rest) {
                Ok(0) => break,
                Ok(used) => fed += used,
                Err(_) => return Err(SniffError::BadHello),
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let server_name = accepted.client_hello().server_name().map(str::to_owned);
                return Ok(Greeting::Tls { server_name });
            }
            Ok(None) => {}
            Err(_) => return Err(SniffError::BadHello),
        }
        if buffer.len() >= MAX_HELLO_BYTES {
            return Err(SniffError::TooLarge);
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(SniffError::Closed);
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// A stream that first replays bytes already read from it.
#[derive(Debug)]
pub(crate) struct Prefixed<S> {
    prefix: Vec<u8>,
    position: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(crate) fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            position: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.position < this.prefix.len() {
            let rest = &this.prefix[this.position..];
            let take = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..take]);
            this.position += take;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
