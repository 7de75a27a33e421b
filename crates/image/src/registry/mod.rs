//! The registry client: the OCI distribution API's manifest and blob reads, with anonymous,
//! bearer-token (from the registry's challenge) and basic authentication, plain HTTP only for
//! loopback registries or `--insecure`, and redirects for blobs.

pub mod auth;
pub(crate) mod http;

use std::sync::Mutex;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Response, StatusCode};

use crate::digest::Digest;
use crate::reference::{Reference, is_loopback_host};
use auth::{AuthError, Challenge, Credentials};
use http::{HttpClient, HttpError, Url};

const MAX_REDIRECTS: usize = 5;

/// Why a registry request failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry request failed")]
    Http(#[from] HttpError),
    #[error("{what} not found on {host}")]
    NotFound { what: String, host: String },
    #[error(
        "{host} refused access to {what} (HTTP {status}); credentials go in $DOCKER_CONFIG/config.json or ~/.docker/config.json"
    )]
    Unauthorized {
        what: String,
        host: String,
        status: u16,
    },
    #[error("{url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error(
        "{0} is reached over plain HTTP, which is only allowed for loopback registries or with --insecure"
    )]
    PlainHttp(String),
    #[error("more than {MAX_REDIRECTS} redirects from {0}")]
    Redirects(String),
    #[error("{0} answered a redirect without a usable Location")]
    Location(String),
    #[error("registry credentials")]
    Auth(#[from] AuthError),
    #[error("the token service {realm} gave no token")]
    Token {
        realm: String,
        #[source]
        source: Option<serde_json::Error>,
    },
    #[error("{what}: the registry sent content with digest {actual}, expected {expected}")]
    Digest {
        what: String,
        expected: Digest,
        actual: Digest,
    },
}

/// A client for one repository on one registry.
#[derive(Debug)]
pub(crate) struct Registry {
    http: HttpClient,
    /// `host[:port]` of the registry API.
    host: String,
    repository: String,
    insecure: bool,
    /// `Some(true)` once HTTPS answered, `Some(false)` once it fell back to HTTP.
    https: Mutex<Option<bool>>,
    credentials: Option<Credentials>,
    authorization: Mutex<Option<String>>,
}

fn locked<T: Clone>(m: &Mutex<T>) -> T {
    m.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

fn set<T>(m: &Mutex<T>, value: T) {
    *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = value;
}

impl Registry {
    /// `credentials`: `None` reads the Docker config.
    pub fn new(
        reference: &Reference,
        insecure: bool,
        credentials: Option<Credentials>,
    ) -> Result<Registry, RegistryError> {
        let credentials = match credentials {
            Some(c) => Some(c),
            None => auth::docker_config_credentials(&reference.registry)?,
        };
        Ok(Registry {
            http: HttpClient::new()?,
            host: reference.api_host().to_owned(),
            repository: reference.repository.clone(),
            insecure,
            https: Mutex::new(None),
            credentials,
            authorization: Mutex::new(None),
        })
    }

    fn plain_allowed(&self, host: &str) -> bool {
        self.insecure || is_loopback_host(host)
    }

    fn url(&self, https: bool, path: &str) -> Result<Url, HttpError> {
        Url::parse(&format!(
            "{}://{}{path}",
            if https { "https" } else { "http" },
            self.host
        ))
    }

    /// One request to the registry host, deciding HTTPS or (where allowed) HTTP on the first.
    async fn send(
        &self,
        path: &str,
        headers: &[(&str, String)],
    ) -> Result<(Url, Response<Incoming>), RegistryError> {
        let mut all: Vec<(&str, String)> = headers.to_vec();
        if let Some(authorization) = locked(&self.authorization) {
            all.push(("authorization", authorization));
        }
        let decided = locked(&self.https);
        let https = decided.unwrap_or(true);
        let url = self.url(https, path)?;
        match self.http.get(Method::GET, &url, &all).await {
            Ok(response) => {
                set(&self.https, Some(https));
                Ok((url, response))
            }
            Err(error)
                if decided.is_none()
                    && error.is_tls_failure()
                    && self.plain_allowed(&self.host) =>
            {
                let url = self.url(false, path)?;
                let response = self.http.get(Method::GET, &url, &all).await?;
                set(&self.https, Some(false));
                Ok((url, response))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// A GET on the registry: authenticates on a 401 and follows redirects.
    async fn get(
        &self,
        path: &str,
        headers: &[(&str, String)],
    ) -> Result<Response<Incoming>, RegistryError> {
        let (mut url, mut response) = self.send(path, headers).await?;
        if response.status() == StatusCode::UNAUTHORIZED {
            let challenge = response
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .and_then(auth::parse_challenge);
            if let Some(challenge) = challenge
                && self.authenticate(challenge).await?
            {
                (url, response) = self.send(path, headers).await?;
            }
        }
        for _ in 0..MAX_REDIRECTS {
            if !response.status().is_redirection() {
                return Ok(response);
            }
            let next = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .and_then(|l| url.join(l).ok())
                .ok_or_else(|| RegistryError::Location(url.to_string()))?;
            if !next.https && !self.plain_allowed(&next.authority()) {
                return Err(RegistryError::PlainHttp(next.to_string()));
            }
            let mut next_headers: Vec<(&str, String)> = headers.to_vec();
            // Credentials never follow a redirect to another host (blob stores sign URLs).
            if next.authority() == self.host
                && let Some(authorization) = locked(&self.authorization)
            {
                next_headers.push(("authorization", authorization));
            }
            response = self.http.get(Method::GET, &next, &next_headers).await?;
            url = next;
        }
        Err(RegistryError::Redirects(url.to_string()))
    }

    /// Answers a challenge; `false` when there is nothing to answer it with.
    async fn authenticate(&self, challenge: Challenge) -> Result<bool, RegistryError> {
        match challenge {
            Challenge::Basic => match &self.credentials {
                Some(credentials) => {
                    set(&self.authorization, Some(credentials.basic_header()));
                    Ok(true)
                }
                None => Ok(false),
            },
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let mut query = vec![format!("scope={}", http::encode_query(&scope))];
                if let Some(service) = service {
                    query.insert(0, format!("service={}", http::encode_query(&service)));
                }
                let separator = if realm.contains('?') { '&' } else { '?' };
                let url = Url::parse(&format!("{realm}{separator}{}", query.join("&")))?;
                if !url.https && !self.plain_allowed(&url.authority()) {
                    return Err(RegistryError::PlainHttp(url.to_string()));
                }
                let mut headers = Vec::new();
                if let Some(credentials) = &self.credentials {
                    headers.push(("authorization", credentials.basic_header()));
                }
                let response = self.http.get(Method::GET, &url, &headers).await?;
                let host = url.authority();
                if !response.status().is_success() {
                    return Err(status_error(response, &url.to_string(), "a registry token").await);
                }
                let body = http::read_body(response.into_body(), &host, 1 << 20).await?;
                #[derive(serde::Deserialize)]
                struct TokenReply {
                    #[serde(default)]
                    token: Option<String>,
                    #[serde(default)]
                    access_token: Option<String>,
                }
                let reply: TokenReply =
                    serde_json::from_slice(&body).map_err(|e| RegistryError::Token {
                        realm: realm.clone(),
                        source: Some(e),
                    })?;
                let token = reply
                    .token
                    .or(reply.access_token)
                    .filter(|t| !t.is_empty())
                    .ok_or(RegistryError::Token {
                        realm,
                        source: None,
                    })?;
                set(&self.authorization, Some(format!("Bearer {token}")));
                Ok(true)
            }
        }
    }

    fn what(&self, kind: &str, id: &str) -> String {
        format!("{kind} {}/{}:{id}", self.host, self.repository)
    }

    /// A manifest or index: its bytes and content type.
    pub async fn manifest(&self, selector: &str) -> Result<(Bytes, Option<String>), RegistryError> {
        let path = format!("/v2/{}/manifests/{selector}", self.repository);
        let response = self
            .get(&path, &[("accept", crate::oci::MANIFEST_ACCEPT.to_owned())])
            .await?;
        let what = self.what("manifest", selector);
        let response = self.check(response, &path, &what).await?;
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = http::read_body(
            response.into_body(),
            &self.host,
            crate::oci::MAX_DOCUMENT_BYTES,
        )
        .await?;
        Ok((body, content_type))
    }

    /// A small blob (a config), verified against `digest`.
    pub async fn small_blob(&self, digest: &Digest) -> Result<Bytes, RegistryError> {
        let response = self.blob(digest, None).await?;
        let body = http::read_body(
            response.into_body(),
            &self.host,
            crate::oci::MAX_DOCUMENT_BYTES,
        )
        .await?;
        let actual = Digest::of(&body);
        if &actual != digest {
            return Err(RegistryError::Digest {
                what: self.what("blob", digest.as_str()),
                expected: digest.clone(),
                actual,
            });
        }
        Ok(body)
    }

    /// A blob's response, from byte `from` when given (206 if the registry honours it).
    pub async fn blob(
        &self,
        digest: &Digest,
        from: Option<u64>,
    ) -> Result<Response<Incoming>, RegistryError> {
        let path = format!("/v2/{}/blobs/{digest}", self.repository);
        let mut headers = Vec::new();
        if let Some(from) = from {
            headers.push(("range", format!("bytes={from}-")));
        }
        let response = self.get(&path, &headers).await?;
        let what = self.what("blob", digest.as_str());
        self.check(response, &path, &what).await
    }

    async fn check(
        &self,
        response: Response<Incoming>,
        path: &str,
        what: &str,
    ) -> Result<Response<Incoming>, RegistryError> {
        match response.status() {
            s if s.is_success() => Ok(response),
            StatusCode::NOT_FOUND => Err(RegistryError::NotFound {
                what: what.to_owned(),
                host: self.host.clone(),
            }),
            s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                Err(RegistryError::Unauthorized {
                    what: what.to_owned(),
                    host: self.host.clone(),
                    status: s.as_u16(),
                })
            }
            _ => Err(status_error(response, &format!("{}{path}", self.host), what).await),
        }
    }
}

async fn status_error(response: Response<Incoming>, url: &str, _what: &str) -> RegistryError {
    let status = response.status().as_u16();
    let host = url.to_owned();
    let body = http::read_body(response.into_body(), &host, 4096)
        .await
        .map(|b| {
            String::from_utf8_lossy(&b)
                .chars()
                .filter(|c| !c.is_control())
                .take(300)
                .collect()
        })
        .unwrap_or_default();
    RegistryError::Status {
        url: url.to_owned(),
        status,
        body,
    }
}

/// The start offset of a `Content-Range: bytes START-END/TOTAL` header.
pub(crate) fn content_range_start(response: &Response<Incoming>) -> Option<u64> {
    let value = response.headers().get("content-range")?.to_str().ok()?;
    let range = value.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}
