//! The daemon's forge: a GitHub-compatible API (`--forge-api`), the git host whose
//! repositories it serves (`--forge-git-host`), and its token (`--forge-token-env` or
//! `--forge-token-file`), held on the host.
//!
//! The token reaches a repository only as a credential of the sandbox's egress proxy (the
//! sandbox holds a placeholder), and the forge's API only from the daemon itself, here: the
//! pull request call goes from the host, never through a sandbox. The token is read again for
//! every call, so a rotated file takes effect at once. Plain `http://` is allowed only for an
//! API on loopback (tests); HTTPS is verified against the host's trust store.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use airlock_api::policy::CredentialSourceSpec;
use airlock_runtime::git::{GitCredential, RepoUrl};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::config::{ConfigError, ServeArgs};

/// How long one forge call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a forge's answer that is read.
const MAX_ANSWER_BYTES: usize = 1 << 20;
const TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error(
        "no forge is configured (start airlockd with --forge-api and --forge-token-env or --forge-token-file)"
    )]
    NotConfigured,
    #[error("{0} is not a repository of the forge's git host {1}")]
    OtherHost(String, String),
    #[error("{0} is not a repository path the forge's API can name (/OWNER/REPO)")]
    NotOwnerRepo(String),
    #[error("cannot read the forge token")]
    Token(#[source] std::io::Error),
    #[error("the forge token variable {0} is not set in the daemon's environment")]
    TokenEnv(String),
    #[error("cannot reach the forge at {0}")]
    Connect(String, #[source] std::io::Error),
    #[error("TLS with the forge at {0} failed")]
    Tls(String, #[source] std::io::Error),
    #[error("the forge at {0} did not answer within {secs} s", secs = CALL_TIMEOUT.as_secs())]
    Timeout(String),
    #[error("the call to the forge failed: {0}")]
    Http(String),
    #[error("the forge refused the pull request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("the forge's answer has no html_url or number")]
    Answer,
}

impl ForgeError {
    /// A refusal the caller can act on (422: a pull request exists, no commits between the
    /// branches) is a conflict; the rest is the forge's or the operator's problem.
    pub fn code(&self) -> airlock_api::v1::ErrorCode {
        use airlock_api::v1::ErrorCode;
        match self {
            ForgeError::NotConfigured | ForgeError::OtherHost(..) | ForgeError::NotOwnerRepo(_) => {
                ErrorCode::Unprocessable
            }
            ForgeError::Refused { status: 422, .. } => ErrorCode::Conflict,
            _ => ErrorCode::ForgeError,
        }
    }
}

/// Where the API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Without a trailing `/` (empty for `https://api.github.com`).
    pub base: String,
}

impl ApiUrl {
    fn parse(raw: &str) -> Result<ApiUrl, String> {
        let (tls, rest) = if let Some(rest) = raw.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = raw.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err("must start with https:// (or http:// on loopback)".into());
        };
        let (authority, base) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() || authority.contains('@') || base.contains(['?', '#']) {
            return Err("needs a host, and no credentials, query or fragment".into());
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => (
                host,
                port.parse::<u16>()
                    .map_err(|_| format!("bad port {port:?}"))?,
            ),
            _ => (authority, if tls { 443 } else { 80 }),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !tls && !loopback {
            return Err("plain http:// is allowed only on a loopback address".into());
        }
        Ok(ApiUrl {
            tls,
            host,
            port,
            base: base.trim_end_matches('/').to_owned(),
        })
    }
}

/// The checked forge flags.
#[derive(Debug, Clone, Default)]
pub struct ForgeConfig {
    pub api: Option<ApiUrl>,
    /// The git host, and its port if the flag named one (else any port).
    pub git_host: Option<(String, Option<u16>)>,
    pub token: Option<CredentialSourceSpec>,
    pub username: String,
}

impl ForgeConfig {
    pub fn from_args(args: &ServeArgs) -> Result<ForgeConfig, ConfigError> {
        let bad = |flag, why: String| ConfigError::Forge { flag, why };
        let api = args
            .forge_api
            .as_deref()
            .map(ApiUrl::parse)
            .transpose()
            .map_err(|why| bad("--forge-api", why))?;
        let token = match (&args.forge_token_env, &args.forge_token_file) {
            (Some(var), _) => {
                if std::env::var_os(var).is_none() {
                    return Err(bad(
                        "--forge-token-env",
                        format!("the daemon's environment has no {var}"),
                    ));
                }
                Some(CredentialSourceSpec::Env(var.clone()))
            }
            (None, Some(path)) => {
                let path = std::path::absolute(path)
                    .map_err(|e| bad("--forge-token-file", e.to_string()))?;
                std::fs::metadata(&path)
                    .map_err(|e| bad("--forge-token-file", format!("{}: {e}", path.display())))?;
                Some(CredentialSourceSpec::File(path.display().to_string()))
            }
            (None, None) => None,
        };
        let git_host = match (&args.forge_git_host, &api) {
            (Some(text), _) => {
                Some(parse_host_port(text).map_err(|why| bad("--forge-git-host", why))?)
            }
            (None, Some(api)) => Some((
                api.host
                    .strip_prefix("api.")
                    .unwrap_or(&api.host)
                    .to_owned(),
                None,
            )),
            (None, None) => None,
        };
        if api.is_some() && token.is_none() {
            return Err(bad(
                "--forge-api",
                "needs the token: --forge-token-env VAR or --forge-token-file PATH".into(),
            ));
        }
        if token.is_some() && git_host.is_none() {
            return Err(bad(
                "--forge-token-env/--forge-token-file",
                "needs --forge-git-host (or --forge-api) to say where the token may go".into(),
            ));
        }
        if args.forge_git_username.is_empty() || args.forge_git_username.contains([':', '\n']) {
            return Err(bad(
                "--forge-git-username",
                "must be non-empty, without `:` or newlines".into(),
            ));
        }
        Ok(ForgeConfig {
            api,
            git_host,
            token,
            username: args.forge_git_username.clone(),
        })
    }

    /// Whether `repo` lives on the forge's git host.
    pub fn serves(&self, repo: &RepoUrl) -> bool {
        self.git_host
            .as_ref()
            .is_some_and(|(host, port)| *host == repo.host && port.is_none_or(|p| p == repo.port))
    }

    /// The credential a sandbox of `repo` gets, if the forge serves it.
    pub fn credential_for(&self, repo: &RepoUrl) -> Option<GitCredential> {
        let token = self.token.as_ref()?;
        self.serves(repo).then(|| GitCredential {
            source: token.clone(),
            username: self.username.clone(),
        })
    }

    fn read_token(&self) -> Result<String, ForgeError> {
        match &self.token {
            Some(CredentialSourceSpec::Env(var)) => {
                std::env::var(var).map_err(|_| ForgeError::TokenEnv(var.clone()))
            }
            Some(CredentialSourceSpec::File(path)) => std::fs::read_to_string(PathBuf::from(path))
                .map(|text| text.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(ForgeError::Token),
            None => Err(ForgeError::NotConfigured),
        }
    }

    /// Opens a pull request from `head` into `base` of `repo`; returns its page and number.
    pub async fn open_pull_request(
        &self,
        repo: &RepoUrl,
        head: &str,
        base: &str,
        title: &str,
        body: Option<&str>,
    ) -> Result<(String, u64), ForgeError> {
        let api = self.api.as_ref().ok_or(ForgeError::NotConfigured)?;
        if !self.serves(repo) {
            let host = self
                .git_host
                .as_ref()
                .map(|h| h.0.clone())
                .unwrap_or_default();
            return Err(ForgeError::OtherHost(repo.url.clone(), host));
        }
        let (owner, name) = repo
            .owner_repo()
            .ok_or_else(|| ForgeError::NotOwnerRepo(repo.url.clone()))?;
        let token = self.read_token()?;
        let payload =
            json!({ "title": title, "body": body.unwrap_or(""), "head": head, "base": base });
        let path = format!("{}/repos/{owner}/{name}/pulls", api.base);
        let call = post(api, &path, &token, payload.to_string());
        let (status, answer) = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| ForgeError::Timeout(api.host.clone()))??;
        let value: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        if status != StatusCode::CREATED && status != StatusCode::OK {
            let mut message = value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_owned();
            for error in value
                .get("errors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(text) = error.get("message").and_then(Value::as_str) {
                    message.push_str(": ");
                    message.push_str(text);
                }
            }
            return Err(ForgeError::Refused {
                status: status.as_u16(),
                message,
            });
        }
        let url = value.get("html_url").and_then(Value::as_str);
        let number = value.get("number").and_then(Value::as_u64);
        match (url, number) {
            (Some(url), Some(number)) => Ok((url.to_owned(), number)),
            _ => Err(ForgeError::Answer),
        }
    }
}

fn parse_host_port(text: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => {
            let port = port
                .parse::<u16>()
                .map_err(|_| format!("bad port in {text:?}"))?;
            (host, Some(port))
        }
        _ => (text, None),
    };
    let host = airlock_egress::parse_host(host)
        .map_err(|e| format!("{text:?}: {e}"))?
        .canonical();
    Ok((host, port))
}

fn tls_config() -> Result<Arc<rustls::ClientConfig>, std::io::Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(TRUST_BUNDLE)?;
    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

async fn post(
    api: &ApiUrl,
    path: &str,
    token: &str,
    payload: String,
) -> Result<(StatusCode, Bytes), ForgeError> {
    let address = format!("{}:{}", api.host, api.port);
    let stream = tokio::net::TcpStream::connect((api.host.as_str(), api.port))
        .await
        .map_err(|e| ForgeError::Connect(address.clone(), e))?;
    let authority = if api.port == if api.tls { 443 } else { 80 } {
        api.host.clone()
    } else {
        address.clone()
    };
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(HOST, authority)
        .header(USER_AGENT, concat!("airlockd/", env!("CARGO_PKG_VERSION")))
        .header(ACCEPT, "application/vnd.github+json")
        .header("x-github-api-version", "2022-11-28")
        .header(CONTENT_TYPE, "application/json")
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| ForgeError::Http(e.to_string()))?;
    if api.tls {
        let config = tls_config().map_err(|e| ForgeError::Tls(address.clone(), e))?;
        let name = rustls::pki_types::ServerName::try_from(api.host.clone())
            .map_err(|e| ForgeError::Tls(address.clone(), std::io::Error::other(e)))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .map_err(|e| ForgeError::Tls(address.clone(), e))?;
        exchange(tls, request).await
    } else {
        exchange(stream, request).await
    }
}

async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes), ForgeError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| ForgeError::Http(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| ForgeError::Http(e.to_string()))?
        .to_bytes();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_api_urls_need_tls_off_loopback() {
        let github = ApiUrl::parse("https://api.github.com").unwrap();
        assert_eq!(
            (github.host.as_str(), github.port, github.base.as_str()),
            ("api.github.com", 443, "")
        );
        let ghe = ApiUrl::parse("https://ghe.example.com/api/v3/").unwrap();
        assert_eq!(ghe.base, "/api/v3");
        assert!(ApiUrl::parse("http://127.0.0.1:8080").is_ok());
        assert!(
            ApiUrl::parse("http://forge.example.com")
                .unwrap_err()
                .contains("loopback")
        );
        assert!(ApiUrl::parse("ftp://x").is_err());
        assert!(ApiUrl::parse("https://u:p@api.github.com").is_err());
    }

    #[test]
    fn test_forge_serves_its_git_host_only() {
        let config = ForgeConfig {
            api: None,
            git_host: Some(("github.com".into(), None)),
            token: Some(CredentialSourceSpec::Env("T".into())),
            username: "x-access-token".into(),
        };
        let ours = RepoUrl::parse("https://github.com/acme/app.git").unwrap();
        let theirs = RepoUrl::parse("https://evil.example/acme/app.git").unwrap();
        assert!(config.credential_for(&ours).is_some());
        assert!(
            config.credential_for(&theirs).is_none(),
            "the token goes to its host only"
        );
        let pinned = ForgeConfig {
            git_host: Some(("github.com".into(), Some(8443))),
            ..config
        };
        assert!(!pinned.serves(&ours));
    }
}
