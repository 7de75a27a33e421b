//! A null E2B server for `airlock bench e2b`: it answers the three calls of the measured cycle
//! (create, `process.Process/Start` of `true`, kill) at once, with the shapes Airlock's daemon
//! gives, so that the SDK's own cost (its Python, its HTTP client, loopback) is measured in the
//! same run and can be subtracted from Airlock's cycle. Anything else it is asked is answered 404
//! and counted: a floor measured on a cycle that is not the same one would not be a floor.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The null server's sandbox id (every create gets the same one: nothing is kept).
const SANDBOX_ID: &str = "null0sandbox";

/// A running null server, on a thread and runtime of its own (the benchmark's thread blocks on
/// the driver); it lives as long as the process.
pub struct NullServer {
    pub address: SocketAddr,
    unexpected: Arc<AtomicU64>,
}

impl NullServer {
    /// Listens on a loopback port.
    pub fn start() -> std::io::Result<NullServer> {
        let unexpected = Arc::new(AtomicU64::new(0));
        let counter = unexpected.clone();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("e2b-null".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = bound_tx.send(Err(err));
                        return;
                    }
                };
                runtime.block_on(serve(bound_tx, counter));
            })?;
        let address = bound_rx
            .recv()
            .map_err(|_| std::io::Error::other("the null server's thread ended"))??;
        Ok(NullServer {
            address,
            unexpected,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Requests that were not one of the cycle's three calls.
    pub fn unexpected(&self) -> u64 {
        self.unexpected.load(Ordering::Relaxed)
    }
}

async fn serve(
    bound: std::sync::mpsc::Sender<std::io::Result<SocketAddr>>,
    counter: Arc<AtomicU64>,
) {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(listener) => listener,
        Err(err) => {
            let _ = bound.send(Err(err));
            return;
        }
    };
    if bound.send(listener.local_addr()).is_err() {
        return;
    }
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        let counter = counter.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let counter = counter.clone();
                async move { Ok::<_, Infallible>(answer(request, &counter).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(request: Request<Incoming>, unexpected: &AtomicU64) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    // Read the body as the daemon does before it answers.
    let _ = request.into_body().collect().await;
    match (&method, path.as_str()) {
        (&Method::POST, "/sandboxes" | "/v2/sandboxes") => json(StatusCode::CREATED, &created()),
        (&Method::POST, "/process.Process/Start") => stream_of_true(),
        (&Method::DELETE, path) if path == format!("/sandboxes/{SANDBOX_ID}") => {
            empty(StatusCode::NO_CONTENT)
        }
        _ => {
            unexpected.fetch_add(1, Ordering::Relaxed);
            eprintln!("bench e2b: the null server does not answer {method} {path}");
            empty(StatusCode::NOT_FOUND)
        }
    }
}

fn created() -> serde_json::Value {
    serde_json::json!({
        "templateID": "base",
        "sandboxID": SANDBOX_ID,
        "alias": "base",
        "clientID": "airlock",
        "envdVersion": "0.5.7",
        "envdAccessToken": "null0token",
        "domain": null,
    })
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// envd's answer to a `true` that exited 0: `start`, `end`, then the end-of-stream frame.
fn stream_of_true() -> Response<Full<Bytes>> {
    let mut out = Vec::new();
    let frames = [
        (0u8, serde_json::json!({"event": {"start": {"pid": 1}}})),
        (
            0u8,
            serde_json::json!({"event": {"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}}),
        ),
        (2u8, serde_json::json!({})),
    ];
    for (flags, message) in frames {
        let bytes = message.to_string().into_bytes();
        out.push(flags);
        out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&bytes);
    }
    let mut response = Response::new(Full::new(Bytes::from(out)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/connect+json"),
    );
    response
}
