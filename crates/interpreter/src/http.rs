//! The HTTP/1.1 side of port 49999: E2B's routes, its status codes and its plain-text errors.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::context::{ContextError, Service, Warmth};
use crate::execute::{self, Job};
use crate::languages::{env_snippets, normalize};
use crate::wire::{CreateContextRequest, ExecuteRequest};

pub type Body = BoxBody<Bytes, Infallible>;

/// The largest request body read (code is text; this bounds a hostile client).
const MAX_BODY_BYTES: usize = 64 << 20;
/// Lines buffered between an execution and a slow client.
const LINE_BUFFER: usize = 64;

/// A response body fed by a channel; it ends when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// E2B's errors are plain text.
fn text(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", message.into())
}

fn json(value: &impl Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    full(StatusCode::OK, "application/json", body)
}

fn context_error(err: &ContextError) -> Response<Body> {
    let status = match err {
        ContextError::NotFound(_) => StatusCode::NOT_FOUND,
        ContextError::NoKernel { .. } | ContextError::BadCwd(_) => StatusCode::BAD_REQUEST,
        ContextError::Kernel(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(status, crate::context::error_chain(err))
}

/// The request body as `T`; an empty body reads as `{}`. Err: the answer to send.
async fn read_json<T: DeserializeOwned>(body: Incoming) -> Result<T, Response<Body>> {
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return Err(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read the request body (at most {MAX_BODY_BYTES} bytes): {err}"),
            ));
        }
    };
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        bytes
    };
    serde_json::from_slice(&bytes).map_err(|err| {
        text(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid request body: {err}"),
        )
    })
}

/// Serves connections on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, service: Arc<Service>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |request| {
                let service = service.clone();
                async move { Ok::<_, Infallible>(handle(&service, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), handler)
                .await;
        });
    }
}

async fn handle(service: &Arc<Service>, request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match (&parts.method, segments.as_slice()) {
        (&Method::GET, ["health"]) => health(service),
        (&Method::POST, ["execute"]) => match read_json(body).await {
            Ok(request) => execute(service, request).await,
            Err(response) => response,
        },
        (&Method::POST, ["contexts"]) => match read_json::<CreateContextRequest>(body).await {
            Ok(request) => {
                let language = normalize(request.language.as_deref());
                match service.create(&language, request.cwd.as_deref()).await {
                    Ok(context) => json(&context.info),
                    Err(err) => context_error(&err),
                }
            }
            Err(response) => response,
        },
        (&Method::GET, ["contexts"]) => json(&service.list()),
        (&Method::POST, ["contexts", id, "restart"]) => match service.get(id) {
            Ok(context) => match context.restart(service).await {
                Ok(()) => json(&()),
                Err(err) => context_error(&err),
            },
            Err(err) => context_error(&err),
        },
        (&Method::DELETE, ["contexts", id]) => match service.remove(id).await {
            Ok(()) => json(&()),
            Err(err) => context_error(&err),
        },
        (_, ["health" | "execute" | "contexts"] | ["contexts", _] | ["contexts", _, "restart"]) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        }
        _ => text(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// `"OK"` once the default python kernel runs (the template's ready check waits on this).
fn health(service: &Service) -> Response<Body> {
    match service.warmth() {
        Warmth::Ready => json(&"OK"),
        Warmth::Starting => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the default python kernel is starting",
        ),
        Warmth::Failed(reason) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the default python kernel did not start: {reason}"),
        ),
    }
}

async fn execute(service: &Arc<Service>, request: ExecuteRequest) -> Response<Body> {
    let context = match (&request.context_id, &request.language) {
        (Some(_), Some(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                "Only one of context_id or language can be provided",
            );
        }
        (Some(id), None) => service.get(id),
        (None, language) => {
            service
                .default_context(&normalize(language.as_deref()))
                .await
        }
    };
    let context = match context {
        Ok(context) => context,
        Err(err) => return context_error(&err),
    };
    let env = match env_snippets(
        context.language(),
        request.env_vars.as_ref().unwrap_or(&Default::default()),
    ) {
        Ok(env) => env,
        Err(err) => return text(StatusCode::BAD_REQUEST, err.to_string()),
    };
    // Waiting for the context's turn happens before the answer starts: a client that gives
    // up meanwhile drops this future, and its code never runs.
    let turn = match context.turn(service).await {
        Ok(turn) => turn,
        Err(err) => return context_error(&err),
    };
    let (sender, receiver) = mpsc::channel(LINE_BUFFER);
    let job = Job {
        code: request.code,
        env,
    };
    tokio::spawn(execute::run(context, turn, job, sender));
    let mut response = Response::new(ChannelBody(receiver).boxed());
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}
