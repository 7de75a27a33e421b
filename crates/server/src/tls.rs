//! TLS on the daemon's own listener, for host-routed traffic: the e2b-desktop SDK hard-codes
//! `https://<port>-<id>.<domain>/…` for its stream URL, so a browser must be able to open a
//! sandbox's port over TLS. One listener serves both: a connection whose first byte is a TLS
//! handshake record (0x16) is accepted as TLS, anything else is plain HTTP, as before.
//!
//! The certificate is the operator's (`--tls-cert`, `--tls-key`: a chain for `*.<domain>` and
//! `<domain>`), or, on a loopback listener by default, one from a local CA that the daemon
//! creates once in `<state-dir>/tls/` and prints the path of, so a browser or client can trust
//! it. That CA is name-constrained to `localhost` and loopback addresses, and the daemon issues
//! leaves only for such names (one per server name, on demand, kept in memory), so trusting it
//! lends nothing for any other site.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints, SanType,
};
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;

/// The TLS record type of a handshake: the first byte a TLS client sends.
const HANDSHAKE_RECORD: u8 = 0x16;
/// Where the local CA lives, under the state directory.
const CA_DIR: &str = "tls";
const CA_CERT: &str = "local-ca.pem";
const CA_KEY: &str = "local-ca.key";
/// How many server names keep a ready leaf.
const LEAF_CACHE: usize = 1024;
/// A leaf's validity: a year from a day ago (leaves live in memory only).
const LEAF_DAYS: i64 = 365;

/// The daemon's TLS options (flattened into `airlockd`'s).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// A PEM certificate chain for host-routed traffic over TLS (a wildcard for `*.<domain>`),
    /// served on the same listener as plain HTTP.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve no TLS on a loopback listener without `--tls-cert` (by default such a listener
    /// also answers TLS with certificates from a local CA in `<state-dir>/tls/`).
    #[arg(long, conflicts_with = "tls_cert")]
    pub no_local_ca: bool,
}

/// What the listener does with TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSetting {
    Off,
    Operator { cert: PathBuf, key: PathBuf },
    LocalCa,
}

impl TlsSetting {
    pub fn from_args(args: &TlsArgs, loopback: bool) -> TlsSetting {
        match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => TlsSetting::Operator {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ if loopback && !args.no_local_ca => TlsSetting::LocalCa,
            _ => TlsSetting::Off,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} is not a PEM private key")]
    BadKey {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("cannot write the local CA under {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating a certificate failed")]
    Certificate(#[from] rcgen::Error),
    #[error("the TLS configuration is invalid")]
    Config(#[from] rustls::Error),
}

/// Marks a request that came over TLS (a request extension), so that answers naming the
/// client's origin say `https`/`wss`.
#[derive(Debug, Clone, Copy)]
pub struct OverTls;

/// The listener's TLS side: a configuration, and the local CA's path when there is one.
pub struct Listener {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub local_ca: Option<PathBuf>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_ca", &self.local_ca)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Listener {
    pub fn new(setting: &TlsSetting, state_dir: &Path) -> Result<Option<Listener>, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth();
        let (mut config, local_ca) = match setting {
            TlsSetting::Off => return Ok(None),
            TlsSetting::Operator { cert, key } => {
                let chain = read_chain(cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::BadKey {
                    path: key.clone(),
                    source,
                })?;
                (builder.with_single_cert(chain, key)?, None)
            }
            TlsSetting::LocalCa => {
                let ca = LocalCa::open(&state_dir.join(CA_DIR))?;
                let path = ca.cert_path.clone();
                (builder.with_cert_resolver(Arc::new(ca)), Some(path))
            }
        };
        // WebSocket upgrades (noVNC, CDP) need HTTP/1.1; the listener speaks nothing else.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Listener {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            local_ca,
        }))
    }
}

/// Whether the client's first byte opens a TLS handshake (without consuming it); `None` when
/// nothing arrived within `wait` (the connection is dropped, as the header timeout would).
pub async fn starts_tls(stream: TcpStream, wait: Duration) -> Option<(TcpStream, bool)> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(wait, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {
            let tls = first[0] == HANDSHAKE_RECORD;
            Some((stream, tls))
        }
        _ => None,
    }
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

/// A server name the local CA issues for: `localhost` and its subdomains.
fn local_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// The local CA: its key on disk (0600, beside its certificate), leaves in memory.
struct LocalCa {
    cert_path: PathBuf,
    ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

/// The CA's parameters: the same on every start, so that a reloaded key issues leaves whose
/// issuer is the certificate on disk.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "Airlock local CA (localhost only)");
    name.push(DnType::OrganizationName, "Airlock");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![
            GeneralSubtree::DnsName("localhost".to_owned()),
            GeneralSubtree::IpAddress(CidrSubnet::V4([127, 0, 0, 0], [255, 0, 0, 0])),
            GeneralSubtree::IpAddress(CidrSubnet::from_v6_prefix(
                std::net::Ipv6Addr::LOCALHOST.octets(),
                128,
            )),
        ],
        excluded_subtrees: vec![],
    });
    params
}

/// The civil date `days` from today (UTC), for certificate validity.
fn days_from_now(days: i64) -> (i32, u8, u8) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let day = i64::try_from(now / 86_400).unwrap_or(0) + days;
    // Howard Hinnant's days-to-civil conversion.
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        i32::try_from(y).unwrap_or(1970),
        u8::try_from(m).unwrap_or(1),
        u8::try_from(d).unwrap_or(1),
    )
}

fn date(days: i64) -> (i32, u8, u8) {
    days_from_now(days)
}

impl LocalCa {
    fn open(dir: &Path) -> Result<LocalCa, TlsError> {
        let cert_path = dir.join(CA_CERT);
        let key_path = dir.join(CA_KEY);
        let stored = (
            std::fs::read_to_string(&cert_path),
            std::fs::read_to_string(&key_path),
        );
        let (ca_der, key) = match stored {
            (Ok(cert), Ok(key)) => {
                let der = CertificateDer::from_pem_slice(cert.as_bytes()).map_err(|_| {
                    TlsError::NoCertificate {
                        path: cert_path.clone(),
                    }
                })?;
                (der, KeyPair::from_pem(&key)?)
            }
            _ => Self::create(dir, &cert_path, &key_path)?,
        };
        Ok(LocalCa {
            cert_path,
            ca_der,
            issuer: Issuer::new(ca_params(), key),
            leaf_key: KeyPair::generate()?,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// A new CA, written key first (0600) and certificate last, each renamed into place.
    fn create(
        dir: &Path,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<(CertificateDer<'static>, KeyPair), TlsError> {
        let write_err = |source| TlsError::Write {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(write_err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(write_err)?;
        let key = KeyPair::generate()?;
        let mut params = ca_params();
        let ((y0, m0, d0), (y1, m1, d1)) = (date(-1), date(10 * 365));
        params.not_before = rcgen::date_time_ymd(y0, m0, d0);
        params.not_after = rcgen::date_time_ymd(y1, m1, d1);
        let cert = params.self_signed(&key)?;
        write_atomically(key_path, key.serialize_pem().as_bytes(), 0o600).map_err(write_err)?;
        write_atomically(cert_path, cert.pem().as_bytes(), 0o644).map_err(write_err)?;
        Ok((cert.der().clone(), key))
    }

    fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, TlsError> {
        let mut leaves = self
            .leaves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(leaf) = leaves.get(name) {
            return Ok(leaf.clone());
        }
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        if name == "localhost" {
            params.subject_alt_names.extend([
                SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
                SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
            ]);
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let ((y0, m0, d0), (y1, m1, d1)) = (date(-1), date(LEAF_DAYS));
        params.not_before = rcgen::date_time_ymd(y0, m0, d0);
        params.not_after = rcgen::date_time_ymd(y1, m1, d1);
        let cert = params.signed_by(&self.leaf_key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let signer = provider().key_provider.load_private_key(key)?;
        let leaf = Arc::new(CertifiedKey::new(
            vec![cert.der().clone(), self.ca_der.clone()],
            signer,
        ));
        if leaves.len() >= LEAF_CACHE {
            leaves.clear();
        }
        leaves.insert(name.to_owned(), leaf.clone());
        Ok(leaf)
    }
}

impl ResolvesServerCert for LocalCa {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // No server name: the client connected by address (127.0.0.1 or ::1).
        let name = hello.server_name().unwrap_or("localhost");
        if !local_name(name) {
            tracing::debug!(name, "TLS for a name the local CA does not issue for");
            return None;
        }
        match self.leaf(&name.trim_end_matches('.').to_ascii_lowercase()) {
            Ok(leaf) => Some(leaf),
            Err(err) => {
                tracing::warn!(error = %err, name, "cannot issue a local TLS certificate");
                None
            }
        }
    }
}

fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_local_ca_names_only_localhost() {
        assert!(local_name("localhost"));
        assert!(local_name("6080-abc.localhost"));
        assert!(local_name("6080-abc.LOCALHOST."));
        assert!(!local_name("example.com"));
        assert!(!local_name("localhost.example.com"));
        assert!(!local_name("notlocalhost"));
    }

    #[test]
    fn test_civil_dates_are_right() {
        let (y, m, d) = days_from_now(0);
        assert!(y >= 2025 && (1..=12).contains(&m) && (1..=31).contains(&d));
        let now = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
        .unwrap();
        // 2000-03-01 is day 11017 of the epoch.
        let (y, m, d) = days_from_now(11_017 - now / 86_400);
        assert_eq!((y, m, d), (2000, 3, 1));
    }

    #[test]
    fn test_local_ca_is_reused_across_starts() {
        let dir = std::env::temp_dir().join(format!("airlock-tls-test-{}", std::process::id()));
        let first = LocalCa::open(&dir).unwrap();
        let again = LocalCa::open(&dir).unwrap();
        assert_eq!(first.ca_der, again.ca_der);
        let mode = std::fs::metadata(dir.join(CA_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A leaf from the reloaded key chains to the stored certificate.
        let leaf = again.leaf("6080-abc.localhost").unwrap();
        assert_eq!(leaf.cert[1], first.ca_der);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
