//! Shared rig of the image store's integration tests: the test images of
//! scripts/test-images.sh, Debian's docker-registry on a free loopback port (stopped on drop),
//! skopeo pushes, scratch store roots, and two small TCP fronts for a registry: a token/basic
//! auth gate and a throttle.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the rig"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use airlock_image::{ImageStore, StoreOptions};

/// The test images (built by scripts/test-images.sh, which the test command runs first).
/// skopeo's trust policy for the tests (accept anything), written whole before it appears:
/// tests run in parallel, and one must never read a file another is still writing.
pub fn skopeo_policy() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let policy = images().join("skopeo-policy.json");
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = images().join(format!(".skopeo-policy.{}.{n}", std::process::id()));
    std::fs::write(
        &partial,
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    std::fs::rename(&partial, &policy).unwrap();
    policy
}

pub fn images() -> PathBuf {
    let dir = std::env::var_os("AIRLOCK_TEST_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-images"));
    assert!(
        dir.join("layouts/busybox/index.json").exists(),
        "no test images in {}: run scripts/test-images.sh first",
        dir.display()
    );
    dir
}

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "airlock-image-test-{tag}-{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn store(&self) -> ImageStore {
        ImageStore::open(&self.0.join("store"), StoreOptions::default()).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's docker-registry on 127.0.0.1, with its storage in a scratch directory.
pub struct Registry {
    pub port: u16,
    child: Child,
    _scratch: Scratch,
}

impl Registry {
    pub fn start() -> Registry {
        let scratch = Scratch::new("registry");
        let port = free_port();
        let config = scratch.0.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                scratch.0.join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian's package of that name) must be installed");
        let registry = Registry {
            port,
            child,
            _scratch: scratch,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `skopeo copy` of `layout:tag` to `<registry>/<repo>` (`--all` for an index).
    pub fn push(&self, layout: &str, tag: &str, repo: &str) {
        let policy = skopeo_policy();
        let source = format!(
            "oci:{}:{tag}",
            images().join("layouts").join(layout).display()
        );
        let status = Command::new("skopeo")
            .arg("--policy")
            .arg(&policy)
            .args([
                "copy",
                "--quiet",
                "--all",
                "--preserve-digests",
                "--dest-tls-verify=false",
                &source,
            ])
            .arg(format!("docker://{}/{repo}", self.host()))
            .status()
            .expect("skopeo must be installed");
        assert!(status.success(), "skopeo copy {source} failed");
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A one-thread runtime, as the CLI uses (layers still unpack on blocking threads).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How the [`Front`] treats requests.
#[derive(Clone, Debug)]
pub enum Gate {
    /// `/v2/*` needs `Bearer <token>`; `/token` hands it out for `Basic user:password`.
    Token {
        user: String,
        password: String,
        token: String,
    },
    /// `/v2/*` needs `Basic user:password`.
    Basic { user: String, password: String },
    /// Everything passes, at most `bytes_per_second` of response.
    Throttle { bytes_per_second: u64 },
}

/// A TCP front for a registry (one request per connection, as airlock's client sends):
/// checks credentials or slows responses, then relays to `upstream`.
pub struct Front {
    pub port: u16,
    stop: Arc<AtomicBool>,
    /// Requests refused with 401, and tokens handed out.
    pub refused: Arc<AtomicU64>,
    pub tokens: Arc<AtomicU64>,
}

fn read_head(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
    }
    Some((String::from_utf8_lossy(&head).into_owned(), head))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
        .map(|l| l[name.len() + 1..].trim())
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

impl Front {
    pub fn start(upstream: u16, gate: Gate) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let tokens = Arc::new(AtomicU64::new(0));
        let (stop2, refused2, tokens2) = (stop.clone(), refused.clone(), tokens.clone());
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (gate, refused, tokens) =
                            (gate.clone(), refused2.clone(), tokens2.clone());
                        std::thread::spawn(move || {
                            serve(stream, upstream, port, &gate, &refused, &tokens)
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Front {
            port,
            stop,
            refused,
            tokens,
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(
    mut client: TcpStream,
    upstream: u16,
    port: u16,
    gate: &Gate,
    refused: &AtomicU64,
    tokens: &AtomicU64,
) {
    let _ = client.set_nonblocking(false);
    // A TLS ClientHello (airlock tries HTTPS first): hang up, as a plain HTTP server would.
    let mut first = [0u8; 1];
    if client.peek(&mut first).is_ok_and(|n| n == 1) && first[0] == 0x16 {
        return;
    }
    let Some((head, raw)) = read_head(&mut client) else {
        return;
    };
    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    let authorization = header(&head, "authorization").unwrap_or("").to_owned();
    let reply = |client: &mut TcpStream, status: &str, extra: &str, body: &str| {
        let _ = write!(
            client,
            "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    let mut rate = None;
    match gate {
        Gate::Token {
            user,
            password,
            token,
        } => {
            if path.starts_with("/token") {
                if authorization == basic(user, password) && path.contains("scope=repository%3A") {
                    tokens.fetch_add(1, Ordering::Relaxed);
                    reply(
                        &mut client,
                        "200 OK",
                        "",
                        &format!(r#"{{"token":"{token}"}}"#),
                    );
                } else {
                    reply(
                        &mut client,
                        "401 Unauthorized",
                        "",
                        r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#,
                    );
                }
                return;
            }
            if authorization != format!("Bearer {token}") {
                refused.fetch_add(1, Ordering::Relaxed);
                let challenge = format!(
                    "WWW-Authenticate: Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"airlock-test\"\r\n"
                );
                reply(
                    &mut client,
                    "401 Unauthorized",
                    &challenge,
                    r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#,
                );
                return;
            }
        }
        Gate::Basic { user, password } => {
            if authorization != basic(user, password) {
                refused.fetch_add(1, Ordering::Relaxed);
                reply(
                    &mut client,
                    "401 Unauthorized",
                    "WWW-Authenticate: Basic realm=\"airlock-test\"\r\n",
                    "{}",
                );
                return;
            }
        }
        Gate::Throttle { bytes_per_second } => rate = Some(*bytes_per_second),
    }
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    // Forward the head without credentials (the real registry has none configured), and ask
    // the registry to close after its answer so that the relay ends with it.
    let mut lines: Vec<String> = String::from_utf8_lossy(&raw)
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            !lower.starts_with("authorization:") && !lower.starts_with("connection:")
        })
        .map(str::to_owned)
        .collect();
    lines.push("Connection: close".to_owned());
    let forwarded = format!("{}\r\n\r\n", lines.join("\r\n"));
    if server.write_all(forwarded.as_bytes()).is_err() {
        return;
    }
    let mut buffer = vec![0u8; 64 << 10];
    let started = Instant::now();
    let mut sent = 0u64;
    loop {
        let n = match server.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if client.write_all(&buffer[..n]).is_err() {
            break;
        }
        sent += n as u64;
        if let Some(rate) = rate {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
}
