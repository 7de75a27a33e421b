//! A fake internet on loopback for the egress tests: the egress crate's own test upstreams (an
//! HTTP and an HTTPS upstream with their own test CA, each answering `hello from <http|https>
//! <target>` and logging what it saw), plus a reviewer webhook. The daemon's proxies reach them
//! through `--test-egress-resolve`; nothing leaves the machine.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[path = "../../../egress/tests/common/mod.rs"]
mod fake_internet;

pub use fake_internet::{Seen, SeenLog, start_http_upstream, start_https_upstream, test_pki};

/// A reviewer webhook: records each approval it is asked about and answers `decision`.
pub async fn start_reviewer(decision: &'static str, asked: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let asked = asked.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let asked = asked.clone();
                async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    asked
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&body).into_owned());
                    let answer = format!(r#"{{"decision":"{decision}"}}"#);
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(answer))))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}
