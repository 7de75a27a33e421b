//! TEST AND BENCHMARK EQUIPMENT (the daemon never uses it): a git smart-HTTP server on
//! loopback (`git http-backend` behind a small hyper server, optionally over TLS and behind
//! a token), and a fake GitHub-compatible forge API that opens pull requests against the
//! repositories that server holds. `crates/server/tests/git.rs` and `airlock bench git` use
//! them; nothing here is reachable from off the host.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One request a test server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub authorization: Option<String>,
    /// The body, for the forge's calls (empty for git's).
    pub body: String,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn record(log: &Log, parts: &hyper::http::request::Parts, body: String) {
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        authorization: parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
    };
    log.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
}

fn answer(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

/// Serves `service` on a fresh loopback port (over TLS with `tls`) until the process ends.
async fn serve<F, Fut>(
    tls: Option<Arc<rustls::ServerConfig>>,
    service: F,
) -> std::io::Result<SocketAddr>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (service, acceptor) = (service.clone(), acceptor.clone());
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |request| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service(request).await) }
                });
                let builder = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(stream).await {
                            let _ = builder.serve_connection(TokioIo::new(tls), handler).await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), handler)
                            .await;
                    }
                }
            });
        }
    });
    Ok(address)
}

/// `git http-backend` over the bare repositories under `root` (pushes allowed), requiring
/// `Authorization: Basic <any user>:<token>` on every request when a token is given.
#[derive(Debug, Clone)]
pub struct GitServer {
    pub address: SocketAddr,
    pub root: PathBuf,
    log: Log,
}

impl GitServer {
    pub async fn start(
        root: &Path,
        token: Option<String>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<GitServer> {
        let log = Log::default();
        let (service_log, service_root) = (log.clone(), root.to_owned());
        let token = Arc::new(token);
        let address = serve(tls, move |request| {
            let (log, root, token) = (service_log.clone(), service_root.clone(), token.clone());
            async move {
                let (parts, body) = request.into_parts();
                record(&log, &parts, String::new());
                if let Some(token) = token.as_ref()
                    && !basic_password_is(&parts.headers, token)
                {
                    let mut refused = answer(StatusCode::UNAUTHORIZED, "token required");
                    refused.headers_mut().insert(
                        WWW_AUTHENTICATE,
                        hyper::header::HeaderValue::from_static("Basic realm=\"git\""),
                    );
                    return refused;
                }
                cgi(&root, Request::from_parts(parts, body)).await
            }
        })
        .await?;
        Ok(GitServer {
            address,
            root: root.to_owned(),
            log,
        })
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn basic_password_is(headers: &hyper::HeaderMap, token: &str) -> bool {
    let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let decoded = String::from_utf8_lossy(&decoded);
    decoded
        .split_once(':')
        .is_some_and(|(_, password)| password == token)
}

/// One request through `git http-backend`, the CGI way.
async fn cgi(root: &Path, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (content_type, protocol, encoding) = (
        header("content-type"),
        header("git-protocol"),
        header("content-encoding"),
    );
    let Ok(body) = request.into_body().collect().await.map(|c| c.to_bytes()) else {
        return answer(StatusCode::BAD_REQUEST, "unreadable body");
    };
    let root = root.to_owned();
    let output = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
        let mut child = Command::new("git")
            .arg("http-backend")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("GIT_PROJECT_ROOT", &root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "http.receivepack")
            .env("GIT_CONFIG_VALUE_0", "true")
            .env("REMOTE_USER", "test")
            .env("REQUEST_METHOD", method)
            .env("PATH_INFO", path)
            .env("QUERY_STRING", query)
            .env("CONTENT_TYPE", content_type)
            .env("HTTP_CONTENT_ENCODING", encoding)
            .env("CONTENT_LENGTH", body.len().to_string())
            .env("GIT_PROTOCOL", protocol)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, &body)?;
        }
        Ok(child.wait_with_output()?.stdout)
    })
    .await;
    let Ok(Ok(output)) = output else {
        return answer(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed");
    };
    let split = output
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| output.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)))
        .unwrap_or((output.len(), 0));
    let head = String::from_utf8_lossy(&output[..split.0]).into_owned();
    let mut response = answer(
        StatusCode::OK,
        Bytes::copy_from_slice(&output[split.0 + split.1..]),
    );
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
            *response.status_mut() =
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A GitHub-compatible `POST /repos/{owner}/{repo}/pulls` over the repositories of a
/// [`GitServer`] (`<root>/<owner>/<repo>.git`): it needs `Authorization: Bearer <token>`,
/// checks that both branches exist there, and answers 201 with `html_url` and `number`.
#[derive(Debug, Clone)]
pub struct FakeForge {
    pub address: SocketAddr,
    log: Log,
}

impl FakeForge {
    pub async fn start(token: String, git_root: &Path) -> std::io::Result<FakeForge> {
        let log = Log::default();
        let (service_log, root) = (log.clone(), git_root.to_owned());
        let token = Arc::new(token);
        let numbers = Arc::new(Mutex::new(0u64));
        let address = serve(None, move |request| {
            let (log, root, token, numbers) = (
                service_log.clone(),
                root.clone(),
                token.clone(),
                numbers.clone(),
            );
            async move { pulls(request, &log, &root, &token, &numbers).await }
        })
        .await?;
        Ok(FakeForge { address, log })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn branch_exists(repository: &Path, branch: &str) -> bool {
    Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(["rev-parse", "--verify", "-q", "--end-of-options"])
        .arg(format!("refs/heads/{branch}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn pulls(
    request: Request<Incoming>,
    log: &Log,
    root: &Path,
    token: &str,
    numbers: &Mutex<u64>,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
        .unwrap_or_default();
    record(log, &parts, body.clone());
    let json_answer = |status: StatusCode, value: Value| {
        let mut response = answer(status, value.to_string());
        response.headers_mut().insert(
            CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        response
    };
    let authorized = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {token}"));
    if !authorized {
        return json_answer(
            StatusCode::UNAUTHORIZED,
            json!({"message": "Bad credentials"}),
        );
    }
    let segments: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
    let ["repos", owner, repo, "pulls"] = segments[..] else {
        return json_answer(StatusCode::NOT_FOUND, json!({"message": "Not Found"}));
    };
    let repository = root.join(owner).join(format!("{repo}.git"));
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let field = |name: &str| request.get(name).and_then(Value::as_str).unwrap_or("");
    let (head, base) = (field("head"), field("base"));
    for (name, branch) in [("head", head), ("base", base)] {
        if !branch_exists(&repository, branch) {
            return json_answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"message": "Validation Failed", "errors": [{"message": format!("{name} {branch:?} does not exist")}]}),
            );
        }
    }
    let number = {
        let mut next = numbers.lock().unwrap_or_else(|e| e.into_inner());
        *next += 1;
        *next
    };
    json_answer(
        StatusCode::CREATED,
        json!({
            "number": number,
            "html_url": format!("https://forge.test/{owner}/{repo}/pull/{number}"),
            "title": field("title"),
            "head": {"ref": head},
            "base": {"ref": base},
        }),
    )
}
