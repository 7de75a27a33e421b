//! The HTTP/1.1 server: accepts connections on the Unix socket, routes requests to the
//! Connect RPCs and the plain endpoints, and makes sure every request body is drained so that
//! a keep-alive connection survives any error.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixListener;

use crate::Agent;
use crate::connect::{
    self, Code, EnvelopeReader, HttpResponse, RpcError, RpcResult, stream_error, stream_response,
    unary_error, unary_ok,
};
use crate::files::{self, drain, http_error};
use crate::process::{self, StreamOptions};
use crate::user::{self, User};
use crate::{claim, filesystem, resume, tunnel, watch};

/// Largest accepted RPC request message.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Where the agent accepts connections: a Unix socket (process and container tiers) or an
/// AF_VSOCK port (the microVM tier, whose host reaches the guest only over vsock).
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    Vsock(tokio_vsock::VsockListener),
}

/// Accepts connections forever.
pub async fn serve(listener: Listener, agent: Arc<Agent>) {
    loop {
        let accepted = match &listener {
            Listener::Unix(unix) => unix
                .accept()
                .await
                .map(|(stream, _)| spawn_connection(stream, agent.clone())),
            Listener::Vsock(vsock) => vsock
                .accept()
                .await
                .map(|(stream, _)| spawn_connection(stream, agent.clone())),
        };
        if let Err(e) = accepted {
            crate::log_line!("airlock-agent: accept failed: {e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn spawn_connection<S>(stream: S, agent: Arc<Agent>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |request| {
            let agent = agent.clone();
            async move { Ok::<_, Infallible>(handle(&agent, request).await) }
        });
        if let Err(e) = http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await
            && !e.is_incomplete_message()
        {
            crate::log_line!("airlock-agent: connection error: {e}");
        }
    });
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Decodes one `application/x-www-form-urlencoded` component (`+` is a space).
pub(crate) fn form_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                // Two hex digits exactly: `from_str_radix` alone would also take a sign (`%+5`).
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The decoded value of query parameter `key`; `Err` when the query is malformed.
pub(crate) fn query_param(query: Option<&str>, key: &str) -> Result<Option<String>, String> {
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = form_decode(k).ok_or_else(|| format!("malformed query parameter name '{k}'"))?;
        if k == key {
            return form_decode(v)
                .map(Some)
                .ok_or_else(|| format!("malformed percent-encoding in query parameter '{key}'"));
        }
    }
    Ok(None)
}

async fn handle(agent: &Agent, request: Request<Incoming>) -> HttpResponse {
    if request.method() == Method::GET && request.uri().path() == tunnel::PATH {
        return tunnel::open(request).await;
    }
    let (parts, mut body) = request.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query();
    match (&parts.method, path.as_str()) {
        (&Method::GET, "/health") => {
            drain(&mut body).await;
            connect::no_content()
        }
        (&Method::GET | &Method::POST, "/files") => {
            let params =
                query_param(query, "path").and_then(|p| Ok((p, query_param(query, "username")?)));
            let (file_path, username) = match params {
                Ok(params) => params,
                Err(message) => {
                    drain(&mut body).await;
                    return http_error(StatusCode::BAD_REQUEST, message);
                }
            };
            let user = match user::from_request(
                header(&parts.headers, "authorization"),
                username.as_deref(),
            ) {
                Ok(user) => user,
                Err(e) => {
                    drain(&mut body).await;
                    return http_error(StatusCode::UNAUTHORIZED, e.message);
                }
            };
            if parts.method == Method::GET {
                drain(&mut body).await;
                files::download(file_path.as_deref(), &user)
            } else {
                files::upload(
                    header(&parts.headers, "content-type"),
                    header(&parts.headers, "content-encoding"),
                    file_path.as_deref(),
                    &user,
                    body,
                )
                .await
            }
        }
        (&Method::POST, claim::PATH) => match read_body(&mut body).await {
            Ok(data) => claim::apply(agent, &data),
            Err(e) => http_error(StatusCode::BAD_REQUEST, e.message),
        },
        (&Method::POST, resume::PATH) => match read_body(&mut body).await {
            Ok(data) => resume::apply(agent, &data),
            Err(e) => http_error(StatusCode::BAD_REQUEST, e.message),
        },
        (&Method::POST, rpc)
            if rpc.starts_with("/process.Process/")
                || rpc.starts_with("/filesystem.Filesystem/") =>
        {
            handle_rpc(agent, &rpc[1..], &parts.headers, body).await
        }
        _ => {
            drain(&mut body).await;
            http_error(
                StatusCode::NOT_FOUND,
                format!("no route for {} {path}", parts.method),
            )
        }
    }
}

/// Reads a whole request body of at most `MAX_MESSAGE_BYTES` (always draining it).
async fn read_body(body: &mut Incoming) -> RpcResult<Vec<u8>> {
    let mut data = Vec::new();
    let mut too_large = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            RpcError::new(
                Code::InvalidArgument,
                format!("reading the request body failed: {e}"),
            )
        })?;
        if let Ok(chunk) = frame.into_data() {
            if data.len() + chunk.len() > MAX_MESSAGE_BYTES {
                too_large = true;
            } else if !too_large {
                data.extend_from_slice(&chunk);
            }
        }
    }
    if too_large {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("request message larger than {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    Ok(data)
}

fn stream_options(headers: &HeaderMap) -> StreamOptions {
    let number = |name| {
        header(headers, name)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| *n > 0)
    };
    StreamOptions {
        timeout: number("connect-timeout-ms").map(Duration::from_millis),
        keepalive: number("keepalive-ping-interval").map(Duration::from_secs),
    }
}

fn parse<T: DeserializeOwned>(body: &[u8], streaming: bool) -> RpcResult<T> {
    if streaming {
        connect::parse_single_envelope(body)
    } else {
        connect::parse_message(body)
    }
}

async fn handle_rpc(
    agent: &Agent,
    method: &str,
    headers: &HeaderMap,
    mut body: Incoming,
) -> HttpResponse {
    let server_streaming = matches!(
        method,
        "process.Process/Start" | "process.Process/Connect" | "filesystem.Filesystem/WatchDir"
    );
    let client_streaming = method == "process.Process/StreamInput";
    let streaming = server_streaming || client_streaming;
    if !connect::is_json_content_type(header(headers, "content-type"), streaming) {
        drain(&mut body).await;
        let error = RpcError::new(
            Code::Unimplemented,
            format!(
                "unsupported content type {:?}: only the JSON codec is served",
                header(headers, "content-type").unwrap_or("")
            ),
        );
        let mut response = unary_error(&error);
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return response;
    }
    let auth = header(headers, "authorization").map(str::to_string);
    let user = || user::from_request(auth.as_deref(), None);
    if client_streaming {
        return match stream_input(agent, &mut body).await {
            Ok(()) => {
                let mut frames = connect::envelope(0, b"{}").to_vec();
                frames.extend_from_slice(&connect::end_envelope(None));
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let _ = tx.try_send(Bytes::from(frames));
                stream_response(rx)
            }
            Err(e) => {
                drain(&mut body).await;
                stream_error(&e)
            }
        };
    }
    let data = match read_body(&mut body).await {
        Ok(data) => data,
        Err(e) if streaming => return stream_error(&e),
        Err(e) => return unary_error(&e),
    };
    let options = stream_options(headers);
    if server_streaming {
        let result = match method {
            "process.Process/Start" => parse(&data, true).and_then(|request| {
                process::start(
                    &agent.processes,
                    request,
                    &user()?,
                    &agent.base_env.read().unwrap_or_else(|e| e.into_inner()),
                    options,
                )
            }),
            "process.Process/Connect" => parse(&data, true)
                .and_then(|request| process::connect(&agent.processes, &request, options)),
            _ => {
                parse(&data, true).and_then(|request| watch::watch_dir(&request, &user()?, options))
            }
        };
        return match result {
            Ok(frames) => stream_response(frames),
            Err(e) => {
                crate::log_line!("airlock-agent: {method} failed: {e}");
                stream_error(&e)
            }
        };
    }
    let result = unary(agent, method, &data, user).await;
    match result {
        Ok(message) => unary_ok(&message),
        Err(e) => {
            if e.code == Code::Internal {
                crate::log_line!("airlock-agent: {method} failed: {e}");
            }
            unary_error(&e)
        }
    }
}

async fn unary(
    agent: &Agent,
    method: &str,
    data: &[u8],
    user: impl Fn() -> RpcResult<User>,
) -> RpcResult<serde_json::Value> {
    let table = &agent.processes;
    match method {
        "process.Process/List" => {
            parse::<serde_json::Map<String, serde_json::Value>>(data, false)?;
            Ok(process::list(table))
        }
        "process.Process/SendSignal" => process::send_signal(table, &parse(data, false)?),
        "process.Process/SendInput" => process::send_input(table, &parse(data, false)?).await,
        "process.Process/CloseStdin" => process::close_stdin(table, &parse(data, false)?).await,
        "process.Process/Update" => process::update(table, &parse(data, false)?).await,
        "filesystem.Filesystem/Stat" => filesystem::stat(&parse(data, false)?, &user()?),
        "filesystem.Filesystem/MakeDir" => filesystem::make_dir(&parse(data, false)?, &user()?),
        "filesystem.Filesystem/Move" => filesystem::move_entry(&parse(data, false)?, &user()?),
        "filesystem.Filesystem/ListDir" => filesystem::list_dir(&parse(data, false)?, &user()?),
        "filesystem.Filesystem/Remove" => filesystem::remove(&parse(data, false)?, &user()?),
        "filesystem.Filesystem/CreateWatcher" => {
            watch::create(&agent.watchers, &parse(data, false)?, &user()?)
        }
        "filesystem.Filesystem/GetWatcherEvents" => {
            watch::get_events(&agent.watchers, &parse(data, false)?)
        }
        "filesystem.Filesystem/RemoveWatcher" => {
            watch::remove(&agent.watchers, &parse(data, false)?)
        }
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!("unknown method /{other}"),
        )),
    }
}

/// The client-streaming `StreamInput`: applies each envelope as it arrives.
async fn stream_input(agent: &Agent, body: &mut Incoming) -> RpcResult<()> {
    let mut reader = EnvelopeReader::default();
    let mut selected = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            RpcError::new(
                Code::InvalidArgument,
                format!("reading the request body failed: {e}"),
            )
        })?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        reader.push(&chunk);
        while let Some((flags, payload)) = reader.next_envelope()? {
            if flags & connect::FLAG_END_STREAM != 0 {
                continue;
            }
            let message = connect::parse_message(&payload)?;
            process::stream_input_message(&agent.processes, &mut selected, message).await?;
        }
    }
    if reader.leftover() != 0 {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "request stream ended inside an envelope",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_form_decoded() {
        let q = Some("path=%2Ftmp%2Fa+b%2Bc&username=user");
        assert_eq!(
            query_param(q, "path").unwrap().as_deref(),
            Some("/tmp/a b+c")
        );
        assert_eq!(query_param(q, "username").unwrap().as_deref(), Some("user"));
        assert_eq!(query_param(q, "missing").unwrap(), None);
        assert!(query_param(Some("path=%zz"), "path").is_err());
        // Found by fuzzing (fuzz/regressions/file_paths/lax-percent-sign): a sign is not a digit.
        assert!(query_param(Some("path=%+5"), "path").is_err());
    }
}
